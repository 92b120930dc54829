// The wire-limit checks and proto <-> core conversions of the placement adapter, without gRPC
// or a node.
#include "server/placement_convert.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "server/cache_host_convert.h"

namespace kvfabric {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string Key(int i) {
  std::string key(BlockKey::kSize, '\x33');
  key[0] = static_cast<char>(i & 0xFF);
  key[1] = static_cast<char>((i >> 8) & 0xFF);
  return key;
}

// 2 layers x 2 x 16 tokens x 2 heads x 16 dims x bf16 = 4096 bytes per block.
v1::ModelFingerprint TestFingerprint() {
  v1::ModelFingerprint fp;
  fp.set_model_id("test/model@1");
  fp.set_layer_count(2);
  fp.set_dtype(v1::DTYPE_BF16);
  fp.set_kv_heads(2);
  fp.set_head_dim(16);
  fp.set_tokens_per_block(16);
  fp.set_tp_size(1);
  fp.set_layout_version(1);
  return fp;
}

v1::TierUsage Usage(v1::Tier tier, std::uint64_t capacity, std::uint64_t free) {
  v1::TierUsage t;
  t.set_tier(tier);
  t.set_capacity_bytes(capacity);
  t.set_free_bytes(free);
  return t;
}

void ExpectInvalid(const Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message(), message);
}

// ---------------------------------------------------------------- limits and checks

TEST(PlacementConvertTest, NodeLimitsAreTheWireLimits) {
  v1::Limits limits = DefaultLimits();
  limits.set_max_chain_blocks(1000);
  limits.set_max_ttl_ms(5000);
  const placement::PlacementLimits l = PlacementLimitsFromProto(limits);
  EXPECT_EQ(l.max_keys_per_batch, 4096u);
  EXPECT_EQ(l.max_chain_blocks, 1000u);
  EXPECT_EQ(l.max_replicas, 8u);
  EXPECT_EQ(l.max_namespace_bytes, 256u);
  EXPECT_EQ(l.max_block_bytes, std::uint64_t{64} << 20);
  EXPECT_EQ(l.max_ttl_ms, 5000u);
  EXPECT_EQ(l.default_ttl_ms, 30000u);
  EXPECT_EQ(l.max_explanation_bytes, 65536u);
}

TEST(PlacementConvertTest, ChecksNameTheLimitAndBothNumbers) {
  const v1::Limits limits = DefaultLimits();
  ExpectInvalid(CheckChainSize(70000, limits), "keys: 70000 > max_chain_blocks 65536");
  ExpectInvalid(CheckChainSize(0, limits), "keys: 0, a chain needs at least 1 key");
  EXPECT_TRUE(CheckChainSize(65536, limits).ok());
  ExpectInvalid(CheckAtMost("events", 5, "max_keys_per_batch", 4),
                "events: 5 > max_keys_per_batch 4");
  EXPECT_TRUE(CheckAtMost("events", 4, "max_keys_per_batch", 4).ok());
  ExpectInvalid(CheckHostId("", "host_id", limits), "host_id: empty; a host_id is required");
  ExpectInvalid(CheckHostId(std::string(129, 'h'), "host_id", limits),
                "host_id: 129 bytes > max_host_id_bytes 128");
  EXPECT_TRUE(CheckHostId(std::string(128, 'h'), "host_id", limits).ok());
  ExpectInvalid(CheckAddress(std::string(257, 'a'), "node_name", limits),
                "node_name: 257 bytes > max_address_bytes 256");
  EXPECT_TRUE(CheckAddress("", "node_name", limits).ok());
}

TEST(PlacementConvertTest, TruncateUtf8NeverSplitsACharacter) {
  const std::uint64_t seed = TestSeed("PlacementConvertTest.TruncateUtf8NeverSplitsACharacter");
  std::mt19937_64 rng(seed);
  // Characters of 1, 2, 3 and 4 bytes.
  const std::vector<std::string> alphabet = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  for (int round = 0; round < 200; ++round) {
    std::string text;
    std::vector<std::size_t> boundaries = {0};
    const int chars = static_cast<int>(rng() % 40);
    for (int c = 0; c < chars; ++c) {
      text += alphabet[rng() % alphabet.size()];
      boundaries.push_back(text.size());
    }
    const std::size_t max = rng() % (text.size() + 2);
    std::string cut = text;
    TruncateUtf8(&cut, max);
    ASSERT_LE(cut.size(), max) << "seed " << seed;
    EXPECT_EQ(text.compare(0, cut.size(), cut), 0) << "seed " << seed;
    // The longest prefix ending on a character boundary within max.
    std::size_t want = 0;
    for (std::size_t b : boundaries) {
      if (b <= max) want = b;
    }
    EXPECT_EQ(cut.size(), want) << "seed " << seed << " text " << text.size() << " max " << max;
  }
}

