// CacheHostService over a real CacheHostNode (8 MiB pool of 64 KiB pages on
// the in-process loopback transport, no NVMe tier), its handlers called
// directly with a default grpc::ServerContext: no network.
//
// Payloads are zeros, written through the real data plane (a loopback
// DataPlaneClient) before each commit: the daemon publishes only bytes a
// transfer wrote (issue 17), so a commit needs both the write and the CRC32C
// of zeros.
#include "server/cache_host_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/data_plane_client.h"
#include "core/crc32c.h"
#include "core/env.h"
#include "proto/transfer_wire.h"
#include "proto/wire_limits.h"
#include "server/cache_host/cache_host_node.h"
#include "transport/loopback_transport.h"

namespace kvfabric {
namespace {

constexpr std::uint64_t kPoolBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kPageBytes = std::uint64_t{64} << 10;
// 2 layers x 2 x 16 tokens x 2 heads x 16 dims x bf16.
constexpr std::uint64_t kExactBytes = 4096;

std::string Key(int i) {
  std::string key(BlockKey::kSize, '\xA5');
  key[0] = static_cast<char>(i & 0xFF);
  key[1] = static_cast<char>((i >> 8) & 0xFF);
  return key;
}

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

// An exact block of kExactBytes, or a compact one of `payload_bytes` (a
// multiple of 2 x 2 layers).
v1::BlockDescriptor Block(int i, std::uint64_t payload_bytes = kExactBytes) {
  v1::BlockDescriptor d;
  d.set_key(Key(i));
  d.set_payload_bytes(payload_bytes);
  d.set_representation(payload_bytes == kExactBytes ? v1::REPRESENTATION_EXACT
                                                    : v1::REPRESENTATION_COMPACT_INT8);
  d.set_format_version(2);
  d.set_token_count(16);
  d.set_prefix_tokens(16 * static_cast<std::uint64_t>(i));
  return d;
}

v1::ReserveRequest ReserveOf(const std::string& ns, std::vector<v1::BlockDescriptor> blocks) {
  v1::ReserveRequest req;
  req.set_namespace_(ns);
  *req.mutable_fingerprint() = TestFingerprint();
  for (v1::BlockDescriptor& b : blocks) *req.add_blocks() = std::move(b);
  return req;
}

std::uint32_t ZerosCrc(std::uint64_t bytes) {
  const std::string zeros(bytes, '\0');
  return crc32c::Value(zeros.data(), zeros.size());
}

std::uint64_t ExtentBytes(const google::protobuf::RepeatedPtrField<v1::Extent>& extents) {
  std::uint64_t total = 0;
  for (const v1::Extent& e : extents) {
    EXPECT_EQ(e.region_index(), 0u);
    EXPECT_GE(e.length_bytes(), 1u);
    EXPECT_LE(e.offset_bytes() + e.length_bytes(), kPoolBytes);
    total += e.length_bytes();
  }
  return total;
}

class CacheHostServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<transport::LoopbackTransport>> t =
        transport::CreateLoopbackTransport({&network_});
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    cache_host::CacheHostOptions options;
    options.host_id = "test-host";
    options.pool.pool_bytes = kPoolBytes;
    options.pool.page_bytes = kPageBytes;
    options.pool.lock_mode = cache_host::LockMode::kOff;
    options.prefault = false;
    options.transport_allocates_pool = false;  // loopback allocations are not page-aligned
    options.transport_address = "loopback:0";
    StatusOr<std::unique_ptr<cache_host::CacheHostNode>> node =
        cache_host::CacheHostNode::Create(std::move(options), transport_.get(), Env::Default());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    health_ = std::make_unique<HealthReporter>(Env::Default(), "test-host", "0.0.0-test");
    health_->SetState(v1::SERVING_STATUS_SERVING, "");
    CacheHostServiceOptions service_options;
    service_options.transport_address = node_->transport_address();
    service_options.admin = true;  // the fixture's calls play operator too
    service_ = std::make_unique<CacheHostService>(node_.get(), health_.get(), service_options);

    auto client_transport = transport::CreateLoopbackTransport({&network_});
    ASSERT_TRUE(client_transport.ok()) << client_transport.status();
    client_transport_ = std::move(*client_transport);
    auto staging = client_transport_->AllocateMemory(kPoolBytes, transport::MemoryKind::kHost);
    ASSERT_TRUE(staging.ok()) << staging.status();
    staging_ = std::move(*staging);
    std::memset(staging_->bytes().data(), 0, staging_->bytes().size());
    auto dp = client::DataPlaneClient::Create(client_transport_.get());
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = std::move(*dp);
    auto conn = dp_->Connect(node_->transport_address(), Deadline());
    ASSERT_TRUE(conn.ok()) << conn.status();
    conn_ = std::move(*conn);
    ASSERT_TRUE(dp_->ExportRegion(conn_.get(), 1, *staging_, Deadline()).ok());
  }

