#include "core/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace kvfabric {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "logging_test.XXXXXX");
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "kvf.log").string();
  }
  void TearDown() override {
    // Leave a default logger that does not point into the removed directory.
    EXPECT_TRUE(InitLogging(LogOptions{}).ok());
    std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> ReadLines() {
    spdlog::default_logger()->flush();
    std::ifstream in(path_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::filesystem::path dir_;
  std::string path_;
};

// Seconds since the epoch of "YYYY-MM-DDTHH:MM:SS", read as UTC.
std::time_t ParseUtc(const std::string& ts) {
  std::tm tm = {};
  std::istringstream in(ts);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  return ::timegm(&tm);
}

// Sets the process time zone for one scope.
class ScopedTimeZone {
 public:
  explicit ScopedTimeZone(const char* tz) {
    ::setenv("TZ", tz, 1);
    ::tzset();
  }
  ~ScopedTimeZone() {
    ::unsetenv("TZ");
    ::tzset();
  }
};

TEST_F(LoggingTest, TextLineHasUtcTimestampLevelThreadAndMessage) {
  // A local zone far from UTC: a timestamp written in local time would be off by 5.5 hours.
  ScopedTimeZone zone("Asia/Kolkata");
  LogOptions options;
  options.file = path_;
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::info("host pool: {} pages of {} = {}", 4096, "2 MiB", "8 GiB");
  const std::vector<std::string> lines = ReadLines();
  ASSERT_EQ(lines.size(), 1u);
  const std::regex re(R"(^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{6}Z info tid=(\d+) )"
                      R"(host pool: 4096 pages of 2 MiB = 8 GiB$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, re)) << lines[0];
  EXPECT_LE(std::labs(static_cast<long>(ParseUtc(m[1].str()) - std::time(nullptr))), 120L)
      << lines[0];
  EXPECT_EQ(std::stol(m[2].str()), static_cast<long>(::syscall(SYS_gettid)));
}

TEST_F(LoggingTest, MultiLineMessageStaysOneLine) {
  LogOptions options;
  options.file = path_;
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::warn("first\nsecond\r\x01 done");
  const std::vector<std::string> lines = ReadLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(" warning tid="), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("first\\nsecond\\r\\x01 done"), std::string::npos) << lines[0];
}

TEST_F(LoggingTest, JsonLineIsOneEscapedObject) {
  LogOptions options;
  options.file = path_;
  options.json = true;
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::error("bad \"key\" in C:\\cfg\nnext\tcol");
  const std::vector<std::string> lines = ReadLines();
  ASSERT_EQ(lines.size(), 1u);
  const std::regex re(R"re(^\{"ts":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z",)re"
                      R"re("level":"error","tid":\d+,"msg":"(.*)"\}$)re");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, re)) << lines[0];
  EXPECT_EQ(m[1].str(), R"(bad \"key\" in C:\\cfg\nnext\tcol)");
}

TEST_F(LoggingTest, LevelFiltersLessSevereEvents) {
  LogOptions options;
  options.file = path_;
  options.level = "warn";
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::info("dropped");
  spdlog::debug("dropped");
  spdlog::warn("kept warn");
  spdlog::error("kept error");
  const std::vector<std::string> lines = ReadLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("kept warn"), std::string::npos);
  EXPECT_NE(lines[1].find("kept error"), std::string::npos);
}

TEST_F(LoggingTest, OffWritesNothingAndTraceWritesEverything) {
  LogOptions options;
  options.file = path_;
  options.level = "off";
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::critical("not even this");
  EXPECT_TRUE(ReadLines().empty());
  options.level = "trace";
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::trace("tiny detail");
  ASSERT_EQ(ReadLines().size(), 1u);
}

TEST_F(LoggingTest, AppendsToAnExistingFile) {
  {
    std::ofstream out(path_);
    out << "earlier line\n";
  }
  LogOptions options;
  options.file = path_;
  ASSERT_TRUE(InitLogging(options).ok());
  spdlog::info("later");
  const std::vector<std::string> lines = ReadLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "earlier line");
}

TEST_F(LoggingTest, UnknownLevelIsInvalidArgumentListingValidOnes) {
  LogOptions options;
  options.file = path_;
  options.level = "warning";
  const Status s = InitLogging(options);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("\"warning\""), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("trace, debug, info, warn, error, off"), std::string_view::npos) << s;
  EXPECT_TRUE(CheckLogLevel("INFO").IsInvalidArgument());
  EXPECT_TRUE(CheckLogLevel("info").ok());
}

TEST_F(LoggingTest, UnwritableFileIsAnErrorAndDirectoriesAreNotCreated) {
  LogOptions options;
  options.file = (dir_ / "no-such-dir" / "kvf.log").string();
  const Status s = InitLogging(options);
  EXPECT_TRUE(s.IsNotFound()) << s;
  EXPECT_NE(s.message().find(options.file), std::string_view::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "no-such-dir"));
}

}  // namespace
}  // namespace kvfabric
