// EtcdProcess: a real single-member etcd server for tests, on loopback.
//
// What it is
//   Start() picks two free loopback ports (client, peer), makes a temporary
//   data directory under the test's temp dir, and runs
//     /usr/bin/etcd --name t --data-dir DIR
//         --listen-client-urls http://127.0.0.1:P --advertise-client-urls ...
//         --listen-peer-urls http://127.0.0.1:Q --initial-advertise-peer-urls ...
//         --initial-cluster t=http://127.0.0.1:Q
//         --heartbeat-interval 20 --election-timeout 200
//   with its output in DIR/etcd.log. The short election timeout makes the
//   single member lead within a fraction of a second and lowers etcd's
//   minimum lease TTL to 1 s (etcd's floor is 1.5 x election timeout, rounded
//   up), so lease-expiry tests stay short. It then waits, bounded, until a
//   range call answers. If etcd exits first (typically a port taken between
//   picking and binding), it retries with fresh ports, three times in all.
//
//   The binary is Debian's etcd-server (3.4). Tests that need it call
//   SkipReason() and GTEST_SKIP with it when it is non-empty.
//
// Ownership: an EtcdProcess owns its child and directory. Destroying it
// SIGKILLs and reaps the child and removes the directory. The child also gets
// SIGKILL if the thread that started it exits (PR_SET_PDEATHSIG), so a
// crashed test leaves no etcd behind: start it from the test's main thread.
//
// Thread safety: one thread (the test's) uses an EtcdProcess.
#ifndef KVFABRIC_SERVER_PLACEMENT_TESTING_ETCD_PROCESS_H_
#define KVFABRIC_SERVER_PLACEMENT_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/statusor.h"
#include "security/grpc_security.h"

namespace kvfabric::placement::testing {

// TLS for the client URL: etcd's --cert-file, --key-file, and with
// client_ca its --trusted-ca-file and --client-cert-auth (clients must
// present a certificate of that CA). `client` is what WaitReady connects
// with (its ca_file verifies etcd's certificate).
struct EtcdTls {
  std::string cert_file;
  std::string key_file;
  std::string client_ca;
  GrpcSecurityOptions client;
};

class EtcdProcess {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";

  // Empty if kBinary is an executable file; else one line saying why etcd
  // tests cannot run ("... not found: apt-get install etcd-server").
  static std::string SkipReason();

  // Starts etcd and waits up to `timeout` for it to answer. Unavailable (with
  // the end of etcd's log) if it does not come up.
  // With `tls`, the client URL is https:// (see EtcdTls).
  static StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::chrono::milliseconds timeout = std::chrono::seconds(20),
      std::optional<EtcdTls> tls = std::nullopt);

  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;
  ~EtcdProcess();

  // "http://127.0.0.1:<client port>" ("https://" with TLS).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& data_dir() const { return data_dir_; }

  // SIGKILLs and reaps etcd now (the directory stays until destruction), for
  // tests of what clients do when etcd goes away.
  void Kill();

  // Kill() (if still running), then starts etcd again on the same ports and
  // data directory, and waits up to `timeout` for it to answer: keys and
  // leases survive, as after a crash of a real member.
  Status Restart(std::chrono::milliseconds timeout = std::chrono::seconds(20));

  // The last `max_bytes` of etcd's log, for failure messages.
  std::string LogTail(std::size_t max_bytes = 2000) const;

 private:
  EtcdProcess() = default;
  Status PickPorts();
  Status Spawn();
  Status WaitReady(std::chrono::steady_clock::time_point deadline);

  pid_t pid_ = -1;   // > 0 until reaped
  std::string dir_;  // the temporary directory: data_dir_ and the log live in it
  std::string data_dir_;
  std::string log_path_;
  std::string endpoint_;
  std::string peer_url_;
  std::optional<EtcdTls> tls_;
};

}  // namespace kvfabric::placement::testing

#endif  // KVFABRIC_SERVER_PLACEMENT_TESTING_ETCD_PROCESS_H_
