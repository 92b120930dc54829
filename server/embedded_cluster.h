// EmbeddedCluster: a whole local kvfabric cluster inside the calling process,
// for `kvfabric demo` and for tests: N cache-host daemons and one placement
// service with the in-process membership store. Every piece is the real one,
// wired as server/cache_host/cached_main.cc and
// server/placement/placement_main.cc wire them: each daemon is a
// CacheHostNode over its own UCX transport (a real data plane on loopback),
// with /metrics, a HealthReporter, CacheHostService on its own gRPC server and,
// once placement runs, a PlacementReporter; placement is a PlacementNode over a
// MemoryMembershipStore with /metrics and PlacementService on its gRPC server.
// Everything listens on 127.0.0.1 with ports the kernel picks.
//
// Start-up is in two steps so that a caller can measure the daemons (e.g.
// `kvfabric calibrate` against them) before placement needs the calibration:
// StartDaemons(), then StartPlacement(calibration), which registers every
// daemon and returns once placement lists them all.
//
// Each daemon registers with placement through a gRPC server of its own (an
// "uplink": another PlacementService over the same PlacementNode). KillDaemon
// closes that uplink before it stops the daemon's reporter, so the reporter's
// Deregister never arrives: placement keeps the dead daemon until its
// membership lease (EmbeddedClusterOptions::membership_ttl) expires, exactly
// as after a crash. Clients use placement_address(), never an uplink.
//
// Daemons differ from kvfabric-cached in what a development machine needs:
// pool memory is not locked (--lock-memory=off), pool memory comes from the
// transport, eviction is cost-aware with cached_main's conservative figures.
//
// Ownership: the cluster owns every server, node, transport and thread it
// starts. Thread safety: none; construct, call and destroy it from one thread
// (the servers it runs serve their own threads).
#ifndef KVFABRIC_SERVER_EMBEDDED_CLUSTER_H_
#define KVFABRIC_SERVER_EMBEDDED_CLUSTER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/bus_calibration.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "security/grpc_security.h"
#include "security/tenant_policy.h"
#include "transport/transport.h"

namespace kvfabric::placement {
class PlacementNode;
}  // namespace kvfabric::placement

namespace kvfabric::server {

struct EmbeddedDaemonOptions {
  // Names the daemon in logs, Health and placement, e.g. "demo-a". Non-empty
  // and unique within the cluster.
  std::string host_id;
  // Host pool size and page size (--host-pool-bytes, --host-page-bytes). No
  // defaults: both required; the page a power of two >= 4 KiB.
  std::uint64_t host_pool_bytes = 0;
  std::uint64_t host_page_bytes = 0;
  // NVMe tier directory (created if missing; its parent must exist). Empty:
  // no NVMe tier, evicted blocks are dropped.
  std::string nvme_dir;
  // Most bytes the NVMe segment files may occupy. Required with nvme_dir.
  std::uint64_t nvme_capacity_bytes = 0;
  // NVMe segment file size; 0: the tier's default (256 MiB). Smaller
  // segments return space sooner on a small demo tier.
  std::uint64_t nvme_segment_bytes = 0;
  // A model whose arithmetic ("histories of N tokens fit") start-up logs, as
  // cached_main's --model-*; empty model_id: none.
  ModelFingerprint model;
  std::uint64_t history_tokens = 32768;
  // Machine name clients compare with theirs to pick local paths. Empty:
  // this machine's hostname (as kvfabric-cached).
  std::string node_name;
  // The data-plane transport (--data-transport): "ucx" or "tcp" (kernel
  // sockets); clients of the cluster must use the same.
  std::string data_transport = "ucx";
  // UCX transport list (--ucx-tls); must include tcp.
  std::string ucx_tls = "sm,self,tcp";
  // Copy helpers of each daemon's transport (UcxTransportOptions::copy_threads).
  int copy_threads = 1;
  // Each daemon's transport: UcxTransportOptions::streaming_copy_min_bytes
  // (kvfabric-cached --streaming-copy-min-bytes).
  std::uint64_t streaming_copy_min_bytes = std::uint64_t{8} << 20;
  // UcxTransportOptions::populate_imported_mappings (kvfabric-cached
  // --no-populate-imports turns it off).
  bool populate_imports = true;
  // Data-plane workers of each daemon's transport (UcxTransportOptions::workers).
  int data_workers = 1;
  // Serve /metrics on 127.0.0.1 with a picked port. Default true.
  bool metrics = true;
  // Background compact_int8 converter threads (kvfabric-cached
  // --compact-threads; docs/compact.md), with its other settings at their
  // defaults (eviction keeps copies within a quarter of the pool). Default 0: off.
  int compact_threads = 0;
  // Tests: wraps the daemon's data-plane transport once it is made (e.g. in
  // transport/testing/fault_injection_transport.h, to corrupt what the
  // daemon pushes to clients). Null: the transport as made.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>
      wrap_transport;
};

struct EmbeddedClusterOptions {
  // At least one.
  std::vector<EmbeddedDaemonOptions> daemons;
  // Serve placement's /metrics on 127.0.0.1 with a picked port. Default true.
  bool placement_metrics = true;
  // Membership lease the daemons ask placement for (--membership-ttl).
  // Default 3 s (kvfabric-cached: 10 s): a killed daemon leaves plans within
  // ~3 s, at one heartbeat per second per daemon.
  std::chrono::milliseconds membership_ttl{3000};
  // How long an orderly stop waits for leases in use (--shutdown-grace).
  // Default 2 s.
  std::chrono::milliseconds shutdown_grace{2000};
  // How long StartPlacement waits for placement to list every daemon.
  // Default 10 s.
  std::chrono::milliseconds registration_timeout{10000};
  // Placement refits each model's split overlap from finished split plans
  // (CalibratedCostModel::Options::learn_split_overlap). Default true.
  bool placement_learns_split_overlap = true;
  // Placement's retrials of slowed daemons (PlacementOptions::retrial_interval and
  // retrial_max_interval; placement_node.h, RETRIALS). Defaults 5 s and 60 s.
  std::chrono::milliseconds placement_retrial_interval{5000};
  std::chrono::milliseconds placement_retrial_max_interval{60000};
  // How every listener is secured (security/grpc_security.h). Default:
  // plaintext, which the embedded cluster may use since it listens on
  // 127.0.0.1 only; with certificates, every listener is TLS (mutual with a
  // CA) and each daemon reaches placement with the same certificate.
  GrpcSecurityOptions security = [] {
    GrpcSecurityOptions o;
    o.insecure = true;
    return o;
  }();
  // Tenants (security/tenant_policy.h); null: one open tenant.
  std::shared_ptr<const TenantPolicy> tenants;
  // Encrypt the daemons' kernel-TCP data planes with TLS, presenting
  // security.cert_file (as kvfabric-cached --data-plane-tls). Needs TLS
  // security and data_transport "tcp".
  bool data_plane_tls = false;
};

class EmbeddedCluster {
 public:
  struct DaemonInfo {
    std::string host_id;
    std::string grpc_address;       // HOST:PORT of its CacheHost service
    std::string admin_address;      // HOST:PORT of its admin listener (Drain, Delete, ...)
    std::string transport_address;  // HOST:PORT of its UCX data plane
    std::string metrics_url;        // "http://HOST:PORT/metrics", or "" if none
    bool killed = false;            // KillDaemon was called
  };

