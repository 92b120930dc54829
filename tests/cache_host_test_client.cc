#include "tests/cache_host_test_client.h"

#include <grpcpp/grpcpp.h>

#include <array>
#include <chrono>
#include <cstring>

#include "core/block_format.h"
#include "core/crc32c.h"
#include "core/model_fingerprint.h"
#include "proto/model_proto.h"
#include "transport/data_transport.h"

namespace kvfabric::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kRegionId = 1;

// Every per-block outcome must be OK; `what` names the call.
Status AllOk(const StatusOr<std::vector<Status>>& got, const std::vector<int>& ids,
             const char* what) {
  KVF_RETURN_IF_ERROR(got.status());
  for (std::size_t k = 0; k < got->size(); ++k) {
    KVF_RETURN_IF_ERROR((*got)[k].WithContext(std::string(what) + " of block " +
                                              std::to_string(ids[k])));
  }
  return Status::OK();
}

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
  session_.reset();
  data_.reset();
  staging_.reset();
  transport_.reset();
}

Status CacheHostTestClient::Attach(const std::string& grpc_address,
                                   const std::string& transport_address) {
  if (session_ != nullptr) session_->Close();
  client::CacheHostSessionOptions o;
  o.grpc_address = grpc_address;
  o.security = security_;
  o.transport_address = transport_address;
  o.rpc_timeout = std::chrono::seconds(30);
  o.transfer_timeout = std::chrono::seconds(60);
  o.region_id = kRegionId;
  o.lease_retries = 5;
  KVF_ASSIGN_OR_RETURN(session_, client::CacheHostSession::Open(data_.get(), *staging_, o));
  return Status::OK();
}

std::span<std::byte> CacheHostTestClient::Staging(std::uint64_t offset, std::uint64_t bytes) {
  return staging_->bytes().subspan(offset, bytes);
}

namespace {

ModelFingerprint CoreFingerprint() {
  ModelFingerprint f;
  f.model_id = "test/model@1";
  f.layer_count = 32;
  f.dtype = KvDtype::kFp16;
  f.kv_heads = 8;
  f.head_dim = 128;
  f.tokens_per_block = 16;
  return f;
}

}  // namespace

v1::ModelFingerprint CacheHostTestClient::Fingerprint() {
  v1::ModelFingerprint f;
  FingerprintToProto(CoreFingerprint(), &f);
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

std::vector<client::CacheHostSession::StoreBlock> CacheHostTestClient::StageBlocks(
    int first, int n, std::uint32_t format_version, std::string_view digest,
    std::vector<int>* ids) {
  std::vector<client::CacheHostSession::StoreBlock> blocks(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    v1::BlockDescriptor& b = blocks[k].descriptor;
    b.set_key(Key(first + k));
    b.set_payload_bytes(kTestBlockBytes);
    b.set_representation(v1::REPRESENTATION_EXACT);
    b.set_format_version(format_version);
    b.set_fingerprint_digest(std::string(digest));
    b.set_token_count(16);
    b.set_prefix_tokens(16 * static_cast<std::uint64_t>(first + k));
    const std::span<std::byte> slot = Staging(std::uint64_t(k) * kTestBlockBytes, kTestBlockBytes);
    Fill(first + k, slot);
    blocks[k].crc32c = crc32c::Value(slot);
    ids->push_back(first + k);
  }
  return blocks;
}

Status CacheHostTestClient::PutBatch(int first, int n, const std::string& ns) {
  session_->SetNamespace(ns);
  std::vector<int> ids;
  const auto blocks = StageBlocks(first, n, 1, "", &ids);
  return AllOk(session_->Store(Fingerprint(), blocks, {0, kTestBlockBytes}), ids, "Store");
}

Status CacheHostTestClient::StoreBatch(int first, int n, std::uint64_t* throttled,
                                       const std::string& ns) {
  if (n < 1 || std::uint64_t(n) * kTestBlockBytes > (32u << 20)) {
    return Status::InvalidArgument("StoreBatch of " + std::to_string(n) + " blocks");
  }
  KVF_ASSIGN_OR_RETURN(const FingerprintDigest digest, CoreFingerprint().Digest());
  session_->SetNamespace(ns);
  std::vector<int> ids;
  const auto blocks = StageBlocks(
      first, n, kBlockFormatVersion,
      std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()), &ids);
  return AllOk(session_->StoreByKey(Fingerprint(), blocks, {0, kTestBlockBytes}, 0, throttled), ids,
               "StoreByKey");
}

Status CacheHostTestClient::GetBatch(const std::vector<int>& ids, const std::string& ns) {
  session_->SetNamespace(ns);
  std::vector<std::string> keys;
  for (int i : ids) keys.push_back(Key(i));
  const std::uint64_t base = 32 << 20;
  KVF_ASSIGN_OR_RETURN(auto got, session_->LeaseGet(keys, "", 0, {base, kTestBlockBytes}));
  std::vector<std::byte> want(kTestBlockBytes);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    KVF_RETURN_IF_ERROR(got[k].status.WithContext("block " + std::to_string(ids[k])));
    auto bytes = Staging(base + k * kTestBlockBytes, kTestBlockBytes);
    if (crc32c::Value(bytes) != got[k].crc32c) {
      return Status::DataLoss("block " + std::to_string(ids[k]) + ": CRC mismatch");
    }
    Fill(ids[k], want);
    if (std::memcmp(want.data(), bytes.data(), kTestBlockBytes) != 0) {
      return Status::DataLoss("block " + std::to_string(ids[k]) + ": bytes differ");
    }
  }
  return Status::OK();
}

}  // namespace kvfabric::testing
