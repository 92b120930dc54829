// The wire-limit checks and proto <-> core conversions of the cache-host
// adapter, without gRPC or a node.
#include "server/cache_host_convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "proto/wire_limits.h"

namespace kvfabric {
namespace {

using cache_host::BlockMeta;

std::string KeyBytes(std::uint8_t fill) { return std::string(BlockKey::kSize, char(fill)); }

// 2 layers x 2 x 16 tokens x 2 heads x 16 dims x bf16 = 4096 bytes per block.
v1::ModelFingerprint TestFingerprint() {
  v1::ModelFingerprint fp;
  fp.set_model_id("test/model@1");
  fp.set_first_layer(0);
  fp.set_layer_count(2);
  fp.set_dtype(v1::DTYPE_BF16);
  fp.set_kv_heads(2);
  fp.set_head_dim(16);
  fp.set_tokens_per_block(16);
  fp.set_tp_rank(0);
  fp.set_tp_size(1);
  fp.set_layout_version(1);
  return fp;
}
constexpr std::uint64_t kExactBytes = 4096;

v1::BlockDescriptor ExactDescriptor(std::uint8_t fill) {
  v1::BlockDescriptor d;
  d.set_key(KeyBytes(fill));
  d.set_payload_bytes(kExactBytes);
  d.set_representation(v1::REPRESENTATION_EXACT);
  d.set_format_version(2);
  d.set_token_count(16);
  d.set_prefix_tokens(32);
  return d;
}

class CacheHostDescriptorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<ModelFingerprint> fp = FingerprintFromProto(TestFingerprint(), DefaultLimits());
    ASSERT_TRUE(fp.ok()) << fp.status();
    fp_ = *fp;
    StatusOr<FingerprintDigest> digest = fp_.Digest();
    ASSERT_TRUE(digest.ok()) << digest.status();
    digest_ = *digest;
  }
  StatusOr<BlockMeta> Meta(const v1::BlockDescriptor& d) {
    return BlockMetaFromDescriptor(d, fp_, digest_, "blocks[2]");
  }
  ModelFingerprint fp_;
  FingerprintDigest digest_{};
};

TEST(CacheHostConvertTest, BatchSizeNamesTheLimitAndBothNumbers) {
  const v1::Limits limits = DefaultLimits();
  EXPECT_TRUE(CheckBatchSize("keys", 1, limits).ok());
  EXPECT_TRUE(CheckBatchSize("keys", 4096, limits).ok());
  Status over = CheckBatchSize("keys", 5000, limits);
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message(), "keys: 5000 > max_keys_per_batch 4096");
  Status empty = CheckBatchSize("lease_ids", 0, limits);
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "lease_ids: 0, at least 1 required");
}

TEST(CacheHostConvertTest, NamespaceAndTtlLimitsAreInclusive) {
  v1::Limits limits = DefaultLimits();
  EXPECT_TRUE(CheckNamespace(std::string(256, 'n'), limits).ok());
  EXPECT_EQ(CheckNamespace(std::string(257, 'n'), limits).message(),
            "namespace: 257 bytes > max_namespace_bytes 256");
  EXPECT_TRUE(CheckTtlMs(0, limits).ok());
  EXPECT_TRUE(CheckTtlMs(600000, limits).ok());
  Status ttl = CheckTtlMs(600001, limits);
  EXPECT_EQ(ttl.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ttl.message(), "ttl_ms: 600001 > max_ttl_ms 600000");
  limits.set_max_ttl_ms(1000);
  EXPECT_EQ(CheckTtlMs(1001, limits).message(), "ttl_ms: 1001 > max_ttl_ms 1000");
}

TEST(CacheHostConvertTest, CallThatIsCancelledOrPastItsDeadlineIsNotLive) {
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(CheckCallLive(false, now + std::chrono::seconds(1), now).ok());
  EXPECT_TRUE(CheckCallLive(false, std::chrono::system_clock::time_point::max(), now).ok());
  EXPECT_EQ(CheckCallLive(false, now, now).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CheckCallLive(false, now - std::chrono::seconds(1), now).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CheckCallLive(true, now + std::chrono::seconds(1), now).code(), StatusCode::kCancelled);
}

