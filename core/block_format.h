// The on-disk and on-the-wire format of one KV-cache block: a fixed 128-byte
// header followed by a layer-major payload and (format version 2) a table of
// one CRC32C per layer slice. The byte-level specification, with
// the table of offsets, the enum values and the versioning rule, is
// docs/block-format.md; this file and that page must agree.
//
// Payload layout (exact representation): layer l occupies
//   [l * layer_bytes, (l + 1) * layer_bytes),
//   layer_bytes = 2 * tokens * kv_heads * head_dim * dtype_size,
// so one layer is a contiguous range a client can stream on its own. Inside a
// layer the keys (K) come first and then the values (V), each
//   tokens * kv_heads * head_dim * dtype_size bytes,
// indexed token-major, then head, then dim: element (t, h, d) of K in layer l is
// at byte l * layer_bytes + ((t * kv_heads + h) * head_dim + d) * dtype_size, and
// the same element of V is layer_bytes / 2 further on. Elements are stored in the
// engine's native little-endian encoding of `dtype`.
//
// The header is encoded field by field in little-endian order (never by copying
// a struct), carries a masked CRC32C of the payload and a masked CRC32C of
// itself, and every size in it is validated with overflow-checked arithmetic
// before anything trusts it: headers arrive from disk and from the network.
//
// Thread safety: the functions are pure; BlockHeader is a plain value.
#ifndef KVFABRIC_CORE_BLOCK_FORMAT_H_
#define KVFABRIC_CORE_BLOCK_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Size of the encoded header, in every format version (see the versioning rule
// in docs/block-format.md).
inline constexpr std::size_t kBlockHeaderBytes = 128;

// The first four header bytes: ASCII "KVFB".
inline constexpr std::array<std::uint8_t, 4> kBlockMagic = {'K', 'V', 'F', 'B'};

// The format version this build writes. Version 2 adds the layer CRC table
// after the payload (a layer slice can be verified on its own, so a reader can
// use layer 0 while later layers are still on their way); version 1 blocks
// (no table) are still read, their layer CRCs computed from the payload.
inline constexpr std::uint16_t kBlockFormatVersion = 2;
inline constexpr std::uint16_t kOldestReadableBlockFormatVersion = 1;

// Most layers one block may cover: 1024 (4 KiB of layer CRCs). Models have at
// most a few hundred; the bound keeps the table a header can ask a reader to
// hold small.
inline constexpr std::uint32_t kMaxBlockLayers = 1024;

// Largest payload a valid block may carry: 64 MiB. The largest realistic block
// (e.g. 128 layers x 2 x 16 tokens x 8 kv heads x 128 dims x fp32 = 32 MiB)
// fits with room to spare, and a reader can allocate this much on the word of a
// header without being talked into an absurd allocation.
inline constexpr std::uint64_t kMaxBlockPayloadBytes = std::uint64_t{64} << 20;

// How the payload represents the engine's tensors. Values are on disk and on
// the wire: numbered explicitly, never renumbered; 0 is never valid.
enum class BlockRepresentation : std::uint8_t {
  // Bit-identical to what the engine wrote; payload size follows exactly from
  // the shape and dtype.
  kExact = 1,
  // Lossy int8 per-channel encoding with scales. This format fixes only the
  // container (equal layer slices, K half then V half); the encoding inside
  // each half and its error bound belong to the compact codec's specification.
  kCompactInt8 = 2,
};

// "exact", "compact_int8"; "unknown" for other values.
std::string_view BlockRepresentationName(BlockRepresentation representation);

// Flag bits. Format version 1 defines none: a writer sets 0 and a reader
// rejects any set bit, so a later flag can never be silently ignored.
inline constexpr std::uint32_t kKnownBlockFlags = 0;

// An opaque 32-byte digest (the BlockKey, the ModelFingerprint digest). This
// file does not interpret them; core/block_key.h defines how they are computed.
using BlockDigest = std::array<std::uint8_t, 32>;

