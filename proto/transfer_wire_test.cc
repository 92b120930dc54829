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

TransferMessage FetchOf(std::size_t keys, std::size_t ns_bytes, bool digest) {
  TransferMessage m;
  m.op = TransferOpCode::kFetch;
  m.request_id = 11;
  m.region_id = 2;
  m.fetch_region_offset = 4096;
  m.fetch_slot_bytes = 256 << 10;
  m.fetch_namespace = std::string(ns_bytes, 'n');
  if (digest) {
    m.fetch_fingerprint.emplace();
    m.fetch_fingerprint->fill(0xd1);
  }
  for (std::size_t i = 0; i < keys; ++i) {
    FetchKey k{};
    k[0] = static_cast<std::uint8_t>(i);
    k[31] = 0xee;
    m.fetch_keys.push_back(k);
  }
  return m;
}

TEST(TransferWireTest, FetchAndItsReplyRoundTrip) {
  for (bool digest : {false, true}) {
    const TransferMessage m = FetchOf(3, 5, digest);
    auto enc = EncodeTransferMessage(m);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    EXPECT_EQ(enc->size(), kTransferHeaderBytes + 20 + (digest ? 32 : 0) + 5 + 3 * 32);
    auto dec = DecodeTransferMessage(AsBytes(*enc));
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    EXPECT_EQ(dec->op, TransferOpCode::kFetch);
    EXPECT_EQ(dec->request_id, 11u);
    EXPECT_EQ(dec->region_id, 2u);
    EXPECT_EQ(dec->fetch_region_offset, 4096u);
    EXPECT_EQ(dec->fetch_slot_bytes, 256u << 10);
    EXPECT_EQ(dec->fetch_namespace, "nnnnn");
    EXPECT_EQ(dec->fetch_fingerprint, m.fetch_fingerprint);
    EXPECT_EQ(dec->fetch_keys, m.fetch_keys);
  }
  TransferMessage reply;
  reply.op = TransferOpCode::kFetchReply;
  reply.request_id = 11;
  reply.status = Status::DataLoss("transfer 0: peer failed");
  reply.bytes_moved = 512 << 10;
  reply.fetch_results = {{StatusCode::kOk, 0xdeadbeef, 256 << 10},
                         {StatusCode::kNotFound, 0, 0},
                         {StatusCode::kUnavailable, 7, 1 << 20}};
  auto enc = EncodeTransferMessage(reply);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(dec->status.message(), "transfer 0: peer failed");
  EXPECT_EQ(dec->bytes_moved, 512u << 10);
  ASSERT_EQ(dec->fetch_results.size(), 3u);
  EXPECT_EQ(dec->fetch_results[0].code, StatusCode::kOk);
  EXPECT_EQ(dec->fetch_results[0].crc32c, 0xdeadbeefu);
  EXPECT_EQ(dec->fetch_results[0].payload_bytes, 256u << 10);
  EXPECT_EQ(dec->fetch_results[1].code, StatusCode::kNotFound);
  EXPECT_EQ(dec->fetch_results[2].code, StatusCode::kUnavailable);
  EXPECT_EQ(dec->fetch_results[2].payload_bytes, 1u << 20);
  // A long message is cut to the limit, not refused.
  reply.status = Status::Internal(std::string(2000, 'm'));
  reply.fetch_results.resize(kMaxFetchKeys);
  enc = EncodeTransferMessage(reply);
  ASSERT_TRUE(enc.ok());
  EXPECT_LE(enc->size(), kMaxTransferMessageBytes);
  dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->status.message().size(), kMaxFetchReplyMessageBytes);
}