TEST(CacheHostConvertTest, KeysMustBe32BytesAndDistinctWhereRequired) {
  StatusOr<BlockKey> key = BlockKeyFromProto(KeyBytes(7), "keys[0]");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(BlockKeyToProto(*key), KeyBytes(7));
  EXPECT_EQ(BlockKeyFromProto(std::string(31, 'k'), "keys[3]").status().message(),
            "keys[3]: 31 bytes; a block key is exactly 32");

  google::protobuf::RepeatedPtrField<std::string> keys;
  *keys.Add() = KeyBytes(1);
  *keys.Add() = KeyBytes(2);
  *keys.Add() = KeyBytes(1);
  StatusOr<std::vector<BlockKey>> any = BlockKeysFromProto(keys, "keys", false);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->size(), 3u);
  StatusOr<std::vector<BlockKey>> distinct = BlockKeysFromProto(keys, "keys", true);
  EXPECT_EQ(distinct.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(distinct.status().message(), "keys[2] repeats keys[0] (keys must be distinct)");

  *keys.Add() = "short";
  EXPECT_EQ(BlockKeysFromProto(keys, "keys", false).status().message(),
            "keys[3]: 5 bytes; a block key is exactly 32");
}

TEST(CacheHostConvertTest, ReserveKeysRefuseOversizedBlocksBatchesAndRepeats) {
  v1::Limits limits = DefaultLimits();
  google::protobuf::RepeatedPtrField<v1::BlockDescriptor> blocks;
  *blocks.Add() = ExactDescriptor(1);
  *blocks.Add() = ExactDescriptor(2);
  StatusOr<std::vector<BlockKey>> keys = ReserveKeysFromProto(blocks, limits);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(BlockKeyToProto((*keys)[1]), KeyBytes(2));

  blocks.Mutable(1)->set_payload_bytes((64u << 20) + 1);
  EXPECT_EQ(ReserveKeysFromProto(blocks, limits).status().message(),
            "blocks[1].payload_bytes: 67108865 > max_block_bytes 67108864");

  blocks.Mutable(1)->set_payload_bytes(kExactBytes);
  limits.set_max_batch_payload_bytes(8191);
  EXPECT_EQ(ReserveKeysFromProto(blocks, limits).status().message(),
            "payload_bytes of all blocks: 8192 > max_batch_payload_bytes 8191");

  limits = DefaultLimits();
  blocks.Mutable(1)->set_key(KeyBytes(1));
  EXPECT_EQ(ReserveKeysFromProto(blocks, limits).status().message(),
            "blocks[1].key repeats blocks[0].key (keys must be distinct)");
  blocks.Mutable(0)->set_key("");
  EXPECT_EQ(ReserveKeysFromProto(blocks, limits).status().message(),
            "blocks[0].key: 0 bytes; a block key is exactly 32");
}

