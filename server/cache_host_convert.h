// Conversions between the kvfabric.v1.CacheHost messages and the cache-host
// core types (server/cache_host/cache_host_node.h), and the wire-limit checks
// the gRPC adapter (server/cache_host_service.h) applies before it calls the
// node.
//
// Two kinds of refusal, as cache_host.proto prescribes:
//   - whole-request: a limit of kvfabric.v1.Limits is exceeded, a key is not
//     32 bytes, keys that must be distinct repeat, the fingerprint is
//     incomplete. The Check* and *FromProto functions return InvalidArgument
//     with a message naming the field, the limit and both numbers, e.g.
//     "keys: 5000 > max_keys_per_batch 4096".
//   - per-entry: a Reserve descriptor that is incomplete or inconsistent
//     (BlockMetaFromDescriptor), answered in that entry's EntryStatus.
// Every `limits` argument is the full set in force (e.g. DefaultLimits()).
//
// Thread safety: pure functions over values.
#ifndef KVFABRIC_SERVER_CACHE_HOST_CONVERT_H_
#define KVFABRIC_SERVER_CACHE_HOST_CONVERT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/block_format.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "proto/model_proto.h"
#include "core/status.h"
#include "proto/grpc_status.h"
#include "core/statusor.h"
#include "kvfabric/v1/cache_host.pb.h"
#include "kvfabric/v1/common.pb.h"
#include "server/cache_host/block_index.h"
#include "server/cache_host/cache_host_node.h"

