#include "transport/tcp/tcp_wire.h"

#include <cstring>

#include "core/crc32c.h"
#include "transport/transport.h"

namespace kvfabric::tcp::wire {
namespace {

constexpr char kHelloMagic[4] = {'K', 'V', 'F', 'T'};
constexpr char kExportMagic[4] = {'K', 'V', 'F', 'X'};

void Put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t Get64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
std::uint8_t Get8(const std::byte* p) { return std::to_integer<std::uint8_t>(*p); }

bool AllZero(const std::byte* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{0}) return false;
  }
  return true;
}

Status BadFrame(std::string_view why) {
  return Status::InvalidArgument("malformed kvfabric TCP frame: " + std::string(why));
}

}  // namespace

std::array<std::byte, kHelloBytes> EncodeHello(std::uint64_t instance) {
  std::array<std::byte, kHelloBytes> out{};
  std::memcpy(out.data(), kHelloMagic, 4);
  out[4] = std::byte{kVersion};
  Put64(out.data() + 8, instance);
  return out;
}

StatusOr<std::uint64_t> DecodeHello(std::span<const std::byte> bytes) {
  if (bytes.size() != kHelloBytes) {
    return Status::Unavailable("kvfabric TCP hello of " + std::to_string(bytes.size()) +
                               " bytes, expected " + std::to_string(kHelloBytes));
  }
  if (std::memcmp(bytes.data(), kHelloMagic, 4) != 0) {
    return Status::Unavailable("peer is not a kvfabric TCP transport (no \"KVFT\" hello)");
  }
  if (Get8(bytes.data() + 4) != kVersion) {
    return Status::Unavailable("peer speaks kvfabric TCP version " +
                               std::to_string(Get8(bytes.data() + 4)) + ", this side " +
                               std::to_string(kVersion));
  }
  if (!AllZero(bytes.data() + 5, 3)) return Status::Unavailable("hello: reserved bytes not zero");
  const std::uint64_t instance = Get64(bytes.data() + 8);
  if (instance == 0) return Status::Unavailable("hello: instance id 0");
  return instance;
}

void EncodeFrameHeader(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out) {
  std::memset(out.data(), 0, kFrameHeaderBytes);
  out[0] = static_cast<std::byte>(h.type);
  out[1] = std::byte{h.status};
  out[2] = static_cast<std::byte>(h.message_header_bytes & 0xff);
  out[3] = static_cast<std::byte>(h.message_header_bytes >> 8);
  Put64(out.data() + 8, h.id);
  Put64(out.data() + 16, h.grant);
  Put64(out.data() + 24, h.offset);
  Put64(out.data() + 32, h.length);
}

StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderBytes> in) {
  FrameHeader h;
  const std::uint8_t type = Get8(in.data());
  if (type < static_cast<std::uint8_t>(FrameType::kSend) ||
      type > static_cast<std::uint8_t>(FrameType::kReadData)) {
    return BadFrame("unknown type " + std::to_string(type));
  }
  h.type = static_cast<FrameType>(type);
  h.status = Get8(in.data() + 1);
  h.message_header_bytes = static_cast<std::uint16_t>(Get8(in.data() + 2) |
                                                      (Get8(in.data() + 3) << 8));
  if (!AllZero(in.data() + 4, 4)) return BadFrame("reserved bytes not zero");
  h.id = Get64(in.data() + 8);
  h.grant = Get64(in.data() + 16);
  h.offset = Get64(in.data() + 24);
  h.length = Get64(in.data() + 32);
  if (h.length > kMaxTcpPayloadBytes) {
    return BadFrame("length " + std::to_string(h.length) + " over the limit of " +
                    std::to_string(kMaxTcpPayloadBytes));
  }
  const bool is_send = h.type == FrameType::kSend;
  const bool is_reply = h.type == FrameType::kWriteAck || h.type == FrameType::kReadData;
  const bool is_request = h.type == FrameType::kWrite || h.type == FrameType::kRead;
  if (!is_send && h.message_header_bytes != 0) return BadFrame("message header on a non-SEND");
  if (h.message_header_bytes > transport::kMaxMessageHeaderBytes) {
    return BadFrame("message header of " + std::to_string(h.message_header_bytes) +
                    " bytes over " + std::to_string(transport::kMaxMessageHeaderBytes));
  }
  if (!is_reply && h.status != 0) return BadFrame("status on a request");
  if (is_reply && h.status > static_cast<std::uint8_t>(StatusCode::kDataLoss)) {
    return BadFrame("unknown status " + std::to_string(h.status));
  }
  if (is_send && (h.id != 0 || h.grant != 0 || h.offset != 0)) {
    return BadFrame("SEND with id, grant or offset");
  }
  if (is_reply && (h.grant != 0 || h.offset != 0)) return BadFrame("reply with grant or offset");
  if (h.type == FrameType::kWriteAck && h.length != 0) return BadFrame("WRITE_ACK with payload");
  if (is_request && h.grant == 0) return BadFrame("request without grant");
  if (is_request && h.offset > kMaxTcpPayloadBytes) return BadFrame("offset over the limit");
  return h;
}

std::string EncodeExport(const ExportToken& token) {
  std::string out(kExportBytes, '\0');
  auto* p = reinterpret_cast<std::byte*>(out.data());
  std::memcpy(p, kExportMagic, 4);
  p[4] = std::byte{kVersion};
  p[5] = static_cast<std::byte>(transport::MemoryKind::kHost);
  Put64(p + 8, token.instance);
  Put64(p + 16, token.grant);
  Put64(p + 24, token.length);
  const std::uint32_t crc = crc32c::Mask(crc32c::Value(p, 32));
  for (int i = 0; i < 4; ++i) p[32 + i] = static_cast<std::byte>(crc >> (8 * i));
  return out;
}

StatusOr<ExportToken> DecodeExport(std::string_view bytes) {
  auto bad = [](std::string_view why) {
    return Status::InvalidArgument("not a kvfabric TCP export: " + std::string(why));
  };
  if (bytes.size() != kExportBytes) {
    return bad(std::to_string(bytes.size()) + " bytes, expected " + std::to_string(kExportBytes));
  }
  const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
  if (std::memcmp(p, kExportMagic, 4) != 0) return bad("no \"KVFX\" magic");
  if (Get8(p + 4) != kVersion) return bad("version " + std::to_string(Get8(p + 4)));
  if (Get8(p + 5) != static_cast<std::uint8_t>(transport::MemoryKind::kHost)) {
    return bad("memory kind " + std::to_string(Get8(p + 5)) + " (host only)");
  }
  if (!AllZero(p + 6, 2)) return bad("reserved bytes not zero");
  std::uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= std::uint32_t{Get8(p + 32 + i)} << (8 * i);
  if (crc32c::Unmask(stored) != crc32c::Value(p, 32)) return bad("CRC mismatch");
  ExportToken t;
  t.instance = Get64(p + 8);
  t.grant = Get64(p + 16);
  t.length = Get64(p + 24);
  if (t.instance == 0 || t.grant == 0) return bad("instance or grant 0");
  if (t.length > kMaxTcpPayloadBytes) return bad("length over the limit");
  return t;
}

}  // namespace kvfabric::tcp::wire