// The decoded header of one block. A plain value; ValidateBlockHeader() says
// whether it describes a block this build can read.
struct BlockHeader {
  std::uint16_t format_version = kBlockFormatVersion;
  BlockRepresentation representation = BlockRepresentation::kExact;
  // Element type of the engine's KV tensors (for a compact block, the type the
  // codec decodes to): core/model_fingerprint.h's KvDtype, the numbering that
  // docs/block-key.md hashes into every key. The header stores it in one byte;
  // ValidateBlockHeader() refuses a value that names no KvDtype or would not fit
  // (no KvDtype is above 255), so it is never truncated.
  KvDtype dtype = KvDtype::kFp16;
  std::uint32_t flags = 0;
  BlockDigest key{};
  BlockDigest fingerprint{};
  std::uint32_t layers = 0;    // Layers of the layer group this block covers.
  std::uint32_t tokens = 0;    // Tokens in the block (tokens_per_block).
  std::uint32_t kv_heads = 0;  // KV heads held by this TP rank.
  std::uint32_t head_dim = 0;  // Elements per head.
  std::uint64_t payload_bytes = 0;
  // CRC32C of the payload, unmasked (the encoding stores it masked).
  std::uint32_t payload_crc32c = 0;

  friend bool operator==(const BlockHeader&, const BlockHeader&) = default;
};

// Returns layers x 2 x tokens x kv_heads x head_dim x dtype_size, the payload
// size of an exact block of that shape.
// Returns InvalidArgument if any dimension is zero, the dtype names no KvDtype (or
// does not fit the header's dtype byte), the product overflows 64 bits, or it
// exceeds kMaxBlockPayloadBytes.
StatusOr<std::uint64_t> ExactPayloadBytes(KvDtype dtype, std::uint32_t layers, std::uint32_t tokens,
                                          std::uint32_t kv_heads, std::uint32_t head_dim);

// Returns OK if `header` describes a block this build can read and lay out:
// FailedPrecondition for a format version outside
// [kOldestReadableBlockFormatVersion, kBlockFormatVersion];
// InvalidArgument for an unknown representation or dtype, unknown flag bits, a
// zero dimension, more than kMaxBlockLayers layers, or a payload size that is zero, above
// kMaxBlockPayloadBytes, or not what the shape requires (exact: ExactPayloadBytes(); compact: a
// multiple of 2 x layers, so that layers and halves split evenly).
// Does not look at the CRC fields.
Status ValidateBlockHeader(const BlockHeader& header);

// Encodes `header` into `out` (little-endian, reserved bytes zero, payload CRC
// and header CRC masked). Returns ValidateBlockHeader()'s error, leaving `out`
// untouched, if the header is not valid: a writer never emits a header that a
// reader would refuse.
Status EncodeBlockHeader(const BlockHeader& header, std::span<std::byte, kBlockHeaderBytes> out);

// Decodes the header in the first kBlockHeaderBytes of `in` (a span holding a
// whole block is fine). Checks, in this order:
//   DataLoss: fewer than kBlockHeaderBytes; bad magic; header CRC mismatch
//     (so a torn or bit-flipped header is always DataLoss);
//   FailedPrecondition: a format version this build does not read;
//   DataLoss: a nonzero reserved byte;
//   then ValidateBlockHeader().
// On success every size in the result has been checked against the shape and
// kMaxBlockPayloadBytes. The payload itself is checked by VerifyPayload().
StatusOr<BlockHeader> DecodeBlockHeader(std::span<const std::byte> in);

// A byte range of the payload (offsets relative to the payload's first byte,
// which follows the header).
struct PayloadSlice {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;

  friend bool operator==(const PayloadSlice&, const PayloadSlice&) = default;
};