  static transport::Deadline Deadline() {
    return std::chrono::steady_clock::now() + std::chrono::seconds(10);
  }

  // Writes zeros into every granted extent of `reserved` over the data plane.
  void WriteZeros(const v1::ReserveResponse& reserved) {
    std::vector<wire::TransferRange> ranges;
    for (const v1::ReserveResult& r : reserved.results()) {
      for (const v1::Extent& e : r.extents()) ranges.push_back({e.offset_bytes(), e.length_bytes(), 0});
    }
    if (ranges.empty()) return;
    std::array<std::uint8_t, 16> token{};
    ASSERT_EQ(reserved.grant().access_token().size(), token.size());
    std::memcpy(token.data(), reserved.grant().access_token().data(), token.size());
    const Status s = dp_->Transfer(conn_.get(), client::DataOp::kPut, reserved.lease_id(), token, 1,
                                   ranges, Deadline());
    ASSERT_TRUE(s.ok()) << s;
  }

  // Calls handler `method` of `service` (default: the fixture's) with a fresh
  // context.
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (CacheHostService::*method)(grpc::ServerContext*, const Req*,
                                                             Resp*),
                    const Req& request, Resp* response, CacheHostService* service = nullptr) {
    grpc::ServerContext context;
    return ((service != nullptr ? service : service_.get())->*method)(&context, &request, response);
  }

  // Reserves and commits block `i` of `payload_bytes` in `ns`.
  void Publish(const std::string& ns, int i, std::uint64_t payload_bytes = kExactBytes) {
    v1::ReserveResponse reserved;
    ASSERT_TRUE(
        Call(&CacheHostService::Reserve, ReserveOf(ns, {Block(i, payload_bytes)}), &reserved).ok());
    ASSERT_EQ(reserved.results(0).status().code(), 0) << reserved.results(0).status().message();
    WriteZeros(reserved);
    v1::CommitRequest commit;
    commit.set_namespace_(ns);
    commit.set_lease_id(reserved.lease_id());
    commit.set_access_token(reserved.grant().access_token());
    v1::CommitEntry* e = commit.add_entries();
    e->set_key(Key(i));
    e->set_crc32c(ZerosCrc(payload_bytes));
    v1::CommitResponse committed;
    ASSERT_TRUE(Call(&CacheHostService::Commit, commit, &committed).ok());
    ASSERT_EQ(committed.results(0).status().code(), 0) << committed.results(0).status().message();
  }

  v1::LookupResult LookupOne(const std::string& ns, int i) {
    v1::LookupRequest req;
    req.set_namespace_(ns);
    req.add_keys(Key(i));
    v1::LookupResponse resp;
    grpc::Status s = Call(&CacheHostService::Lookup, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.results_size() == 1 ? resp.results(0) : v1::LookupResult();
  }

  // Destroyed in reverse: the service, the node, then its transport.
  transport::LoopbackNetwork network_;
  std::unique_ptr<transport::LoopbackTransport> transport_;
  std::unique_ptr<cache_host::CacheHostNode> node_;
  std::unique_ptr<HealthReporter> health_;
  std::unique_ptr<CacheHostService> service_;
  // The writer's side: destroyed first (it closes its connection).
  std::unique_ptr<transport::LoopbackTransport> client_transport_;
  std::unique_ptr<transport::MemoryRegion> staging_;
  std::unique_ptr<client::DataPlaneClient> dp_;
  std::shared_ptr<client::DaemonConnection> conn_;
};

void ExpectInvalid(const grpc::Status& s, const std::string& message) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), message);
}

TEST_F(CacheHostServiceTest, BatchOverMaxKeysPerBatchIsRefusedNamingTheLimit) {
  v1::LookupRequest lookup;
  for (int i = 0; i < 4097; ++i) lookup.add_keys(Key(i));
  v1::LookupResponse resp;
  ExpectInvalid(Call(&CacheHostService::Lookup, lookup, &resp),
                "keys: 4097 > max_keys_per_batch 4096");
  EXPECT_EQ(resp.results_size(), 0);

  v1::RenewRequest renew;
  for (int i = 0; i < 4097; ++i) renew.add_lease_ids(i + 1);
  v1::RenewResponse renewed;
  ExpectInvalid(Call(&CacheHostService::Renew, renew, &renewed),
                "lease_ids: 4097 > max_keys_per_batch 4096");

  v1::ReleaseRequest release;
  for (int i = 0; i < 2; ++i) {
    v1::ReleaseEntry* e = release.add_entries();
    e->set_lease_id(i + 1);
    for (int k = 0; k < 2049; ++k) e->add_keys(Key(k));
  }
  v1::ReleaseResponse released;
  ExpectInvalid(Call(&CacheHostService::Release, release, &released),
                "keys of all entries: 4098 > max_keys_per_batch 4096");
}