TEST(CacheHostConvertTest, EnumsMapByValueAndRefuseUnspecified) {
  for (KvDtype dt :
       {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32, KvDtype::kFp8E4M3, KvDtype::kInt8}) {
    const v1::DType wire = KvDtypeToProto(dt);
    EXPECT_EQ(static_cast<int>(wire), static_cast<int>(dt));
    StatusOr<KvDtype> back = KvDtypeFromProto(wire);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, dt);
  }
  EXPECT_EQ(KvDtypeFromProto(v1::DTYPE_UNSPECIFIED).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvDtypeFromProto(99).status().message(), "dtype: unknown value 99");

  for (BlockRepresentation r : {BlockRepresentation::kExact, BlockRepresentation::kCompactInt8}) {
    StatusOr<BlockRepresentation> back = RepresentationFromProto(RepresentationToProto(r));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, r);
  }
  EXPECT_FALSE(RepresentationFromProto(v1::REPRESENTATION_UNSPECIFIED).ok());
  EXPECT_FALSE(RepresentationFromProto(7).ok());

  EXPECT_EQ(TierToProto(cache_host::BlockTier::kHost), v1::TIER_HOST);
  EXPECT_EQ(TierToProto(cache_host::BlockTier::kBoth), v1::TIER_HOST);
  EXPECT_EQ(TierToProto(cache_host::BlockTier::kNvme), v1::TIER_NVME);
  EXPECT_EQ(ServingStateToProto(cache_host::ServingState::kStarting), v1::SERVING_STATUS_STARTING);
  EXPECT_EQ(ServingStateToProto(cache_host::ServingState::kServing), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(ServingStateToProto(cache_host::ServingState::kDraining), v1::SERVING_STATUS_DRAINING);
  EXPECT_EQ(ServingStateToProto(cache_host::ServingState::kStopped),
            v1::SERVING_STATUS_NOT_SERVING);
  EXPECT_EQ(EvictionPolicyToProto(cache_host::EvictionPolicyKind::kLru), v1::EVICTION_POLICY_LRU);
  EXPECT_EQ(EvictionPolicyToProto(cache_host::EvictionPolicyKind::kCostAware),
            v1::EVICTION_POLICY_COST_AWARE);
}

TEST(CacheHostConvertTest, FingerprintRoundTripsAndItsDigestIsTheCoreOne) {
  StatusOr<ModelFingerprint> fp = FingerprintFromProto(TestFingerprint(), DefaultLimits());
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(fp->model_id, "test/model@1");
  EXPECT_EQ(fp->dtype, KvDtype::kBf16);
  StatusOr<std::uint64_t> bytes = fp->BlockBytes();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, kExactBytes);
  v1::ModelFingerprint wire;
  FingerprintToProto(*fp, &wire);
  EXPECT_EQ(wire.SerializeAsString(), TestFingerprint().SerializeAsString());
}

// Block-key v2 (docs/block-key.md, 6.7): every new field crosses the wire both
// ways, and the daemon's digest is the client's.
TEST(CacheHostConvertTest, FingerprintV2FieldsRoundTripAndDigestAgrees) {
  ModelFingerprint fp = *FingerprintFromProto(TestFingerprint(), DefaultLimits());
  fp.key_version = 2;
  fp.weights_revision = std::string("rev\0\xff", 5);  // bytes, not UTF-8
  fp.quantization = "awq-int4";
  fp.kv_scale_scheme = "fp8-per-tensor";
  fp.kv_scales_digest.fill(0x5a);
  fp.rope = "factor=8;scaling=llama3;theta=500000";
  fp.v_head_dim = 8;
  fp.vocab_size = 32000;
  ASSERT_TRUE(fp.Validate().ok()) << fp.Validate();
  v1::ModelFingerprint wire;
  FingerprintToProto(fp, &wire);
  EXPECT_EQ(wire.key_version(), 2u);
  EXPECT_EQ(wire.kv_scales_digest().size(), 32u);
  v1::ModelFingerprint parsed;  // through bytes, as a daemon receives it
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  StatusOr<ModelFingerprint> back = FingerprintFromProto(parsed, DefaultLimits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, fp);
  EXPECT_EQ(*back->Digest(), *fp.Digest());

  // Each field on its own changes what the daemon computes.
  const v1::ModelFingerprint base = wire;
  std::vector<v1::ModelFingerprint> changed(7, base);
  changed[0].set_weights_revision("other");
  changed[1].set_quantization("gptq");
  changed[2].set_kv_scales_digest(std::string(32, 'x'));
  changed[3].set_kv_scale_scheme("fp8-per-head");
  changed[4].set_rope("theta=10000");
  changed[5].set_v_head_dim(4);
  changed[6].set_vocab_size(32001);
  for (std::size_t i = 0; i < changed.size(); ++i) {
    StatusOr<ModelFingerprint> c = FingerprintFromProto(changed[i], DefaultLimits());
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    EXPECT_NE(*c->Digest(), *fp.Digest()) << i;
  }

  // A v1 fingerprint is written as an older sender writes it: key_version 0,
  // no v2 field, and read back as v1.
  fp = *FingerprintFromProto(TestFingerprint(), DefaultLimits());
  EXPECT_EQ(fp.key_version, 1u);
  fp.key_version = 1;
  FingerprintToProto(fp, &wire);
  EXPECT_EQ(wire.SerializeAsString(), TestFingerprint().SerializeAsString());
  v1::ModelFingerprint explicit_v1 = TestFingerprint();
  explicit_v1.set_key_version(1);
  EXPECT_EQ(*FingerprintFromProto(explicit_v1, DefaultLimits())->Digest(), *fp.Digest());
}

