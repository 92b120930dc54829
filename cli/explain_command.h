// `kvfabric explain eviction`: asks a cache host why a block left its host
// pool (CacheHost.ExplainEviction) and prints each decision with its formula.
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_EXPLAIN_COMMAND_H_
#define KVFABRIC_CLI_EXPLAIN_COMMAND_H_

#include <string>

#include "core/status.h"
#include "kvfabric/v1/cache_host.pb.h"

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

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_EXPLAIN_COMMAND_H_
