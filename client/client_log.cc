#include "client/client_log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace kvfabric::client {
namespace {

// core/logging.cc's text layout, with the logger's name before the message so
// that the library's lines stand out in an engine's stderr.
constexpr const char* kStderrPattern = "%Y-%m-%dT%H:%M:%S.%fZ %l tid=%t %n: %v";

// The logger's only sink: stderr, or the engine's LogSink. base_sink holds
// mutex_ around sink_it_, so lines reach the target one at a time, and
// Replace taking the same mutex is what guarantees that the previous target
// is not running once Replace returns.
class SwitchableSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  SwitchableSink() {
    set_formatter_(std::make_unique<spdlog::pattern_formatter>(kStderrPattern,
                                                               spdlog::pattern_time_type::utc));
  }

  void Replace(LogSink sink) {
    LogSink previous;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      previous = std::exchange(target_, std::move(sink));
    }
    // `previous` (and whatever it captured) is destroyed outside the lock.
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (target_) {
      // A copy so that the sink sees a NUL-terminated message (the C API
      // hands it on as a C string); the buffer is reused line after line.
      line_.assign(msg.payload.data(), msg.payload.size());
      target_(msg.level, line_);
      return;
    }
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    std::fwrite(formatted.data(), 1, formatted.size(), stderr);
    std::fflush(stderr);
  }

  void flush_() override {
    if (!target_) std::fflush(stderr);
  }

 private:
  LogSink target_;    // guarded by base_sink::mutex_; empty: stderr
  std::string line_;  // guarded by base_sink::mutex_
};

struct LogState {
  LogState() : sink(std::make_shared<SwitchableSink>()), logger("kvfabric", sink) {
    logger.set_level(spdlog::level::warn);
  }
  std::shared_ptr<SwitchableSink> sink;
  spdlog::logger logger;
};

// Never destroyed: library threads (and static destructors) may log at exit.
LogState& State() {
  static LogState* const state = new LogState();
  return *state;
}

}  // namespace

spdlog::logger& Log() { return State().logger; }

void SetLogLevel(spdlog::level::level_enum level) { State().logger.set_level(level); }

void SetLogSink(LogSink sink) { State().sink->Replace(std::move(sink)); }

}  // namespace kvfabric::client