// ---------------------------------------------------------------- enums

TEST(PlacementConvertTest, EnumsRefuseUnspecifiedAndUnknownValues) {
  EXPECT_EQ(*TierFromProto(v1::TIER_NVME, "tier", false), Tier::kNvme);
  EXPECT_EQ(*TierFromProto(v1::TIER_UNSPECIFIED, "tier", true), Tier::kUnspecified);
  ExpectInvalid(TierFromProto(v1::TIER_UNSPECIFIED, "t", false).status(),
                "t: unset (TIER_UNSPECIFIED); TIER_HOST or TIER_NVME required");
  ExpectInvalid(TierFromProto(9, "t", true).status(), "t: unknown value 9");
  EXPECT_EQ(TierToProto(Tier::kHost), v1::TIER_HOST);

  EXPECT_EQ(*BlockEventKindFromProto(v1::BLOCK_EVENT_KIND_PRESENT, "k"),
            placement::BlockEventKind::kPresent);
  EXPECT_FALSE(BlockEventKindFromProto(0, "k").ok());
  ExpectInvalid(BlockEventKindFromProto(8, "k").status(), "k: unknown value 8");

  EXPECT_EQ(*BusPathFromProto(v1::BUS_PATH_HOST_TO_NVME, "p"), BusPath::kHostToNvme);
  EXPECT_FALSE(BusPathFromProto(0, "p").ok());
  EXPECT_EQ(*BusPathFromProto(v1::BUS_PATH_LOCAL_MEMCPY, "p"), BusPath::kLocalMemcpy);
  EXPECT_EQ(*BusPathFromProto(v1::BUS_PATH_CLIENT_INGEST, "p"), BusPath::kClientIngest);
  ExpectInvalid(BusPathFromProto(9, "p").status(), "p: unknown value 9");

  EXPECT_EQ(PlanKindToProto(PlanKind::kSplit), v1::PLAN_KIND_SPLIT);
  EXPECT_EQ(RunActionToProto(RunAction::kRecompute), v1::RUN_ACTION_RECOMPUTE);
}

// ---------------------------------------------------------------- membership

v1::RegisterRequest RegisterOf() {
  v1::RegisterRequest req;
  req.set_host_id("h1");
  req.set_incarnation(77);
  req.set_grpc_address("10.0.0.1:7000");
  req.set_transport_address("10.0.0.1:7001");
  req.set_node_name("rack1-n3");
  *req.add_tiers() = Usage(v1::TIER_NVME, 100 * kGiB, 40 * kGiB);
  *req.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 10 * kGiB);
  return req;
}

TEST(PlacementConvertTest, RegisterBecomesAMemberRecordWithItsTierBytes) {
  StatusOr<placement::MemberRecord> r = MemberRecordFromRegister(RegisterOf(), DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host_id, "h1");
  EXPECT_EQ(r->incarnation, 77u);
  EXPECT_EQ(r->grpc_address, "10.0.0.1:7000");
  EXPECT_EQ(r->transport_address, "10.0.0.1:7001");
  EXPECT_EQ(r->node_name, "rack1-n3");
  EXPECT_EQ(r->host_capacity_bytes, 16 * kGiB);
  EXPECT_EQ(r->host_free_bytes, 10 * kGiB);
  EXPECT_EQ(r->nvme_capacity_bytes, 100 * kGiB);
  EXPECT_EQ(r->nvme_free_bytes, 40 * kGiB);
  EXPECT_FALSE(r->draining);

  v1::RegisterRequest bad = RegisterOf();
  bad.set_incarnation(0);
  EXPECT_EQ(MemberRecordFromRegister(bad, DefaultLimits()).status().code(),
            StatusCode::kInvalidArgument);
  bad = RegisterOf();
  bad.set_transport_address(std::string(300, 'x'));
  ExpectInvalid(MemberRecordFromRegister(bad, DefaultLimits()).status(),
                "transport_address: 300 bytes > max_address_bytes 256");
}

