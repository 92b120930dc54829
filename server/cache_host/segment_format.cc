#include "server/cache_host/segment_format.h"

#include <cstdio>
#include <cstring>

#include "core/crc32c.h"

namespace kvfabric::cache_host {
namespace {

constexpr std::string_view kNamePrefix = "segment-";
constexpr std::string_view kNameSuffix = ".kvfseg";

void Put16(std::span<std::byte> out, size_t at, uint16_t v) {
  for (size_t i = 0; i < 2; ++i) out[at + i] = std::byte(v >> (8 * i));
}
void Put32(std::span<std::byte> out, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) out[at + i] = std::byte(v >> (8 * i));
}
void Put64(std::span<std::byte> out, size_t at, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) out[at + i] = std::byte(v >> (8 * i));
}
uint64_t GetN(std::span<const std::byte> in, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

bool MagicIs(std::span<const std::byte> in, const std::array<uint8_t, 8>& magic) {
  if (in.size() < magic.size()) return false;
  return std::memcmp(in.data(), magic.data(), magic.size()) == 0;
}

// Checks magic, the CRC stored at `crc_at` over [0, crc_at), and the version.
Status CheckFraming(std::span<const std::byte> in, size_t bytes, size_t crc_at,
                    const std::array<uint8_t, 8>& magic, std::string_view what) {
  if (in.size() < bytes) return Status::DataLoss(std::string(what) + ": truncated");
  if (!MagicIs(in, magic)) return Status::DataLoss(std::string(what) + ": bad magic");
  const uint32_t stored = crc32c::Unmask(static_cast<uint32_t>(GetN(in, crc_at, 4)));
  const uint32_t computed = crc32c::Value(in.first(crc_at));
  if (stored != computed) return Status::DataLoss(std::string(what) + ": CRC mismatch");
  const auto version = static_cast<uint16_t>(GetN(in, 8, 2));
  if (version != kSegmentFormatVersion) {
    return Status::FailedPrecondition(std::string(what) + ": format version " +
                                      std::to_string(version) + ", this build reads " +
                                      std::to_string(kSegmentFormatVersion));
  }
  return Status::OK();
}

}  // namespace

std::string SegmentFileName(uint64_t segment_id) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(segment_id));
  return std::string(kNamePrefix) + hex + std::string(kNameSuffix);
}

std::optional<uint64_t> ParseSegmentFileName(std::string_view name) {
  if (name.size() != kNamePrefix.size() + 16 + kNameSuffix.size()) return std::nullopt;
  if (!name.starts_with(kNamePrefix) || !name.ends_with(kNameSuffix)) return std::nullopt;
  uint64_t id = 0;
  for (char c : name.substr(kNamePrefix.size(), 16)) {
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = uint64_t(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = uint64_t(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    id = (id << 4) | digit;
  }
  return id;
}

void EncodeSegmentHeader(const SegmentHeader& header, std::span<std::byte> out) {
  std::memcpy(out.data(), kSegmentMagic.data(), kSegmentMagic.size());
  Put16(out, 8, kSegmentFormatVersion);
  Put16(out, 10, 0);
  Put32(out, 12, header.alignment);
  Put64(out, 16, header.segment_id);
  Put64(out, 24, header.created_wall_micros);
  Put32(out, 32, crc32c::Mask(crc32c::Value(out.first(32))));
}

StatusOr<SegmentHeader> DecodeSegmentHeader(std::span<const std::byte> in) {
  KVF_RETURN_IF_ERROR(CheckFraming(in, kSegmentHeaderBytes, 32, kSegmentMagic, "segment header"));
  if (GetN(in, 10, 2) != 0) return Status::DataLoss("segment header: nonzero reserved field");
  SegmentHeader h;
  h.alignment = static_cast<uint32_t>(GetN(in, 12, 4));
  h.segment_id = GetN(in, 16, 8);
  h.created_wall_micros = GetN(in, 24, 8);
  if (h.alignment < 512 || (h.alignment & (h.alignment - 1)) != 0) {
    return Status::InvalidArgument("segment header: alignment " + std::to_string(h.alignment) +
                                   " is not a power of two >= 512");
  }
  return h;
}

void EncodeTombstone(const Tombstone& tombstone, std::span<std::byte> out) {
  std::memcpy(out.data(), kTombstoneMagic.data(), kTombstoneMagic.size());
  Put16(out, 8, kSegmentFormatVersion);
  Put16(out, 10, 0);
  Put32(out, 12, 0);
  Put64(out, 16, tombstone.record_bytes);
  std::memcpy(out.data() + 24, tombstone.key.data(), tombstone.key.size());
  Put32(out, 56, crc32c::Mask(crc32c::Value(out.first(56))));
}

StatusOr<Tombstone> DecodeTombstone(std::span<const std::byte> in, uint64_t alignment) {
  KVF_RETURN_IF_ERROR(CheckFraming(in, kTombstoneBytes, 56, kTombstoneMagic, "tombstone"));
  if (GetN(in, 10, 2) != 0 || GetN(in, 12, 4) != 0) {
    return Status::DataLoss("tombstone: nonzero reserved field");
  }
  Tombstone t;
  t.record_bytes = GetN(in, 16, 8);
  std::memcpy(t.key.data(), in.data() + 24, t.key.size());
  if (t.record_bytes == 0 || t.record_bytes % alignment != 0) {
    return Status::DataLoss("tombstone: record size " + std::to_string(t.record_bytes) +
                            " is not a positive multiple of " + std::to_string(alignment));
  }
  return t;
}

bool HasTombstoneMagic(std::span<const std::byte> in) { return MagicIs(in, kTombstoneMagic); }

}  // namespace kvfabric::cache_host
