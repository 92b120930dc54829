#include "tests/cache_host_test_client.h"

#include <grpcpp/grpcpp.h>

#include <array>
#include <chrono>
#include <cstring>

#include "core/crc32c.h"
#include "transport/data_transport.h"

namespace kvfabric::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kRegionId = 1;

}  // namespace

StatusOr<std::unique_ptr<CacheHostTestClient>> CacheHostTestClient::Create(
    std::uint64_t seed, const std::string& data_transport) {
  std::unique_ptr<CacheHostTestClient> c(new CacheHostTestClient);
  c->seed_ = seed;
  transport::DataTransportOptions o;
  o.kind = data_transport == kKernelTcp ? "tcp" : "ucx";
  o.ucx_tls = data_transport;
  KVF_ASSIGN_OR_RETURN(c->transport_, transport::CreateDataTransport(o));
  KVF_ASSIGN_OR_RETURN(c->staging_,
                       c->transport_->AllocateMemory(64 << 20, transport::MemoryKind::kHost));
  KVF_ASSIGN_OR_RETURN(c->data_, client::DataPlaneClient::Create(c->transport_.get()));
  return c;
}

CacheHostTestClient::~CacheHostTestClient() {
  data_.reset();
  staging_.reset();
  transport_.reset();
}

Status CacheHostTestClient::Attach(const std::string& grpc_address,
                                   const std::string& transport_address) {
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(16 << 20);
  ch.SetMaxSendMessageSize(16 << 20);
  stub_ = v1::CacheHost::NewStub(
      grpc::CreateCustomChannel(grpc_address, grpc::InsecureChannelCredentials(), ch));
  if (!transport_address_.empty()) data_->Disconnect(transport_address_);
  transport_address_ = transport_address;
  KVF_ASSIGN_OR_RETURN(conn_,
                       data_->Connect(transport_address, Clock::now() + std::chrono::seconds(10)));
  return data_->ExportRegion(conn_, kRegionId, *staging_, Clock::now() + std::chrono::seconds(10));
}

std::span<std::byte> CacheHostTestClient::Staging(std::uint64_t offset, std::uint64_t bytes) {
  return staging_->bytes().subspan(offset, bytes);
}

v1::ModelFingerprint CacheHostTestClient::Fingerprint() {
  v1::ModelFingerprint f;
  f.set_model_id("test/model@1");
  f.set_first_layer(0);
  f.set_layer_count(32);
  f.set_dtype(v1::DTYPE_FP16);
  f.set_kv_heads(8);
  f.set_head_dim(128);
  f.set_tokens_per_block(16);
  f.set_tp_rank(0);
  f.set_tp_size(1);
  f.set_layout_version(1);
  return f;
}

std::string CacheHostTestClient::Key(int i) const {
  std::string k(32, '\0');
  std::uint64_t v = seed_ * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i);
  for (int b = 0; b < 32; ++b) {
    k[b] = static_cast<char>(v >> (8 * (b % 8)));
    if (b % 8 == 7) v = v * 6364136223846793005ull + 1442695040888963407ull;
  }
  return k;
}

void CacheHostTestClient::Fill(int i, std::span<std::byte> dst) const {
  std::uint64_t x = seed_ ^ (0x2545F4914F6CDD1Dull * static_cast<std::uint64_t>(i + 1));
  auto* words = reinterpret_cast<std::uint64_t*>(dst.data());
  for (std::size_t w = 0; w < dst.size() / 8; ++w) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[w] = x;
  }
}