TEST_F(CacheHostServiceTest, EmptyBatchesAreRefused) {
  v1::ReserveResponse reserve;
  ExpectInvalid(Call(&CacheHostService::Reserve, ReserveOf("", {}), &reserve),
                "blocks: 0, at least 1 required");
  v1::CommitResponse commit;
  ExpectInvalid(Call(&CacheHostService::Commit, v1::CommitRequest(), &commit),
                "entries: 0, at least 1 required");
  v1::LeaseResponse lease;
  ExpectInvalid(Call(&CacheHostService::Lease, v1::LeaseRequest(), &lease),
                "keys: 0, at least 1 required");
  v1::DeleteResponse del;
  ExpectInvalid(Call(&CacheHostService::Delete, v1::DeleteRequest(), &del),
                "keys: 0, at least 1 required");
}

TEST_F(CacheHostServiceTest, KeyNamespaceAndTtlLimitsAreWholeRequestErrors) {
  v1::LookupRequest lookup;
  lookup.add_keys(Key(1));
  lookup.add_keys(std::string(31, 'k'));
  v1::LookupResponse looked;
  ExpectInvalid(Call(&CacheHostService::Lookup, lookup, &looked),
                "keys[1]: 31 bytes; a block key is exactly 32");

  v1::DeleteRequest del;
  del.set_namespace_(std::string(257, 'n'));
  del.add_keys(Key(1));
  v1::DeleteResponse deleted;
  ExpectInvalid(Call(&CacheHostService::Delete, del, &deleted),
                "namespace: 257 bytes > max_namespace_bytes 256");

  v1::LeaseRequest lease;
  lease.add_keys(Key(1));
  lease.set_ttl_ms(600001);
  v1::LeaseResponse leased;
  ExpectInvalid(Call(&CacheHostService::Lease, lease, &leased),
                "ttl_ms: 600001 > max_ttl_ms 600000");

  lease.set_ttl_ms(0);
  lease.add_keys(Key(1));
  ExpectInvalid(Call(&CacheHostService::Lease, lease, &leased),
                "keys[1] repeats keys[0] (keys must be distinct)");

  lease.clear_keys();
  lease.add_keys(Key(1));
  lease.set_expected_fingerprint_digest("short");
  ExpectInvalid(Call(&CacheHostService::Lease, lease, &leased),
                "expected_fingerprint_digest: 5 bytes; empty or 32 required");
}

TEST_F(CacheHostServiceTest, ReserveChecksBlockSizesFingerprintAndDistinctKeys) {
  v1::ReserveResponse resp;
  ExpectInvalid(Call(&CacheHostService::Reserve, ReserveOf("", {Block(1, (64u << 20) + 4)}), &resp),
                "blocks[0].payload_bytes: 67108868 > max_block_bytes 67108864");
  ExpectInvalid(Call(&CacheHostService::Reserve, ReserveOf("", {Block(1), Block(1)}), &resp),
                "blocks[1].key repeats blocks[0].key (keys must be distinct)");
  v1::ReserveRequest bad_fp = ReserveOf("", {Block(1)});
  bad_fp.mutable_fingerprint()->set_layer_count(0);
  grpc::Status s = Call(&CacheHostService::Reserve, bad_fp, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("fingerprint", 0), 0u) << s.error_message();

  // Tighter limits in force are enforced and reported by Health.
  CacheHostServiceOptions tight;
  tight.transport_address = node_->transport_address();
  tight.limits.set_max_keys_per_batch(2);
  tight.limits.set_max_batch_payload_bytes(8191);
  CacheHostService small(node_.get(), health_.get(), tight);
  ExpectInvalid(Call(&CacheHostService::Reserve, ReserveOf("", {Block(1), Block(2), Block(3)}),
                     &resp, &small),
                "blocks: 3 > max_keys_per_batch 2");
  ExpectInvalid(
      Call(&CacheHostService::Reserve, ReserveOf("", {Block(1), Block(2)}), &resp, &small),
      "payload_bytes of all blocks: 8192 > max_batch_payload_bytes 8191");
  v1::HealthResponse health;
  ASSERT_TRUE(Call(&CacheHostService::Health, v1::HealthRequest(), &health, &small).ok());
  EXPECT_EQ(health.limits().max_keys_per_batch(), 2u);
  EXPECT_EQ(health.limits().max_batch_payload_bytes(), 8191u);
  EXPECT_EQ(health.server_id(), "test-host");
}

