#include "tests/server_process.h"

#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace kvfabric::testing {

std::string RunInChild(bool as_nobody, const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  std::fflush(nullptr);  // the child must not print the parent's buffered output again
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (as_nobody &&
        (setgroups(0, nullptr) != 0 || setgid(kNobodyUid) != 0 || setuid(kNobodyUid) != 0)) {
      _exit(3);
    }
    const std::string text = fn();
    (void)!write(fds[1], text.data(), text.size());
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, r);
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return "child failed: wait status " + std::to_string(wstatus) + "; it said: " + text;
  }
  return text;
}

std::string ServerBinary(const char* env_var, const std::string& name) {
  if (const char* p = std::getenv(env_var); p != nullptr && *p != '\0') return p;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : ".";
  return exe.substr(0, exe.rfind('/')) + "/" + name;
}

StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(const std::string& binary,
                                                              const std::string& name,
                                                              const std::string& dir,
                                                              std::vector<std::string> args,
                                                              std::chrono::milliseconds timeout) {
  return StartWrapped({}, binary, name, dir, std::move(args), timeout);
}

StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::StartWrapped(
    const std::vector<std::string>& wrapper, const std::string& binary, const std::string& name,
    const std::string& dir, std::vector<std::string> args, std::chrono::milliseconds timeout) {
  std::unique_ptr<ServerProcess> p(new ServerProcess);
  const std::string ready = dir + "/" + name + ".ready";
  std::filesystem::remove(ready);
  std::vector<std::string> argv = wrapper;
  argv.push_back(binary);
  argv.push_back("--ready-file=" + ready);
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  if (int err = posix_spawn(&p->pid_, cargv[0], nullptr, nullptr, cargv.data(), environ);
      err != 0) {
    p->pid_ = -1;
    return Status::Unavailable("cannot spawn " + binary + ": " + std::strerror(err));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
      p->pid_ = -1;
      return Status::Unavailable(name + " (" + binary + ") exited during start-up, status " +
                                 std::to_string(status));
    }
    std::ifstream in(ready);
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) p->info_[line.substr(0, eq)] = line.substr(eq + 1);
    }
    if (p->info_.count("pid") != 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::DeadlineExceeded(name + " did not become ready in time");
}

ServerProcess::~ServerProcess() { Kill(SIGKILL); }

std::string ServerProcess::Get(const std::string& key) const {
  auto it = info_.find(key);
  return it == info_.end() ? std::string() : it->second;
}

void ServerProcess::Kill(int sig) {
  if (pid_ <= 0) return;
  kill(pid_, sig);
  if (sig == SIGKILL) {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

int ServerProcess::WaitExit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

}  // namespace kvfabric::testing