Status CacheHostTestClient::PutBatch(int first, int n, const std::string& ns) {
  v1::ReserveRequest req;
  req.set_namespace_(ns);
  *req.mutable_fingerprint() = Fingerprint();
  for (int i = first; i < first + n; ++i) {
    v1::BlockDescriptor* b = req.add_blocks();
    b->set_key(Key(i));
    b->set_payload_bytes(kTestBlockBytes);
    b->set_representation(v1::REPRESENTATION_EXACT);
    b->set_format_version(1);
    b->set_token_count(16);
    b->set_prefix_tokens(16 * static_cast<std::uint64_t>(i));
  }
  v1::ReserveResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Status g = stub_->Reserve(&ctx, req, &resp);
  if (!g.ok()) return Status::Unavailable("Reserve: " + g.error_message());
  std::vector<wire::TransferRange> ranges;
  v1::CommitRequest commit;
  commit.set_namespace_(ns);
  commit.set_lease_id(resp.lease_id());
  commit.set_release_uncommitted(true);
  for (int k = 0; k < n; ++k) {
    const v1::ReserveResult& r = resp.results(k);
    if (r.status().code() != 0) {
      return Status(static_cast<StatusCode>(r.status().code()), r.status().message());
    }
    const std::uint64_t off = static_cast<std::uint64_t>(k) * kTestBlockBytes;
    Fill(first + k, Staging(off, kTestBlockBytes));
    std::uint64_t pos = off;
    for (const v1::Extent& x : r.extents()) {
      ranges.push_back({x.offset_bytes(), x.length_bytes(), pos});
      pos += x.length_bytes();
    }
    v1::CommitEntry* c = commit.add_entries();
    c->set_key(Key(first + k));
    c->set_crc32c(crc32c::Value(Staging(off, kTestBlockBytes)));
  }
  std::array<std::uint8_t, 16> token{};
  std::memcpy(token.data(), resp.grant().access_token().data(), 16);
  KVF_RETURN_IF_ERROR(data_->Transfer(conn_, client::DataOp::kPut, resp.lease_id(), token,
                                      kRegionId, ranges, Clock::now() + std::chrono::seconds(60)));
  v1::CommitResponse cresp;
  grpc::ClientContext cctx;
  g = stub_->Commit(&cctx, commit, &cresp);
  if (!g.ok()) return Status::Unavailable("Commit: " + g.error_message());
  for (const v1::CommitResult& r : cresp.results()) {
    if (r.status().code() != 0) {
      return Status(static_cast<StatusCode>(r.status().code()), r.status().message());
    }
  }
  return Status::OK();
}

Status CacheHostTestClient::GetBatch(const std::vector<int>& ids, const std::string& ns) {
  v1::LeaseRequest req;
  req.set_namespace_(ns);
  for (int i : ids) req.add_keys(Key(i));
  v1::LeaseResponse resp;
  // An entry answering UNAVAILABLE means "retry" (a block staged from NVMe
  // can be evicted again before the lease pins it): release and lease again.
  for (int attempt = 0;; ++attempt) {
    resp.Clear();
    grpc::ClientContext ctx;
    grpc::Status g = stub_->Lease(&ctx, req, &resp);
    if (!g.ok()) return Status::Unavailable("Lease: " + g.error_message());
    bool retry = false;
    for (const v1::LeaseResult& r : resp.results()) {
      retry = retry || r.status().code() == static_cast<int>(StatusCode::kUnavailable);
    }
    if (!retry || attempt == 5) break;
    if (resp.lease_id() != 0) {
      v1::ReleaseRequest rel;
      rel.set_namespace_(ns);
      rel.add_entries()->set_lease_id(resp.lease_id());
      v1::ReleaseResponse rresp;
      grpc::ClientContext rctx;
      stub_->Release(&rctx, rel, &rresp);
    }
  }
  std::vector<wire::TransferRange> ranges;
  const std::uint64_t base = 32 << 20;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const v1::LeaseResult& r = resp.results(static_cast<int>(k));
    if (r.status().code() != 0) {
      return Status(static_cast<StatusCode>(r.status().code()),
                    "block " + std::to_string(ids[k]) + ": " + r.status().message());
    }
    std::uint64_t pos = base + k * kTestBlockBytes;
    for (const v1::Extent& x : r.extents()) {
      ranges.push_back({x.offset_bytes(), x.length_bytes(), pos});
      pos += x.length_bytes();
    }
  }
  std::array<std::uint8_t, 16> token{};
  std::memcpy(token.data(), resp.grant().access_token().data(), 16);
  KVF_RETURN_IF_ERROR(data_->Transfer(conn_, client::DataOp::kGet, resp.lease_id(), token,
                                      kRegionId, ranges, Clock::now() + std::chrono::seconds(60)));
  std::vector<std::byte> want(kTestBlockBytes);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto got = Staging(base + k * kTestBlockBytes, kTestBlockBytes);
    if (crc32c::Value(got) != resp.results(static_cast<int>(k)).block().crc32c()) {
      return Status::DataLoss("block " + std::to_string(ids[k]) + ": CRC mismatch");
    }
    Fill(ids[k], want);
    if (std::memcmp(want.data(), got.data(), kTestBlockBytes) != 0) {
      return Status::DataLoss("block " + std::to_string(ids[k]) + ": bytes differ");
    }
  }
  v1::ReleaseRequest rel;
  rel.set_namespace_(ns);
  rel.add_entries()->set_lease_id(resp.lease_id());
  v1::ReleaseResponse rresp;
  grpc::ClientContext rctx;
  stub_->Release(&rctx, rel, &rresp);
  return Status::OK();
}


}  // namespace kvfabric::testing