TEST(CacheHostConvertTest, FingerprintV2FieldsOutOfRangeAreRefusedWhole) {
  const v1::Limits limits = DefaultLimits();
  auto refused = [&](const v1::ModelFingerprint& fp, std::string_view part) {
    Status s = FingerprintFromProto(fp, limits).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message().substr(0, 11), "fingerprint") << s;
    EXPECT_NE(s.message().find(part), std::string_view::npos) << s;
  };
  v1::ModelFingerprint fp = TestFingerprint();
  fp.set_key_version(3);
  refused(fp, "fingerprint.key_version: 3; this server computes block-key encodings 1 and 2");
  fp = TestFingerprint();
  fp.set_key_version(2);
  fp.set_kv_scale_scheme("fp8-per-tensor");
  fp.set_kv_scales_digest(std::string(5, 'd'));
  refused(fp, "fingerprint.kv_scales_digest: 5 bytes; empty or 32 required");
  fp.clear_kv_scales_digest();
  refused(fp, "needs kv_scales_digest");
  fp = TestFingerprint();
  fp.set_key_version(2);
  fp.set_rope("theta=1e6");
  refused(fp, "write 1e6 as 1000000");
  fp = TestFingerprint();
  fp.set_key_version(2);
  fp.set_quantization(std::string(65, 'q'));
  refused(fp, "quantization is 65 bytes, the limit is 64");
  // v2 fields from a sender that left key_version unset (v1) are refused, not
  // dropped: the digest would not cover them.
  fp = TestFingerprint();
  fp.set_vocab_size(32000);
  refused(fp, "vocab_size 32000 cannot be expressed in block-key v1; set key_version 2");
}

TEST(CacheHostConvertTest, DaemonRefusesUnequalKeyAndValueHeadsItCannotStore) {
  v1::ModelFingerprint fp = TestFingerprint();
  fp.set_key_version(2);
  fp.set_v_head_dim(8);                                         // head_dim 16
  EXPECT_TRUE(FingerprintFromProto(fp, DefaultLimits()).ok());  // keyed, planned
  Status s = StorableFingerprintFromProto(fp, DefaultLimits()).status();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s;
  EXPECT_EQ(s.message().rfind("fingerprint: v_head_dim 8 != head_dim 16", 0), 0u) << s;
  fp.set_v_head_dim(16);
  EXPECT_TRUE(StorableFingerprintFromProto(fp, DefaultLimits()).ok());
  EXPECT_TRUE(StorableFingerprintFromProto(TestFingerprint(), DefaultLimits()).ok());
}

