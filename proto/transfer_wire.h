// The data-plane messages between a kvfabric client and a cache-host daemon,
// carried as transport kSend headers (transport/transport.h; at most
// kMaxMessageHeaderBytes). The control plane (gRPC, cache_host.proto) grants
// a lease with an access token and pool extents; these messages ask the daemon
// to move the bytes of those extents (TRANSFER_MODE_OWNER_DRIVEN):
//
//   client -> daemon  kImportRegion  one chunk of the client's exported staging
//                                    region (MemoryRegion::Export), named by a
//                                    client-chosen region id; chunks arrive in
//                                    order and the last completes the import.
//   client -> daemon  kPut           "pull these ranges of my region into your
//                                    pool extents" (daemon: kRead entries)
//   client -> daemon  kGet           "push these pool extents into my region"
//                                    (daemon: kWrite entries)
//   daemon -> client  kReply         the outcome of one request, by request id,
//                                    sent after every byte moved (or failed).
//   client -> daemon  kFetch         "lease these keys, push them into my
//                                    region, release them": a Lease, a kGet and
//                                    a Release in one round trip, for blocks in
//                                    the daemon's host pool (no NVMe I/O on the
//                                    data path; others answer Unavailable and
//                                    go through gRPC Lease, which stages them).
//   daemon -> client  kFetchReply    a kFetch's outcome and one result per key.
//   client -> daemon  kStore         "reserve these keys, pull their bytes from
//                                    my region, verify each CRC32C, commit":
//                                    gRPC Reserve, a kPut and gRPC Commit in one
//                                    round trip (the daemon checks the CRCs on
//                                    a worker thread, not the progress thread).
//   daemon -> client  kStoreReply    a kStore's outcome and one result per key.
//   daemon -> client  kChallenge     sent once when a connection is accepted: a
//                                    32-byte random nonce (request_id 0).
//   client -> daemon  kHello         proves the connection belongs to a gRPC
//                                    session (CacheHost.OpenDataSession): the
//                                    session id and HMAC-SHA256(session secret,
//                                    HelloProofInput(nonce, session id)).
//                                    Answered by kReply; a daemon that requires
//                                    sessions reads nothing else first and closes
//                                    the connection on a bad proof.
//
// Layout (little-endian), common header of 48 bytes:
//   0  u32 magic "KVFT"     4 u8 version (1)   5 u8 op   6 u16 reserved (0)
//   8  u64 request_id      16 u64 lease_id    24 16 bytes access token
//   40 u32 region_id       44 u32 count
// kPut/kGet: `count` ranges of 24 bytes: u64 pool_offset, u64 length,
//   u64 region_offset; 1 <= count <= kMaxRangesPerRequest.
// kImportRegion: u32 total_bytes, u32 chunk_offset, then `count` bytes of the
//   export; lease_id and token are zero; total_bytes <= kMaxExportBytes.
// kReply: i32 code (StatusCode), u64 bytes_moved, u16 message length, message
//   (at most kMaxReplyMessageBytes); region_id and count are zero.
// kFetch: lease_id and token zero; `count` keys, 1 <= count <= kMaxFetchKeys:
//   u64 region_offset, u64 slot_bytes (>= 1; key i lands at region_offset +
//   i x slot_bytes and must fit in slot_bytes; the slots must not wrap u64),
//   u16 namespace length (<= kMaxFetchNamespaceBytes), u8 flags (bit 0: a
//   32-byte expected fingerprint digest follows; bit 1: scattered slots, see
//   below; bit 2: a layer range follows; other bits 0), u8 reserved (0),
//   [u32 first_layer, u32 layer_count (>= 1)], [digest], namespace bytes, then
//   `count` keys of 32 bytes, then with bit 1 `count` u64 slot offsets: key i
//   lands at offset i instead (region_offset is 0; each slot must not wrap
//   u64). Scattered slots let a client name its history pages directly, so
//   the block is written once, where it will be read (issue 22's one copy).
//   With a layer range only layer slices [first_layer, first_layer +
//   layer_count) of each block move (docs/block-format.md: one layer is
//   payload_bytes / layers contiguous bytes), landing at the key's slot; the
//   result's crc32c and payload_bytes are then the range's, so a client can
//   verify layer 0 of a batch and use it while later layers are on the wire.
//   With flag bit 3 (check landing) the daemon, where it copies the bytes
//   itself through a mapping of the client's region (UCX shared memory),
//   reads each key's bytes back in the slot right after writing them and
//   compares their CRC32C with the one it answers; a key that matched has
//   bit 63 of its result's payload_bytes set (landing_checked), and the
//   client need not read it again. Keys without the bit the client checks.
// kStore: lease_id and token zero; `count` keys, 1 <= count <= kMaxStoreKeys:
//   u32 ttl_ms (0: the daemon's default), u16 namespace length (<=
//   kMaxFetchNamespaceBytes), u8 flags (0), u8 representation
//   (BlockRepresentation), u8 dtype (KvDtype), u8 format_version (1..2),
//   u16 reserved (0), u32 tokens_per_block, u32 layers, u32 kv_heads,
//   u32 head_dim, the 32-byte fingerprint digest of the model, namespace
//   bytes, then `count` entries of 64 bytes: the 32-byte key, u64
//   region_offset, u64 payload_bytes (>= 1; [region_offset, + payload_bytes)
//   must not wrap u64), u64 prefix_tokens, u32 crc32c, u32 reserved (0).
//   Every block of one kStore has the same model shape and namespace.
// kStoreReply: as kFetchReply (results carry the code; crc32c and
//   payload_bytes are zero). Per key: OK (committed), AlreadyExists (another
//   writer holds or held it: nothing to do), ResourceExhausted (no room, or a
//   quota), DataLoss (the bytes pulled did not match crc32c; nothing kept),
//   InvalidArgument (the entry's shape), or the reservation's own error.
// kChallenge: lease_id, token, region_id zero; count 32; the 32-byte nonce.
// kHello: lease_id is the session id; token and region_id zero; count 32; the
//   32-byte proof.
// kFetchReply: lease_id, token and region_id zero; `count` results (0 when the
//   whole request failed, else exactly the request's key count): i32 code,
//   u64 bytes_moved, u16 message length (<= kMaxFetchReplyMessageBytes), then
//   `count` results of 16 bytes (i32 code, u32 crc32c, u64 payload_bytes;
//   bit 63 of payload_bytes: landing checked, see kFetch flag bit 3), then
//   the message.
// Decoding is exact: every size and count is checked, trailing bytes are an
// error, and nothing is allocated beyond what the message's own size bounds.
// Pure functions; thread-safe.
#ifndef KVFABRIC_PROTO_TRANSFER_WIRE_H_
#define KVFABRIC_PROTO_TRANSFER_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::wire {