TEST_F(CacheHostServiceTest, ReserveGrantsOwnerDrivenExtentsCoveringEachPayload) {
  v1::ReserveResponse resp;
  // One page, two pages (and a bit) of 64 KiB.
  grpc::Status s =
      Call(&CacheHostService::Reserve, ReserveOf("tenant", {Block(1), Block(2, 140000)}), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_NE(resp.lease_id(), 0u);
  EXPECT_GT(resp.ttl_ms(), 0u);
  EXPECT_LE(resp.ttl_ms(), kDefaultTtlMs);
  const v1::TransportGrant& grant = resp.grant();
  EXPECT_EQ(grant.mode(), v1::TRANSFER_MODE_OWNER_DRIVEN);
  EXPECT_EQ(grant.transport_address(), node_->transport_address());
  ASSERT_EQ(grant.regions_size(), 1);
  EXPECT_EQ(grant.regions(0).length_bytes(), node_->pool_bytes());
  EXPECT_EQ(grant.regions(0).base_address(), 0u);
  EXPECT_TRUE(grant.regions(0).remote_key().empty());
  EXPECT_EQ(grant.access_token().size(), 16u);

  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).status().code(), 0) << resp.results(0).status().message();
  EXPECT_EQ(resp.results(1).status().code(), 0) << resp.results(1).status().message();
  EXPECT_EQ(ExtentBytes(resp.results(0).extents()), kExactBytes);
  EXPECT_EQ(ExtentBytes(resp.results(1).extents()), 140000u);
  EXPECT_LE(resp.results(1).extents_size(), 256);
}

TEST_F(CacheHostServiceTest, BadDescriptorIsAnsweredInItsEntryOnly) {
  v1::BlockDescriptor wrong_digest = Block(2);
  wrong_digest.set_fingerprint_digest(std::string(32, '\x01'));
  v1::BlockDescriptor no_version = Block(3);
  no_version.clear_format_version();
  v1::ReserveResponse resp;
  ASSERT_TRUE(
      Call(&CacheHostService::Reserve, ReserveOf("", {Block(1), wrong_digest, no_version}), &resp)
          .ok());
  ASSERT_EQ(resp.results_size(), 3);
  EXPECT_EQ(resp.results(0).status().code(), 0);
  EXPECT_NE(resp.lease_id(), 0u);
  EXPECT_EQ(resp.results(1).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(resp.results(1).status().message().rfind("blocks[1].fingerprint_digest", 0), 0u)
      << resp.results(1).status().message();
  EXPECT_EQ(resp.results(1).extents_size(), 0);
  EXPECT_EQ(resp.results(2).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(resp.results(2).status().message(),
            "blocks[2].format_version: unset; this daemon accepts 1 to 2");

  // Nothing valid: no grant at all.
  v1::ReserveResponse none;
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("", {no_version}), &none).ok());
  EXPECT_EQ(none.lease_id(), 0u);
  EXPECT_EQ(none.ttl_ms(), 0u);
  EXPECT_FALSE(none.has_grant());
}

