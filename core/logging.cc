#include "core/logging.h"

#include <fcntl.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "core/errno_status.h"

namespace kvfabric {

namespace {

struct LevelName {
  std::string_view name;
  spdlog::level::level_enum level;
};

constexpr std::array<LevelName, 6> kLevels = {{
    {"trace", spdlog::level::trace},
    {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},
    {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},
    {"off", spdlog::level::off},
}};

constexpr std::string_view kValidLevels = "trace, debug, info, warn, error, off";

// The pattern flag that writes the event's message, escaped so that it stays on one line (and,
// for JSON, inside a JSON string).
constexpr char kMessageFlag = '*';

class OneLineMessage final : public spdlog::custom_flag_formatter {
 public:
  explicit OneLineMessage(bool json) : json_(json) {}

  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm_time*/,
              spdlog::memory_buf_t& dest) override {
    for (const char c : msg.payload) Append(c, dest);
  }

  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<OneLineMessage>(json_);
  }

 private:
  static void Put(std::string_view s, spdlog::memory_buf_t& dest) {
    dest.append(s.data(), s.data() + s.size());
  }

  void Append(char c, spdlog::memory_buf_t& dest) const {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        Put("\\n", dest);
        return;
      case '\r':
        Put("\\r", dest);
        return;
      case '\t':
        json_ ? Put("\\t", dest) : dest.push_back(c);
        return;
      case '"':
        json_ ? Put("\\\"", dest) : dest.push_back(c);
        return;
      case '\\':
        json_ ? Put("\\\\", dest) : dest.push_back(c);
        return;
      default:
        break;
    }
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), json_ ? "\\u%04x" : "\\x%02x", u);
      Put(buf, dest);
      return;
    }
    // Bytes >= 0x80 pass through: UTF-8 stays readable. (Invalid UTF-8 from a caller makes an
    // invalid JSON line; messages are written by this project's code, which logs UTF-8.)
    dest.push_back(c);
  }

  bool json_;
};

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%fZ %l tid=%t %*";
constexpr const char* kJsonPattern =
    R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","tid":%t,"msg":"%*"})";

}  // namespace

std::string_view ValidLogLevels() { return kValidLevels; }

Status CheckLogLevel(std::string_view level) {
  for (const LevelName& l : kLevels) {
    if (l.name == level) return Status::OK();
  }
  return Status::InvalidArgument("unknown log level \"" + std::string(level) +
                                 "\" (valid: " + std::string(kValidLevels) + ")");
}

Status InitLogging(const LogOptions& options) {
  KVF_RETURN_IF_ERROR(CheckLogLevel(options.level));
  spdlog::level::level_enum level = spdlog::level::info;
  for (const LevelName& l : kLevels) {
    if (l.name == options.level) level = l.level;
  }

  spdlog::sink_ptr sink;
  if (options.file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else {
    // Open it once ourselves for a precise error: spdlog reports failure as an exception with a
    // text message, and would create missing parent directories, which we do not want (a typo
    // in a path must not scatter directories; the unit file or manifest creates the real one).
    const int fd = ::open(options.file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return StatusFromErrno(errno, "opening log file " + options.file);
    ::close(fd);
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file, /*truncate=*/false);
    } catch (const spdlog::spdlog_ex& e) {
      return Status::Unknown(std::string("opening log file ") + options.file + ": " + e.what());
    }
  }

  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<OneLineMessage>(kMessageFlag, options.json);
  formatter->set_pattern(options.json ? kJsonPattern : kTextPattern);
  sink->set_formatter(std::move(formatter));

  auto logger = std::make_shared<spdlog::logger>("", std::move(sink));
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);  // every event: see the file comment
  spdlog::set_default_logger(std::move(logger));
  return Status::OK();
}

}  // namespace kvfabric