TEST(TransferWireTest, ScatteredFetchSlotsRoundTripAndAreChecked) {
  TransferMessage m = FetchOf(3, 5, true);
  m.fetch_region_offset = 0;
  m.fetch_slot_offsets = {7 << 20, 0, 3 << 20};  // any order: a context's pages
  auto enc = EncodeTransferMessage(m);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(enc->size(), kTransferHeaderBytes + 20 + 32 + 5 + 3 * (32 + 8));
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->fetch_slot_offsets, m.fetch_slot_offsets);
  EXPECT_EQ(dec->fetch_keys, m.fetch_keys);
  EXPECT_EQ(dec->fetch_fingerprint, m.fetch_fingerprint);
  // Every truncation is refused.
  for (std::size_t n = 0; n < enc->size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(enc->substr(0, n))).ok()) << n;
  }
  // A slot that wraps u64, on either side.
  std::string bad = *enc;
  for (std::size_t i = bad.size() - 8; i < bad.size(); ++i) bad[i] = static_cast<char>(0xff);
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  TransferMessage wraps = m;
  wraps.fetch_slot_offsets[1] = ~std::uint64_t{0} - 10;
  EXPECT_TRUE(EncodeTransferMessage(wraps).status().IsInvalidArgument());
  // One offset per key, with region_offset 0.
  TransferMessage short_list = m;
  short_list.fetch_slot_offsets.pop_back();
  EXPECT_TRUE(EncodeTransferMessage(short_list).status().IsInvalidArgument());
  TransferMessage both = m;
  both.fetch_region_offset = 4096;
  EXPECT_TRUE(EncodeTransferMessage(both).status().IsInvalidArgument());
}

TEST(TransferWireTest, LayerRangeFetchRoundTripsAndIsChecked) {
  TransferMessage m = FetchOf(2, 3, false);
  m.fetch_region_offset = 0;
  m.fetch_slot_offsets = {64 << 10, 1 << 20};
  m.fetch_first_layer = 5;
  m.fetch_layer_count = 3;
  auto enc = EncodeTransferMessage(m);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(enc->size(), kTransferHeaderBytes + 20 + 8 + 3 + 2 * (32 + 8));
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->fetch_first_layer, 5u);
  EXPECT_EQ(dec->fetch_layer_count, 3u);
  EXPECT_EQ(dec->fetch_slot_offsets, m.fetch_slot_offsets);
  for (std::size_t n = 0; n < enc->size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(enc->substr(0, n))).ok()) << n;
  }
  // A range of no layers is refused on the wire and by the encoder.
  std::string zero = *enc;
  for (std::size_t i = kTransferHeaderBytes + 24; i < kTransferHeaderBytes + 28; ++i) zero[i] = 0;
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(zero)).ok());
  TransferMessage no_count = m;
  no_count.fetch_layer_count = 0;
  EXPECT_TRUE(EncodeTransferMessage(no_count).status().IsInvalidArgument());
  // Without the flag nothing is read for it: whole blocks.
  no_count.fetch_first_layer = 0;
  dec = DecodeTransferMessage(AsBytes(*EncodeTransferMessage(no_count)));
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(dec->fetch_layer_count, 0u);
}

// Flag bit 3 asks the daemon to check landings; a result's landing_checked
// travels in bit 63 of its payload_bytes, which stays the size.
TEST(TransferWireTest, CheckLandingFlagAndResultBitRoundTrip) {
  TransferMessage m = FetchOf(2, 3, false);
  for (bool check : {false, true}) {
    m.fetch_check_landing = check;
    auto enc = EncodeTransferMessage(m);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    auto dec = DecodeTransferMessage(AsBytes(*enc));
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    EXPECT_EQ(dec->fetch_check_landing, check);
  }
  TransferMessage reply;
  reply.op = TransferOpCode::kFetchReply;
  reply.request_id = 11;
  reply.fetch_results = {{StatusCode::kOk, 0xdeadbeef, 256 << 10, true},
                         {StatusCode::kOk, 0x1234, 2 << 20, false}};
  auto enc = EncodeTransferMessage(reply);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  ASSERT_EQ(dec->fetch_results.size(), 2u);
  EXPECT_TRUE(dec->fetch_results[0].landing_checked);
  EXPECT_EQ(dec->fetch_results[0].payload_bytes, 256u << 10);
  EXPECT_FALSE(dec->fetch_results[1].landing_checked);
  EXPECT_EQ(dec->fetch_results[1].payload_bytes, 2u << 20);
}