namespace kvfabric {

// Most namespaces a StatsResponse lists (cache_host.proto, StatsRequest).
inline constexpr std::size_t kMaxStatsNamespaces = 1024;

// ---------------------------------------------------------------- checks

// OK if 1 <= n <= limits.max_keys_per_batch. `field` names what was counted
// ("keys", "blocks", "entries", "lease_ids").
Status CheckBatchSize(std::string_view field, std::size_t n, const v1::Limits& limits);

// OK if the namespace is at most limits.max_namespace_bytes long.
Status CheckNamespace(std::string_view ns, const v1::Limits& limits);

// OK if ttl_ms <= limits.max_ttl_ms (0 means the default and is fine).
Status CheckTtlMs(std::uint32_t ttl_ms, const v1::Limits& limits);

// The one place a call's liveness is judged: Cancelled if the client cancelled
// it, DeadlineExceeded if its deadline is at or before `now`, else OK. The
// adapter asks before handing work to the node.
Status CheckCallLive(bool cancelled, std::chrono::system_clock::time_point deadline,
                     std::chrono::system_clock::time_point now);

// ---------------------------------------------------------------- keys

// `bytes` as a BlockKey; InvalidArgument naming `field` (e.g. "keys[3]") and
// the length unless it is exactly 32 bytes.
StatusOr<BlockKey> BlockKeyFromProto(std::string_view bytes, std::string_view field);
std::string BlockKeyToProto(const BlockKey& key);

// OK unless a key repeats; then InvalidArgument naming both positions, e.g.
// "entries[7].key repeats entries[2].key (keys must be distinct)" for
// field "entries" and member ".key".
Status CheckDistinctKeys(std::span<const BlockKey> keys, std::string_view field,
                         std::string_view member = "");

// Every element of a repeated key field, in order. Refuses (whole-request) a
// key that is not 32 bytes and, when `distinct`, a key that repeats. `field`
// is the repeated field's name ("keys", "entries[3].keys").
StatusOr<std::vector<BlockKey>> BlockKeysFromProto(
    const google::protobuf::RepeatedPtrField<std::string>& keys, std::string_view field,
    bool distinct);

// The keys of Reserve's blocks, in order, after the whole-request checks on
// them: every key 32 bytes and distinct, every payload_bytes at most
// max_block_bytes, and their sum at most max_batch_payload_bytes. The batch
// size is CheckBatchSize's.
StatusOr<std::vector<BlockKey>> ReserveKeysFromProto(
    const google::protobuf::RepeatedPtrField<v1::BlockDescriptor>& blocks,
    const v1::Limits& limits);

// ---------------------------------------------------------------- enums

// InvalidArgument for DTYPE_UNSPECIFIED or a number that names no DType.
StatusOr<KvDtype> KvDtypeFromProto(int dtype);
// KvDtypeToProto: proto/model_proto.h.

// InvalidArgument for REPRESENTATION_UNSPECIFIED or an unknown number.
StatusOr<BlockRepresentation> RepresentationFromProto(int representation);
v1::Representation RepresentationToProto(BlockRepresentation representation);

// kHost and kBoth rest in the host pool: TIER_HOST; kNvme: TIER_NVME.
v1::Tier TierToProto(cache_host::BlockTier tier);
v1::ServingStatus ServingStateToProto(cache_host::ServingState state);
v1::EvictionPolicy EvictionPolicyToProto(cache_host::EvictionPolicyKind policy);

// ---------------------------------------------------------------- fingerprint

// The core fingerprint, validated: every field set (model_id non-empty and at
// most limits.max_model_id_bytes, dtype specified, tokens_per_block at most
// limits.max_tokens_per_block) and ModelFingerprint::Validate() passes.
// Whole-request InvalidArgument, prefixed "fingerprint", otherwise.
StatusOr<ModelFingerprint> FingerprintFromProto(const v1::ModelFingerprint& fingerprint,
                                                const v1::Limits& limits);
// FingerprintToProto: proto/model_proto.h.

// FingerprintFromProto for a request whose blocks this daemon will hold
// (Reserve): also refuses, whole-request, a fingerprint whose value heads
// differ from its key heads (Unimplemented, "fingerprint: v_head_dim ..."),
// since the block format and the daemon's layer slices hold equal K and V
// halves. Keys of such models are still computed; placement plans them.
StatusOr<ModelFingerprint> StorableFingerprintFromProto(const v1::ModelFingerprint& fingerprint,
                                                        const v1::Limits& limits);

// ---------------------------------------------------------------- descriptors

// The BlockMeta of one Reserve descriptor, or the per-entry InvalidArgument
// (prefixed with `field`, e.g. "blocks[2]") for a descriptor that is not
// complete and consistent: payload_bytes 0, representation or format_version
// unset or unknown, token_count != fingerprint.tokens_per_block, a shape the
// block format refuses (ValidateBlockHeader: e.g. an exact block whose
// payload_bytes is not what the fingerprint's shape needs), or a non-empty
// fingerprint_digest that is not `digest`. crc32c is ignored (Commit gives it).
// REQUIRES: `fingerprint` validated and `digest` its Digest(); the caller has
// already refused payload_bytes above max_block_bytes (a whole-request limit).
StatusOr<cache_host::BlockMeta> BlockMetaFromDescriptor(const v1::BlockDescriptor& descriptor,
                                                        const ModelFingerprint& fingerprint,
                                                        const FingerprintDigest& digest,
                                                        std::string_view field);

// A committed block's descriptor. format_version is kBlockFormatVersion (the
// daemon keeps a CRC per layer slice of every block it holds).
void DescriptorFromMeta(const BlockKey& key, const cache_host::BlockMeta& meta,
                        std::uint32_t crc32c, v1::BlockDescriptor* out);

// ---------------------------------------------------------------- results

// StatusToEntry / StatusFromEntry: proto/grpc_status.h.

// Pool byte ranges as Extents of region 0 (the grant's only region).
void ExtentsToProto(std::span<const cache_host::ByteExtent> extents,
                    google::protobuf::RepeatedPtrField<v1::Extent>* out);

// An owner-driven grant over the whole pool: one region {base_address 0,
// length pool_bytes, no remote key}, the daemon's transport address, and the
// grant's 16-byte access token. The data plane checks every extent a transfer
// names against the lease, so the region may span the pool.
void GrantToProto(const cache_host::GrantInfo& grant, std::string_view transport_address,
                  std::uint64_t pool_bytes, v1::TransportGrant* out);
// (lease_id, access_token) from a request naming a grant. InvalidArgument,
// naming `field`, unless the token is 16 bytes.
StatusOr<cache_host::GrantRef> GrantRefFromProto(std::uint64_t lease_id, const std::string& token,
                                                 const std::string& field);

// TTLs. ttl_ms 0 becomes limits.default_ttl_ms, so that what Health reports is
// what is granted; TtlMsFromUs truncates to whole milliseconds and saturates.
std::uint64_t TtlUsFromMs(std::uint32_t ttl_ms, const v1::Limits& limits);
std::uint32_t TtlMsFromUs(std::uint64_t ttl_us);

// ---------------------------------------------------------------- stats

// What StatsFromSnapshot needs besides the snapshot.
struct StatsContext {
  std::uint64_t host_pool_bytes = 0;  // CacheHostNode::pool_bytes()
  std::uint64_t nvme_unit_bytes = 0;  // the NVMe tier's allocation unit (O_DIRECT alignment)
  cache_host::EvictionPolicyKind policy = cache_host::EvictionPolicyKind::kCostAware;
};

// Fills every field of `out` from `snapshot`: the host tier, then the NVMe
// tier if enabled, the counters, and with `include_namespaces` at most
// kMaxStatsNamespaces namespaces, largest (committed bytes, all tiers) first.
void StatsFromSnapshot(const cache_host::CacheHostSnapshot& snapshot, const StatsContext& context,
                       bool include_namespaces, v1::StatsResponse* out);

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_CACHE_HOST_CONVERT_H_