TEST(CacheHostConvertTest, IncompleteOrInvalidFingerprintIsRefusedWhole) {
  const v1::Limits limits = DefaultLimits();
  auto refused = [&](v1::ModelFingerprint fp) {
    Status s = FingerprintFromProto(fp, limits).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().substr(0, 11), "fingerprint") << s;
    return std::string(s.message());
  };
  v1::ModelFingerprint fp = TestFingerprint();
  fp.clear_model_id();
  EXPECT_EQ(refused(fp), "fingerprint.model_id: empty; a model id is required");
  fp = TestFingerprint();
  fp.set_model_id(std::string(257, 'm'));
  EXPECT_EQ(refused(fp), "fingerprint.model_id: 257 bytes > max_model_id_bytes 256");
  fp = TestFingerprint();
  fp.set_tokens_per_block(512);
  EXPECT_EQ(refused(fp), "fingerprint.tokens_per_block: 512 > max_tokens_per_block 256");
  fp = TestFingerprint();
  fp.clear_dtype();
  refused(fp);
  fp = TestFingerprint();
  fp.clear_layer_count();
  refused(fp);
  fp = TestFingerprint();
  fp.clear_layout_version();
  refused(fp);
  fp = TestFingerprint();
  fp.set_tp_rank(1);  // == tp_size
  refused(fp);
  fp = TestFingerprint();
  fp.set_tokens_per_block(12);  // not a power of two
  refused(fp);
}

TEST_F(CacheHostDescriptorTest, CompleteDescriptorBecomesBlockMeta) {
  v1::BlockDescriptor d = ExactDescriptor(3);
  d.set_crc32c(1234);  // ignored: Commit gives the CRC
  StatusOr<BlockMeta> meta = Meta(d);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->bytes, kExactBytes);
  EXPECT_EQ(meta->representation, BlockRepresentation::kExact);
  EXPECT_EQ(meta->fingerprint, digest_);
  EXPECT_EQ(meta->tokens, 16u);
  EXPECT_EQ(meta->token_offset, 32u);

  // A digest that matches is accepted, and the descriptor round-trips.
  d.set_fingerprint_digest(std::string(digest_.begin(), digest_.end()));
  meta = Meta(d);
  ASSERT_TRUE(meta.ok()) << meta.status();
  v1::BlockDescriptor back;
  DescriptorFromMeta(*BlockKeyFromProto(d.key(), "key"), *meta, 1234, &back);
  EXPECT_EQ(back.SerializeAsString(), d.SerializeAsString());
  // Writers of format version 1 (same payload layout) are still accepted.
  d.set_format_version(1);
  EXPECT_TRUE(Meta(d).ok()) << Meta(d).status();
}

// Issue 17: prefix_tokens feeds the cost-aware eviction score; a hostile
// value made a block look too costly to ever evict.
TEST_F(CacheHostDescriptorTest, PrefixTokensAreWholeBlocksWithinTheLongestChain) {
  v1::BlockDescriptor d = ExactDescriptor(1);
  d.set_prefix_tokens(16 * (65536 - 1));
  EXPECT_TRUE(Meta(d).ok()) << Meta(d).status();
  d.set_prefix_tokens(16 * 65536);
  Status s = Meta(d).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "blocks[2].prefix_tokens: 1048576; must be a multiple of tokens_per_block 16 below "
            "1048576 (max_chain_blocks 65536 blocks)");
  d.set_prefix_tokens(~std::uint64_t{0});
  EXPECT_EQ(Meta(d).status().code(), StatusCode::kInvalidArgument);
  d.set_prefix_tokens(17);
  EXPECT_EQ(Meta(d).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CacheHostDescriptorTest, CompactBlockNeedsOnlyEvenLayerSplit) {
  v1::BlockDescriptor d = ExactDescriptor(3);
  d.set_representation(v1::REPRESENTATION_COMPACT_INT8);
  d.set_payload_bytes(1000);  // multiple of 2 x 2 layers
  EXPECT_TRUE(Meta(d).ok()) << Meta(d).status();
  d.set_payload_bytes(1002);
  EXPECT_EQ(Meta(d).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CacheHostDescriptorTest, BadDescriptorIsInvalidArgumentNamingTheEntryAndField) {
  auto message = [&](const v1::BlockDescriptor& d) {
    Status s = Meta(d).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message().substr(0, 9), "blocks[2]") << s;
    return std::string(s.message());
  };
  v1::BlockDescriptor d = ExactDescriptor(3);
  d.set_payload_bytes(0);
  EXPECT_EQ(message(d), "blocks[2].payload_bytes: 0; a block holds at least 1 byte");
  d = ExactDescriptor(3);
  d.clear_representation();
  message(d);
  d = ExactDescriptor(3);
  d.clear_format_version();
  EXPECT_EQ(message(d), "blocks[2].format_version: unset; this daemon accepts 1 to 2");
  d.set_format_version(3);
  EXPECT_EQ(message(d), "blocks[2].format_version: 3; this daemon accepts 1 to 2");
  d = ExactDescriptor(3);
  d.set_token_count(8);
  EXPECT_EQ(message(d),
            "blocks[2].token_count: 8 != fingerprint.tokens_per_block 16 (only full blocks are "
            "keyed)");
  d = ExactDescriptor(3);
  d.set_payload_bytes(kExactBytes + 1);  // not what the shape needs
  message(d);
  d = ExactDescriptor(3);
  d.set_fingerprint_digest("abc");
  EXPECT_EQ(message(d), "blocks[2].fingerprint_digest: 3 bytes; empty or 32 required");
  d.set_fingerprint_digest(std::string(32, '\0'));
  EXPECT_NE(message(d).find("is not the digest of the request's fingerprint"), std::string::npos);
}

