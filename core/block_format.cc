#include "core/block_format.h"

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/model_fingerprint.h"

namespace kvfabric {
namespace {

// Field offsets; docs/block-format.md has the same table.
constexpr std::size_t kOffMagic = 0;           // 4 bytes
constexpr std::size_t kOffVersion = 4;         // u16
constexpr std::size_t kOffRepresentation = 6;  // u8
constexpr std::size_t kOffDtype = 7;           // u8
constexpr std::size_t kOffFlags = 8;           // u32
constexpr std::size_t kOffLayers = 12;         // u32
constexpr std::size_t kOffTokens = 16;         // u32
constexpr std::size_t kOffKvHeads = 20;        // u32
constexpr std::size_t kOffHeadDim = 24;        // u32
constexpr std::size_t kOffPayloadCrc = 28;     // u32, masked
constexpr std::size_t kOffPayloadBytes = 32;   // u64
constexpr std::size_t kOffKey = 40;            // 32 bytes
constexpr std::size_t kOffFingerprint = 72;    // 32 bytes
constexpr std::size_t kOffReserved = 104;      // 20 bytes, zero
constexpr std::size_t kOffHeaderCrc = 124;     // u32, masked, over [0, 124)
static_assert(kOffKey + 32 == kOffFingerprint);
static_assert(kOffFingerprint + 32 == kOffReserved);
static_assert(kOffHeaderCrc + 4 == kBlockHeaderBytes);

void PutU8(std::byte* p, std::uint8_t v) { p[0] = static_cast<std::byte>(v); }

void PutU16(std::byte* p, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

void PutU32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

void PutU64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint8_t GetU8(const std::byte* p) { return std::to_integer<std::uint8_t>(p[0]); }

std::uint16_t GetU16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<std::uint16_t>(p[0]) |
                                    (std::to_integer<std::uint16_t>(p[1]) << 8));
}

std::uint32_t GetU32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<std::uint32_t>(p[i]) << (8 * i);
  return v;
}

std::uint64_t GetU64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string Hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// "4b 56 46 42".
std::string HexBytes(const std::byte* p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof(buf), "%02x", std::to_integer<unsigned>(p[i]));
    if (i > 0) out += ' ';
    out += buf;
  }
  return out;
}

std::string Num(std::uint64_t v) { return std::to_string(v); }

// Multiplies into *acc; false on 64-bit overflow (then *acc is unspecified).
bool MulChecked(std::uint64_t* acc, std::uint64_t factor) {
  return !__builtin_mul_overflow(*acc, factor, acc);
}

std::string ShapeString(const BlockHeader& h) {
  return "layers=" + Num(h.layers) + " tokens=" + Num(h.tokens) + " kv_heads=" + Num(h.kv_heads) +
         " head_dim=" + Num(h.head_dim) + " dtype=" + std::string(KvDtypeName(h.dtype));
}

Status UnsupportedVersion(std::uint16_t version) {
  return Status::FailedPrecondition(
      "unsupported block format version " + Num(version) + " (this build reads versions " +
      Num(kOldestReadableBlockFormatVersion) + " to " + Num(kBlockFormatVersion) + ")");
}

bool ReadableVersion(std::uint16_t version) {
  return version >= kOldestReadableBlockFormatVersion && version <= kBlockFormatVersion;
}

// OK if `dtype` names a KvDtype whose number fits the header's u8 dtype byte,
// so that EncodeBlockHeader() never truncates it; InvalidArgument otherwise.
Status CheckDtype(KvDtype dtype) {
  const auto code = static_cast<std::uint32_t>(dtype);
  if (KvDtypeSize(dtype) == 0) {
    return Status::InvalidArgument("unknown block dtype " + Num(code));
  }
  if (code > std::numeric_limits<std::uint8_t>::max()) {
    return Status::InvalidArgument("block dtype " + Num(code) + " (" +
                                   std::string(KvDtypeName(dtype)) +
                                   ") does not fit the header's one-byte dtype field");
  }
  return Status::OK();
}

// Layer slice size of a header that passed ValidateBlockHeader().
std::uint64_t LayerBytes(const BlockHeader& h) { return h.payload_bytes / h.layers; }

}  // namespace