TransferMessage StoreOf(std::size_t keys, std::size_t ns_bytes) {
  TransferMessage m;
  m.op = TransferOpCode::kStore;
  m.request_id = 77;
  m.region_id = 3;
  m.fetch_namespace = std::string(ns_bytes, 'n');
  m.store_ttl_ms = 30000;
  m.store_shape.representation = 1;
  m.store_shape.dtype = 2;
  m.store_shape.format_version = 2;
  m.store_shape.tokens_per_block = 16;
  m.store_shape.layers = 4;
  m.store_shape.kv_heads = 8;
  m.store_shape.head_dim = 128;
  m.store_shape.fingerprint.fill(9);
  for (std::size_t i = 0; i < keys; ++i) {
    StoreEntry e;
    e.key.fill(static_cast<std::uint8_t>(i + 1));
    e.region_offset = i << 20;
    e.payload_bytes = 256 << 10;
    e.prefix_tokens = 16 * i;
    e.crc32c = 0x1234567u + static_cast<std::uint32_t>(i);
    m.store_entries.push_back(e);
  }
  return m;
}

TEST(TransferWireTest, StoreRoundTripsAndIsChecked) {
  TransferMessage m = StoreOf(3, 5);
  auto enc = EncodeTransferMessage(m);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(enc->size(), kTransferHeaderBytes + 28 + 32 + 5 + 3 * kStoreEntryBytes);
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->op, TransferOpCode::kStore);
  EXPECT_EQ(dec->region_id, 3u);
  EXPECT_EQ(dec->fetch_namespace, "nnnnn");
  EXPECT_EQ(dec->store_ttl_ms, 30000u);
  EXPECT_EQ(dec->store_shape.dtype, 2);
  EXPECT_EQ(dec->store_shape.layers, 4u);
  EXPECT_EQ(dec->store_shape.head_dim, 128u);
  EXPECT_EQ(dec->store_shape.fingerprint, m.store_shape.fingerprint);
  ASSERT_EQ(dec->store_entries.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(dec->store_entries[i].key, m.store_entries[i].key);
    EXPECT_EQ(dec->store_entries[i].region_offset, m.store_entries[i].region_offset);
    EXPECT_EQ(dec->store_entries[i].payload_bytes, m.store_entries[i].payload_bytes);
    EXPECT_EQ(dec->store_entries[i].prefix_tokens, m.store_entries[i].prefix_tokens);
    EXPECT_EQ(dec->store_entries[i].crc32c, m.store_entries[i].crc32c);
  }
  for (std::size_t n = 0; n < enc->size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(enc->substr(0, n))).ok()) << n;
  }
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(*enc + "x")).ok());
  // Byte offsets after the header: 48 ttl, 52 namespace length, 54 flags,
  // 58 reserved; the first entry starts at 48 + 28 + 32 + 5 = 113.
  std::string bad = *enc;
  bad[16] = 1;  // a lease id: kStore presents no grant
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = *enc;
  bad[54] = 1;  // flags
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = *enc;
  bad[58] = 1;  // reserved
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = *enc;
  bad[113 + 60] = 1;  // the entry's reserved word
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  // Ranges that are empty or wrap: refused by both sides.
  TransferMessage wrap = StoreOf(1, 0);
  wrap.store_entries[0].region_offset = ~std::uint64_t{0} - 10;
  EXPECT_TRUE(EncodeTransferMessage(wrap).status().IsInvalidArgument());
  std::string wrapped = *EncodeTransferMessage(StoreOf(1, 0));
  for (int i = 0; i < 8; ++i) wrapped[48 + 28 + 32 + 32 + i] = static_cast<char>(0xff);
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(wrapped)).ok());
  TransferMessage empty = StoreOf(1, 0);
  empty.store_entries[0].payload_bytes = 0;
  EXPECT_TRUE(EncodeTransferMessage(empty).status().IsInvalidArgument());
  // Counts: 1..kMaxStoreKeys, and the largest fits the transport's header.
  EXPECT_TRUE(EncodeTransferMessage(StoreOf(0, 1)).status().IsInvalidArgument());
  EXPECT_TRUE(EncodeTransferMessage(StoreOf(kMaxStoreKeys + 1, 1)).status().IsInvalidArgument());
  EXPECT_TRUE(
      EncodeTransferMessage(StoreOf(1, kMaxFetchNamespaceBytes + 1)).status().IsInvalidArgument());
  auto largest = EncodeTransferMessage(StoreOf(kMaxStoreKeys, kMaxFetchNamespaceBytes));
  ASSERT_TRUE(largest.ok());
  EXPECT_LE(largest->size(), kMaxTransferMessageBytes);
}

