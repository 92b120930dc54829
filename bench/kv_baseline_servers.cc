// Baseline servers: finding redis-server or memcached and running one as a child process.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/kv_baselines.h"
#include "core/errno_status.h"

extern char** environ;

namespace kvfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kStopGrace = 5s;

// --- Processes and ports ---

StatusOr<std::uint16_t> PickFreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return StatusFromErrno(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  Status s;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    s = StatusFromErrno(errno, "bind 127.0.0.1:0");
  } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    s = StatusFromErrno(errno, "getsockname");
  }
  ::close(fd);
  if (!s.ok()) return s;
  return static_cast<std::uint16_t>(ntohs(addr.sin_port));
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

}  // namespace

// ---------------------------------------------------------------------------
// Names and binaries

std::string_view BaselineKindName(BaselineKind kind) {
  return kind == BaselineKind::kRedis ? "redis" : "memcached";
}

std::string_view BaselineBinaryName(BaselineKind kind) {
  return kind == BaselineKind::kRedis ? "redis-server" : "memcached";
}

StatusOr<std::string> FindBaselineBinary(BaselineKind kind) {
  const std::string_view name = BaselineBinaryName(kind);
  const char* env_path = std::getenv("PATH");
  const std::string path =
      (env_path != nullptr && *env_path != '\0') ? env_path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + std::string(name);
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return Status::NotFound(std::string(name) + " not found on PATH (" + path +
                          "): run tools/setup.sh");
}

// ---------------------------------------------------------------------------
// BaselineServer

StatusOr<std::unique_ptr<BaselineServer>> BaselineServer::Start(
    BaselineKind kind, const BaselineServerOptions& options) {
  if (kind == BaselineKind::kMemcached && options.memcached_memory_mib < 16) {
    return Status::InvalidArgument(
        "memcached_memory_mib = " + std::to_string(options.memcached_memory_mib) +
        ": memcached needs at least 16 MiB for its 8 MiB item limit (-I 8m)");
  }
  if (kind == BaselineKind::kMemcached && options.memcached_threads < 1) {
    return Status::InvalidArgument(
        "memcached_threads = " + std::to_string(options.memcached_threads) +
        ": must be at least 1");
  }
  if (options.start_attempts < 1) {
    return Status::InvalidArgument("start_attempts = " + std::to_string(options.start_attempts) +
                                   ": must be at least 1");
  }
  KVF_ASSIGN_OR_RETURN(const std::string binary, FindBaselineBinary(kind));

  std::string tmpl =
      options.temp_parent + "/kvf_baseline_" + std::string(BaselineKindName(kind)) + "_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return StatusFromErrno(errno, "mkdtemp " + tmpl + " (set temp_parent)");
  }
  auto server = std::unique_ptr<BaselineServer>(new BaselineServer(kind, tmpl));

  std::string failures;
  for (int attempt = 1; attempt <= options.start_attempts; ++attempt) {
    KVF_ASSIGN_OR_RETURN(const std::uint16_t port, PickFreeLoopbackPort());
    const Status s = server->StartOnce(binary, port, options);
    if (s.ok()) return server;
    // Only an early exit (a port taken meanwhile) is worth another port.
    if (!s.IsUnavailable()) return s.WithContext(binary + " on port " + std::to_string(port));
    failures += "; attempt " + std::to_string(attempt) + " on port " + std::to_string(port) + ": " +
                std::string(s.message());
  }
  return Status::Unavailable(binary + " did not start" + failures);
}

Status BaselineServer::StartOnce(const std::string& binary, std::uint16_t port,
                                 const BaselineServerOptions& options) {
  const std::string port_text = std::to_string(port);
  std::vector<std::string> args = {binary};
  if (kind_ == BaselineKind::kRedis) {
    args.insert(args.end(), {"--port", port_text, "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", dir_, "--protected-mode", "no"});
  } else {
    args.insert(args.end(), {"-l", "127.0.0.1", "-p", port_text, "-U", "0", "-I", "8m", "-m",
                             std::to_string(options.memcached_memory_mib), "-t",
                             std::to_string(options.memcached_threads)});
    // memcached refuses to run as root unless told which user to be.
    if (::geteuid() == 0) args.insert(args.end(), {"-u", "root"});
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const std::string log_path = dir_ + "/server.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // This process's sockets (the benchmark's own connections) stay here.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  // A caller that blocks or ignores signals must not pass that on: a server
  // with SIGTERM blocked would only ever stop by SIGKILL.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int rc = ::posix_spawn(&pid_, binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    pid_ = -1;
    return StatusFromErrno(rc, "posix_spawn " + binary);
  }

  const Clock::time_point deadline = Clock::now() + options.start_timeout;
  Status last = Status::Unavailable("never tried");
  while (true) {
    int wstatus = 0;
    const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      // The directory goes with the server object: quote the log, not its path.
      return Status::Unavailable(DescribeWaitStatus(wstatus) +
                                 " before accepting connections; its log ends: " + LogTail());
    }
    auto client = BaselineClient::Connect(kind_, "127.0.0.1", port, 1s);
    if (client.ok()) last = (*client)->Ping();
    if (client.ok() && last.ok()) {
      port_ = port;
      return Status::OK();
    }
    if (!client.ok()) last = client.status();
    if (Clock::now() >= deadline) {
      Stop();
      return Status::DeadlineExceeded("no answer on 127.0.0.1:" + port_text + " within " +
                                      std::to_string(options.start_timeout.count()) +
                                      " ms (raise start_timeout; last: " + last.ToString() +
                                      "); its log ends: " + LogTail());
    }
    std::this_thread::sleep_for(10ms);
  }
}

std::string BaselineServer::LogTail() const {
  const std::string path = dir_ + "/server.log";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "(no log)";
  constexpr off_t kTail = 600;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const off_t from = size > kTail ? size - kTail : 0;
  std::string text(static_cast<std::size_t>(size - from), '\0');
  const ssize_t n = size > 0 ? ::pread(fd, text.data(), text.size(), from) : 0;
  ::close(fd);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = '|';
  }
  return text.empty() ? "(empty log)" : text;
}

void BaselineServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const Clock::time_point deadline = Clock::now() + kStopGrace;
  while (Clock::now() < deadline) {
    const pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

BaselineServer::~BaselineServer() {
  Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);  // best effort: a leftover temp dir harms nothing
}
}  // namespace kvfabric::bench
