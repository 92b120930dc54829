// Process-wide logging set-up for kvfabric binaries (spdlog).
//
// A binary fills a LogOptions from its flags (core/config/logging_flags.h) or YAML, calls
// InitLogging once from main before it starts threads, and then logs with spdlog's free
// functions (spdlog::info, spdlog::warn, ...), which go to the default logger configured here.
// Library code logs the same way and never configures logging. The exception is libkvfabric
// (client/), which runs inside an engine's process: it logs through its own logger,
// client/client_log.h, whose level and sink are the engine's to set (kvf_set_log_level).
//
// Every event is one line: a message containing newlines is escaped ("\n" as the two
// characters backslash, n) so that line-oriented collectors never split an event.
//   text: 2024-05-01T12:00:00.123456Z info tid=4711 host pool: 4096 pages of 2 MiB = 8 GiB
//   json: {"ts":"2024-05-01T12:00:00.123456Z","level":"info","tid":4711,"msg":"host pool: ..."}
// Timestamps are UTC with microseconds; the level names are spdlog's (trace, debug, info,
// warning, error, critical); tid is the kernel thread id.
//
// Events are flushed as they are written (stderr is unbuffered; a file is flushed after every
// event), so the last lines before a crash are on disk. That is affordable because logs are for
// operators, never in a per-block path.
//
// Thread safety: InitLogging must not run concurrently with itself; logging from any thread is
// safe before, during (events go to the old or the new logger) and after it.
#ifndef KVFABRIC_CORE_LOGGING_H_
#define KVFABRIC_CORE_LOGGING_H_

#include <string>
#include <string_view>

#include "core/status.h"

namespace kvfabric {

struct LogOptions {
  // Least severe level written: trace, debug, info, warn, error, or off. Default info: start-up
  // arithmetic and state changes, nothing per request.
  std::string level = "info";

  // One JSON object per line instead of text. For log collectors (Loki, Elasticsearch); text is
  // easier for people reading journalctl.
  bool json = false;

  // Append to this file instead of writing to stderr; created if missing. Default empty:
  // stderr, which is what systemd's journal and Kubernetes collect.
  std::string file;
};

// The accepted values of LogOptions::level, for help texts: "trace, debug, info, warn, error,
// off".
std::string_view ValidLogLevels();

// OK if `level` is one of ValidLogLevels() (exactly, lower case); else InvalidArgument quoting
// `level` and listing the valid ones.
Status CheckLogLevel(std::string_view level);

// Replaces spdlog's default logger with one configured by `options`. Returns InvalidArgument
// for an unknown level (the previous logger stays), or the error opening `options.file`
// (typically PermissionDenied / NotFound for its directory).
// Call once from main; a later call replaces the logger again (tests do this).
Status InitLogging(const LogOptions& options);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_LOGGING_H_
