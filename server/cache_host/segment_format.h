// The on-disk format of NVMe-tier segment files, apart from the blocks
// themselves (core/block_format.h): file names, the segment header, and the
// tombstone that marks a removed block. docs/nvme-tier.md is the byte-level
// specification; this file and that page must agree.
//
// A segment file is
//   [segment header: one alignment unit]
//   [record][record]...            each record starts on an alignment boundary
// and a record is either a block (128-byte block header, payload, zero padding
// to the next boundary) or a tombstone over the first alignment unit of a
// removed block's record (the rest of the record is left as it was).
//
// Every integer is little-endian, encoded field by field; each structure
// carries a masked CRC32C of its own bytes. Decoders validate everything before
// trusting a size: segments are read back after crashes and media errors.
//
// Thread safety: the functions are pure.
#ifndef KVFABRIC_SERVER_CACHE_HOST_SEGMENT_FORMAT_H_
#define KVFABRIC_SERVER_CACHE_HOST_SEGMENT_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/block_format.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::cache_host {

// The segment format version this build writes and reads.
inline constexpr uint16_t kSegmentFormatVersion = 1;

// Bytes of the encoded segment header and tombstone (their CRC included); each
// occupies the start of an alignment unit whose remaining bytes are zero.
inline constexpr size_t kSegmentHeaderBytes = 36;
inline constexpr size_t kTombstoneBytes = 60;

// First bytes of a segment header and of a tombstone. A block record starts
// with "KVFB" (kBlockMagic), so the three never match one another.
inline constexpr std::array<uint8_t, 8> kSegmentMagic = {'K', 'V', 'F', 'S', 'E', 'G', 'M', 'T'};
inline constexpr std::array<uint8_t, 8> kTombstoneMagic = {'K', 'V', 'F', 'D', 'E', 'A', 'D', '!'};

struct SegmentHeader {
  uint64_t segment_id = 0;
  // The alignment unit records were written with (Env::DirectIoAlignment()).
  uint32_t alignment = 0;
  // When the segment was created, for operators (Env::WallMicros()).
  uint64_t created_wall_micros = 0;

  friend bool operator==(const SegmentHeader&, const SegmentHeader&) = default;
};

// Marks the record at its offset as removed; `record_bytes` (padded) lets a
// recovery scan skip the whole record.
struct Tombstone {
  uint64_t record_bytes = 0;
  BlockDigest key{};  // the removed block's key, for diagnostics; zero if unknown

  friend bool operator==(const Tombstone&, const Tombstone&) = default;
};

// Rounds `n` up to a multiple of `alignment` (a power of two).
constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

// "segment-<16 lowercase hex digits>.kvfseg".
std::string SegmentFileName(uint64_t segment_id);
// The id in a name SegmentFileName() produced; nullopt for any other name.
std::optional<uint64_t> ParseSegmentFileName(std::string_view name);

// Encode into the first bytes of `out` (which the caller has zeroed).
// REQUIRES: out.size() >= kSegmentHeaderBytes (resp. kTombstoneBytes).
void EncodeSegmentHeader(const SegmentHeader& header, std::span<std::byte> out);
void EncodeTombstone(const Tombstone& tombstone, std::span<std::byte> out);

// DataLoss for a short input, bad magic, a CRC mismatch or a nonzero reserved
// field; FailedPrecondition for another version; InvalidArgument for an
// alignment that is not a power of two of at least 512 bytes.
StatusOr<SegmentHeader> DecodeSegmentHeader(std::span<const std::byte> in);
// DataLoss as above, and for a record size that is zero or not a multiple of
// `alignment`.
StatusOr<Tombstone> DecodeTombstone(std::span<const std::byte> in, uint64_t alignment);

// True if `in` starts with the tombstone magic (whether or not it is valid).
bool HasTombstoneMagic(std::span<const std::byte> in);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_SEGMENT_FORMAT_H_
