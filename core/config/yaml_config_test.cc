#include "core/config/yaml_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/logging_flags.h"
#include "core/config/unit_flags.h"
#include "core/logging.h"

namespace kvfabric {
namespace {

using std::chrono::microseconds;

constexpr std::uint64_t kMiB = 1024 * 1024;

// What a daemon's main would fill from its flags.
struct DaemonOptions {
  std::uint64_t host_pool_bytes = 1024 * kMiB;
  std::uint64_t page_bytes = 2 * kMiB;
  microseconds lease = std::chrono::seconds(30);
  int port = 7000;
  std::string name = "cached";
  std::vector<std::string> peers;
  bool verbose = false;
  int bench_iterations = 1;
  LogOptions log;
};

// A root App shaped like a real binary's: top-level options, a dotted option, logging flags,
// a subcommand with its own option, and YAML configuration.
class TestApp {
 public:
  TestApp() : app_("kvfabric-test: a daemon-shaped app") {
    AddYamlConfigOption(&app_);
    AddBytesOption(app_, "--host-pool-bytes", &opts_.host_pool_bytes, "pinned host pool size");
    AddBytesOption(app_, "--pool.page-bytes", &opts_.page_bytes, "host page size");
    AddDurationOption(app_, "--lease", &opts_.lease, "lease duration");
    app_.add_option("--port", opts_.port, "gRPC port")->capture_default_str();
    app_.add_option("--name", opts_.name, "daemon name");
    app_.add_option("--peers", opts_.peers, "peer addresses");
    app_.add_flag("-v,--verbose", opts_.verbose, "more output");
    AddLoggingFlags(app_, &opts_.log);
    CLI::App* bench = app_.add_subcommand("bench", "run a benchmark");
    bench->add_option("--iterations", opts_.bench_iterations, "iterations");
  }

