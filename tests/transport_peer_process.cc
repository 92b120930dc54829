#include "tests/transport_peer_process.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/errno_status.h"
#include "tests/transport_peer_protocol.h"

extern char** environ;

namespace kvfabric::transport_test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string PeerPath() {
  if (const char* env = std::getenv("KVF_TRANSPORT_PEER"); env != nullptr && *env != '\0') {
    return env;
  }
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "transport_peer";
  const std::string self(buf, static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "transport_peer";
}

StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start(const std::string& tls,
                                                          Deadline deadline) {
  auto peer = std::unique_ptr<PeerProcess>(new PeerProcess());
  KVF_RETURN_IF_ERROR(peer->Spawn(tls));
  KVF_RETURN_IF_ERROR(peer->ReadAddress(deadline));
  return peer;
}

PeerProcess::~PeerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);  // SIGKILL cannot be caught or ignored: bounded
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

void PeerProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> PeerProcess::WaitExit(Deadline deadline) {
  while (pid_ > 0) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    if (r < 0 || Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

Status PeerProcess::Spawn(const std::string& tls) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return StatusFromErrno(errno, "pipe2");
  stdout_fd_ = fds[0];
  const std::string path = PeerPath();
  std::vector<std::string> args = {
      path, "--tls=" + tls, "--parent-pid=" + std::to_string(::getpid()), "--idle-exit-s=60"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  // The sockets and event fds of this process's transports stay here: a
  // child holding a copy would keep their connections open.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  const int rc = ::posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    pid_ = -1;
    return StatusFromErrno(rc, "posix_spawn " + path + " (set KVF_TRANSPORT_PEER)");
  }
  return Status::OK();
}

Status PeerProcess::ReadAddress(Deadline deadline) {
  std::string buffered;
  while (true) {
    for (std::size_t eol; (eol = buffered.find('\n')) != std::string::npos;) {
      const std::string line = buffered.substr(0, eol);
      buffered.erase(0, eol + 1);
      if (line.rfind(kListeningPrefix, 0) == 0) {
        address_ = line.substr(std::strlen(kListeningPrefix));
        return Status::OK();
      }
      std::fprintf(stderr, "transport_peer: %s\n", line.c_str());
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return Status::DeadlineExceeded("peer printed no address: " + buffered);
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return StatusFromErrno(errno, "poll");
    if (ready <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno != EINTR) return StatusFromErrno(errno, "read");
    if (n == 0) return Status::Unavailable("peer exited before printing its address");
    if (n > 0) buffered.append(buf, static_cast<std::size_t>(n));
  }
}

}  // namespace kvfabric::transport_test