TEST(PlacementConvertTest, TierListsRefuseRepeatsUnspecifiedAndFreeOverCapacity) {
  google::protobuf::RepeatedPtrField<v1::TierUsage> tiers;
  *tiers.Add() = Usage(v1::TIER_HOST, 10, 5);
  *tiers.Add() = Usage(v1::TIER_HOST, 10, 5);
  ExpectInvalid(TierUsageFromProto(tiers, "tiers").status(),
                "tiers[1].tier: TIER_HOST listed twice; one entry per tier");
  tiers.Clear();
  *tiers.Add() = Usage(v1::TIER_NVME, 10, 11);
  ExpectInvalid(TierUsageFromProto(tiers, "tiers").status(),
                "tiers[0].free_bytes: 11 > capacity_bytes 10");
  tiers.Clear();
  *tiers.Add() = Usage(v1::TIER_UNSPECIFIED, 10, 1);
  EXPECT_EQ(TierUsageFromProto(tiers, "tiers").status().code(), StatusCode::kInvalidArgument);
  tiers.Clear();
  StatusOr<MemberUpdate> none = TierUsageFromProto(tiers, "tiers");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(PlacementConvertTest, HeartbeatUpdatesOnlyWhatItCarries) {
  v1::HeartbeatRequest beat;
  beat.set_host_id("h1");
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 2 * kGiB);
  beat.set_status(v1::SERVING_STATUS_STARTING);
  StatusOr<MemberUpdate> update = HeartbeatUpdateFromProto(beat, DefaultLimits());
  ASSERT_TRUE(update.ok()) << update.status();
  placement::MemberRecord record = *MemberRecordFromRegister(RegisterOf(), DefaultLimits());
  ApplyMemberUpdate(*update, &record);
  EXPECT_EQ(record.host_free_bytes, 2 * kGiB);
  EXPECT_EQ(record.nvme_free_bytes, 40 * kGiB);  // not listed: unchanged
  EXPECT_TRUE(record.draining);
  EXPECT_EQ(record.grpc_address, "10.0.0.1:7000");

  beat.clear_tiers();
  beat.set_status(v1::SERVING_STATUS_SERVING);
  update = HeartbeatUpdateFromProto(beat, DefaultLimits());
  ASSERT_TRUE(update.ok());
  ApplyMemberUpdate(*update, &record);
  EXPECT_FALSE(record.draining);
  beat.set_status(v1::SERVING_STATUS_UNSPECIFIED);
  EXPECT_TRUE(HeartbeatUpdateFromProto(beat, DefaultLimits())->empty());
  beat.set_status(static_cast<v1::ServingStatus>(42));
  ExpectInvalid(HeartbeatUpdateFromProto(beat, DefaultLimits()).status(),
                "status: unknown value 42");
  beat.set_status(v1::SERVING_STATUS_SERVING);
  beat.clear_host_id();
  ExpectInvalid(HeartbeatUpdateFromProto(beat, DefaultLimits()).status(),
                "host_id: empty; a host_id is required");
}

