#include "core/config/logging_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvfabric {
namespace {

// Parses `args` into `*options` through a fresh App; returns "" or CLI11's error message.
std::string Parse(std::vector<std::string> args, LogOptions* options) {
  CLI::App app("logging_flags_test");
  AddLoggingFlags(app, options);
  std::vector<const char*> argv = {"logging_flags_test"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(LoggingFlagsTest, DefaultsAreTheFieldsAsGiven) {
  LogOptions options;
  options.level = "debug";
  ASSERT_EQ(Parse({}, &options), "");
  EXPECT_EQ(options.level, "debug");
  EXPECT_FALSE(options.json);
  EXPECT_EQ(options.file, "");
}

TEST(LoggingFlagsTest, FlagsSetEveryField) {
  LogOptions options;
  ASSERT_EQ(Parse({"--log-level", "error", "--log-file", "/tmp/x.log", "--log-json"}, &options),
            "");
  EXPECT_EQ(options.level, "error");
  EXPECT_EQ(options.file, "/tmp/x.log");
  EXPECT_TRUE(options.json);
}

TEST(LoggingFlagsTest, UnknownLevelIsRejectedNamingFlagAndValidLevels) {
  LogOptions options;
  const std::string error = Parse({"--log-level", "loud"}, &options);
  EXPECT_NE(error.find("--log-level"), std::string::npos) << error;
  EXPECT_NE(error.find("\"loud\""), std::string::npos) << error;
  EXPECT_NE(error.find("trace, debug, info, warn, error, off"), std::string::npos) << error;
  EXPECT_EQ(options.level, "info");
}

}  // namespace
}  // namespace kvfabric
