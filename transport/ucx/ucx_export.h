// The wire encoding of an exported UCX memory range (MemoryRegion::Export ->
// Endpoint::ImportRegion in transport/ucx/ucx_transport.h).
//
// Layout, version 2, all integers little-endian:
//   offset  size  field
//        0     4  magic "KVFU"
//        4     1  version (2)
//        5     1  memory kind (transport::MemoryKind)
//        6     2  reserved, zero
//        8     8  remote base address of the range (registration base + offset)
//       16     8  length of the range in bytes
//       24     8  grant id: names the exported range to its owner, which
//                 places owner-placed kRead/kWrite (transport/ucx/ucx_am_rma.h)
//                 after bounds-checking them against the range it granted
//       32     4  length N of the packed remote key (1 .. kMaxPackedRkeyBytes)
//       36     N  packed remote key (ucp_rkey_pack)
//     36+N     4  CRC32C (masked) of bytes [0, 36+N)
// Version 1 (no grant id) is not read any more: its importer would use UCX's
// emulated get/put, which the owner cannot bounds-check. The encoding is
// exact: trailing bytes are an error. Pure functions, no UCX calls;
// thread-safe.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_EXPORT_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_EXPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/statusor.h"
#include "transport/transport.h"

namespace kvfabric::ucx {

inline constexpr std::uint8_t kExportVersion = 2;
// UCX 1.13 packs a key in well under 1 KiB per memory domain; this bounds
// what an importer accepts from a peer.
inline constexpr std::size_t kMaxPackedRkeyBytes = 16 * 1024;

struct ExportedRange {
  transport::MemoryKind kind = transport::MemoryKind::kHost;
  std::uint64_t address = 0;  // remote virtual address of the first byte
  std::uint64_t length = 0;
  std::uint64_t grant_id = 0;  // the owner's name for this range (never 0 when exported)
  std::string packed_rkey;     // opaque to us
};

// REQUIRES: 0 < packed_rkey.size() <= kMaxPackedRkeyBytes.
std::string EncodeExportedRange(const ExportedRange& range);

// InvalidArgument (saying which check failed) for anything that is not exactly
// one well-formed version-2 encoding: short or long input, wrong magic,
// unknown version or kind, non-zero reserved bits, a key length out of range,
// address + length overflowing 64 bits, or a CRC mismatch.
StatusOr<ExportedRange> DecodeExportedRange(std::string_view bytes);

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_EXPORT_H_
