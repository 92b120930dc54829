// `kvfabric status`: the cluster at a glance, for operators without
// Prometheus. Asks placement for its daemons, the cluster's headline figures
// and the members that left lately (Placement.ListHosts, twice, --interval
// apart, for rates), and each daemon for its occupancy (CacheHost.Stats), or
// asks the daemons named with --cache-host directly. Prints:
//   - plans by kind (totals, and per second over the interval), plans in
//     flight;
//   - bandwidth per bus path as the clients reported it (over the interval,
//     and on average since placement started);
//   - one row per daemon: state (the daemon's own, or placement's view when
//     it does not answer), membership lease left (EXPIRING when more than
//     half of it has passed since the last heartbeat: the daemon is missing
//     heartbeats and placement will drop it), capacity and use per tier,
//     blocks, leases in flight, hits and misses;
//   - the daemons that departed lately (deregistered, or lease expired) with
//     the directory entries dropped with them.
// A daemon that does not answer is shown with its error instead of figures;
// the command still exits 0 if placement (or any daemon) answered.
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_STATUS_COMMAND_H_
#define KVFABRIC_CLI_STATUS_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvfabric/v1/cache_host.pb.h"
#include "kvfabric/v1/placement.pb.h"
#include "security/grpc_security.h"

namespace kvfabric::cli {

struct StatusArgs {
  // How the gRPC connections are secured (--tls-ca, --tls-cert, --tls-key,
  // --tls-token-file, --insecure; security/grpc_security.h).
  GrpcSecurityOptions security;
  std::string placement;                // placement gRPC address; empty: use cache_hosts
  std::vector<std::string> cache_hosts;  // daemon gRPC addresses, repeatable
  bool json = false;
  int timeout_ms = 5000;
  // Seconds between the two ListHosts samples the rates come from; 0: one
  // sample, averages since placement started only.
  double interval_s = 1.0;
};

// One daemon's row: what placement knows (if asked) and what it says itself.
struct DaemonStatus {
  std::string host_id;       // from placement, else the daemon's Health server_id
  std::string grpc_address;
  std::optional<v1::HostStatus> membership;  // placement's view
  std::optional<v1::StatsResponse> stats;    // the daemon's own
  std::string error;                         // why stats are missing
};

// What placement said about the cluster (absent with --cache-host only).
struct ClusterReport {
  std::optional<v1::ListHostsResponse> first;  // the earlier sample, if two were taken
  std::optional<v1::ListHostsResponse> last;
  double interval_s = 0;          // between the samples
  std::uint64_t now_unix_us = 0;  // this machine's clock when the last sample came
};

// The table (or one JSON object) `kvfabric status` prints.
std::string FormatStatus(const StatusArgs& args, const std::vector<DaemonStatus>& daemons,
                         const ClusterReport& cluster = {});

// Queries and prints. InvalidArgument without --placement or --cache-host;
// Unavailable if placement does not answer.
Status RunStatus(const StatusArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_STATUS_COMMAND_H_
