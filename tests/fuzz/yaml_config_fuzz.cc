// libFuzzer target: the YAML configuration loader (core/config/yaml_config.h) every kvfabric
// binary reads with --config. Any bytes must become configuration items or be refused with a
// CLI::ConfigError naming the file and line, in bounded time and memory (aliases that multiply
// or loop are refused at core/config/yaml_config.cc's bounds, not walked).
#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/unit_flags.h"
#include "core/config/yaml_config.h"

using namespace kvfabric;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The option kinds the binaries use: a size, a duration, numbers, a string, a list, a flag,
  // a dotted name and a subcommand section.
  CLI::App app{"fuzz"};
  std::uint64_t bytes = 0;
  std::chrono::microseconds lease{0};
  int port = 0;
  double ratio = 0;
  std::string name;
  std::vector<std::string> peers;
  bool verbose = false;
  std::string dotted;
  AddBytesOption(app, "--host-pool-bytes", &bytes, "");
  AddDurationOption(app, "--lease", &lease, "");
  app.add_option("--port", port);
  app.add_option("--ratio", ratio);
  app.add_option("--name", name);
  app.add_option("--peers", peers);
  app.add_flag("--verbose", verbose);
  app.add_option("--pool.host-bytes", dotted);
  CLI::App* sub = app.add_subcommand("bench", "")->configurable();
  int iterations = 0;
  sub->add_option("--iterations", iterations);
  AddYamlConfigOption(&app);
  YamlConfig config(&app);
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    std::vector<CLI::ConfigItem> items = config.from_config(in);
    (void)items;
  } catch (const CLI::Error&) {
  }
  return 0;
}
