// The wire format of the kernel-TCP transport (tcp_transport.h). Pure
// functions, no sockets; every decoder checks every field it reads and says
// which check failed. All integers are little-endian.
//
// Hello, 16 bytes, sent by each side first:
//   0  4  magic "KVFT"     4  1  version (1)     5  3  reserved, zero
//   8  8  instance id of the sending transport (random, never 0)
//
// Frame header, 40 bytes:
//   0  1  type (FrameType)
//   1  1  status (replies: StatusCode of the owner's answer; else 0)
//   2  2  message header bytes that follow (kSend only, <= kMaxMessageHeaderBytes)
//   4  4  reserved, zero
//   8  8  request id (WRITE, WRITE_ACK, READ, READ_DATA; else 0)
//  16  8  grant (WRITE, READ; else 0)
//  24  8  offset within the grant (WRITE, READ; else 0)
//  32  8  length: payload bytes that follow (SEND, WRITE, READ_DATA) or bytes
//         asked for (READ); at most kMaxTcpPayloadBytes
//
// Export, 36 bytes (MemoryRegion::Export -> Endpoint::ImportRegion):
//   0  4  magic "KVFX"     4  1  version (1)     5  1  memory kind
//   6  2  reserved, zero   8  8  instance id of the exporting transport
//  16  8  grant            24  8  length of the exported range
//  32  4  CRC32C (masked) of bytes [0, 32)
#ifndef KVFABRIC_TRANSPORT_TCP_TCP_WIRE_H_
#define KVFABRIC_TRANSPORT_TCP_TCP_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::tcp::wire {

inline constexpr std::size_t kHelloBytes = 16;
inline constexpr std::size_t kFrameHeaderBytes = 40;
inline constexpr std::size_t kExportBytes = 36;
inline constexpr std::uint8_t kVersion = 1;
// No single frame carries more: 1 TiB bounds what a peer can make a receiver
// read or discard for one frame.
inline constexpr std::uint64_t kMaxTcpPayloadBytes = std::uint64_t{1} << 40;

enum class FrameType : std::uint8_t {
  kSend = 1,
  kWrite = 2,
  kWriteAck = 3,
  kRead = 4,
  kReadData = 5,
};

struct FrameHeader {
  FrameType type = FrameType::kSend;
  std::uint8_t status = 0;  // StatusCode; replies only
  std::uint16_t message_header_bytes = 0;
  std::uint64_t id = 0;
  std::uint64_t grant = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

struct ExportToken {
  std::uint64_t instance = 0;
  std::uint64_t grant = 0;
  std::uint64_t length = 0;
};

std::array<std::byte, kHelloBytes> EncodeHello(std::uint64_t instance);
// The peer's instance id, or Unavailable naming what is wrong (not a kvfabric
// TCP transport, another version, instance 0).
StatusOr<std::uint64_t> DecodeHello(std::span<const std::byte> bytes);

void EncodeFrameHeader(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out);
// InvalidArgument naming the field: an unknown type, non-zero reserved bytes,
// a message header on anything but SEND or over kMaxMessageHeaderBytes, a
// length over kMaxTcpPayloadBytes, a status on a request, fields a type does
// not use that are not zero.
StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderBytes> in);

std::string EncodeExport(const ExportToken& token);
// InvalidArgument naming the check that failed (size, magic, version, kind,
// reserved bytes, grant or instance 0, CRC).
StatusOr<ExportToken> DecodeExport(std::string_view bytes);

}  // namespace kvfabric::tcp::wire

#endif  // KVFABRIC_TRANSPORT_TCP_TCP_WIRE_H_