std::string_view BlockRepresentationName(BlockRepresentation representation) {
  switch (representation) {
    case BlockRepresentation::kExact:
      return "exact";
    case BlockRepresentation::kCompactInt8:
      return "compact_int8";
  }
  return "unknown";
}

StatusOr<std::uint64_t> ExactPayloadBytes(KvDtype dtype, std::uint32_t layers, std::uint32_t tokens,
                                          std::uint32_t kv_heads, std::uint32_t head_dim) {
  KVF_RETURN_IF_ERROR(CheckDtype(dtype));
  const std::uint32_t dtype_size = KvDtypeSize(dtype);
  if (layers == 0 || tokens == 0 || kv_heads == 0 || head_dim == 0) {
    return Status::InvalidArgument("block shape has a zero dimension: layers=" + Num(layers) +
                                   " tokens=" + Num(tokens) + " kv_heads=" + Num(kv_heads) +
                                   " head_dim=" + Num(head_dim));
  }
  std::uint64_t bytes = layers;
  const bool fits = MulChecked(&bytes, 2) && MulChecked(&bytes, tokens) &&
                    MulChecked(&bytes, kv_heads) && MulChecked(&bytes, head_dim) &&
                    MulChecked(&bytes, dtype_size);
  if (!fits || bytes > kMaxBlockPayloadBytes) {
    return Status::InvalidArgument(
        "block of layers=" + Num(layers) + " x 2 x tokens=" + Num(tokens) +
        " x kv_heads=" + Num(kv_heads) + " x head_dim=" + Num(head_dim) + " x " + Num(dtype_size) +
        " bytes (" + std::string(KvDtypeName(dtype)) + ") " +
        (fits ? "= " + Num(bytes) + " bytes" : std::string("overflows 64 bits")) +
        ", above kMaxBlockPayloadBytes " + Num(kMaxBlockPayloadBytes));
  }
  return bytes;
}

namespace {
Status ValidateShape(const BlockHeader& h);
}  // namespace

Status ValidateBlockHeader(const BlockHeader& h) {
  if (!ReadableVersion(h.format_version)) {
    return UnsupportedVersion(h.format_version);
  }
  if ((h.flags & ~kKnownBlockFlags) != 0) {
    return Status::InvalidArgument("unknown block flag bits " + Hex32(h.flags & ~kKnownBlockFlags));
  }
  KVF_RETURN_IF_ERROR(ValidateShape(h));
  if (h.layers > kMaxBlockLayers) {
    return Status::InvalidArgument("block of " + Num(h.layers) + " layers, more than " +
                                   Num(kMaxBlockLayers) + " (kMaxBlockLayers)");
  }
  return Status::OK();
}