TEST(CacheHostConvertTest, EntryStatusCarriesCodeByValueAndMessage) {
  v1::EntryStatus entry;
  entry.set_code(5);
  StatusToEntry(Status::OK(), &entry);
  EXPECT_EQ(entry.code(), 0);
  EXPECT_TRUE(entry.message().empty());
  EXPECT_TRUE(StatusFromEntry(entry).ok());

  StatusToEntry(Status::DataLoss("crc 1 != 2"), &entry);
  EXPECT_EQ(entry.code(), 15);
  EXPECT_EQ(entry.message(), "crc 1 != 2");
  EXPECT_EQ(StatusFromEntry(entry), Status::DataLoss("crc 1 != 2"));
  StatusToEntry(Status::AlreadyExists("x"), &entry);
  EXPECT_EQ(entry.code(), 6);

  entry.set_code(99);
  EXPECT_EQ(StatusFromEntry(entry).code(), StatusCode::kInternal);
}

TEST(CacheHostConvertTest, GrantIsOwnerDrivenOverOnePoolRegionWithTheToken) {
  cache_host::GrantInfo grant;
  grant.lease_id = 42;
  grant.ttl_us = 5'000'999;
  for (std::size_t i = 0; i < grant.token.size(); ++i) grant.token[i] = std::uint8_t(i + 1);
  v1::TransportGrant wire;
  GrantToProto(grant, "10.0.0.1:7000", 8u << 20, &wire);
  EXPECT_EQ(wire.mode(), v1::TRANSFER_MODE_OWNER_DRIVEN);
  EXPECT_EQ(wire.transport_address(), "10.0.0.1:7000");
  ASSERT_EQ(wire.regions_size(), 1);
  EXPECT_EQ(wire.regions(0).length_bytes(), 8u << 20);
  EXPECT_EQ(wire.regions(0).base_address(), 0u);
  EXPECT_TRUE(wire.regions(0).remote_key().empty());
  ASSERT_EQ(wire.access_token().size(), 16u);
  EXPECT_EQ(wire.access_token()[0], 1);
  EXPECT_EQ(wire.access_token()[15], 16);

  const cache_host::ByteExtent extents[] = {{65536, 65536}, {0, 100}};
  google::protobuf::RepeatedPtrField<v1::Extent> out;
  ExtentsToProto(extents, &out);
  ASSERT_EQ(out.size(), 2);
  EXPECT_EQ(out.Get(0).region_index(), 0u);
  EXPECT_EQ(out.Get(0).offset_bytes(), 65536u);
  EXPECT_EQ(out.Get(1).length_bytes(), 100u);
}