  // Starts every daemon (see the file comment), not registered anywhere yet.
  // InvalidArgument / FailedPrecondition naming the daemon and the setting
  // for options that cannot work; daemons started before a failure are
  // stopped again.
  static StatusOr<std::unique_ptr<EmbeddedCluster>> StartDaemons(
      const EmbeddedClusterOptions& options);

  // Starts placement with `calibration` (may be empty: placeholder figures),
  // registers every daemon not killed with it, and waits (up to
  // registration_timeout) until placement's ListHosts shows each of them:
  // DeadlineExceeded naming the missing ones otherwise.
  // REQUIRES: called once, after StartDaemons.
  Status StartPlacement(const BusCalibration& calibration);

  // Orderly: each daemon drains, its reporter deregisters, its node shuts
  // down (bounded by shutdown_grace) and its servers stop; then placement.
  ~EmbeddedCluster();
  EmbeddedCluster(const EmbeddedCluster&) = delete;
  EmbeddedCluster& operator=(const EmbeddedCluster&) = delete;

  // Placement's gRPC address (HOST:PORT), "" before StartPlacement.
  std::string placement_address() const;
  // Placement's /metrics URL, "" if none (or before StartPlacement).
  std::string placement_metrics_url() const;
  // One per daemon, in the order of EmbeddedClusterOptions::daemons.
  std::vector<DaemonInfo> daemons() const;
  // Placement's node, for in-process readers (its cost model, counters); null before
  // StartPlacement. Valid until the cluster is destroyed.
  placement::PlacementNode* placement_node() const;

  // Caps daemon `i`'s data-plane sends (what clients fetch) at `bytes_per_s`
  // from now on, 0 lifts the cap: the kernel paces its TCP data connections
  // (SO_MAX_PACING_RATE), a slower link without root or netem.
  // FailedPrecondition unless the cluster runs data_transport "tcp";
  // InvalidArgument for an index out of range.
  Status SetDaemonSendRate(std::size_t i, std::uint64_t bytes_per_s);

  // Stops daemon `i` abruptly as far as clients can tell: its gRPC server
  // shuts down at once (calls in flight are cancelled), its node shuts down
  // without grace, its transport closes (peers' endpoints fail), and it never
  // deregisters: placement drops it when its membership lease expires.
  // InvalidArgument for an index out of range; FailedPrecondition if already
  // killed.
  Status KillDaemon(std::size_t i);

  // Waits until every live daemon's compact converter (compact_threads > 0)
  // has nothing queued or converting, or `timeout` passes (false). A
  // converter paused for room does not go idle.
  bool WaitForCompactConversions(std::chrono::milliseconds timeout);

 private:
  struct Daemon;
  struct Placement;

  explicit EmbeddedCluster(EmbeddedClusterOptions options);
  Status StartDaemon(const EmbeddedDaemonOptions& options, Daemon* daemon);
  // The orderly stop of the destructor.
  void StopDaemon(Daemon* daemon);
  // Starts daemon `d`'s uplink and reporter.
  Status Register(Daemon* d);
  Status WaitForHosts();

  const EmbeddedClusterOptions options_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::unique_ptr<Placement> placement_;
};

}  // namespace kvfabric::server

#endif  // KVFABRIC_SERVER_EMBEDDED_CLUSTER_H_
