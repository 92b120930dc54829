// The protocol limits servers enforce and report (kvfabric.v1.Limits), as
// named constants. docs/protocol.md lists them; a request over a limit is
// refused with INVALID_ARGUMENT naming the limit and the value.
#ifndef KVFABRIC_PROTO_WIRE_LIMITS_H_
#define KVFABRIC_PROTO_WIRE_LIMITS_H_

#include <cstdint>

#include "kvfabric/v1/common.pb.h"

namespace kvfabric {

inline constexpr std::uint32_t kMaxKeysPerBatch = 4096;
inline constexpr std::uint32_t kMaxChainBlocks = 65536;
inline constexpr std::uint64_t kMaxBatchPayloadBytes = std::uint64_t{4} << 30;
inline constexpr std::uint32_t kMaxExtentsPerBlock = 256;
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{16} << 20;
inline constexpr std::uint64_t kMaxRequestBytes = std::uint64_t{4} << 20;
inline constexpr std::uint32_t kMaxHostIdBytes = 128;
inline constexpr std::uint32_t kMaxAddressBytes = 256;
inline constexpr std::uint32_t kMaxTransportBlobBytes = 4096;
inline constexpr std::uint32_t kMaxTtlMs = 600000;
inline constexpr std::uint32_t kDefaultTtlMs = 30000;
inline constexpr std::uint32_t kMaxReplicas = 8;
inline constexpr std::uint32_t kMaxExplanationBytes = 65536;
// Decisions one ListEvictions or ListPlans call returns at most (their
// `limit`; 0 asks for kDefaultListedDecisions).
inline constexpr std::uint32_t kMaxListedDecisions = 1000;
inline constexpr std::uint32_t kDefaultListedDecisions = 20;

// The defaults above plus the format limits from core (block payload, tokens
// per block, namespace and model id lengths).
v1::Limits DefaultLimits();

}  // namespace kvfabric

#endif  // KVFABRIC_PROTO_WIRE_LIMITS_H_
