// The client library's own logger. libkvfabric runs inside an engine's
// process, so it does not log through spdlog's default logger (the engine's,
// or nobody's) and never configures it: every client/ file logs through
// Log(), a logger named "kvfabric" that is not in spdlog's registry (so
// spdlog::set_level, spdlog::drop_all and a logger of the same name in the
// engine leave it alone).
//
// Defaults: level warn (refusals and failures an operator acts on; the
// start-up arithmetic is info), written to stderr as
//   2026-12-01T12:00:00.123456Z warning tid=4711 kvfabric: device arena: ...
// SetLogSink sends the lines to the engine instead (the C API's
// kvf_set_log_sink), SetLogLevel changes the level (kvf_set_log_level).
//
// Threads: Log() and the setters may be called from any thread, concurrently
// with logging. A sink is called with one line at a time (calls never
// overlap), on the thread that logged, and never again once the SetLogSink
// that replaced it has returned. It must not call SetLogSink, nor anything in
// the library that may log (that deadlocks).
#ifndef KVFABRIC_CLIENT_CLIENT_LOG_H_
#define KVFABRIC_CLIENT_CLIENT_LOG_H_

#include <spdlog/logger.h>

#include <functional>
#include <string_view>

namespace kvfabric::client {

// The library's logger: Log().warn("device arena: {}", message). It lives for
// the whole process (it is never destroyed, so logging from static
// destructors is safe).
spdlog::logger& Log();

// Least severe level written (spdlog::level::off: nothing). Default warn.
void SetLogLevel(spdlog::level::level_enum level);

// Receives one event: its level and its message, without a trailing newline
// or the timestamp; message.data() is NUL-terminated, valid during the call.
using LogSink = std::function<void(spdlog::level::level_enum level, std::string_view message)>;

// Sends every line written from now on to `sink`; an empty sink restores
// stderr. Returns once no call of the previous sink is running.
void SetLogSink(LogSink sink);

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_CLIENT_LOG_H_