TEST(TransferWireTest, StoreReplyCarriesOneCodePerKey) {
  TransferMessage m;
  m.op = TransferOpCode::kStoreReply;
  m.request_id = 5;
  m.bytes_moved = 1 << 20;
  m.fetch_results = {
      {StatusCode::kOk, 0, 0}, {StatusCode::kAlreadyExists, 0, 0}, {StatusCode::kDataLoss, 0, 0}};
  auto enc = EncodeTransferMessage(m);
  ASSERT_TRUE(enc.ok());
  auto dec = DecodeTransferMessage(AsBytes(*enc));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->op, TransferOpCode::kStoreReply);
  ASSERT_EQ(dec->fetch_results.size(), 3u);
  EXPECT_EQ(dec->fetch_results[1].code, StatusCode::kAlreadyExists);
  EXPECT_EQ(dec->fetch_results[2].code, StatusCode::kDataLoss);
  EXPECT_EQ(dec->bytes_moved, 1u << 20);
}

TEST(TransferWireTest, LargestFetchFitsTheTransportHeaderLimit) {
  auto enc = EncodeTransferMessage(FetchOf(kMaxFetchKeys, kMaxFetchNamespaceBytes, true));
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_LE(enc->size(), kMaxTransferMessageBytes);
  TransferMessage scattered = FetchOf(kMaxFetchKeys, kMaxFetchNamespaceBytes, true);
  scattered.fetch_region_offset = 0;
  scattered.fetch_slot_offsets.assign(kMaxFetchKeys, 1 << 20);
  scattered.fetch_first_layer = 1;
  scattered.fetch_layer_count = 1;
  enc = EncodeTransferMessage(scattered);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_LE(enc->size(), kMaxTransferMessageBytes);
  EXPECT_TRUE(EncodeTransferMessage(FetchOf(kMaxFetchKeys + 1, 0, false))
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(EncodeTransferMessage(FetchOf(0, 0, false)).status().IsInvalidArgument());
  EXPECT_TRUE(EncodeTransferMessage(FetchOf(1, kMaxFetchNamespaceBytes + 1, false))
                  .status()
                  .IsInvalidArgument());
}

TEST(TransferWireTest, RefusesMalformedFetches) {
  const std::string good = *EncodeTransferMessage(FetchOf(2, 3, true));
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(good.substr(0, n))).ok()) << n;
  }
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(good + "x")).ok());
  // Byte offsets after the 48-byte header: 48 region_offset, 56 slot_bytes,
  // 64 namespace length, 66 flags, 67 reserved.
  std::string bad = good;
  bad[16] = 1;  // a lease id: kFetch presents no grant
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[66] = 5;  // an unknown flag
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[66] = 3;  // scattered slots announced, but no offsets follow
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[67] = 1;  // reserved
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  bad[44] = 17;  // more keys than the limit
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  for (int i = 56; i < 64; ++i) bad[i] = 0;  // empty slots
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good;
  for (int i = 48; i < 56; ++i) bad[i] = static_cast<char>(0xff);  // slots that wrap
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  TransferMessage wraps = FetchOf(2, 0, false);
  wraps.fetch_region_offset = ~std::uint64_t{0} - 100;
  wraps.fetch_slot_bytes = 64;
  EXPECT_TRUE(EncodeTransferMessage(wraps).status().IsInvalidArgument());

  TransferMessage reply;
  reply.op = TransferOpCode::kFetchReply;
  reply.fetch_results = {{StatusCode::kOk, 1, 2}};
  const std::string good_reply = *EncodeTransferMessage(reply);
  for (std::size_t n = 0; n < good_reply.size(); ++n) {
    EXPECT_FALSE(DecodeTransferMessage(AsBytes(good_reply.substr(0, n))).ok()) << n;
  }
  bad = good_reply;
  bad[62] = 99;  // a result code that is no StatusCode
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
  bad = good_reply;
  bad[40] = 1;  // a region id in a reply
  EXPECT_FALSE(DecodeTransferMessage(AsBytes(bad)).ok());
}

