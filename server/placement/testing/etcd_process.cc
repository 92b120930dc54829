#include "server/placement/testing/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/errno_status.h"
#include "server/placement/etcd_client.h"

namespace kvfabric::placement::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A port the kernel considers free on 127.0.0.1 right now. etcd binds it a
// moment later; a collision in between makes Start() retry.
StatusOr<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return StatusFromErrno(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return StatusFromErrno(err, "bind 127.0.0.1:0");
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

std::string EtcdProcess::SkipReason() {
  if (::access(kBinary, X_OK) == 0) return "";
  return std::string(kBinary) + " not found or not executable (apt-get install etcd-server; " +
         "tools/setup.sh installs it)";
}

StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(std::chrono::milliseconds timeout,
                                                          std::optional<EtcdTls> tls) {
  const Clock::time_point deadline = Clock::now() + timeout;
  auto etcd = std::unique_ptr<EtcdProcess>(new EtcdProcess());
  etcd->tls_ = std::move(tls);
  std::string tmpl = ::testing::TempDir() + "kvf_etcd_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return StatusFromErrno(errno, "mkdtemp " + tmpl);
  etcd->dir_ = tmpl;
  etcd->log_path_ = tmpl + "/etcd.log";
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    etcd->Kill();
    etcd->data_dir_ = tmpl + "/data" + std::to_string(attempt);
    last = etcd->PickPorts();
    if (last.ok()) last = etcd->Spawn();
    if (last.ok()) last = etcd->WaitReady(deadline);
    if (last.ok()) return etcd;
    if (Clock::now() >= deadline) break;
  }
  return Status::Unavailable(last.ToString() + "; etcd log ends:\n" + etcd->LogTail());
}

EtcdProcess::~EtcdProcess() {
  Kill();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // best effort: a temp dir
  }
}

void EtcdProcess::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

std::string EtcdProcess::LogTail(std::size_t max_bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string log = ss.str();
  return log.size() <= max_bytes ? log : log.substr(log.size() - max_bytes);
}

Status EtcdProcess::Restart(std::chrono::milliseconds timeout) {
  Kill();
  KVF_RETURN_IF_ERROR(Spawn());
  const Status s = WaitReady(Clock::now() + timeout);
  if (!s.ok()) return Status::Unavailable(s.ToString() + "; etcd log ends:\n" + LogTail());
  return Status::OK();
}

Status EtcdProcess::PickPorts() {
  KVF_ASSIGN_OR_RETURN(const int client_port, FreeLoopbackPort());
  int peer_port = client_port;
  while (peer_port == client_port) {  // both were free, but the kernel may offer one twice
    KVF_ASSIGN_OR_RETURN(peer_port, FreeLoopbackPort());
  }
  endpoint_ = std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(client_port);
  peer_url_ = "http://127.0.0.1:" + std::to_string(peer_port);
  return Status::OK();
}

Status EtcdProcess::Spawn() {
  const std::string& peer = peer_url_;
  std::vector<std::string> args = {kBinary,     "--name",
                                   "t",         "--data-dir",
                                   data_dir_,   "--listen-client-urls",
                                   endpoint_,   "--advertise-client-urls",
                                   endpoint_,   "--listen-peer-urls",
                                   peer,        "--initial-advertise-peer-urls",
                                   peer,        "--initial-cluster",
                                   "t=" + peer, "--heartbeat-interval",
                                   "20",        "--election-timeout",
                                   "200"};
  if (tls_) {
    for (const std::string& a :
         {std::string("--cert-file"), tls_->cert_file, std::string("--key-file"), tls_->key_file}) {
      args.push_back(a);
    }
    if (!tls_->client_ca.empty()) {
      for (const std::string& a :
           {std::string("--trusted-ca-file"), tls_->client_ca, std::string("--client-cert-auth")}) {
        args.push_back(a);
      }
    }
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return StatusFromErrno(errno, "open " + log_path_);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until execv.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::close_range(3, ~0U, 0);  // sockets of the test stay in the test
    ::execv(kBinary, argv.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  if (pid < 0) return StatusFromErrno(fork_errno, "fork");
  pid_ = pid;
  return Status::OK();
}

Status EtcdProcess::WaitReady(Clock::time_point deadline) {
  EtcdClientOptions options;
  options.endpoint = endpoint_;
  options.request_timeout = 500ms;
  if (tls_) options.tls = tls_->client;
  Status last = Status::Unavailable("not tried");
  while (Clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("etcd on " + endpoint_ + " exited (wait status " +
                                 std::to_string(wstatus) + ") before answering");
    }
    // A fresh client (and connection) per probe: a connection etcd accepted
    // before it was ready to serve stays silent for ~10 s.
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(options));
    last = client->Range("kvf-etcd-process-probe").status();
    if (last.ok()) return Status::OK();
    std::this_thread::sleep_for(50ms);
  }
  return Status::Unavailable("etcd on " + endpoint_ +
                             " did not answer in time: " + last.ToString());
}

}  // namespace kvfabric::placement::testing