TEST(PlacementConvertTest, HostStatusShowsDrainingAndOnlyConfiguredTiers) {
  placement::HostStatus status;
  status.record = *MemberRecordFromRegister(RegisterOf(), DefaultLimits());
  status.record.nvme_capacity_bytes = 0;
  status.record.nvme_free_bytes = 0;
  status.record.draining = true;
  status.last_heartbeat_unix_us = 123;
  status.lease_remaining_ms = 456;
  status.directory_blocks = 789;
  v1::HostStatus out;
  HostStatusToProto(status, &out);
  EXPECT_EQ(out.host().host_id(), "h1");
  EXPECT_EQ(out.host().incarnation(), 77u);
  EXPECT_EQ(out.status(), v1::SERVING_STATUS_DRAINING);
  ASSERT_EQ(out.tiers_size(), 1);
  EXPECT_EQ(out.tiers(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(out.tiers(0).free_bytes(), 10 * kGiB);
  EXPECT_EQ(out.last_heartbeat_unix_us(), 123u);
  EXPECT_EQ(out.lease_remaining_ms(), 456u);
  EXPECT_EQ(out.directory_blocks(), 789u);
}

// ---------------------------------------------------------------- reports

v1::ReportBlocksRequest ReportOf(int events) {
  v1::ReportBlocksRequest req;
  req.set_host_id("h1");
  req.set_incarnation(77);
  req.set_membership_lease_id(5);
  req.set_membership_token("0123456789abcdef");
  req.set_sequence(3);
  req.set_snapshot_id(9);
  req.set_snapshot_last(true);
  for (int i = 0; i < events; ++i) {
    v1::BlockEvent* e = req.add_events();
    e->set_kind(v1::BLOCK_EVENT_KIND_PRESENT);
    e->set_namespace_("ns");
    e->mutable_block()->set_key(Key(i));
    e->mutable_block()->set_payload_bytes(4096);
    e->mutable_block()->set_representation(v1::REPRESENTATION_COMPACT_INT8);
    e->set_tier(v1::TIER_NVME);
    e->set_hit_count(i);
  }
  return req;
}

TEST(PlacementConvertTest, ReportBlocksConvertsEveryEvent) {
  StatusOr<placement::BlockReport> r = BlockReportFromProto(ReportOf(2), DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host_id, "h1");
  EXPECT_EQ(r->incarnation, 77u);
  EXPECT_EQ(r->lease_id, 5u);
  EXPECT_EQ(r->token, "0123456789abcdef");
  EXPECT_EQ(r->sequence, 3u);
  EXPECT_EQ(r->snapshot_id, 9u);
  EXPECT_TRUE(r->snapshot_last);
  ASSERT_EQ(r->events.size(), 2u);
  const placement::BlockEvent& e = r->events[1];
  EXPECT_EQ(e.kind, placement::BlockEventKind::kPresent);
  EXPECT_EQ(e.ns, "ns");
  EXPECT_EQ(BlockKeyToProto(e.key), Key(1));
  EXPECT_EQ(e.tier, Tier::kNvme);
  EXPECT_EQ(e.payload_bytes, 4096u);
  EXPECT_EQ(e.representation, 2);
  EXPECT_EQ(e.hit_count, 1u);

  // An empty report (e.g. a snapshot's last chunk) is fine.
  EXPECT_TRUE(BlockReportFromProto(ReportOf(0), DefaultLimits()).ok());
  // An eviction from every tier leaves the tier and the descriptor's details unset.
  v1::ReportBlocksRequest evict = ReportOf(1);
  evict.mutable_events(0)->set_kind(v1::BLOCK_EVENT_KIND_EVICTED);
  evict.mutable_events(0)->set_tier(v1::TIER_UNSPECIFIED);
  evict.mutable_events(0)->mutable_block()->clear_representation();
  EXPECT_TRUE(BlockReportFromProto(evict, DefaultLimits()).ok());
}

TEST(PlacementConvertTest, ReportBlocksRefusesABadEventWhole) {
  const v1::Limits limits = DefaultLimits();
  ExpectInvalid(BlockReportFromProto(ReportOf(4097), limits).status(),
                "events: 4097 > max_keys_per_batch 4096");
  v1::ReportBlocksRequest bad = ReportOf(3);
  bad.mutable_events(2)->mutable_block()->set_key("short");
  ExpectInvalid(BlockReportFromProto(bad, limits).status(),
                "events[2].block.key: 5 bytes; a block key is exactly 32");
  bad = ReportOf(3);
  bad.mutable_events(1)->set_namespace_(std::string(257, 'n'));
  ExpectInvalid(BlockReportFromProto(bad, limits).status(),
                "events[1]: namespace: 257 bytes > max_namespace_bytes 256");
  bad = ReportOf(3);
  bad.mutable_events(0)->mutable_block()->set_representation(static_cast<v1::Representation>(5));
  ExpectInvalid(BlockReportFromProto(bad, limits).status(),
                "events[0].block: representation: unknown value 5");
  bad = ReportOf(1);
  bad.set_sequence(0);
  EXPECT_EQ(BlockReportFromProto(bad, limits).status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- locate and plan

placement::ChainLocations SampleLocations() {
  placement::ChainLocations loc;
  placement::MemberRecord a, b;
  a.host_id = "a";
  a.incarnation = 1;
  a.grpc_address = "a:1";
  a.transport_address = "a:2";
  a.node_name = "n1";
  b = a;
  b.host_id = "b";
  b.incarnation = 2;
  loc.hosts = {a, b};
  loc.blocks = {
      {{1, Tier::kHost, 4096, 1}, {0, Tier::kNvme, 4096, 1}}, {}, {{0, Tier::kHost, 99, 2}}};
  loc.cached_prefix_blocks = 1;
  return loc;
}

TEST(PlacementConvertTest, ChainLocationsSurviveTheRoundTrip) {
  const placement::ChainLocations in = SampleLocations();
  v1::ChainLocations wire;
  ChainLocationsToProto(in, &wire);
  EXPECT_EQ(wire.hosts(1).host_id(), "b");
  EXPECT_EQ(wire.hosts(1).incarnation(), 2u);
  EXPECT_EQ(wire.blocks(0).replicas(1).tier(), v1::TIER_NVME);
  EXPECT_EQ(wire.blocks(2).replicas(0).representation(), v1::REPRESENTATION_COMPACT_INT8);
  StatusOr<placement::ChainLocations> out = ChainLocationsFromProto(wire, 3, DefaultLimits());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->hosts, in.hosts);
  EXPECT_EQ(out->cached_prefix_blocks, 1u);
  ASSERT_EQ(out->blocks.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(out->blocks[i].size(), in.blocks[i].size());
    for (std::size_t r = 0; r < in.blocks[i].size(); ++r) {
      EXPECT_EQ(out->blocks[i][r].host_index, in.blocks[i][r].host_index);
      EXPECT_EQ(out->blocks[i][r].tier, in.blocks[i][r].tier);
      EXPECT_EQ(out->blocks[i][r].payload_bytes, in.blocks[i][r].payload_bytes);
      EXPECT_EQ(out->blocks[i][r].representation, in.blocks[i][r].representation);
    }
  }
}

TEST(PlacementConvertTest, ClientLocationsMustFitTheChainAndTheHostTable) {
  v1::Limits limits = DefaultLimits();
  v1::ChainLocations wire;
  ChainLocationsToProto(SampleLocations(), &wire);
  ExpectInvalid(ChainLocationsFromProto(wire, 4, limits).status(),
                "locations.blocks: 3 != 4 keys (one location per key)");
  v1::ChainLocations bad = wire;
  bad.mutable_blocks(2)->mutable_replicas(0)->set_host_index(2);
  ExpectInvalid(ChainLocationsFromProto(bad, 3, limits).status(),
                "locations.blocks[2].replicas[0].host_index: 2 >= 2 hosts");
  bad = wire;
  bad.mutable_blocks(0)->mutable_replicas(0)->set_tier(v1::TIER_UNSPECIFIED);
  EXPECT_EQ(ChainLocationsFromProto(bad, 3, limits).status().code(), StatusCode::kInvalidArgument);
  bad = wire;
  bad.mutable_hosts(0)->set_incarnation(0);
  EXPECT_EQ(ChainLocationsFromProto(bad, 3, limits).status().code(), StatusCode::kInvalidArgument);
  limits.set_max_replicas(1);
  ExpectInvalid(ChainLocationsFromProto(wire, 3, limits).status(),
                "locations.blocks[0].replicas: 2 > max_replicas 1");
}

v1::PlanRequest PlanOf(int keys) {
  v1::PlanRequest req;
  req.set_namespace_("ns");
  *req.mutable_fingerprint() = TestFingerprint();
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  req.set_client_node("n1");
  req.set_suffix_tokens(5);
  req.set_include_explanation(true);
  return req;
}

TEST(PlacementConvertTest, PlanRequestSizesTheChainFromTheFingerprint) {
  v1::PlanRequest req = PlanOf(3);
  v1::PathParameters* h2d = req.add_client_paths();
  h2d->set_path(v1::BUS_PATH_HOST_TO_DEVICE);
  h2d->set_alpha_us(7);
  h2d->set_beta_bytes_per_s(2e10);
  req.add_client_paths()->set_path(v1::BUS_PATH_DEVICE_TO_HOST);  // accepted, unused
  StatusOr<placement::PlanRequest> r = PlanRequestFromProto(req, "client-7", DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ns, "ns");
  EXPECT_EQ(r->model_id, "test/model@1");
  EXPECT_EQ(r->client_id, "client-7");
  EXPECT_EQ(r->client_node, "n1");
  EXPECT_EQ(r->suffix_tokens, 5u);
  EXPECT_TRUE(r->include_explanation);
  ASSERT_EQ(r->chain.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(BlockKeyToProto(r->chain[i].key), Key(static_cast<int>(i)));
    EXPECT_EQ(r->chain[i].tokens, 16u);
    EXPECT_EQ(r->chain[i].prefix_tokens, 16 * i);
    EXPECT_EQ(r->chain[i].bytes, 4096u);
  }
  ASSERT_TRUE(r->host_to_device.has_value());
  EXPECT_EQ(r->host_to_device->alpha_us, 7);
  EXPECT_EQ(r->host_to_device->beta_bytes_per_s, 2e10);
  EXPECT_TRUE(HasFlatSizeCurve(*r->host_to_device));  // no factors sent: the line alone
  EXPECT_FALSE(r->locations.has_value());
  for (int k = 0; k < kSizeClasses; ++k) h2d->add_size_factors(1 + 0.125 * k);
  r = PlanRequestFromProto(req, "client-7", DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host_to_device->size_factors[7], 1.875);
  h2d->add_size_factors(1);
  ExpectInvalid(PlanRequestFromProto(req, "client-7", DefaultLimits()).status(),
                "client_paths[0].size_factors: must hold 0 or 8 factors, got 9");
  h2d->clear_size_factors();
  EXPECT_FALSE(r->recompute.has_value());

  ChainLocationsToProto(SampleLocations(), req.mutable_locations());
  r = PlanRequestFromProto(req, "client-7", DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->locations.has_value());
  EXPECT_EQ(r->locations->hosts.size(), 2u);
}

// The engine's stated prefill constants arrive whole, c3 (the per-prefix-token term) included;
// a sender without c3 states 0 (the three-term model).
TEST(PlacementConvertTest, PlanRequestCarriesTheEnginesPrefillConstants) {
  v1::PlanRequest req = PlanOf(2);
  v1::RecomputeParameters* pre = req.mutable_engine_prefill();
  pre->set_c0_us(2000);
  pre->set_c1_us(10);
  pre->set_c2_us(0.001);
  pre->set_split_serial_fraction(0.25);
  pre->set_c3_us(0.5);
  StatusOr<placement::PlanRequest> r = PlanRequestFromProto(req, "client-7", DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->engine_prefill.has_value());
  EXPECT_EQ(r->engine_prefill->c0_us, 2000);
  EXPECT_EQ(r->engine_prefill->c1_us_per_token, 10);
  EXPECT_EQ(r->engine_prefill->c2_us_per_token2, 0.001);
  EXPECT_EQ(r->engine_prefill->split_serial_fraction, 0.25);
  EXPECT_EQ(r->engine_prefill->c3_us_per_prefix_token, 0.5);
  pre->clear_c3_us();
  r = PlanRequestFromProto(req, "client-7", DefaultLimits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->engine_prefill->c3_us_per_prefix_token, 0);
}

TEST(PlacementConvertTest, PlanRequestRefusesWhatCannotBePlanned) {
  v1::Limits limits = DefaultLimits();
  ExpectInvalid(PlanRequestFromProto(PlanOf(70000), "", limits).status(),
                "keys: 70000 > max_chain_blocks 65536");
  v1::PlanRequest req = PlanOf(2);
  req.mutable_fingerprint()->clear_model_id();
  ExpectInvalid(PlanRequestFromProto(req, "", limits).status(),
                "fingerprint.model_id: empty; a model id is required");
  req = PlanOf(2);
  req.add_client_paths()->set_path(v1::BUS_PATH_HOST_TO_DEVICE);
  req.add_client_paths()->set_path(v1::BUS_PATH_HOST_TO_DEVICE);
  ExpectInvalid(PlanRequestFromProto(req, "", limits).status(),
                "client_paths[1].path: BUS_PATH_HOST_TO_DEVICE listed twice");
  req = PlanOf(2);
  req.add_client_paths()->set_path(v1::BUS_PATH_UNSPECIFIED);
  EXPECT_EQ(PlanRequestFromProto(req, "", limits).status().code(), StatusCode::kInvalidArgument);
  limits.set_max_block_bytes(4095);
  ExpectInvalid(PlanRequestFromProto(PlanOf(2), "", limits).status(),
                "fingerprint: a block of 4096 bytes > max_block_bytes 4095");
}

TEST(PlacementConvertTest, PlanResultGivesFallbacksForFetchRunsAndCutsTheExplanation) {
  placement::PlanResult result;
  result.plan_id = 12;
  result.plan.kind = PlanKind::kFetchAll;
  result.plan.predicted_total_us = 250;
  result.plan.runs = {{0, 2, RunAction::kFetch, 1, Tier::kHost, 8192, 0, 100},
                      {2, 1, RunAction::kRecompute, 0, Tier::kUnspecified, 4096, 100, 250}};
  result.plan.alternatives = {{PlanKind::kRecomputeAll, 900, 0, 0, false},
                              {PlanKind::kFetchAll, 250, 0, 2, true}};
  result.plan.explanation = std::string(10, 'x') + "\xE2\x82\xAC";  // 13 bytes
  result.locations = SampleLocations();
  result.fallback_host_indices = {{0}, {}};
  v1::Limits limits = DefaultLimits();
  limits.set_max_explanation_bytes(12);
  v1::PlanResponse out;
  PlanResultToProto(result, limits, &out);
  EXPECT_EQ(out.plan_id(), 12u);
  EXPECT_EQ(out.kind(), v1::PLAN_KIND_FETCH_ALL);
  EXPECT_EQ(out.predicted_total_us(), 250);
  ASSERT_EQ(out.runs_size(), 2);
  EXPECT_EQ(out.runs(0).action(), v1::RUN_ACTION_FETCH);
  EXPECT_EQ(out.runs(0).host_index(), 1u);
  EXPECT_EQ(out.runs(0).tier(), v1::TIER_HOST);
  ASSERT_EQ(out.runs(0).fallback_host_indices_size(), 1);
  EXPECT_EQ(out.runs(0).fallback_host_indices(0), 0u);
  EXPECT_EQ(out.runs(0).payload_bytes(), 8192u);
  EXPECT_EQ(out.runs(0).predicted_end_us(), 100);
  EXPECT_EQ(out.runs(1).action(), v1::RUN_ACTION_RECOMPUTE);
  EXPECT_EQ(out.runs(1).tier(), v1::TIER_UNSPECIFIED);
  EXPECT_EQ(out.runs(1).predicted_start_us(), 100);
  ASSERT_EQ(out.alternatives_size(), 2);
  EXPECT_EQ(out.alternatives(0).kind(), v1::PLAN_KIND_RECOMPUTE_ALL);
  EXPECT_EQ(out.alternatives(0).predicted_us(), 900);
  EXPECT_TRUE(out.alternatives(1).chosen());
  EXPECT_EQ(out.locations().hosts_size(), 2);
  EXPECT_EQ(out.locations().cached_prefix_blocks(), 1u);
  EXPECT_EQ(out.explanation(), std::string(10, 'x'));  // the euro sign does not fit whole
}

// ---------------------------------------------------------------- observations and explain

TEST(PlacementConvertTest, ObservationsConvertAndRefuseOverLimitsWhole) {
  v1::ReportObservationsRequest req;
  req.set_namespace_("ns");
  req.set_plan_id(4);
  *req.mutable_fingerprint() = TestFingerprint();
  v1::TransferObservation* t = req.add_transfers();
  t->set_path(v1::BUS_PATH_NVME_TO_HOST);
  t->set_host_id("a");
  t->set_bytes(4096);
  t->set_observed_us(12.5);
  v1::RecomputeObservation* r = req.add_recomputes();
  r->set_tokens(16);
  r->set_prefix_tokens(32);
  r->set_observed_us(900);
  v1::StaleEntry* s = req.add_stale_entries();
  s->set_host_id("b");
  s->set_key(Key(3));
  req.add_fallback_runs(1);
  req.set_plan_finished(true);
  req.set_observed_total_us(1000);
  StatusOr<placement::ObservationReport> o = ObservationReportFromProto(req, DefaultLimits());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ns, "ns");
  EXPECT_EQ(o->plan_id, 4u);
  EXPECT_EQ(o->model_id, "test/model@1");
  ASSERT_EQ(o->transfers.size(), 1u);
  EXPECT_EQ(o->transfers[0].path, BusPath::kNvmeToHost);
  EXPECT_EQ(o->transfers[0].host_id, "a");
  EXPECT_EQ(o->transfers[0].bytes, 4096u);
  EXPECT_EQ(o->transfers[0].observed_us, 12.5);
  ASSERT_EQ(o->recomputes.size(), 1u);
  EXPECT_EQ(o->recomputes[0].tokens, 16u);
  EXPECT_EQ(o->recomputes[0].prefix_tokens, 32u);
  ASSERT_EQ(o->stale_entries.size(), 1u);
  EXPECT_EQ(o->stale_entries[0].host_id, "b");
  EXPECT_EQ(BlockKeyToProto(o->stale_entries[0].key), Key(3));
  EXPECT_EQ(o->fallback_runs, (std::vector<std::uint32_t>{1}));
  EXPECT_TRUE(o->plan_finished);
  EXPECT_EQ(o->observed_total_us, 1000);

  // Without a fingerprint there is no model (recomputes go unscored in the node).
  v1::ReportObservationsRequest plain = req;
  plain.clear_fingerprint();
  EXPECT_EQ(ObservationReportFromProto(plain, DefaultLimits())->model_id, "");

  v1::ReportObservationsRequest bad = req;
  for (int i = 0; i < 4096; ++i) *bad.add_transfers() = *t;
  ExpectInvalid(ObservationReportFromProto(bad, DefaultLimits()).status(),
                "transfers: 4097 > max_keys_per_batch 4096");
  bad = req;
  bad.mutable_transfers(0)->set_path(v1::BUS_PATH_UNSPECIFIED);
  EXPECT_EQ(ObservationReportFromProto(bad, DefaultLimits()).status().code(),
            StatusCode::kInvalidArgument);
  bad = req;
  bad.mutable_stale_entries(0)->set_key(std::string(33, 'k'));
  ExpectInvalid(ObservationReportFromProto(bad, DefaultLimits()).status(),
                "stale_entries[0].key: 33 bytes; a block key is exactly 32");
}

TEST(PlacementConvertTest, PlanExplanationCarriesTheFormulaTermsAndTime) {
  placement::PlanExplanation e;
  e.plan_id = 3;
  e.kind = PlanKind::kSplit;
  e.formula = "t = a + b";
  e.text = "line one\nline two";
  e.terms = {{"alpha_h2d", 10, "us"}, {"beta_h2d", 2.5e10, "bytes/s"}};
  e.decided_unix_us = 1234;
  v1::Limits limits = DefaultLimits();
  limits.set_max_explanation_bytes(8);
  v1::ExplainResponse out;
  PlanExplanationToProto(e, limits, &out);
  EXPECT_EQ(out.kind(), v1::EXPLAIN_KIND_PLAN);
  EXPECT_EQ(out.formula(), "t = a + b");
  EXPECT_EQ(out.text(), "line one");
  ASSERT_EQ(out.terms_size(), 2);
  EXPECT_EQ(out.terms(1).name(), "beta_h2d");
  EXPECT_EQ(out.terms(1).value(), 2.5e10);
  EXPECT_EQ(out.terms(1).unit(), "bytes/s");
  EXPECT_EQ(out.decided_unix_us(), 1234u);
}

// ---------------------------------------------------------------- place

v1::PlaceRequest PlaceOf(int keys) {
  v1::PlaceRequest req;
  req.set_namespace_("ns");
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  req.set_payload_bytes(4096);
  req.set_replicas(2);
  req.add_exclude_host_ids("c");
  return req;
}

TEST(PlacementConvertTest, PlaceRequestChecksEveryLimit) {
  const v1::Limits limits = DefaultLimits();
  StatusOr<placement::PlaceRequest> p = PlaceRequestFromProto(PlaceOf(2), limits);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ns, "ns");
  ASSERT_EQ(p->keys.size(), 2u);
  EXPECT_EQ(BlockKeyToProto(p->keys[1]), Key(1));
  EXPECT_EQ(p->payload_bytes, 4096u);
  EXPECT_EQ(p->replicas, 2u);
  EXPECT_EQ(p->exclude_host_ids, (std::vector<std::string>{"c"}));

  ExpectInvalid(PlaceRequestFromProto(PlaceOf(4097), limits).status(),
                "keys: 4097 > max_keys_per_batch 4096");
  ExpectInvalid(PlaceRequestFromProto(PlaceOf(0), limits).status(), "keys: 0, at least 1 required");
  v1::PlaceRequest bad = PlaceOf(1);
  bad.set_replicas(9);
  ExpectInvalid(PlaceRequestFromProto(bad, limits).status(), "replicas: 9 > max_replicas 8");
  bad = PlaceOf(1);
  bad.set_payload_bytes(0);
  ExpectInvalid(PlaceRequestFromProto(bad, limits).status(),
                "payload_bytes: 0; a block holds at least 1 byte");
  bad = PlaceOf(1);
  bad.add_exclude_host_ids("");
  ExpectInvalid(PlaceRequestFromProto(bad, limits).status(),
                "exclude_host_ids[1]: empty; a host_id is required");
  bad = PlaceOf(1);
  *bad.mutable_fingerprint() = TestFingerprint();
  bad.mutable_fingerprint()->set_tokens_per_block(512);
  ExpectInvalid(PlaceRequestFromProto(bad, limits).status(),
                "fingerprint.tokens_per_block: 512 > max_tokens_per_block 256");
}

TEST(PlacementConvertTest, PlaceResultsCarryTheirEntryStatus) {
  placement::PlaceResponse in;
  in.hosts.resize(2);
  in.hosts[0].host_id = "a";
  in.hosts[1].host_id = "b";
  in.results.resize(2);
  in.results[0].host_indices = {1, 0};
  in.results[0].scores = {0.9, 0.4};
  in.results[0].existing_host_indices = {0};
  in.results[0].hot = true;
  in.results[1].status = Status::ResourceExhausted("no daemon has 4096 bytes free");
  v1::PlaceResponse out;
  PlaceResponseToProto(in, &out);
  ASSERT_EQ(out.hosts_size(), 2);
  EXPECT_EQ(out.hosts(1).host_id(), "b");
  ASSERT_EQ(out.results_size(), 2);
  EXPECT_EQ(out.results(0).status().code(), 0);
  EXPECT_EQ(out.results(0).host_indices(0), 1u);
  EXPECT_EQ(out.results(0).scores(1), 0.4);
  EXPECT_EQ(out.results(0).existing_host_indices(0), 0u);
  EXPECT_TRUE(out.results(0).hot());
  EXPECT_EQ(out.results(1).status().code(), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_EQ(out.results(1).status().message(), "no daemon has 4096 bytes free");
  EXPECT_EQ(out.results(1).host_indices_size(), 0);
}

}  // namespace
}  // namespace kvfabric
