// `kvfabric explain eviction`: asks a cache host why a block left its host
// pool (CacheHost.ExplainEviction) and prints each decision with its formula;
// without --key, lists the daemon's most recent decisions (ListEvictions) of
// one namespace, or of all with --all-namespaces on the admin listener.
// `kvfabric explain plan`: asks placement for a plan's formula with its
// numbers (Placement.Explain); without --plan-id, lists the most recent plans
// (ListPlans) with their kinds and predicted and observed times.
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_EXPLAIN_COMMAND_H_
#define KVFABRIC_CLI_EXPLAIN_COMMAND_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "kvfabric/v1/cache_host.pb.h"
#include "kvfabric/v1/placement.pb.h"
#include "security/grpc_security.h"

namespace kvfabric::cli {

struct ExplainEvictionArgs {
  // How the gRPC connections are secured (--tls-ca, --tls-cert, --tls-key,
  // --tls-token-file, --insecure; security/grpc_security.h).
  GrpcSecurityOptions security;
  std::string cache_host;  // gRPC address of the daemon, HOST:PORT
  std::string tenant;      // namespace ("" is the default tenant)
  std::string key_hex;     // 64 hex characters; empty: list recent decisions
  bool all_namespaces = false;  // list every namespace's (admin listener only)
  std::uint32_t last = 20;      // how many recent decisions to list
  bool json = false;
  int timeout_ms = 5000;
};

// The text `kvfabric explain eviction` prints for `response` (a table, or one
// JSON object with --json).
std::string FormatExplainEviction(const ExplainEvictionArgs& args,
                                  const v1::ExplainEvictionResponse& response);

// The list `kvfabric explain eviction` without --key prints.
std::string FormatEvictionList(const ExplainEvictionArgs& args,
                               const v1::ListEvictionsResponse& response);

// Runs the RPC and prints. InvalidArgument for a malformed key; the RPC's
// error (Unavailable: daemon unreachable) otherwise.
Status RunExplainEviction(const ExplainEvictionArgs& args);

struct ExplainPlanArgs {
  // How the gRPC connections are secured (--tls-ca, --tls-cert, --tls-key,
  // --tls-token-file, --insecure; security/grpc_security.h).
  GrpcSecurityOptions security;
  std::string placement;  // gRPC address of the placement service, HOST:PORT
  std::uint64_t plan_id = 0;  // 0: list recent plans
  std::string tenant;         // list only this namespace's plans ("": all)
  std::uint32_t last = 20;    // how many recent plans to list
  bool json = false;
  int timeout_ms = 5000;
};

// The text `kvfabric explain plan` prints: the formula, then each term with
// its value and unit, then the explanation text (or one JSON object).
std::string FormatExplainPlan(const ExplainPlanArgs& args, const v1::ExplainResponse& response);

// The list `kvfabric explain plan` without --plan-id prints; `now_unix_us`
// dates the plans ("12 s ago").
std::string FormatPlanList(const ExplainPlanArgs& args, const v1::ListPlansResponse& response,
                           std::uint64_t now_unix_us);

// Runs Placement.Explain for a plan id (ListPlans without one) and prints.
// NotFound once the plan aged out of placement's bounded history.
Status RunExplainPlan(const ExplainPlanArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_EXPLAIN_COMMAND_H_
