// `kvfabric status`: the cluster at a glance. Asks placement for its live
// daemons (Placement.ListHosts) and each daemon for its occupancy
// (CacheHost.Stats), or asks the daemons named with --cache-host directly,
// and prints one row per daemon: state, capacity and use per tier, blocks,
// leases in flight, hits and misses. A daemon that does not answer is shown
// with its error instead of figures; the command still exits 0 if placement
// (or any daemon) answered.
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_STATUS_COMMAND_H_
#define KVFABRIC_CLI_STATUS_COMMAND_H_

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvfabric/v1/cache_host.pb.h"
#include "kvfabric/v1/placement.pb.h"

namespace kvfabric::cli {

struct StatusArgs {
  std::string placement;                // placement gRPC address; empty: use cache_hosts
  std::vector<std::string> cache_hosts;  // daemon gRPC addresses, repeatable
  bool json = false;
  int timeout_ms = 5000;
};

// One daemon's row: what placement knows (if asked) and what it says itself.
struct DaemonStatus {
  std::string host_id;       // from placement, else the daemon's Health server_id
  std::string grpc_address;
  std::optional<v1::HostStatus> membership;  // placement's view
  std::optional<v1::StatsResponse> stats;    // the daemon's own
  std::string error;                         // why stats are missing
};

// The table (or one JSON object) `kvfabric status` prints.
std::string FormatStatus(const StatusArgs& args, const std::vector<DaemonStatus>& daemons);

// Queries and prints. InvalidArgument without --placement or --cache-host;
// Unavailable if placement does not answer.
Status RunStatus(const StatusArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_STATUS_COMMAND_H_
