// A small datacentre on one machine, for fault tests: each host is a Linux
// network namespace with one link (a veth pair) into a switch namespace that
// bridges them, in a private /24 of 10.213.0.0/16. The test process itself
// is the host "client": its end of a veth into the switch lives in the root
// namespace at .1, so a test (the engine) reaches the hosts only through
// their addresses, over links the harness shapes and cuts:
//
//   client (root ns, .1) ──┐
//   placement (ns, .2) ────┤ switch ns: bridge br0, one port per host
//   cache-a (ns, .3) ──────┤ (a port down = that host partitioned;
//   cache-b (ns, .4) ──────┘  tbf on both ends = a rate-capped link)
//
// Processes are started in a host with StartIn (a ServerProcess run through
// `ip netns exec`, which execs in place: the pid is the server's).
//
// Names carry the creating process's pid ("kvft.<pid>.<n>.<host>"), so
// parallel runs never collide, the destructor removes everything it made
// (also when the test failed), and Create first removes what a crashed
// earlier run (a pid no longer alive) left behind.
//
// Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's ip and tc;
// SkipReason says, in one line, why a machine cannot.
//
// Thread safety: not thread-safe; use from the test's main thread.
#ifndef KVFABRIC_TESTS_FAULT_NETNS_CLUSTER_H_
#define KVFABRIC_TESTS_FAULT_NETNS_CLUSTER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "tests/server_process.h"

namespace kvfabric::testing {

class NetnsCluster {
 public:
  // "" if this machine lets the test create namespaces, veths and qdiscs;
  // else why not (the test skips with it).
  static std::string SkipReason();

  // The hosts named `hosts` (letters, digits and '-'; not "client"), each in
  // its own namespace, and the client link. Addresses: client .1, then the
  // hosts in order from .2.
  static StatusOr<std::unique_ptr<NetnsCluster>> Create(const std::vector<std::string>& hosts);

  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // "10.213.N.K" of a host ("client": the test process's).
  std::string Address(const std::string& host) const;

  // Starts `binary` with `args` in `host`'s namespace (see ServerProcess).
  StatusOr<std::unique_ptr<ServerProcess>> StartIn(
      const std::string& host, const std::string& binary, const std::string& name,
      const std::string& dir, std::vector<std::string> args,
      std::chrono::milliseconds timeout = std::chrono::seconds(120)) const;

  // Cuts `host`'s link (its switch port goes down: packets to and from it
  // are dropped, connections hang until their timeouts) and restores it.
  Status Partition(const std::string& host);
  Status Heal(const std::string& host);

  // Caps `host`'s link at `bits_per_second` in both directions (tc tbf on
  // both ends of its veth); 0 removes the cap.
  Status RateLimit(const std::string& host, std::uint64_t bits_per_second);

  // The namespace a host runs in ("" for the client: the root namespace).
  std::string Namespace(const std::string& host) const;

 private:
  struct Host {
    std::string ns;           // "" for the client
    std::string switch_port;  // its veth end in the switch namespace
    std::string device;       // its own end (in its namespace, or the root one)
    std::string address;
  };
  NetnsCluster() = default;

  std::string switch_ns_;
  std::string prefix_;  // "kvft.<pid>.<n>"
  std::map<std::string, Host> hosts_;
  std::vector<std::string> namespaces_;  // to delete, the switch's last
};

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_FAULT_NETNS_CLUSTER_H_
