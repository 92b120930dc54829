// PeerProcess: a transport_peer child process (tests/transport_peer_main.cc)
// started by a cross-process test.
//
// What it is
//   Start() spawns the peer with posix_spawn (its stdout on a pipe, every
//   other descriptor of this process closed in the child, so the child holds
//   none of this process's sockets), passes this process's pid so the peer
//   exits when orphaned, and waits, bounded, for the peer's "listening on
//   <ip:port>" line. Other stdout lines before it (UCX logs) are echoed to
//   stderr.
//
//   The peer binary is $KVF_TRANSPORT_PEER when set (the build sets it),
//   else "transport_peer" in the directory of the running test binary.
//   Tests may read the environment; library code may not (STYLE.md).
//
// Ownership: a PeerProcess owns its child. Destroying it SIGKILLs and reaps
// the child if it was not reaped yet, so no test leaves an orphan or a
// zombie, whichever way it ends.
//
// Thread safety: one thread (the test's) uses a PeerProcess.
#ifndef KVFABRIC_TESTS_TRANSPORT_PEER_PROCESS_H_
#define KVFABRIC_TESTS_TRANSPORT_PEER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::transport_test {

// The peer binary to run; see the file comment.
std::string PeerPath();

class PeerProcess {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // Starts the peer with UCX transport list `tls` and waits until `deadline`
  // for its listen address. Unavailable if it exits first, DeadlineExceeded
  // if it prints none in time (it is killed either way), the errno Status if
  // it cannot be spawned.
  static StatusOr<std::unique_ptr<PeerProcess>> Start(const std::string& tls, Deadline deadline);

  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess();

  // "ip:port" the peer listens on.
  const std::string& address() const { return address_; }

  // Sends `sig` (SIGSTOP, SIGCONT, SIGKILL, ...) unless already reaped.
  void Signal(int sig);

  // The child's wait status if it exited by `deadline` (it is then reaped);
  // nothing if it is still running, or was reaped before.
  std::optional<int> WaitExit(Deadline deadline);

 private:
  PeerProcess() = default;
  Status Spawn(const std::string& tls);
  Status ReadAddress(Deadline deadline);

  pid_t pid_ = -1;  // > 0 until reaped
  int stdout_fd_ = -1;
  std::string address_;
};

}  // namespace kvfabric::transport_test

#endif  // KVFABRIC_TESTS_TRANSPORT_PEER_PROCESS_H_