  // Parses `args` (without argv[0]); returns "" on success, else CLI11's error message.
  std::string Parse(std::vector<std::string> args) {
    std::vector<const char*> argv = {"kvfabric-test"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    try {
      app_.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }

  CLI::App& app() { return app_; }
  const DaemonOptions& opts() const { return opts_; }

 private:
  DaemonOptions opts_;
  CLI::App app_;
};

class YamlConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "yaml_config_test.XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path);
    out << contents;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(YamlConfigTest, FlagsOnlyWithoutConfigFile) {
  TestApp t;
  ASSERT_EQ(t.Parse({"--host-pool-bytes", "64MiB", "--port", "7100", "--lease", "250ms", "--peers",
                     "a:1", "--peers", "b:2", "-v", "--log-level", "debug"}),
            "");
  EXPECT_EQ(t.opts().host_pool_bytes, 64 * kMiB);
  EXPECT_EQ(t.opts().port, 7100);
  EXPECT_EQ(t.opts().lease, microseconds(250000));
  EXPECT_EQ(t.opts().peers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_TRUE(t.opts().verbose);
  EXPECT_EQ(t.opts().log.level, "debug");
  EXPECT_EQ(t.opts().page_bytes, 2 * kMiB);  // untouched default
}

TEST_F(YamlConfigTest, YamlOnlySetsEveryKindOfValue) {
  const std::string path = WriteFile("c.yaml", R"(
# a comment
host-pool-bytes: 64MiB
lease: 1h30m
port: 7200
name: "node 7"
peers: [a:1, b:2]
verbose: yes
log-level: warn
log-json: true
)");
  TestApp t;
  ASSERT_EQ(t.Parse({"--config", path}), "");
  EXPECT_EQ(t.opts().host_pool_bytes, 64 * kMiB);
  EXPECT_EQ(t.opts().lease, std::chrono::minutes(90));
  EXPECT_EQ(t.opts().port, 7200);
  EXPECT_EQ(t.opts().name, "node 7");
  EXPECT_EQ(t.opts().peers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_TRUE(t.opts().verbose);
  EXPECT_EQ(t.opts().log.level, "warn");
  EXPECT_TRUE(t.opts().log.json);
}

TEST_F(YamlConfigTest, CommandLineFlagOverridesYaml) {
  const std::string path = WriteFile("c.yaml", "host-pool-bytes: 64MiB\nport: 7200\n");
  TestApp t;
  // The flag comes before and after --config: position does not matter, the flag wins.
  ASSERT_EQ(t.Parse({"--host-pool-bytes", "2GiB", "--config", path}), "");
  EXPECT_EQ(t.opts().host_pool_bytes, 2048 * kMiB);
  EXPECT_EQ(t.opts().port, 7200);  // not on the command line: from the file

  TestApp t2;
  ASSERT_EQ(t2.Parse({"--config", path, "--port", "1"}), "");
  EXPECT_EQ(t2.opts().port, 1);
  EXPECT_EQ(t2.opts().host_pool_bytes, 64 * kMiB);
}

TEST_F(YamlConfigTest, UnknownKeyIsRejectedNamingKeyFileAndLine) {
  const std::string path = WriteFile("typo.yaml", "port: 7200\nhost-pool-byts: 64MiB\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find(path + ":2:"), std::string::npos) << error;
  EXPECT_NE(error.find("unknown key \"host-pool-byts\""), std::string::npos) << error;
}

TEST_F(YamlConfigTest, UnknownKeyInsideSubcommandSectionIsRejected) {
  const std::string path = WriteFile("c.yaml", "bench:\n  iterations: 5\n  iteration: 6\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find(path + ":3:"), std::string::npos) << error;
  EXPECT_NE(error.find("unknown key \"bench.iteration\""), std::string::npos) << error;
  EXPECT_NE(error.find("in subcommand \"bench\""), std::string::npos) << error;
}

TEST_F(YamlConfigTest, BadSizeInYamlIsRejectedNamingTheOption) {
  const std::string path = WriteFile("c.yaml", "host-pool-bytes: 64QB\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find("--host-pool-bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("\"64QB\""), std::string::npos) << error;
}

TEST_F(YamlConfigTest, BadLogLevelInYamlListsValidLevels) {
  const std::string path = WriteFile("c.yaml", "log-level: verbose\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find("--log-level"), std::string::npos) << error;
  EXPECT_NE(error.find("trace, debug, info, warn, error, off"), std::string::npos) << error;
}

TEST_F(YamlConfigTest, MalformedYamlIsRejectedNamingTheLine) {
  const std::string path = WriteFile("bad.yaml", "port: 7200\nname: [unclosed\nverbose: true\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find(path + ":"), std::string::npos) << error;
  EXPECT_NE(error.find("malformed YAML"), std::string::npos) << error;
  // yaml-cpp reports an unclosed flow sequence where it gives up: at or after line 2.
  EXPECT_EQ(error.find(path + ":1:"), std::string::npos) << error;
}

TEST_F(YamlConfigTest, NestedSectionSelectsSubcommandOrDottedOption) {
  const std::string path = WriteFile("c.yaml", R"(
bench:
  iterations: 5
pool:
  page-bytes: 4MiB
)");
  TestApp t;
  ASSERT_EQ(t.Parse({"--config", path}), "");
  EXPECT_EQ(t.opts().bench_iterations, 5);
  EXPECT_EQ(t.opts().page_bytes, 4 * kMiB);
}

TEST_F(YamlConfigTest, SectionInvokesSubcommandOnlyIfConfigurable) {
  const std::string path = WriteFile("c.yaml", "bench:\n  iterations: 5\n");
  TestApp plain;
  ASSERT_EQ(plain.Parse({"--config", path}), "");
  EXPECT_EQ(plain.opts().bench_iterations, 5);
  EXPECT_FALSE(plain.app().got_subcommand("bench"));

  TestApp configurable;
  configurable.app().get_subcommand("bench")->configurable();
  ASSERT_EQ(configurable.Parse({"--config", path}), "");
  EXPECT_EQ(configurable.opts().bench_iterations, 5);
  EXPECT_TRUE(configurable.app().got_subcommand("bench"));
}

TEST_F(YamlConfigTest, DottedKeysEqualNesting) {
  const std::string path = WriteFile("c.yaml", "bench.iterations: 9\npool.page-bytes: 8MiB\n");
  TestApp t;
  ASSERT_EQ(t.Parse({"--config", path}), "");
  EXPECT_EQ(t.opts().bench_iterations, 9);
  EXPECT_EQ(t.opts().page_bytes, 8 * kMiB);
}

TEST_F(YamlConfigTest, SameOptionTwiceIsRejected) {
  const std::string path =
      WriteFile("c.yaml", "pool:\n  page-bytes: 4MiB\npool.page-bytes: 8MiB\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find(path + ":3:"), std::string::npos) << error;
  EXPECT_NE(error.find("first set on line 2"), std::string::npos) << error;

  const std::string both = WriteFile("v.yaml", "v: true\nverbose: false\n");
  TestApp t2;
  EXPECT_NE(t2.Parse({"--config", both}).find("first set on line 1"), std::string::npos);
}

TEST_F(YamlConfigTest, NonConfigurableOptionAndNullValueAreRejected) {
  const std::string path = WriteFile("c.yaml", "config: other.yaml\n");
  TestApp t;
  const std::string error = t.Parse({"--config", path});
  EXPECT_NE(error.find("cannot be set in a configuration file"), std::string::npos) << error;

  const std::string null_value = WriteFile("n.yaml", "port:\n");
  TestApp t2;
  const std::string error2 = t2.Parse({"--config", null_value});
  EXPECT_NE(error2.find("key \"port\" has no value"), std::string::npos) << error2;
}

TEST_F(YamlConfigTest, TopLevelMustBeAMappingAndOneDocument) {
  TestApp t;
  const std::string list = WriteFile("l.yaml", "- port\n- 7200\n");
  EXPECT_NE(t.Parse({"--config", list}).find("top level must be a mapping"), std::string::npos);
  TestApp t2;
  const std::string two = WriteFile("t.yaml", "port: 1\n---\nport: 2\n");
  EXPECT_NE(t2.Parse({"--config", two}).find("more than one YAML document"), std::string::npos);
}

TEST_F(YamlConfigTest, EmptyFileChangesNothing) {
  const std::string path = WriteFile("empty.yaml", "# nothing configured yet\n");
  TestApp t;
  ASSERT_EQ(t.Parse({"--config", path}), "");
  EXPECT_EQ(t.opts().port, 7000);
}

TEST_F(YamlConfigTest, MissingConfigFileIsAnError) {
  TestApp t;
  const std::string missing = (dir_ / "absent.yaml").string();
  EXPECT_NE(t.Parse({"--config", missing}).find(missing), std::string::npos);
}

TEST_F(YamlConfigTest, ConfigToStrEmitsYamlThatReadsBackToTheSameValues) {
  const std::string path = WriteFile("c.yaml", "name: \"true\"\npeers: [a, 'b c', '']\n");
  TestApp t;
  ASSERT_EQ(t.Parse({"--config", path, "--host-pool-bytes", "3GiB", "--lease", "1.5s", "--log-file",
                     "/var/log/x: y.log", "bench", "--iterations", "4"}),
            "");
  const std::string dumped = t.app().config_to_str(/*default_also=*/true,
                                                   /*write_description=*/true);
  // It is YAML, with descriptions as comments and the subcommand as a nested mapping.
  const YAML::Node node = YAML::Load(dumped);
  ASSERT_TRUE(node.IsMap()) << dumped;
  EXPECT_EQ(node["host-pool-bytes"].Scalar(), "3GiB") << dumped;
  EXPECT_EQ(node["bench"]["iterations"].Scalar(), "4") << dumped;
  EXPECT_NE(dumped.find("# pinned host pool size\n"), std::string::npos) << dumped;

  const std::string dump_path = WriteFile("dump.yaml", dumped);
  TestApp back;
  ASSERT_EQ(back.Parse({"--config", dump_path}), "") << dumped;
  EXPECT_EQ(back.opts().host_pool_bytes, 3072 * kMiB);
  EXPECT_EQ(back.opts().lease, microseconds(1500000));
  EXPECT_EQ(back.opts().name, "true");
  EXPECT_EQ(back.opts().peers, (std::vector<std::string>{"a", "b c", ""}));
  EXPECT_EQ(back.opts().log.file, "/var/log/x: y.log");
  EXPECT_EQ(back.opts().bench_iterations, 4);
  EXPECT_EQ(back.opts().page_bytes, 2 * kMiB);  // its default, written and read back
  EXPECT_EQ(back.opts().port, 7000);
}

}  // namespace
}  // namespace kvfabric

namespace kvfabric {
namespace {

class YamlConfigBoundsTest : public YamlConfigTest {};

TEST_F(YamlConfigBoundsTest, AliasesThatMultiplyOrLoopAreRefusedNotWalked) {
  // 2^40 leaves in a few lines: refused at the bound, quickly.
  std::string bomb = "l0: &l0 {a: 1, b: 1}\n";
  for (int i = 1; i <= 40; ++i) {
    bomb += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " {a: *l" +
            std::to_string(i - 1) + ", b: *l" + std::to_string(i - 1) + "}\n";
  }
  TestApp t;
  std::string error = t.Parse({"--config", WriteFile("bomb.yaml", bomb)});
  EXPECT_NE(error.find("keys and list elements"), std::string::npos) << error;

  // Nesting past the depth bound.
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += std::string(static_cast<std::size_t>(i) * 2, ' ') + "k:\n";
  deep += std::string(80, ' ') + "k: 1\n";
  TestApp t2;
  error = t2.Parse({"--config", WriteFile("deep.yaml", deep)});
  EXPECT_NE(error.find("nested deeper than 32 levels"), std::string::npos) << error;
}

}  // namespace
}  // namespace kvfabric

namespace kvfabric {
namespace {

// A fuzzer found this: yaml-cpp's parser answers it with endless empty
// documents (LoadAll ran out of memory); the loader stops counting at two.
TEST_F(YamlConfigBoundsTest, InputThatMakesTheParserRepeatEmptyDocumentsIsRefusedInBoundedTime) {
  const std::string input(
      "f-ig\n#\n!1111111111111,11\xff\xff\xff\xff\xff\xff\xff.11111:'*b}\xbb\n");
  TestApp t;
  const std::string error = t.Parse({"--config", WriteFile("endless.yaml", input)});
  EXPECT_FALSE(error.empty());
}

}  // namespace
}  // namespace kvfabric
