// Argument checks shared by the files of PlacementNode (placement_node.cc,
// placement_node_plans.cc). Internal.
#ifndef KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_INTERNAL_H_
#define KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/bus_cost_model.h"
#include "core/status.h"

namespace kvfabric::placement::internal {

// "keys: 70000 > max_chain_blocks 65536".
inline Status OverLimit(std::string_view what, std::uint64_t got, std::string_view limit,
                        std::uint64_t max) {
  return Status::InvalidArgument(std::string(what) + ": " + std::to_string(got) + " > " +
                                 std::string(limit) + " " + std::to_string(max));
}

inline bool GoodPath(const PathParameters& p) {
  return std::isfinite(p.alpha_us) && p.alpha_us >= 0 && std::isfinite(p.beta_bytes_per_s) &&
         p.beta_bytes_per_s > 0 && SizeFactorsValid(p);
}

inline bool GoodRecompute(const RecomputeParameters& r) { return RecomputeParametersValid(r); }

}  // namespace kvfabric::placement::internal

#endif  // KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_INTERNAL_H_
