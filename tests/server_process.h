// ServerProcess: a kvfabric server binary (kvfabric-cached, kvfabric-placement)
// started by a cross-process test.
//
// Start() spawns the binary with posix_spawn and the given flags plus
// --ready-file=<dir>/<name>.ready, and waits (bounded) until the server wrote
// that file: "key=value" lines (grpc=HOST:PORT, transport=..., metrics=URL,
// pid=N). A server that exits first fails the start with its exit status.
//
// Binaries are found through an environment variable the build sets
// (KVF_CACHED, KVF_PLACEMENT), else beside the test binary. Tests may read the
// environment; library code may not (STYLE.md).
//
// Ownership: a ServerProcess owns its child; destroying it SIGKILLs and reaps
// it, so no test leaves an orphan, whichever way it ends.
//
// Thread safety: one thread (the test's) uses a ServerProcess.
#ifndef KVFABRIC_TESTS_SERVER_PROCESS_H_
#define KVFABRIC_TESTS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/statusor.h"

namespace kvfabric::testing {

// uid and gid of "nobody" (Debian), the other user cross-user tests run as.
inline constexpr std::uint32_t kNobodyUid = 65534;

// Runs `fn` in a forked child, as uid/gid nobody when `as_nobody` (which
// needs root), and returns the text `fn` returned; "child failed: ..." when
// the child could not switch user or did not exit 0. Call it before this
// process starts gRPC or UCX threads: the child initialises every library
// itself.
std::string RunInChild(bool as_nobody, const std::function<std::string()>& fn);

// $env_var if set and non-empty, else `name` in the test binary's directory.
std::string ServerBinary(const char* env_var, const std::string& name);

class ServerProcess {
 public:
  // Starts `binary` with `args` and --ready-file in `dir` (named after
  // `name`), waiting up to `timeout` for the ready file.
  static StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& binary, const std::string& name, const std::string& dir,
      std::vector<std::string> args,
      std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // As Start, run through `wrapper` (e.g. {"/usr/sbin/ip", "netns", "exec",
  // NS}: in a network namespace), which must exec the binary in place so that
  // the pid signalled is the server's.
  static StatusOr<std::unique_ptr<ServerProcess>> StartWrapped(
      const std::vector<std::string>& wrapper, const std::string& binary, const std::string& name,
      const std::string& dir, std::vector<std::string> args,
      std::chrono::milliseconds timeout = std::chrono::seconds(120));

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();

  // A value of the ready file ("" if absent).
  std::string Get(const std::string& key) const;
  std::string grpc() const { return Get("grpc"); }
  std::string transport() const { return Get("transport"); }
  std::string metrics() const { return Get("metrics"); }

  // Sends `sig`; SIGKILL also reaps. No-op once reaped.
  void Kill(int sig);
  // The exit status (128 + signal if killed), waiting up to `timeout`; -1 if
  // it is still running.
  int WaitExit(std::chrono::milliseconds timeout);

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  std::map<std::string, std::string> info_;
};

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_SERVER_PROCESS_H_
