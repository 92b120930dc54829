#include "transport/ucx/ucx_export.h"

#include <cstring>

#include "core/crc32c.h"

namespace kvfabric::ucx {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'F', 'U'};
constexpr std::size_t kFixedBytes = 36;
constexpr std::size_t kCrcBytes = 4;

void PutLe(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t GetLe(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  }
  return v;
}

Status Malformed(std::string_view why) {
  return Status::InvalidArgument(std::string("malformed UCX region export: ") + std::string(why));
}

}  // namespace

std::string EncodeExportedRange(const ExportedRange& range) {
  std::string out;
  out.reserve(kFixedBytes + range.packed_rkey.size() + kCrcBytes);
  out.append(kMagic, sizeof(kMagic));
  PutLe(out, kExportVersion, 1);
  PutLe(out, static_cast<std::uint8_t>(range.kind), 1);
  PutLe(out, 0, 2);
  PutLe(out, range.address, 8);
  PutLe(out, range.length, 8);
  PutLe(out, range.grant_id, 8);
  PutLe(out, range.packed_rkey.size(), 4);
  out += range.packed_rkey;
  PutLe(out, crc32c::Mask(crc32c::Value(out.data(), out.size())), 4);
  return out;
}

StatusOr<ExportedRange> DecodeExportedRange(std::string_view bytes) {
  if (bytes.size() < kFixedBytes + 1 + kCrcBytes) {
    return Malformed(std::to_string(bytes.size()) + " bytes, fewer than the smallest encoding (" +
                     std::to_string(kFixedBytes + 1 + kCrcBytes) + ")");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return Malformed("bad magic");
  const std::uint64_t version = GetLe(bytes, 4, 1);
  if (version != kExportVersion) {
    return Malformed("version " + std::to_string(version) + ", this build reads version " +
                     std::to_string(kExportVersion));
  }
  const std::uint64_t kind = GetLe(bytes, 5, 1);
  if (kind != static_cast<std::uint8_t>(transport::MemoryKind::kHost) &&
      kind != static_cast<std::uint8_t>(transport::MemoryKind::kDevice)) {
    return Malformed("unknown memory kind " + std::to_string(kind));
  }
  if (GetLe(bytes, 6, 2) != 0) return Malformed("reserved bits set");
  ExportedRange r;
  r.kind = static_cast<transport::MemoryKind>(kind);
  r.address = GetLe(bytes, 8, 8);
  r.length = GetLe(bytes, 16, 8);
  r.grant_id = GetLe(bytes, 24, 8);
  if (r.grant_id == 0) return Malformed("grant id 0");
  const std::uint64_t key_bytes = GetLe(bytes, 32, 4);
  if (key_bytes == 0 || key_bytes > kMaxPackedRkeyBytes) {
    return Malformed("packed key of " + std::to_string(key_bytes) + " bytes (allowed 1.." +
                     std::to_string(kMaxPackedRkeyBytes) + ")");
  }
  if (bytes.size() != kFixedBytes + key_bytes + kCrcBytes) {
    return Malformed(std::to_string(bytes.size()) + " bytes, the header says " +
                     std::to_string(kFixedBytes + key_bytes + kCrcBytes));
  }
  if (r.address + r.length < r.address) return Malformed("address + length overflows");
  const std::size_t body = kFixedBytes + key_bytes;
  const auto stored = static_cast<std::uint32_t>(GetLe(bytes, body, 4));
  if (crc32c::Unmask(stored) != crc32c::Value(bytes.data(), body)) {
    return Malformed("checksum mismatch");
  }
  r.packed_rkey.assign(bytes.substr(kFixedBytes, key_bytes));
  return r;
}

}  // namespace kvfabric::ucx