TEST_F(CacheHostServiceTest, CommitWithWrongCrcIsDataLossAndPublishesNothing) {
  v1::ReserveResponse reserved;
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("", {Block(1)}), &reserved).ok());
  ASSERT_EQ(reserved.results(0).status().code(), 0);
  WriteZeros(reserved);
  v1::CommitRequest commit;
  commit.set_lease_id(reserved.lease_id());
  commit.set_access_token(reserved.grant().access_token());
  v1::CommitEntry* e = commit.add_entries();
  e->set_key(Key(1));
  e->set_crc32c(~ZerosCrc(kExactBytes));
  v1::CommitResponse resp;
  ASSERT_TRUE(Call(&CacheHostService::Commit, commit, &resp).ok());
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).status().code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_FALSE(resp.results(0).status().message().empty());
  EXPECT_EQ(LookupOne("", 1).status().code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CacheHostServiceTest, CommitUnderUnknownLeaseFailsWholeCall) {
  v1::CommitRequest commit;
  commit.set_lease_id(987654321);
  commit.set_access_token(std::string(16, '\x01'));
  commit.add_entries()->set_key(Key(1));
  v1::CommitResponse resp;
  EXPECT_EQ(Call(&CacheHostService::Commit, commit, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  commit.set_access_token("short");
  ExpectInvalid(Call(&CacheHostService::Commit, commit, &resp),
                "access_token: 5 bytes; the grant's access token (from the Reserve or Lease "
                "answer) is 16");
}

// Issue 17: a lease id names a grant but does not let anyone use it. Another
// client that learns tenant a's ids (they are random now, but may be logged or
// observed) and names a's namespace can neither commit, renew nor release them
// without the grant's token; the holder's lease is untouched.
TEST_F(CacheHostServiceTest, LeaseIdWithoutItsTokenCannotCommitRenewOrRelease) {
  v1::ReserveResponse reserved;
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("a", {Block(1)}), &reserved).ok());
  ASSERT_NE(reserved.lease_id(), 0u);
  WriteZeros(reserved);
  Publish("a", 2);
  v1::LeaseRequest lease;
  lease.set_namespace_("a");
  lease.add_keys(Key(2));
  v1::LeaseResponse leased;
  ASSERT_TRUE(Call(&CacheHostService::Lease, lease, &leased).ok());
  ASSERT_NE(leased.lease_id(), 0u);
  EXPECT_NE(leased.lease_id(), reserved.lease_id() + 1) << "ids look sequential";

  std::string wrong = reserved.grant().access_token();
  wrong[0] = static_cast<char>(wrong[0] ^ 1);
  v1::CommitRequest commit;
  commit.set_namespace_("a");
  commit.set_lease_id(reserved.lease_id());
  commit.set_access_token(wrong);
  v1::CommitEntry* e = commit.add_entries();
  e->set_key(Key(1));
  e->set_crc32c(ZerosCrc(kExactBytes));
  commit.set_release_uncommitted(true);
  v1::CommitResponse committed;
  grpc::Status s = Call(&CacheHostService::Commit, commit, &committed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();

  v1::RenewRequest renew;
  renew.set_namespace_("a");
  renew.add_lease_ids(leased.lease_id());
  renew.add_access_tokens(wrong);
  v1::RenewResponse renewed;
  ASSERT_TRUE(Call(&CacheHostService::Renew, renew, &renewed).ok());
  EXPECT_EQ(renewed.results(0).status().code(), grpc::StatusCode::NOT_FOUND);
  renew.add_lease_ids(leased.lease_id());
  ExpectInvalid(Call(&CacheHostService::Renew, renew, &renewed),
                "access_tokens: 1 for 2 lease_ids (one token per lease)");

  v1::ReleaseRequest release;
  release.set_namespace_("a");
  release.add_entries()->set_lease_id(leased.lease_id());
  release.mutable_entries(0)->set_access_token(wrong);
  release.add_entries()->set_lease_id(reserved.lease_id());
  release.mutable_entries(1)->set_access_token(wrong);
  v1::ReleaseResponse released;
  ASSERT_TRUE(Call(&CacheHostService::Release, release, &released).ok());
  EXPECT_EQ(released.results(0).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(released.results(1).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LookupOne("a", 2).active_leases(), 1u) << "the holder's read lease was released";

  // The holders' grants still work.
  commit.set_access_token(reserved.grant().access_token());
  v1::CommitResponse mine;
  ASSERT_TRUE(Call(&CacheHostService::Commit, commit, &mine).ok());
  EXPECT_EQ(mine.results(0).status().code(), 0) << mine.results(0).status().message();
  release.mutable_entries(0)->set_access_token(leased.grant().access_token());
  release.mutable_entries()->RemoveLast();
  v1::ReleaseResponse held;
  ASSERT_TRUE(Call(&CacheHostService::Release, release, &held).ok());
  EXPECT_EQ(held.results(0).status().code(), 0) << held.results(0).status().message();
  EXPECT_EQ(LookupOne("a", 2).active_leases(), 0u);
}

TEST_F(CacheHostServiceTest, CommittedBlockIsVisibleAndCannotBeReservedAgain) {
  Publish("a", 1);
  const v1::LookupResult found = LookupOne("a", 1);
  EXPECT_EQ(found.status().code(), 0);
  EXPECT_EQ(found.tier(), v1::TIER_HOST);
  EXPECT_EQ(found.block().key(), Key(1));
  EXPECT_EQ(found.block().payload_bytes(), kExactBytes);
  EXPECT_EQ(found.block().crc32c(), ZerosCrc(kExactBytes));
  EXPECT_EQ(found.block().representation(), v1::REPRESENTATION_EXACT);
  EXPECT_EQ(found.block().format_version(), 2u);
  EXPECT_EQ(found.block().fingerprint_digest().size(), 32u);
  EXPECT_EQ(found.block().token_count(), 16u);
  EXPECT_EQ(found.block().prefix_tokens(), 16u);
  EXPECT_EQ(found.active_leases(), 0u);

  v1::ReserveResponse again;
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("a", {Block(1)}), &again).ok());
  ASSERT_EQ(again.results_size(), 1);
  EXPECT_EQ(again.results(0).status().code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(again.results(0).extents_size(), 0);
  EXPECT_EQ(again.lease_id(), 0u);
  EXPECT_FALSE(again.has_grant());
}

TEST_F(CacheHostServiceTest, AnotherNamespaceSeesNothing) {
  Publish("a", 1);
  EXPECT_EQ(LookupOne("b", 1).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LookupOne("", 1).status().code(), grpc::StatusCode::NOT_FOUND);
  v1::LeaseRequest lease;
  lease.set_namespace_("b");
  lease.add_keys(Key(1));
  v1::LeaseResponse leased;
  ASSERT_TRUE(Call(&CacheHostService::Lease, lease, &leased).ok());
  EXPECT_EQ(leased.results(0).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(leased.lease_id(), 0u);
  v1::DeleteRequest del;
  del.set_namespace_("b");
  del.add_keys(Key(1));
  v1::DeleteResponse deleted;
  ASSERT_TRUE(Call(&CacheHostService::Delete, del, &deleted).ok());
  EXPECT_EQ(deleted.results(0).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LookupOne("a", 1).status().code(), 0);
}

TEST_F(CacheHostServiceTest, LeaseGrantsReadExtentsUntilReleased) {
  Publish("a", 1);
  Publish("a", 2, 140000);
  v1::LeaseRequest lease;
  lease.set_namespace_("a");
  lease.add_keys(Key(1));
  lease.add_keys(Key(2));
  lease.add_keys(Key(3));  // not committed
  v1::LeaseResponse leased;
  ASSERT_TRUE(Call(&CacheHostService::Lease, lease, &leased).ok());
  ASSERT_NE(leased.lease_id(), 0u);
  EXPECT_EQ(leased.grant().mode(), v1::TRANSFER_MODE_OWNER_DRIVEN);
  EXPECT_EQ(leased.grant().access_token().size(), 16u);
  ASSERT_EQ(leased.results_size(), 3);
  EXPECT_EQ(leased.results(0).status().code(), 0);
  EXPECT_EQ(leased.results(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(leased.results(0).block().crc32c(), ZerosCrc(kExactBytes));
  EXPECT_EQ(ExtentBytes(leased.results(0).extents()), kExactBytes);
  EXPECT_EQ(leased.results(1).block().representation(), v1::REPRESENTATION_COMPACT_INT8);
  EXPECT_EQ(ExtentBytes(leased.results(1).extents()), 140000u);
  EXPECT_EQ(leased.results(2).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LookupOne("a", 1).active_leases(), 1u);

  v1::RenewRequest renew;
  renew.set_namespace_("a");
  renew.add_lease_ids(leased.lease_id());
  renew.add_access_tokens(leased.grant().access_token());
  renew.add_lease_ids(leased.lease_id() + 1000);
  renew.add_access_tokens(leased.grant().access_token());
  renew.set_ttl_ms(5000);
  v1::RenewResponse renewed;
  ASSERT_TRUE(Call(&CacheHostService::Renew, renew, &renewed).ok());
  ASSERT_EQ(renewed.results_size(), 2);
  EXPECT_EQ(renewed.results(0).status().code(), 0);
  EXPECT_GT(renewed.results(0).ttl_ms(), 0u);
  EXPECT_LE(renewed.results(0).ttl_ms(), 5000u);
  EXPECT_EQ(renewed.results(1).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(renewed.results(1).ttl_ms(), 0u);

  v1::ReleaseRequest release;
  release.set_namespace_("a");
  release.add_entries()->set_lease_id(leased.lease_id());
  release.mutable_entries(0)->set_access_token(leased.grant().access_token());
  v1::ReleaseResponse released;
  ASSERT_TRUE(Call(&CacheHostService::Release, release, &released).ok());
  EXPECT_EQ(released.results(0).status().code(), 0);
  EXPECT_EQ(LookupOne("a", 1).active_leases(), 0u);
  v1::ReleaseResponse again;
  ASSERT_TRUE(Call(&CacheHostService::Release, release, &again).ok());
  EXPECT_EQ(again.results(0).status().code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CacheHostServiceTest, LeaseOverBatchPayloadLimitIsRefusedAndLeavesNoLease) {
  Publish("a", 1);
  Publish("a", 2);
  CacheHostServiceOptions tight;
  tight.transport_address = node_->transport_address();
  tight.limits.set_max_batch_payload_bytes(2 * kExactBytes - 1);
  CacheHostService small(node_.get(), health_.get(), tight);
  v1::LeaseRequest lease;
  lease.set_namespace_("a");
  lease.add_keys(Key(1));
  lease.add_keys(Key(2));
  v1::LeaseResponse leased;
  ExpectInvalid(Call(&CacheHostService::Lease, lease, &leased, &small),
                "payload_bytes of the leased blocks: 8192 > max_batch_payload_bytes 8191; lease "
                "fewer keys per call");
  EXPECT_EQ(LookupOne("a", 1).active_leases(), 0u);
  EXPECT_EQ(LookupOne("a", 2).active_leases(), 0u);
}

TEST_F(CacheHostServiceTest, DeletedBlockIsGone) {
  Publish("a", 1);
  v1::DeleteRequest del;
  del.set_namespace_("a");
  del.add_keys(Key(1));
  del.add_keys(Key(2));
  v1::DeleteResponse deleted;
  ASSERT_TRUE(Call(&CacheHostService::Delete, del, &deleted).ok());
  ASSERT_EQ(deleted.results_size(), 2);
  EXPECT_EQ(deleted.results(0).status().code(), 0);
  EXPECT_EQ(deleted.results(1).status().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LookupOne("a", 1).status().code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CacheHostServiceTest, StatsCountBlocksPagesAndNamespaces) {
  Publish("a", 1);
  Publish("a", 2);
  Publish("b", 3, 150000);  // 3 pages
  v1::StatsRequest req;
  req.set_include_namespaces(true);
  v1::StatsResponse stats;
  ASSERT_TRUE(Call(&CacheHostService::Stats, req, &stats).ok());
  ASSERT_EQ(stats.tiers_size(), 1);  // no NVMe tier
  const v1::TierUsage& host = stats.tiers(0);
  EXPECT_EQ(host.tier(), v1::TIER_HOST);
  EXPECT_EQ(host.capacity_bytes(), kPoolBytes);
  EXPECT_EQ(host.page_bytes(), kPageBytes);
  EXPECT_EQ(host.committed_bytes(), 5 * kPageBytes);
  EXPECT_EQ(host.reserved_bytes(), 0u);
  EXPECT_EQ(host.free_bytes(), kPoolBytes - 5 * kPageBytes);
  EXPECT_EQ(host.blocks(), 3u);
  EXPECT_EQ(stats.blocks(), 3u);
  EXPECT_EQ(stats.commits_total(), 3u);
  EXPECT_EQ(stats.active_reservations(), 0u);
  EXPECT_EQ(stats.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(stats.eviction_policy(), v1::EVICTION_POLICY_COST_AWARE);
  ASSERT_GE(stats.namespaces_size(), 2);
  EXPECT_EQ(stats.namespaces(0).namespace_(), "b");
  EXPECT_EQ(stats.namespaces(0).committed_bytes(), 3 * kPageBytes);
  EXPECT_EQ(stats.namespaces(0).blocks(), 1u);
  EXPECT_EQ(stats.namespaces(1).namespace_(), "a");
  EXPECT_EQ(stats.namespaces(1).blocks(), 2u);

  v1::StatsResponse brief;
  ASSERT_TRUE(Call(&CacheHostService::Stats, v1::StatsRequest(), &brief).ok());
  EXPECT_EQ(brief.namespaces_size(), 0);
}

// Issue 17: the RPCs that act on every tenant are served only by the admin
// instance (the daemon's --admin-address listener); the public one refuses
// them, naming where they are, and still serves everything else.
TEST_F(CacheHostServiceTest, PublicListenerRefusesTheAdministrativeRpcs) {
  Publish("a", 1);
  CacheHostServiceOptions options;
  options.transport_address = node_->transport_address();
  options.admin_address = "unix:/run/kvfabric/admin.sock";
  CacheHostService open(node_.get(), health_.get(), options);
  const std::string where =
      "it is served only on the daemon's admin listener, unix:/run/kvfabric/admin.sock "
      "(--admin-address)";

  v1::DrainResponse drained;
  grpc::Status s = Call(&CacheHostService::Drain, v1::DrainRequest(), &drained, &open);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "Drain is administrative (it acts on every tenant): " + where);
  v1::DeleteRequest del;
  del.set_namespace_("a");
  del.add_keys(Key(1));
  v1::DeleteResponse deleted;
  s = Call(&CacheHostService::Delete, del, &deleted, &open);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::StatsRequest all;
  all.set_include_namespaces(true);
  v1::StatsResponse stats;
  s = Call(&CacheHostService::Stats, all, &stats, &open);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(stats.namespaces_size(), 0);

  // Nothing was drained or deleted; the rest is served.
  EXPECT_EQ(LookupOne("a", 1).status().code(), 0);
  EXPECT_TRUE(Call(&CacheHostService::Stats, v1::StatsRequest(), &stats, &open).ok());
  v1::ReserveResponse reserved;
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("a", {Block(2)}), &reserved, &open).ok());
  EXPECT_EQ(reserved.results(0).status().code(), 0);

  // A daemon without an admin listener says how to get one.
  CacheHostServiceOptions none;
  none.transport_address = node_->transport_address();
  CacheHostService closed(node_.get(), health_.get(), none);
  s = Call(&CacheHostService::Drain, v1::DrainRequest(), &drained, &closed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("start it with --admin-address"), std::string::npos)
      << s.error_message();
}

// `kvfabric explain eviction` without --key: a tenant lists its own recent
// decisions; every tenant's only on the admin listener (keys are tenants').
TEST_F(CacheHostServiceTest, ListEvictionsShowsOneTenantsDecisionsOrEveryOnesToTheAdmin) {
  const std::uint64_t blocks = 2 * kPoolBytes / kPageBytes;  // twice the pool: evictions
  for (std::uint64_t i = 0; i < blocks; ++i) {
    ASSERT_NO_FATAL_FAILURE(Publish(i % 2 == 0 ? "a" : "b", static_cast<int>(i)));
  }
  v1::ListEvictionsRequest req;
  req.set_namespace_("a");
  req.set_limit(5);
  v1::ListEvictionsResponse list;
  ASSERT_TRUE(Call(&CacheHostService::ListEvictions, req, &list).ok());
  ASSERT_EQ(list.decisions_size(), 5);
  EXPECT_EQ(list.log_capacity(), 4096u);
  for (int i = 0; i < list.decisions_size(); ++i) {
    const v1::ListedEviction& e = list.decisions(i);
    EXPECT_EQ(e.namespace_(), "a");
    EXPECT_EQ(e.key().size(), 32u);
    EXPECT_FALSE(e.decision().explanation().empty());
    if (i > 0) EXPECT_LT(e.decision().sequence(), list.decisions(i - 1).decision().sequence());
  }
  // The same block, asked by key, has the decision listed first.
  v1::ExplainEvictionRequest explain;
  explain.set_namespace_("a");
  explain.set_key(list.decisions(0).key());
  v1::ExplainEvictionResponse why;
  ASSERT_TRUE(Call(&CacheHostService::ExplainEviction, explain, &why).ok());
  ASSERT_GE(why.decisions_size(), 1);
  EXPECT_EQ(why.decisions(0).sequence(), list.decisions(0).decision().sequence());

  v1::ListEvictionsRequest all;
  all.set_all_namespaces(true);
  all.set_limit(1000);
  v1::ListEvictionsResponse every;
  ASSERT_TRUE(Call(&CacheHostService::ListEvictions, all, &every).ok());
  bool saw_a = false, saw_b = false;
  for (const v1::ListedEviction& e : every.decisions()) {
    saw_a = saw_a || e.namespace_() == "a";
    saw_b = saw_b || e.namespace_() == "b";
  }
  EXPECT_TRUE(saw_a && saw_b);

  CacheHostServiceOptions options;
  options.transport_address = node_->transport_address();
  CacheHostService open(node_.get(), health_.get(), options);
  v1::ListEvictionsResponse refused;
  grpc::Status s = Call(&CacheHostService::ListEvictions, all, &refused, &open);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refused.decisions_size(), 0);
  v1::ListEvictionsResponse own;
  EXPECT_TRUE(Call(&CacheHostService::ListEvictions, req, &own, &open).ok());
  EXPECT_EQ(own.decisions_size(), 5);
  all.set_limit(1001);
  v1::ListEvictionsResponse too_many;
  s = Call(&CacheHostService::ListEvictions, all, &too_many);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CacheHostServiceTest, DrainRefusesNewReservationsAndLeasesUntilResumed) {
  Publish("a", 1);
  v1::DrainRequest drain;
  v1::DrainResponse drained;
  ASSERT_TRUE(Call(&CacheHostService::Drain, drain, &drained).ok());
  EXPECT_EQ(drained.status(), v1::SERVING_STATUS_DRAINING);
  EXPECT_EQ(drained.active_reservations(), 0u);
  EXPECT_EQ(drained.active_read_leases(), 0u);
  v1::HealthResponse health;
  ASSERT_TRUE(Call(&CacheHostService::Health, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_DRAINING);
  EXPECT_FALSE(health.detail().empty());

  v1::ReserveResponse reserved;
  EXPECT_EQ(Call(&CacheHostService::Reserve, ReserveOf("a", {Block(2)}), &reserved).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  v1::LeaseRequest lease;
  lease.set_namespace_("a");
  lease.add_keys(Key(1));
  v1::LeaseResponse leased;
  EXPECT_EQ(Call(&CacheHostService::Lease, lease, &leased).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LookupOne("a", 1).status().code(), 0);  // reads of metadata go on

  drain.set_resume(true);
  ASSERT_TRUE(Call(&CacheHostService::Drain, drain, &drained).ok());
  EXPECT_EQ(drained.status(), v1::SERVING_STATUS_SERVING);
  ASSERT_TRUE(Call(&CacheHostService::Health, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_SERVING);
  ASSERT_TRUE(Call(&CacheHostService::Reserve, ReserveOf("a", {Block(2)}), &reserved).ok());
  EXPECT_EQ(reserved.results(0).status().code(), 0);
}

TEST(CacheHostServiceWithoutNodeTest, OnlyHealthIsServedWhileStarting) {
  HealthReporter health(Env::Default(), "test-host", "0.0.0-test");
  CacheHostService service(nullptr, &health, CacheHostServiceOptions());
  grpc::ServerContext context;
  v1::LookupRequest lookup;
  lookup.add_keys(Key(1));
  v1::LookupResponse looked;
  EXPECT_EQ(service.Lookup(&context, &lookup, &looked).error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::StatsRequest stats_req;
  v1::StatsResponse stats;
  EXPECT_EQ(service.Stats(&context, &stats_req, &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  v1::HealthRequest health_req;
  v1::HealthResponse resp;
  ASSERT_TRUE(service.Health(&context, &health_req, &resp).ok());
  EXPECT_EQ(resp.status(), v1::SERVING_STATUS_STARTING);
  EXPECT_EQ(resp.limits().max_keys_per_batch(), kMaxKeysPerBatch);
}

}  // namespace
}  // namespace kvfabric