namespace {
Status ValidateShape(const BlockHeader& h) {
  switch (h.representation) {
    case BlockRepresentation::kExact: {
      KVF_ASSIGN_OR_RETURN(const std::uint64_t expected,
                           ExactPayloadBytes(h.dtype, h.layers, h.tokens, h.kv_heads, h.head_dim));
      if (h.payload_bytes != expected) {
        return Status::InvalidArgument("exact block payload_bytes " + Num(h.payload_bytes) +
                                       " disagrees with its shape (" + ShapeString(h) + " needs " +
                                       Num(expected) + " bytes)");
      }
      return Status::OK();
    }
    case BlockRepresentation::kCompactInt8: {
      KVF_RETURN_IF_ERROR(CheckDtype(h.dtype));
      if (h.layers == 0 || h.tokens == 0 || h.kv_heads == 0 || h.head_dim == 0) {
        return Status::InvalidArgument("block shape has a zero dimension: " + ShapeString(h));
      }
      if (h.payload_bytes == 0 || h.payload_bytes > kMaxBlockPayloadBytes) {
        return Status::InvalidArgument("compact block payload_bytes " + Num(h.payload_bytes) +
                                       " outside [1, kMaxBlockPayloadBytes " +
                                       Num(kMaxBlockPayloadBytes) + "]");
      }
      // layers >= 1 and payload_bytes <= 2^26, so 2 * layers cannot overflow.
      if (h.payload_bytes % (std::uint64_t{2} * h.layers) != 0) {
        return Status::InvalidArgument("compact block payload_bytes " + Num(h.payload_bytes) +
                                       " is not a multiple of 2 x layers (" + Num(h.layers) + ")");
      }
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown block representation " +
                                 Num(static_cast<std::uint8_t>(h.representation)));
}

}  // namespace

Status EncodeBlockHeader(const BlockHeader& h, std::span<std::byte, kBlockHeaderBytes> out) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(h));
  std::byte* p = out.data();
  for (std::size_t i = 0; i < kBlockHeaderBytes; ++i) p[i] = std::byte{0};
  for (std::size_t i = 0; i < kBlockMagic.size(); ++i) PutU8(p + kOffMagic + i, kBlockMagic[i]);
  PutU16(p + kOffVersion, h.format_version);
  PutU8(p + kOffRepresentation, static_cast<std::uint8_t>(h.representation));
  // Checked narrowing: ValidateBlockHeader() above refused a dtype above 255.
  PutU8(p + kOffDtype, static_cast<std::uint8_t>(h.dtype));
  PutU32(p + kOffFlags, h.flags);
  PutU32(p + kOffLayers, h.layers);
  PutU32(p + kOffTokens, h.tokens);
  PutU32(p + kOffKvHeads, h.kv_heads);
  PutU32(p + kOffHeadDim, h.head_dim);
  PutU32(p + kOffPayloadCrc, crc32c::Mask(h.payload_crc32c));
  PutU64(p + kOffPayloadBytes, h.payload_bytes);
  for (std::size_t i = 0; i < 32; ++i) {
    PutU8(p + kOffKey + i, h.key[i]);
    PutU8(p + kOffFingerprint + i, h.fingerprint[i]);
  }
  PutU32(p + kOffHeaderCrc, crc32c::Mask(crc32c::Value(p, kOffHeaderCrc)));
  return Status::OK();
}

StatusOr<BlockHeader> DecodeBlockHeader(std::span<const std::byte> in) {
  if (in.size() < kBlockHeaderBytes) {
    return Status::DataLoss("block header truncated: " + Num(in.size()) + " bytes, need " +
                            Num(kBlockHeaderBytes));
  }
  const std::byte* p = in.data();
  for (std::size_t i = 0; i < kBlockMagic.size(); ++i) {
    if (GetU8(p + kOffMagic + i) != kBlockMagic[i]) {
      return Status::DataLoss("bad block magic: bytes " + HexBytes(p + kOffMagic, 4) +
                              ", want 4b 56 46 42 (\"KVFB\")");
    }
  }
  const std::uint32_t stored_crc = crc32c::Unmask(GetU32(p + kOffHeaderCrc));
  const std::uint32_t computed_crc = crc32c::Value(p, kOffHeaderCrc);
  if (stored_crc != computed_crc) {
    return Status::DataLoss("block header CRC mismatch: stored " + Hex32(stored_crc) +
                            " computed " + Hex32(computed_crc));
  }
  BlockHeader h;
  h.format_version = GetU16(p + kOffVersion);
  if (!ReadableVersion(h.format_version)) {
    return UnsupportedVersion(h.format_version);
  }
  for (std::size_t off = kOffReserved; off < kOffHeaderCrc; ++off) {
    if (GetU8(p + off) != 0) {
      return Status::DataLoss("nonzero reserved block header byte at offset " + Num(off) + ": " +
                              Num(GetU8(p + off)));
    }
  }
  // Enum values are carried through as raw numbers; ValidateBlockHeader rejects
  // the unknown ones before anything switches on them.
  h.representation = static_cast<BlockRepresentation>(GetU8(p + kOffRepresentation));
  h.dtype = static_cast<KvDtype>(GetU8(p + kOffDtype));
  h.flags = GetU32(p + kOffFlags);
  h.layers = GetU32(p + kOffLayers);
  h.tokens = GetU32(p + kOffTokens);
  h.kv_heads = GetU32(p + kOffKvHeads);
  h.head_dim = GetU32(p + kOffHeadDim);
  h.payload_crc32c = crc32c::Unmask(GetU32(p + kOffPayloadCrc));
  h.payload_bytes = GetU64(p + kOffPayloadBytes);
  for (std::size_t i = 0; i < 32; ++i) {
    h.key[i] = GetU8(p + kOffKey + i);
    h.fingerprint[i] = GetU8(p + kOffFingerprint + i);
  }
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(h));
  return h;
}