enum class TransferOpCode : std::uint8_t {
  kImportRegion = 1,
  kPut = 2,
  kGet = 3,
  kReply = 4,
  kFetch = 5,
  kFetchReply = 6,
  kChallenge = 7,
  kHello = 8,
  kStore = 9,
  kStoreReply = 10,
};

inline constexpr std::uint32_t kTransferMagic = 0x5446564bu;  // "KVFT" little-endian
inline constexpr std::uint8_t kTransferVersion = 1;
inline constexpr std::size_t kTransferHeaderBytes = 48;
inline constexpr std::size_t kRangeBytes = 24;
// Fits transport::kMaxMessageHeaderBytes (1024): 48 + 40 x 24 = 1008.
inline constexpr std::uint32_t kMaxRangesPerRequest = 40;
// Largest export a daemon imports (Limits.max_transport_blob_bytes).
inline constexpr std::uint32_t kMaxExportBytes = 4096;
// Export bytes per kImportRegion chunk: 1024 - 48 - 8.
inline constexpr std::uint32_t kMaxImportChunkBytes = 968;
inline constexpr std::uint32_t kMaxReplyMessageBytes = 900;
inline constexpr std::size_t kMaxTransferMessageBytes = 1024;
// kFetch: 48 + 20 + 8 (layer range) + 32 (digest) + 256 (namespace) + 16 x 32
// (keys) + 16 x 8 (scattered slot offsets) = 1004.
inline constexpr std::uint32_t kMaxFetchKeys = 16;
inline constexpr std::size_t kFetchKeyBytes = 32;
inline constexpr std::size_t kFetchDigestBytes = 32;
inline constexpr std::size_t kMaxFetchNamespaceBytes = 256;
// kFetchReply: 48 + 14 + 16 x 16 (results) + 512 = 830.
inline constexpr std::uint32_t kMaxFetchReplyMessageBytes = 512;
inline constexpr std::size_t kFetchResultBytes = 16;
inline constexpr std::size_t kHelloBytes = 32;  // a kChallenge nonce, a kHello proof
// kStore: 48 + 28 + 32 (digest) + 256 (namespace) + 8 x 64 (entries) = 876.
inline constexpr std::uint32_t kMaxStoreKeys = 8;
inline constexpr std::size_t kStoreEntryBytes = 64;

using FetchKey = std::array<std::uint8_t, kFetchKeyBytes>;

