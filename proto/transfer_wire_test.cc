#include "proto/transfer_wire.h"

#include <gtest/gtest.h>

#include <random>

#include "core/testing/test_seed.h"

namespace kvfabric::wire {
namespace {

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(TransferWireTest, RoundTripsEveryOp) {
  TransferMessage put;
  put.op = TransferOpCode::kPut;
  put.request_id = 7;
  put.lease_id = 99;
  put.token[0] = 1;
  put.token[15] = 0xff;
  put.region_id = 3;
  put.ranges = {{4096, 2 << 20, 0}, {1 << 30, 17, 5}};
  auto enc = EncodeTransferMessage(put);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(enc->size(), kTransferHeaderBytes + 2 * kRangeBytes);
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->op, TransferOpCode::kPut);
  EXPECT_EQ(dec->request_id, 7u);
  EXPECT_EQ(dec->lease_id, 99u);
  EXPECT_EQ(dec->token, put.token);
  EXPECT_EQ(dec->region_id, 3u);
  ASSERT_EQ(dec->ranges.size(), 2u);
  EXPECT_EQ(dec->ranges[1].pool_offset, 1u << 30);
  EXPECT_EQ(dec->ranges[1].length, 17u);
  EXPECT_EQ(dec->ranges[1].region_offset, 5u);

  TransferMessage imp;
  imp.op = TransferOpCode::kImportRegion;
  imp.region_id = 1;
  imp.import_total_bytes = 1000;
  imp.import_chunk_offset = 968;
  imp.import_chunk = std::string(32, 'x');
  enc = EncodeTransferMessage(imp);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->import_chunk, imp.import_chunk);
  EXPECT_EQ(dec->import_chunk_offset, 968u);

  TransferMessage reply;
  reply.op = TransferOpCode::kReply;
  reply.request_id = 7;
  reply.status = Status::InvalidArgument("range outside lease");
  reply.bytes_moved = 12;
  enc = EncodeTransferMessage(reply);
  ASSERT_TRUE(enc.ok());
  dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dec->status.message(), "range outside lease");
  EXPECT_EQ(dec->bytes_moved, 12u);
}

TEST(TransferWireTest, LargestRequestFitsTheTransportHeaderLimit) {
  TransferMessage m;
  m.op = TransferOpCode::kGet;
  m.ranges.resize(kMaxRangesPerRequest, TransferRange{0, 1, 0});
  auto enc = EncodeTransferMessage(m);
  ASSERT_TRUE(enc.ok());
  EXPECT_LE(enc->size(), 1024u);
  m.ranges.push_back({0, 1, 0});
  EXPECT_TRUE(EncodeTransferMessage(m).status().IsInvalidArgument());
}

TEST(TransferWireTest, RefusesMalformedMessages) {
  TransferMessage m;
  m.op = TransferOpCode::kGet;
  m.ranges = {{0, 10, 0}};
  const std::string good = *EncodeTransferMessage(m);
  // Every truncation and every extension is refused.
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(good.substr(0, n))).ok()) << n;
  }
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(good + "x")).ok());
  std::string bad = good;
  bad[0] ^= 1;  // magic
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[4] = 2;  // version
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[44] = 41;  // count above the limit
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  // An import chunk claiming to run past its export's total.
  TransferMessage imp;
  imp.op = TransferOpCode::kImportRegion;
  imp.import_total_bytes = 10;
  imp.import_chunk_offset = 5;
  imp.import_chunk = "123456";
  EXPECT_TRUE(EncodeTransferMessage(imp).status().IsInvalidArgument());
  // A zero-length range.
  bad = good;
  for (int i = 56; i < 64; ++i) bad[i] = 0;
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
}

TEST(TransferWireTest, RandomBytesNeverCrashTheDecoder) {
  const std::uint64_t seed = TestSeed("TransferWireTest.RandomBytesNeverCrashTheDecoder");
  std::mt19937_64 rng(seed);
  TransferMessage m;
  m.op = TransferOpCode::kPut;
  m.ranges = {{1, 2, 3}, {4, 5, 6}};
  const std::string good = *EncodeTransferMessage(m);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) s[rng() % s.size()] = static_cast<char>(rng());
    if (DecodeTransferMessage(AsBytes(s)).ok()) ++decoded;
  }
  // Flips inside range values decode (they are plain numbers); header flips do not.
  EXPECT_GT(decoded, 0);
  EXPECT_LT(decoded, 20000);
}

}  // namespace
}  // namespace kvfabric::wire
