// The placeholder figures of the bus cost model: what placement plans with and what a daemon's
// cost-aware eviction scores with until a calibration file (`kvfabric calibrate`), an engine's
// statement (ClientOptions::prefill) or the online refit replaces them. One source: placement
// (PlacementOptions), the daemon (cached_main, EmbeddedCluster) and docs/cost-model.md all read
// these. They describe a 100 Gb/s fabric, PCIe 4 x16, a datacentre NVMe drive and an 8B-class
// model on one GPU; on any real machine, calibrate.
//
// Units as core/bus_cost_model.h: microseconds, bytes per second, tokens.
#ifndef KVFABRIC_CORE_COST_DEFAULTS_H_
#define KVFABRIC_CORE_COST_DEFAULTS_H_

#include "core/bus_cost_model.h"

namespace kvfabric::cost_defaults {

// Remote daemon host memory -> client host memory, over the transport.
inline constexpr PathParameters kRemoteToLocal{25.0, 10e9};
// Client host memory -> remote daemon host memory (write-back).
inline constexpr PathParameters kLocalToRemote{25.0, 10e9};
// A daemon on the client's node -> client host memory.
inline constexpr PathParameters kLocalMemcpy{5.0, 10e9};
// Daemon NVMe -> daemon host memory (staging read).
inline constexpr PathParameters kNvmeToHost{100.0, 3e9};
// Every daemon -> one client, all streams together: one 100 Gb/s port that the streams share
// (the same figure as one stream, so several daemons are not assumed faster until measured).
inline constexpr PathParameters kClientIngest{0.0, 10e9};
// Client host -> device (per client).
inline constexpr PathParameters kHostToDevice{10.0, 25e9};
// Recompute (prefill): t = c0 + c1 n + c2 n (p + n/2).
inline constexpr RecomputeParameters kRecompute{2000.0, 10.0, 0.001};

}  // namespace kvfabric::cost_defaults

#endif  // KVFABRIC_CORE_COST_DEFAULTS_H_