// The range of layer `layer`'s K and V: [layer * layer_bytes, +layer_bytes).
// Returns ValidateBlockHeader()'s error for an invalid header, and OutOfRange
// when layer >= header.layers.
StatusOr<PayloadSlice> LayerSlice(const BlockHeader& header, std::uint32_t layer);
// The first half of LayerSlice(): the keys of layer `layer`. Errors as LayerSlice.
StatusOr<PayloadSlice> KeySlice(const BlockHeader& header, std::uint32_t layer);
// The second half of LayerSlice(): the values of layer `layer`. Errors as LayerSlice.
StatusOr<PayloadSlice> ValueSlice(const BlockHeader& header, std::uint32_t layer);

// Checks `payload` against `header`: returns ValidateBlockHeader()'s error for
// an invalid header, DataLoss "payload size mismatch" when payload.size() !=
// header.payload_bytes, and DataLoss "payload CRC mismatch: stored 0x...
// computed 0x..." when the CRC32C differs.
Status VerifyPayload(const BlockHeader& header, std::span<const std::byte> payload);

// ---- Layer CRCs (format version 2) ----
// A version 2 block is stored as header, payload, then the layer CRC table:
// `layers` u32, entry l the masked CRC32C of LayerSlice(l). The table is tied
// to the header: folding its CRCs in order (crc32c::Combine) gives the
// header's payload_crc32c, so a table that disagrees with its header is
// DataLoss, and every layer checked against its entry means the payload is
// the one the header's CRC names.

// Bytes of the layer CRC table: 4 x layers for version 2, 0 for version 1.
// REQUIRES: ValidateBlockHeader(header).ok().
std::uint64_t LayerCrcTableBytes(const BlockHeader& header);
// Header, payload and layer CRC table: the bytes a block occupies when stored.
// REQUIRES: ValidateBlockHeader(header).ok().
std::uint64_t BlockRecordBytes(const BlockHeader& header);

// The CRC32C of layer slices [first, first + count) as one byte range, from
// the slices' CRCs `layer_crcs` (no bytes read): what a reader of that range
// checks it against. OutOfRange when the range leaves `layer_crcs`.
StatusOr<std::uint32_t> LayerRangeCrc(std::span<const std::uint32_t> layer_crcs,
                                      std::uint64_t layer_bytes, std::uint32_t first,
                                      std::uint32_t count);

// Computes each layer slice's CRC32C of `payload` into `out` (one pass) and
// checks that they fold to header.payload_crc32c: VerifyPayload()'s errors,
// and InvalidArgument if out.size() != header.layers.
Status ComputeLayerCrcs(const BlockHeader& header, std::span<const std::byte> payload,
                        std::span<std::uint32_t> out);

// Writes the layer CRC table of `header` (version 2) into `out`
// (LayerCrcTableBytes() bytes). InvalidArgument for a version 1 header, a
// wrong count or size, or CRCs that do not fold to header.payload_crc32c.
Status EncodeLayerCrcTable(const BlockHeader& header, std::span<const std::uint32_t> layer_crcs,
                           std::span<std::byte> out);

// Checks a stored block's body (payload, then for version 2 its layer CRC
// table) against `header` and fills `layer_crcs` (header.layers entries; may
// be empty to skip) with each layer's CRC. DataLoss when the body's size is
// not payload + table, a table entry differs from its slice (naming the
// layer), or the payload's CRC differs from the header's; version 1 bodies
// are checked as VerifyPayload() does, their layer CRCs computed.
Status VerifyBlockBody(const BlockHeader& header, std::span<const std::byte> body,
                       std::span<std::uint32_t> layer_crcs);

// Sets header->payload_bytes and header->payload_crc32c from `payload`, then
// validates. On error (ValidateBlockHeader()'s, e.g. a payload whose size does
// not match the shape) *header is left unchanged.
// REQUIRES: header != nullptr.
Status SealBlock(BlockHeader* header, std::span<const std::byte> payload);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_BLOCK_FORMAT_H_
