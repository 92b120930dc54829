#include "tests/fault/netns_cluster.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

extern char** environ;

namespace kvfabric::testing {
namespace {

constexpr const char* kIp = "/usr/sbin/ip";
constexpr const char* kTc = "/usr/sbin/tc";

// Runs argv to completion; its stdout and stderr, or an error quoting them.
StatusOr<std::string> Run(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> copy = argv;
  std::vector<char*> cargv;
  for (std::string& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  if (err == 0) {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  }
  close(fds[0]);
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
  if (err != 0) return Status::Unavailable("cannot run " + command + ": " + std::strerror(err));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal(command + " failed (status " + std::to_string(status) + "): " + out);
  }
  return out;
}

std::vector<std::string> InNs(const std::string& ns, std::vector<std::string> argv) {
  if (ns.empty()) return argv;
  std::vector<std::string> out = {kIp, "netns", "exec", ns};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Namespaces of runs whose process is gone (a crash, a SIGKILLed test).
void RemoveStale() {
  StatusOr<std::string> list = Run({kIp, "netns", "list"});
  if (!list.ok()) return;
  std::istringstream in(*list);
  std::string line;
  while (std::getline(in, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind("kvft.", 0) != 0) continue;
    const std::size_t dot = name.find('.', 5);
    if (dot == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.substr(5, dot - 5).c_str()));
    if (pid > 0 && !Alive(pid)) (void)Run({kIp, "netns", "del", name});
  }
}

bool ValidHostName(const std::string& name) {
  if (name.empty() || name.size() > 32 || name == "client" || name == "switch") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
  });
}

}  // namespace

std::string NetnsCluster::SkipReason() {
  if (access(kIp, X_OK) != 0 || access(kTc, X_OK) != 0) {
    return "iproute2 (ip, tc) not found: apt-get install iproute2";
  }
  const std::string probe = "kvft." + std::to_string(getpid()) + ".probe";
  StatusOr<std::string> added = Run({kIp, "netns", "add", probe});
  if (!added.ok()) {
    return "network namespaces are not allowed here (needs root or CAP_NET_ADMIN + "
           "CAP_SYS_ADMIN): " +
           added.status().ToString();
  }
  (void)Run({kIp, "netns", "del", probe});
  return "";
}

StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(
    const std::vector<std::string>& hosts) {
  static int runs = 0;
  const int run = runs++;
  RemoveStale();
  for (const std::string& h : hosts) {
    if (!ValidHostName(h)) {
      return Status::InvalidArgument("host name \"" + h +
                                     "\": letters, digits and '-', at most 32, not client/switch");
    }
  }
  if (hosts.size() > 200) return Status::InvalidArgument("at most 200 hosts");
  std::unique_ptr<NetnsCluster> c(new NetnsCluster);
  const pid_t pid = getpid();
  c->prefix_ = "kvft." + std::to_string(pid) + "." + std::to_string(run);
  char id[8];
  std::snprintf(id, sizeof id, "%04x", static_cast<unsigned>((pid * 7 + run) & 0xffff));

  // A /24 no interface of the root namespace uses yet.
  KVF_ASSIGN_OR_RETURN(std::string addrs, Run({kIp, "-o", "-4", "addr", "show"}));
  int octet = -1;
  for (int k = 0; k < 250 && octet < 0; ++k) {
    const int candidate = (pid + run * 17 + k) % 250 + 1;
    if (addrs.find("10.213." + std::to_string(candidate) + ".") == std::string::npos) {
      octet = candidate;
    }
  }
  if (octet < 0) return Status::ResourceExhausted("no free /24 in 10.213.0.0/16");
  const std::string subnet = "10.213." + std::to_string(octet) + ".";

  c->switch_ns_ = c->prefix_ + ".switch";
  KVF_RETURN_IF_ERROR(Run({kIp, "netns", "add", c->switch_ns_}).status());
  c->namespaces_.push_back(c->switch_ns_);
  const std::string sw = c->switch_ns_;
  KVF_RETURN_IF_ERROR(Run({kIp, "-n", sw, "link", "set", "lo", "up"}).status());
  KVF_RETURN_IF_ERROR(
      Run({kIp, "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0"}).status());
  KVF_RETURN_IF_ERROR(Run({kIp, "-n", sw, "link", "set", "br0", "up"}).status());

  std::vector<std::string> all = {"client"};
  all.insert(all.end(), hosts.begin(), hosts.end());
  for (std::size_t i = 0; i < all.size(); ++i) {
    Host h;
    h.address = subnet + std::to_string(i + 1);
    const std::string a = "kv" + std::string(id) + "a" + std::to_string(i);
    const std::string b = "kv" + std::string(id) + "b" + std::to_string(i);
    h.switch_port = "p" + std::to_string(i);
    KVF_RETURN_IF_ERROR(Run({kIp, "link", "add", a, "type", "veth", "peer", "name", b}).status());
    KVF_RETURN_IF_ERROR(Run({kIp, "link", "set", b, "netns", sw}).status());
    KVF_RETURN_IF_ERROR(
        Run({kIp, "-n", sw, "link", "set", "dev", b, "name", h.switch_port}).status());
    KVF_RETURN_IF_ERROR(
        Run({kIp, "-n", sw, "link", "set", h.switch_port, "master", "br0", "up"}).status());
    if (i == 0) {
      h.device = a;  // the client: the root namespace
      if (Status s = Run({kIp, "addr", "add", h.address + "/24", "dev", a}).status(); !s.ok()) {
        (void)Run({kIp, "link", "del", a});
        return s;
      }
      KVF_RETURN_IF_ERROR(Run({kIp, "link", "set", a, "up"}).status());
    } else {
      h.ns = c->prefix_ + "." + all[i];
      KVF_RETURN_IF_ERROR(Run({kIp, "netns", "add", h.ns}).status());
      c->namespaces_.insert(c->namespaces_.begin(), h.ns);
      KVF_RETURN_IF_ERROR(Run({kIp, "-n", h.ns, "link", "set", "lo", "up"}).status());
      KVF_RETURN_IF_ERROR(Run({kIp, "link", "set", a, "netns", h.ns}).status());
      h.device = "eth0";
      KVF_RETURN_IF_ERROR(Run({kIp, "-n", h.ns, "link", "set", "dev", a, "name", "eth0"}).status());
      KVF_RETURN_IF_ERROR(
          Run({kIp, "-n", h.ns, "addr", "add", h.address + "/24", "dev", "eth0"}).status());
      KVF_RETURN_IF_ERROR(Run({kIp, "-n", h.ns, "link", "set", "eth0", "up"}).status());
    }
    c->hosts_[all[i]] = std::move(h);
  }
  return c;
}