StatusOr<PayloadSlice> LayerSlice(const BlockHeader& header, std::uint32_t layer) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(header));
  if (layer >= header.layers) {
    return Status::OutOfRange("layer " + Num(layer) + " out of range for a block of " +
                              Num(header.layers) + " layers");
  }
  // Validated: payload_bytes <= kMaxBlockPayloadBytes and layer < layers, so
  // the product stays below payload_bytes.
  const std::uint64_t layer_bytes = LayerBytes(header);
  return PayloadSlice{layer * layer_bytes, layer_bytes};
}

StatusOr<PayloadSlice> KeySlice(const BlockHeader& header, std::uint32_t layer) {
  KVF_ASSIGN_OR_RETURN(const PayloadSlice slice, LayerSlice(header, layer));
  return PayloadSlice{slice.offset, slice.bytes / 2};
}

StatusOr<PayloadSlice> ValueSlice(const BlockHeader& header, std::uint32_t layer) {
  KVF_ASSIGN_OR_RETURN(const PayloadSlice slice, LayerSlice(header, layer));
  return PayloadSlice{slice.offset + slice.bytes / 2, slice.bytes / 2};
}

Status VerifyPayload(const BlockHeader& header, std::span<const std::byte> payload) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(header));
  if (payload.size() != header.payload_bytes) {
    return Status::DataLoss("payload size mismatch: header says " + Num(header.payload_bytes) +
                            " bytes, got " + Num(payload.size()));
  }
  const std::uint32_t computed = crc32c::Value(payload);
  if (computed != header.payload_crc32c) {
    return Status::DataLoss("payload CRC mismatch: stored " + Hex32(header.payload_crc32c) +
                            " computed " + Hex32(computed));
  }
  return Status::OK();
}

Status SealBlock(BlockHeader* header, std::span<const std::byte> payload) {
  BlockHeader sealed = *header;
  sealed.payload_bytes = payload.size();
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(sealed));  // Before spending time on the CRC.
  sealed.payload_crc32c = crc32c::Value(payload);
  *header = sealed;
  return Status::OK();
}

// ---------------------------------------------------------------- layer CRCs

std::uint64_t LayerCrcTableBytes(const BlockHeader& header) {
  return header.format_version >= 2 ? std::uint64_t{4} * header.layers : 0;
}

std::uint64_t BlockRecordBytes(const BlockHeader& header) {
  return kBlockHeaderBytes + header.payload_bytes + LayerCrcTableBytes(header);
}

StatusOr<std::uint32_t> LayerRangeCrc(std::span<const std::uint32_t> layer_crcs,
                                      std::uint64_t layer_bytes, std::uint32_t first,
                                      std::uint32_t count) {
  if (count == 0 || first >= layer_crcs.size() || count > layer_crcs.size() - first) {
    return Status::OutOfRange("layers [" + Num(first) + ", " + Num(std::uint64_t{first} + count) +
                              ") of a block of " + Num(layer_crcs.size()) + " layers");
  }
  const std::uint32_t shift = crc32c::ShiftFor(layer_bytes);
  std::uint32_t crc = layer_crcs[first];
  for (std::uint32_t l = first + 1; l < first + count; ++l) {
    crc = crc32c::CombineShifted(crc, layer_crcs[l], shift);
  }
  return crc;
}

Status ComputeLayerCrcs(const BlockHeader& header, std::span<const std::byte> payload,
                        std::span<std::uint32_t> out) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(header));
  if (out.size() != header.layers) {
    return Status::InvalidArgument("room for " + Num(out.size()) + " layer CRCs, block has " +
                                   Num(header.layers) + " layers");
  }
  if (payload.size() != header.payload_bytes) {
    return Status::DataLoss("payload size mismatch: header says " + Num(header.payload_bytes) +
                            " bytes, got " + Num(payload.size()));
  }
  const std::uint64_t layer_bytes = LayerBytes(header);
  const std::uint32_t shift = crc32c::ShiftFor(layer_bytes);
  std::uint32_t whole = 0;
  for (std::uint32_t l = 0; l < header.layers; ++l) {
    out[l] = crc32c::Value(payload.subspan(l * layer_bytes, layer_bytes));
    whole = l == 0 ? out[l] : crc32c::CombineShifted(whole, out[l], shift);
  }
  if (whole != header.payload_crc32c) {
    return Status::DataLoss("payload CRC mismatch: stored " + Hex32(header.payload_crc32c) +
                            " computed " + Hex32(whole));
  }
  return Status::OK();
}