TEST(CacheHostConvertTest, TtlZeroMeansTheDefaultAndMillisecondsTruncate) {
  v1::Limits limits = DefaultLimits();
  EXPECT_EQ(TtlUsFromMs(0, limits), 30'000'000u);
  EXPECT_EQ(TtlUsFromMs(1500, limits), 1'500'000u);
  limits.set_default_ttl_ms(2000);
  EXPECT_EQ(TtlUsFromMs(0, limits), 2'000'000u);
  EXPECT_EQ(TtlMsFromUs(5'000'999), 5000u);
  EXPECT_EQ(TtlMsFromUs(999), 0u);
  EXPECT_EQ(TtlMsFromUs(~std::uint64_t{0}), 0xFFFFFFFFu);
}

cache_host::CacheHostSnapshot TestSnapshot() {
  cache_host::CacheHostSnapshot s;
  s.state = cache_host::ServingState::kServing;
  s.uptime_us = 77;
  s.memory_locked = true;
  s.page_bytes = 65536;
  s.pages.pages = 128;
  s.pages.free = 100;
  s.pages.reserved = 5;
  s.pages.committed = 20;
  s.pages.staging = 3;
  s.pages.leased = 2;
  s.table.active_reservations = 4;
  s.table.active_leases = 6;
  s.table.reservations_expired = 7;
  s.table.leases_expired = 8;
  s.table.hits = 9;
  s.table.misses = 10;
  s.table.commits = 11;
  s.table.crc_failures = 1;
  s.staging_crc_failures = 2;
  s.recovery.dropped_corrupt = 3;
  s.recovery.dropped_torn = 4;
  s.recovery.recovered = 12;
  s.table.demotions_completed = 13;
  s.table.promotions_completed = 14;
  s.evictions_by_action[1] = 1;
  s.evictions_by_action[2] = 2;
  s.evictions_by_action[3] = 3;
  s.nvme_enabled = true;
  s.nvme_capacity_bytes = 1 << 30;
  s.nvme.used_bytes = 1 << 20;
  s.nvme.live_bytes = 1 << 19;
  return s;
}

