#include "core/config/logging_flags.h"

#include <string>

namespace kvfabric {

void AddLoggingFlags(CLI::App& app, LogOptions* options) {
  CLI::Validator level_check(
      [](std::string& level) -> std::string {
        Status s = CheckLogLevel(level);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "", "LOG_LEVEL");
  app.add_option("--log-level", options->level,
                 "least severe level logged: " + std::string(ValidLogLevels()))
      ->check(level_check)
      ->type_name("LEVEL")
      ->capture_default_str()
      ->group("Logging");
  app.add_option("--log-file", options->file, "append logs to this file instead of stderr")
      ->type_name("PATH")
      ->group("Logging");
  app.add_flag("--log-json", options->json, "log one JSON object per line instead of text")
      ->group("Logging");
}

}  // namespace kvfabric