Status EncodeLayerCrcTable(const BlockHeader& header, std::span<const std::uint32_t> layer_crcs,
                           std::span<std::byte> out) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(header));
  if (header.format_version < 2) {
    return Status::InvalidArgument("format version " + Num(header.format_version) +
                                   " blocks carry no layer CRC table");
  }
  if (layer_crcs.size() != header.layers || out.size() != LayerCrcTableBytes(header)) {
    return Status::InvalidArgument("layer CRC table of " + Num(layer_crcs.size()) + " CRCs into " +
                                   Num(out.size()) + " bytes for a block of " + Num(header.layers) +
                                   " layers");
  }
  KVF_ASSIGN_OR_RETURN(const std::uint32_t whole,
                       LayerRangeCrc(layer_crcs, LayerBytes(header), 0, header.layers));
  if (whole != header.payload_crc32c) {
    return Status::InvalidArgument("layer CRCs fold to " + Hex32(whole) + ", header says " +
                                   Hex32(header.payload_crc32c));
  }
  for (std::uint32_t l = 0; l < header.layers; ++l) {
    PutU32(out.data() + 4 * std::size_t{l}, crc32c::Mask(layer_crcs[l]));
  }
  return Status::OK();
}

Status VerifyBlockBody(const BlockHeader& header, std::span<const std::byte> body,
                       std::span<std::uint32_t> layer_crcs) {
  KVF_RETURN_IF_ERROR(ValidateBlockHeader(header));
  const std::uint64_t table_bytes = LayerCrcTableBytes(header);
  if (body.size() != header.payload_bytes + table_bytes) {
    return Status::DataLoss("block body size mismatch: header says " + Num(header.payload_bytes) +
                            " payload + " + Num(table_bytes) + " table bytes, got " +
                            Num(body.size()));
  }
  const std::span<const std::byte> payload = body.first(header.payload_bytes);
  if (layer_crcs.empty() && table_bytes == 0) return VerifyPayload(header, payload);
  // One pass: each layer's CRC, then the table (if any) and the fold.
  std::uint32_t stack[64];
  std::vector<std::uint32_t> heap;
  std::span<std::uint32_t> crcs = layer_crcs;
  if (crcs.empty()) {
    if (header.layers <= 64) {
      crcs = std::span<std::uint32_t>(stack, header.layers);
    } else {
      heap.resize(header.layers);
      crcs = heap;
    }
  }
  if (crcs.size() != header.layers) {
    return Status::InvalidArgument("room for " + Num(crcs.size()) + " layer CRCs, block has " +
                                   Num(header.layers) + " layers");
  }
  const std::uint64_t layer_bytes = LayerBytes(header);
  const std::byte* table = body.data() + header.payload_bytes;
  const std::uint32_t shift = crc32c::ShiftFor(layer_bytes);
  std::uint32_t whole = 0;
  for (std::uint32_t l = 0; l < header.layers; ++l) {
    crcs[l] = crc32c::Value(payload.subspan(l * layer_bytes, layer_bytes));
    if (table_bytes != 0) {
      const std::uint32_t stored = crc32c::Unmask(GetU32(table + 4 * std::size_t{l}));
      if (stored != crcs[l]) {
        return Status::DataLoss("layer " + Num(l) + " CRC mismatch: stored " + Hex32(stored) +
                                " computed " + Hex32(crcs[l]));
      }
    }
    whole = l == 0 ? crcs[l] : crc32c::CombineShifted(whole, crcs[l], shift);
  }
  if (whole != header.payload_crc32c) {
    return Status::DataLoss("payload CRC mismatch: stored " + Hex32(header.payload_crc32c) +
                            " computed " + Hex32(whole));
  }
  return Status::OK();
}

}  // namespace kvfabric