TEST(CacheHostConvertTest, StatsFillTiersAndCountersFromTheSnapshot) {
  cache_host::CacheHostSnapshot s = TestSnapshot();
  cache_host::NamespaceUsage a;
  a.tenant = "a";
  a.host_bytes = 65536;
  a.blocks = 3;
  a.host_blocks = 2;
  a.nvme_blocks = 2;
  s.namespaces.push_back(a);
  StatsContext context{8u << 20, 4096, cache_host::EvictionPolicyKind::kLru};
  v1::StatsResponse out;
  StatsFromSnapshot(s, context, false, &out);

  ASSERT_EQ(out.tiers_size(), 2);
  const v1::TierUsage& host = out.tiers(0);
  EXPECT_EQ(host.tier(), v1::TIER_HOST);
  EXPECT_EQ(host.capacity_bytes(), 8u << 20);
  EXPECT_EQ(host.committed_bytes(), 20u * 65536);
  EXPECT_EQ(host.reserved_bytes(), 5u * 65536);
  EXPECT_EQ(host.leased_bytes(), 2u * 65536);
  EXPECT_EQ(host.staging_bytes(), 3u * 65536);
  EXPECT_EQ(host.free_bytes(), 100u * 65536);
  EXPECT_EQ(host.page_bytes(), 65536u);
  EXPECT_EQ(host.blocks(), 2u);
  const v1::TierUsage& nvme = out.tiers(1);
  EXPECT_EQ(nvme.tier(), v1::TIER_NVME);
  EXPECT_EQ(nvme.capacity_bytes(), 1u << 30);
  EXPECT_EQ(nvme.committed_bytes(), 1u << 19);
  EXPECT_EQ(nvme.free_bytes(), (1u << 30) - (1u << 20));
  EXPECT_EQ(nvme.page_bytes(), 4096u);
  EXPECT_EQ(nvme.blocks(), 2u);

  EXPECT_EQ(out.blocks(), 3u);
  EXPECT_EQ(out.active_reservations(), 4u);
  EXPECT_EQ(out.active_read_leases(), 6u);
  EXPECT_EQ(out.reservations_expired_total(), 7u);
  EXPECT_EQ(out.read_leases_expired_total(), 8u);
  EXPECT_EQ(out.hits_total(), 9u);
  EXPECT_EQ(out.misses_total(), 10u);
  EXPECT_EQ(out.commits_total(), 11u);
  EXPECT_EQ(out.crc_failures_total(), 6u);
  EXPECT_EQ(out.evictions_total(), 6u);
  EXPECT_EQ(out.demotions_total(), 13u);
  EXPECT_EQ(out.promotions_total(), 14u);
  EXPECT_EQ(out.recovered_blocks(), 12u);
  EXPECT_EQ(out.recovery_dropped_blocks(), 7u);
  EXPECT_EQ(out.eviction_policy(), v1::EVICTION_POLICY_LRU);
  EXPECT_TRUE(out.memory_locked());
  EXPECT_EQ(out.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(out.uptime_us(), 77u);
  EXPECT_EQ(out.namespaces_size(), 0);

  s.nvme_enabled = false;
  v1::StatsResponse host_only;
  StatsFromSnapshot(s, context, false, &host_only);
  EXPECT_EQ(host_only.tiers_size(), 1);
}

TEST(CacheHostConvertTest, StatsListAtMost1024NamespacesLargestFirst) {
  const std::uint64_t seed =
      TestSeed("CacheHostConvertTest.StatsListAtMost1024NamespacesLargestFirst");
  std::mt19937_64 rng(seed);
  cache_host::CacheHostSnapshot s = TestSnapshot();
  constexpr int kNamespaces = 1500;
  for (int i = 0; i < kNamespaces; ++i) {
    cache_host::NamespaceUsage u;
    u.tenant = "t" + std::to_string(i);
    // Distinct sizes: namespace i holds (i + 1) pages, on host or NVMe.
    const std::uint64_t bytes = std::uint64_t(i + 1) * 65536;
    if (rng() % 2 == 0) {
      u.host_bytes = bytes;
    } else {
      u.nvme_bytes = bytes;
    }
    u.reserved_bytes = std::uint64_t(i);
    u.quota_bytes = 1u << 30;
    u.blocks = std::uint64_t(i + 1);
    u.hits = 2;
    u.misses = 1;
    s.namespaces.push_back(u);
  }
  std::shuffle(s.namespaces.begin(), s.namespaces.end(), rng);
  v1::StatsResponse out;
  StatsFromSnapshot(s, {8u << 20, 4096, cache_host::EvictionPolicyKind::kCostAware}, true, &out);
  ASSERT_EQ(out.namespaces_size(), 1024);
  for (int k = 0; k < out.namespaces_size(); ++k) {
    const int i = kNamespaces - 1 - k;  // the largest first
    const v1::NamespaceUsage& n = out.namespaces(k);
    EXPECT_EQ(n.namespace_(), "t" + std::to_string(i));
    EXPECT_EQ(n.committed_bytes(), std::uint64_t(i + 1) * 65536);
    EXPECT_EQ(n.reserved_bytes(), std::uint64_t(i));
    EXPECT_EQ(n.quota_bytes(), 1u << 30);
    EXPECT_EQ(n.blocks(), std::uint64_t(i + 1));
    EXPECT_EQ(n.hits_total(), 2u);
    EXPECT_EQ(n.misses_total(), 1u);
  }
  EXPECT_EQ(out.eviction_policy(), v1::EVICTION_POLICY_COST_AWARE);
}

}  // namespace
}  // namespace kvfabric