TEST(TransferWireTest, RandomBytesNeverCrashTheFetchDecoder) {
  const std::uint64_t seed = TestSeed("TransferWireTest.RandomBytesNeverCrashTheFetchDecoder");
  std::mt19937_64 rng(seed);
  TransferMessage reply;
  reply.op = TransferOpCode::kFetchReply;
  reply.status = Status::NotFound("gone");
  reply.fetch_results = {{StatusCode::kOk, 1, 2}, {StatusCode::kNotFound, 0, 0}};
  const std::string goods[] = {*EncodeTransferMessage(FetchOf(4, 7, true)),
                               *EncodeTransferMessage(reply)};
  for (const std::string& good : goods) {
    for (int i = 0; i < 20000; ++i) {
      std::string s = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) s[rng() % s.size()] = static_cast<char>(rng());
      auto dec = DecodeTransferMessage(AsBytes(s));
      if (dec.ok() && dec->op == TransferOpCode::kFetch) {
        EXPECT_LE(dec->fetch_keys.size(), kMaxFetchKeys);
        EXPECT_NE(dec->fetch_slot_bytes, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace kvfabric::wire

namespace kvfabric::wire {
namespace {

TEST(TransferWireTest, ChallengeAndHelloRoundTripAndRefuseExtras) {
  TransferMessage c;
  c.op = TransferOpCode::kChallenge;
  for (std::size_t i = 0; i < kHelloBytes; ++i) c.hello[i] = static_cast<std::uint8_t>(i * 7);
  auto ce = EncodeTransferMessage(c);
  ASSERT_TRUE(ce.ok()) << ce.status().ToString();
  EXPECT_EQ(ce->size(), kTransferHeaderBytes + kHelloBytes);
  auto cd = DecodeTransferMessage(std::as_bytes(std::span<const char>(ce->data(), ce->size())));
  ASSERT_TRUE(cd.ok()) << cd.status().ToString();
  EXPECT_EQ(cd->op, TransferOpCode::kChallenge);
  EXPECT_EQ(cd->hello, c.hello);

  TransferMessage h;
  h.op = TransferOpCode::kHello;
  h.request_id = 9;
  h.lease_id = 0x1122334455667788ull;  // the session id
  h.hello = c.hello;
  auto he = EncodeTransferMessage(h);
  ASSERT_TRUE(he.ok());
  auto hd = DecodeTransferMessage(std::as_bytes(std::span<const char>(he->data(), he->size())));
  ASSERT_TRUE(hd.ok()) << hd.status().ToString();
  EXPECT_EQ(hd->lease_id, h.lease_id);
  EXPECT_EQ(hd->request_id, 9u);
  EXPECT_EQ(hd->hello, h.hello);

  // A byte more or less, or a session id on a challenge, is refused.
  std::string longer = *he + "x";
  EXPECT_FALSE(
      DecodeTransferMessage(std::as_bytes(std::span<const char>(longer.data(), longer.size())))
          .ok());
  std::string shorter = he->substr(0, he->size() - 1);
  EXPECT_FALSE(
      DecodeTransferMessage(std::as_bytes(std::span<const char>(shorter.data(), shorter.size())))
          .ok());
  std::string with_id = *ce;
  with_id[16] = 1;  // lease_id of a challenge
  EXPECT_FALSE(
      DecodeTransferMessage(std::as_bytes(std::span<const char>(with_id.data(), with_id.size())))
          .ok());

  // The proof input binds the nonce and the session id.
  EXPECT_NE(HelloProofInput(c.hello, 1), HelloProofInput(c.hello, 2));
  std::array<std::uint8_t, kHelloBytes> other = c.hello;
  other[0] ^= 1;
  EXPECT_NE(HelloProofInput(c.hello, 1), HelloProofInput(other, 1));
}

}  // namespace
}  // namespace kvfabric::wire