// One key's outcome in a kFetchReply. OK: payload_bytes bytes were placed at
// the key's slot, and crc32c is the CRC the block was committed with (with a
// layer range: the range's bytes and their CRC, folded from the layer CRCs
// the daemon verified at commit). OutOfRange: the range is not inside the
// block's layers; Unavailable also when the daemon holds no layer CRCs for it
// (lease the whole block through the control plane).
// NotFound, FailedPrecondition (another model fingerprint), Unavailable (not
// in the host pool now: lease it through the control plane), ResourceExhausted
// (larger than the slot), or the lease's own error.
struct FetchKeyResult {
  StatusCode code = StatusCode::kOk;
  std::uint32_t crc32c = 0;
  std::uint64_t payload_bytes = 0;  // < 2^63 (bit 63 of the field is landing_checked)
  // The daemon read the bytes back where they landed in the client's slot
  // and their CRC32C matched crc32c (only when the request asked, flag bit 3).
  bool landing_checked = false;
};

// One block of a kStore: its bytes are [region_offset, + payload_bytes) of
// the request's region.
struct StoreEntry {
  FetchKey key{};
  std::uint64_t region_offset = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t prefix_tokens = 0;
  std::uint32_t crc32c = 0;
};

// The model shape every block of one kStore shares (the daemon keeps it
// with each block, and writes it into the block's NVMe header).
struct StoreShape {
  std::uint8_t representation = 1;  // BlockRepresentation
  std::uint8_t dtype = 1;           // KvDtype
  std::uint8_t format_version = 2;
  std::uint32_t tokens_per_block = 0;
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::array<std::uint8_t, kFetchDigestBytes> fingerprint{};
};

struct TransferRange {
  std::uint64_t pool_offset = 0;
  std::uint64_t length = 0;
  std::uint64_t region_offset = 0;
};

struct TransferMessage {
  TransferOpCode op = TransferOpCode::kReply;
  std::uint64_t request_id = 0;
  std::uint64_t lease_id = 0;
  std::array<std::uint8_t, 16> token{};
  std::uint32_t region_id = 0;
  // kPut / kGet.
  std::vector<TransferRange> ranges;
  // kImportRegion.
  std::uint32_t import_total_bytes = 0;
  std::uint32_t import_chunk_offset = 0;
  std::string import_chunk;
  // kReply and kFetchReply.
  Status status;
  std::uint64_t bytes_moved = 0;
  // kFetch.
  std::uint64_t fetch_region_offset = 0;
  std::uint64_t fetch_slot_bytes = 0;
  std::string fetch_namespace;
  std::optional<std::array<std::uint8_t, kFetchDigestBytes>> fetch_fingerprint;
  std::vector<FetchKey> fetch_keys;
  // Scattered slots (flag bit 1): key i lands at fetch_slot_offsets[i]; empty:
  // at fetch_region_offset + i x fetch_slot_bytes.
  std::vector<std::uint64_t> fetch_slot_offsets;
  // Layer range (flag bit 2): fetch_layer_count 0 means whole blocks.
  std::uint32_t fetch_first_layer = 0;
  std::uint32_t fetch_layer_count = 0;
  // Flag bit 3: check each key's bytes where they landed, where the daemon
  // can (FetchKeyResult::landing_checked).
  bool fetch_check_landing = false;
  // kFetchReply and kStoreReply.
  std::vector<FetchKeyResult> fetch_results;
  // kStore (its namespace is fetch_namespace).
  std::uint32_t store_ttl_ms = 0;
  StoreShape store_shape;
  std::vector<StoreEntry> store_entries;
  // kChallenge (the nonce) and kHello (the proof; lease_id is the session id).
  std::array<std::uint8_t, kHelloBytes> hello{};
};

// What a kHello proof authenticates: a domain label, the daemon's nonce and
// the session id (little-endian), so a proof is good for one connection of
// one session only.
std::string HelloProofInput(const std::array<std::uint8_t, kHelloBytes>& nonce,
                            std::uint64_t session_id);

// InvalidArgument for a message that breaks the layout's bounds (too many
// ranges or keys, an empty or oversized chunk, a chunk past total_bytes, slots
// that wrap, ...). A reply message longer than its limit is truncated, not
// refused.
StatusOr<std::string> EncodeTransferMessage(const TransferMessage& message);

// InvalidArgument naming the first check that failed.
StatusOr<TransferMessage> DecodeTransferMessage(std::span<const std::byte> bytes);

}  // namespace kvfabric::wire

#endif  // KVFABRIC_PROTO_TRANSFER_WIRE_H_
