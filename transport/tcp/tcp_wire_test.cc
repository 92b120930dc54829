#include "transport/tcp/tcp_wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transport/transport.h"

namespace kvfabric::tcp::wire {
namespace {

std::array<std::byte, kFrameHeaderBytes> Encode(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderBytes> out{};
  EncodeFrameHeader(h, out);
  return out;
}

TEST(TcpWireTest, HelloRoundTripsAndRefusesStrangers) {
  const auto hello = EncodeHello(0x1234567890abcdefull);
  StatusOr<std::uint64_t> got = DecodeHello(hello);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 0x1234567890abcdefull);

  const std::string http = "GET / HTTP/1.1\r\n";
  StatusOr<std::uint64_t> stranger =
      DecodeHello(std::span<const std::byte>(reinterpret_cast<const std::byte*>(http.data()), 16));
  EXPECT_EQ(stranger.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stranger.status().message().find("not a kvfabric TCP transport"), std::string::npos);

  auto other_version = hello;
  other_version[4] = std::byte{9};
  EXPECT_NE(DecodeHello(other_version).status().message().find("version 9"), std::string::npos);
  EXPECT_FALSE(DecodeHello(EncodeHello(0)).ok());
  EXPECT_FALSE(DecodeHello(std::span<const std::byte>(hello.data(), 15)).ok());
}

TEST(TcpWireTest, FrameHeadersRoundTrip) {
  const FrameHeader in[] = {
      {FrameType::kSend, 0, 1024, 0, 0, 0, 5},
      {FrameType::kWrite, 0, 0, 7, 0xfeed, 100, 1 << 20},
      {FrameType::kWriteAck, static_cast<std::uint8_t>(StatusCode::kOutOfRange), 0, 7, 0, 0, 0},
      {FrameType::kRead, 0, 0, 8, 0xfeed, 0, kMaxTcpPayloadBytes},
      {FrameType::kReadData, 0, 0, 8, 0, 0, 4096},
  };
  for (const FrameHeader& h : in) {
    StatusOr<FrameHeader> out = DecodeFrameHeader(Encode(h));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->type, h.type);
    EXPECT_EQ(out->status, h.status);
    EXPECT_EQ(out->message_header_bytes, h.message_header_bytes);
    EXPECT_EQ(out->id, h.id);
    EXPECT_EQ(out->grant, h.grant);
    EXPECT_EQ(out->offset, h.offset);
    EXPECT_EQ(out->length, h.length);
  }
}

TEST(TcpWireTest, FrameHeadersThatBreakTheProtocolAreRefusedNamingTheField) {
  struct Case {
    FrameHeader h;
    const char* why;
  };
  const Case cases[] = {
      {{FrameType::kSend, 0, 1025, 0, 0, 0, 0}, "message header of 1025"},
      {{FrameType::kWrite, 0, 8, 1, 2, 0, 0}, "message header on a non-SEND"},
      {{FrameType::kRead, 0, 0, 1, 2, 0, kMaxTcpPayloadBytes + 1}, "over the limit"},
      {{FrameType::kRead, 3, 0, 1, 2, 0, 1}, "status on a request"},
      {{FrameType::kReadData, 99, 0, 1, 0, 0, 0}, "unknown status"},
      {{FrameType::kSend, 0, 0, 1, 0, 0, 0}, "SEND with id"},
      {{FrameType::kReadData, 0, 0, 1, 5, 0, 0}, "reply with grant"},
      {{FrameType::kWriteAck, 0, 0, 1, 0, 0, 9}, "WRITE_ACK with payload"},
      {{FrameType::kWrite, 0, 0, 1, 0, 0, 9}, "request without grant"},
  };
  for (const Case& c : cases) {
    StatusOr<FrameHeader> out = DecodeFrameHeader(Encode(c.h));
    ASSERT_FALSE(out.ok()) << c.why;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(c.why), std::string::npos) << out.status();
  }
  auto unknown = Encode({FrameType::kSend, 0, 0, 0, 0, 0, 0});
  unknown[0] = std::byte{42};
  EXPECT_NE(DecodeFrameHeader(unknown).status().message().find("unknown type 42"),
            std::string::npos);
  auto reserved = Encode({FrameType::kSend, 0, 0, 0, 0, 0, 0});
  reserved[5] = std::byte{1};
  EXPECT_NE(DecodeFrameHeader(reserved).status().message().find("reserved"), std::string::npos);
}

TEST(TcpWireTest, ExportsRoundTripAndEveryCorruptionIsRefused) {
  const ExportToken t{.instance = 11, .grant = 22, .length = 33};
  const std::string e = EncodeExport(t);
  ASSERT_EQ(e.size(), kExportBytes);
  StatusOr<ExportToken> back = DecodeExport(e);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->instance, 11u);
  EXPECT_EQ(back->grant, 22u);
  EXPECT_EQ(back->length, 33u);
  for (std::size_t i = 0; i < e.size(); ++i) {
    std::string bad = e;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_EQ(DecodeExport(bad).status().code(), StatusCode::kInvalidArgument) << "byte " << i;
  }
  EXPECT_FALSE(DecodeExport(e + "x").ok());
  EXPECT_FALSE(DecodeExport(e.substr(1)).ok());
  EXPECT_FALSE(DecodeExport(EncodeExport({.instance = 1, .grant = 0, .length = 1})).ok());
}

}  // namespace
}  // namespace kvfabric::tcp::wire
