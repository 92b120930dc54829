// `kvfabric explain eviction`: asks a cache host why a block left its host
// pool (CacheHost.ExplainEviction) and prints each decision with its formula.
// `kvfabric explain plan`: asks placement for a plan's formula with its
// numbers (Placement.Explain).
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_EXPLAIN_COMMAND_H_
#define KVFABRIC_CLI_EXPLAIN_COMMAND_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "kvfabric/v1/cache_host.pb.h"
#include "kvfabric/v1/placement.pb.h"

namespace kvfabric::cli {

struct ExplainEvictionArgs {
  std::string cache_host;  // gRPC address of the daemon, HOST:PORT
  std::string tenant;      // namespace ("" is the default tenant)
  std::string key_hex;     // 64 hex characters
  bool json = false;
  int timeout_ms = 5000;
};

// The text `kvfabric explain eviction` prints for `response` (a table, or one
// JSON object with --json).
std::string FormatExplainEviction(const ExplainEvictionArgs& args,
                                  const v1::ExplainEvictionResponse& response);

// Runs the RPC and prints. InvalidArgument for a malformed key; the RPC's
// error (Unavailable: daemon unreachable) otherwise.
Status RunExplainEviction(const ExplainEvictionArgs& args);

struct ExplainPlanArgs {
  std::string placement;  // gRPC address of the placement service, HOST:PORT
  std::uint64_t plan_id = 0;
  bool json = false;
  int timeout_ms = 5000;
};

// The text `kvfabric explain plan` prints: the formula, then each term with
// its value and unit, then the explanation text (or one JSON object).
std::string FormatExplainPlan(const ExplainPlanArgs& args, const v1::ExplainResponse& response);

// Runs Placement.Explain for a plan id and prints. NotFound once the plan aged
// out of placement's bounded history.
Status RunExplainPlan(const ExplainPlanArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_EXPLAIN_COMMAND_H_
