// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum every
// kvfabric block carries for its payload and header, on disk and on the wire.
//
// Extend() and Value() fold inputs of 1 KiB and more by carry-less
// multiplication (VPCLMULQDQ on 512-bit registers) when the CPU has AVX-512
// and VPCLMULQDQ, use the SSE4.2 `crc32` instruction otherwise (and for short
// inputs) when the CPU has it, and a portable slicing-by-8 table elsewhere
// (decided once, at first use). Every path produces identical values, so a
// block written on one machine verifies on any other. Non-x86-64 builds compile only the portable
// path.
//
// Conventions follow LevelDB's util/crc32c.h: Value(data, n) is the standard
// CRC32C of the bytes (initial value and final XOR 0xFFFFFFFF), and
// Extend(Value(a), b) == Value(a ++ b).
//
// Thread safety: every function is pure and may be called from any thread.
#ifndef KVFABRIC_CORE_CRC32C_H_
#define KVFABRIC_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvfabric::crc32c {

// Returns the CRC32C of concat(A, data[0, n)) where `crc` is the CRC32C of
// some byte string A. Extend(0, data, n) == Value(data, n).
// REQUIRES: data points to n readable bytes (data may be null when n == 0).
std::uint32_t Extend(std::uint32_t crc, const void* data, std::size_t n);

// Returns the CRC32C of data[0, n).
inline std::uint32_t Value(const void* data, std::size_t n) { return Extend(0, data, n); }

inline std::uint32_t Value(std::span<const std::byte> bytes) {
  return Extend(0, bytes.data(), bytes.size());
}

inline std::uint32_t Extend(std::uint32_t crc, std::span<const std::byte> bytes) {
  return Extend(crc, bytes.data(), bytes.size());
}

// Copies n bytes from src to dst (the ranges must not overlap, as for
// std::memcpy) and returns Extend(crc, dst, n): the CRC of the bytes it
// stored, in one pass: each piece is loaded once into a register, stored
// from it and fed to the CRC from it, so the CRC covers exactly the values
// the store instructions wrote and neither side is read twice. Where the CPU
// folds (FoldingAvailable()) and n is at least 1 KiB, 64-byte registers
// folded by VPCLMULQDQ; elsewhere with the `crc32` instruction
// (HardwareAvailable()), 8-byte registers in three interleaved chains.
// Without either (not x86-64), pieces of kCopyPieceBytes are copied with
// std::memcpy and each read back while it is still in this core's cache.
// With `streaming`, the one-pass stores bypass the caches (non-temporal,
// fenced before return, as core/stream_copy.h), for a destination not read
// again soon.
std::uint32_t ExtendCopy(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                         bool streaming);

// Bytes ExtendCopy's read-back path copies before reading them back: well
// inside a core's L2 (and near its L1), so the read-back hits cache.
inline constexpr std::size_t kCopyPieceBytes = std::size_t{64} << 10;

// Returns the CRC32C of concat(A, B) from crc_a = Value(A), crc_b = Value(B)
// and B's length, without reading the bytes: O(log len_b) carry-less
// multiplications modulo the polynomial, about a microsecond. Lets a block's
// whole-payload CRC be derived from its per-layer CRCs (core/block_format.h).
std::uint32_t Combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b);

// Combine() split in two, for folding many pieces of one length:
// CombineShifted(a, b, ShiftFor(n)) == Combine(a, b, n), and costs one
// multiplication (ShiftFor() is the O(log n) part).
std::uint32_t ShiftFor(std::uint64_t len_b);
std::uint32_t CombineShifted(std::uint32_t crc_a, std::uint32_t crc_b, std::uint32_t shift);

// Computing the CRC of a string that contains embedded CRCs tends to give
// degenerate results (the CRC of data followed by its own CRC is a constant),
// so a CRC stored next to the data it covers is stored masked. Same rotation
// and constant as LevelDB, which makes the stored values interoperable with
// tools that know LevelDB's masking.
inline constexpr std::uint32_t kMaskDelta = 0xa282ead8u;

// Returns the masked representation of `crc`.
inline constexpr std::uint32_t Mask(std::uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

// Returns the CRC whose masked representation is `masked_crc`.
inline constexpr std::uint32_t Unmask(std::uint32_t masked_crc) {
  const std::uint32_t rot = masked_crc - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

// Both implementations, exposed so tests can compare them. Production code
// calls Extend(), which dispatches.
namespace internal {

// Slicing-by-8 table implementation; runs everywhere.
std::uint32_t ExtendPortable(std::uint32_t crc, const void* data, std::size_t n);

// True when this build has a hardware path and the CPU supports it
// (x86-64 with SSE4.2).
bool HardwareAvailable();

// True when this build has the folding path and the CPU supports it
// (x86-64 with SSE4.2, PCLMULQDQ, AVX-512F and VPCLMULQDQ, and an OS that
// saves the AVX-512 registers).
bool FoldingAvailable();

// Carry-less-multiplication folding (VPCLMULQDQ over 512-bit registers) for
// inputs of kFoldMinBytes (1 KiB) or more, the SSE4.2 path below that.
// REQUIRES: FoldingAvailable().
std::uint32_t ExtendFolding(std::uint32_t crc, const void* data, std::size_t n);

// SSE4.2 implementation (the `crc32` instruction only).
// REQUIRES: HardwareAvailable(). (On builds without a hardware path this
// forwards to ExtendPortable, so callers never execute an illegal instruction.)
std::uint32_t ExtendHardware(std::uint32_t crc, const void* data, std::size_t n);

// ExtendCopy's three paths, exposed so tests and benchmarks can compare them.
// REQUIRES: FoldingAvailable().
std::uint32_t ExtendCopyFolding(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                                bool streaming);
// REQUIRES: HardwareAvailable() (forwards to ExtendCopyReadBack on builds
// without a hardware path).
std::uint32_t ExtendCopyHardware(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                                 bool streaming);
std::uint32_t ExtendCopyReadBack(std::uint32_t crc, void* dst, const void* src, std::size_t n);

}  // namespace internal
}  // namespace kvfabric::crc32c

#endif  // KVFABRIC_CORE_CRC32C_H_