NetnsCluster::~NetnsCluster() {
  // Deleting a namespace deletes the veth ends in it and so their peers; the
  // switch goes last and takes the client's root-namespace end with it.
  for (const std::string& ns : namespaces_) (void)Run({kIp, "netns", "del", ns});
}

std::string NetnsCluster::Address(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? std::string() : it->second.address;
}

std::string NetnsCluster::Namespace(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? std::string() : it->second.ns;
}

StatusOr<std::unique_ptr<ServerProcess>> NetnsCluster::StartIn(
    const std::string& host, const std::string& binary, const std::string& name,
    const std::string& dir, std::vector<std::string> args,
    std::chrono::milliseconds timeout) const {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return Status::NotFound("no host \"" + host + "\" in the cluster");
  std::vector<std::string> wrapper;
  if (!it->second.ns.empty()) wrapper = {kIp, "netns", "exec", it->second.ns};
  return ServerProcess::StartWrapped(wrapper, binary, name, dir, std::move(args), timeout);
}

Status NetnsCluster::Partition(const std::string& host) {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return Status::NotFound("no host \"" + host + "\"");
  return Run({kIp, "-n", switch_ns_, "link", "set", it->second.switch_port, "down"}).status();
}

Status NetnsCluster::Heal(const std::string& host) {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return Status::NotFound("no host \"" + host + "\"");
  return Run({kIp, "-n", switch_ns_, "link", "set", it->second.switch_port, "up"}).status();
}

Status NetnsCluster::RateLimit(const std::string& host, std::uint64_t bits_per_second) {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return Status::NotFound("no host \"" + host + "\"");
  const Host& h = it->second;
  const std::vector<std::pair<std::string, std::string>> ends = {{switch_ns_, h.switch_port},
                                                                 {h.ns, h.device}};
  for (const auto& [ns, dev] : ends) {
    if (bits_per_second == 0) {
      (void)Run(InNs(ns, {kTc, "qdisc", "del", "dev", dev, "root"}));  // none: fine
      continue;
    }
    // A burst of 10 ms at the rate (at least 16 KB), queueing at most 200 ms.
    const std::uint64_t burst = std::max<std::uint64_t>(bits_per_second / 8 / 100, 16000);
    KVF_RETURN_IF_ERROR(Run(InNs(ns, {kTc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                                      std::to_string(bits_per_second) + "bit", "burst",
                                      std::to_string(burst), "latency", "200ms"}))
                            .status());
  }
  return Status::OK();
}

}  // namespace kvfabric::testing
