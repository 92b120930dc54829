// The cache-host probe of `kvfabric calibrate`: Reserve + kPut + Commit and kFetch of probe
// blocks against a cache-host daemon over its data transport, timed (UCX builds only). The read
// is the client's own: one kFetch round trip on the data plane (CacheHostSession::Fetch), with
// no gRPC call in it, so the fitted alpha is the data plane's, not a control call's.
#ifdef KVF_HAVE_UCX
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cli/calibrate_internal.h"
#include "client/data_plane_client.h"
#include "core/block_format.h"
#include "core/crc32c.h"
#include "core/units.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "proto/grpc_status.h"
#include "transport/data_transport.h"

namespace kvfabric::cli::calibrate_internal {
namespace {

// ---------------------------------------------------------------- cache hosts

constexpr char kProbeNamespace[] = "kvfabric.calibrate";
constexpr std::uint32_t kRegionId = 1;
// Probe blocks are exact blocks of 16 tokens x 2 (K, V) x kv_heads x 64 dims x fp16 = 4 KiB per
// head and layer, so any multiple of 4 KiB is a valid block: ProbeGeometry picks the fewest heads
// that keep the layer count within kMaxBlockLayers (a 16 MiB block is 4 heads x 1024 layers).
constexpr std::uint64_t kBytesPerLayer = 4096;

struct ProbeGeometry {
  std::uint32_t kv_heads = 1;
  std::uint32_t layers = 1;
};

ProbeGeometry GeometryFor(std::uint64_t block_bytes) {
  const std::uint64_t units = block_bytes / kBytesPerLayer;
  for (std::uint64_t heads = 1; heads <= units; ++heads) {
    if (units % heads == 0 && units / heads <= kMaxBlockLayers) {
      return {static_cast<std::uint32_t>(heads), static_cast<std::uint32_t>(units / heads)};
    }
  }
  return {};  // units == 0 cannot happen: SplitIntoBlocks gives whole 4 KiB units
}
constexpr std::uint32_t kProbeTtlMs = 120000;
constexpr auto kTransferTimeout = std::chrono::seconds(120);

// Every per-block outcome of `got` must be OK; `what` names the call.
Status AllOk(const StatusOr<std::vector<Status>>& got, const std::string& what) {
  KVF_RETURN_IF_ERROR(got.status().WithContext(what));
  for (std::size_t k = 0; k < got->size(); ++k) {
    KVF_RETURN_IF_ERROR((*got)[k].WithContext(what + ", probe block " + std::to_string(k)));
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<ClientFabric>> ClientFabric::Create(std::uint64_t staging_bytes,
                                                             const std::string& data_transport) {
  auto f = std::make_unique<ClientFabric>();
  transport::DataTransportOptions t;
  t.kind = data_transport;
  KVF_ASSIGN_OR_RETURN(f->transport, transport::CreateDataTransport(t));
  KVF_ASSIGN_OR_RETURN(f->staging,
                       f->transport->AllocateMemory(staging_bytes, transport::MemoryKind::kHost));
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  std::span<std::byte> bytes = f->staging->bytes();
  for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  KVF_ASSIGN_OR_RETURN(f->data, client::DataPlaneClient::Create(f->transport.get()));
  return f;
}

StatusOr<std::unique_ptr<CacheHostTarget>> CacheHostTarget::Open(
    const std::string& address, const std::string& admin_address,
    std::span<const std::uint64_t> sizes, int timeout_ms, const GrpcSecurityOptions& security) {
  auto s = std::unique_ptr<CacheHostTarget>(
      new CacheHostTarget(address, admin_address, timeout_ms, security));
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(16 << 20);
  ch.SetMaxSendMessageSize(16 << 20);
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                       OpenSecureChannel(address, security, ch));
  s->stub_ = v1::CacheHost::NewStub(channel);
  v1::HealthResponse health;
  KVF_RETURN_IF_ERROR(
      s->Call("Health", s->stub_->Health(s->Context().get(), v1::HealthRequest(), &health)));
  if (health.status() != v1::SERVING_STATUS_SERVING) {
    return Status::Unavailable("--cache-host " + address + " is not serving (status " +
                               std::to_string(health.status()) + "): " + health.detail());
  }
  if (health.server_id().empty()) {
    return Status::FailedPrecondition("--cache-host " + address +
                                      ": Health reports no server_id (host_id)");
  }
  s->host_id_ = health.server_id();
  s->limits_ = health.limits();
  s->max_block_bytes_ = std::min(kMaxProbeBlockBytes, s->limits_.max_block_bytes());
  std::uint64_t needed = 0;
  for (std::uint64_t bytes : sizes) {
    KVF_RETURN_IF_ERROR(s->Split(bytes).status());
    needed += bytes;
  }
  needed += sizes.back();  // the largest put, alongside every size's get blocks
  v1::StatsResponse stats;
  KVF_RETURN_IF_ERROR(
      s->Call("Stats", s->stub_->Stats(s->Context().get(), v1::StatsRequest(), &stats)));
  for (const v1::TierUsage& t : stats.tiers()) {
    if (t.tier() == v1::TIER_HOST && t.free_bytes() < needed) {
      return Status::FailedPrecondition(
          "--cache-host " + address + " (" + s->host_id_ + "): " + FormatBytes(t.free_bytes()) +
          " free in its host pool, the probe needs " + FormatBytes(needed) +
          " (every size once for reads + the largest write): lower --max-bytes or free the "
          "pool");
    }
  }
  return s;
}

CacheHostTarget::~CacheHostTarget() {
  // Best effort: the blocks also expire with the daemon's eviction; nothing to report to.
  for (auto& [bytes, keys] : get_keys_) DeleteKeys(keys).IgnoreError();
}

Status CacheHostTarget::PrepareGets(ClientFabric* fabric, std::span<const std::uint64_t> sizes) {
  fabric_ = fabric;
  client::CacheHostSessionOptions o;
  o.host_id = host_id_;
  o.grpc_address = address_;
  o.admin_address = admin_address_;
  o.ns = kProbeNamespace;
  o.security = security_;
  o.rpc_timeout = std::chrono::milliseconds(timeout_ms_);
  o.transfer_timeout = kTransferTimeout;
  o.region_id = kRegionId;
  KVF_ASSIGN_OR_RETURN(session_,
                       client::CacheHostSession::Open(fabric->data.get(), *fabric->staging, o));
  for (std::uint64_t bytes : sizes) {
    KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
    std::vector<std::string> keys = NewKeys(split.blocks);
    KVF_RETURN_IF_ERROR(Put(split, keys, Crcs(split)));
    get_keys_[bytes] = std::move(keys);
  }
  return Status::OK();
}

StatusOr<double> CacheHostTarget::TimedGet(std::uint64_t bytes, std::uint64_t offset) {
  auto it = get_keys_.find(bytes);
  if (it == get_keys_.end()) return Status::Internal("no probe blocks put for this size");
  KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
  if (offset + bytes > fabric_->staging->bytes().size()) {
    return Status::Internal("probe read beyond the staging region");
  }
  std::span<std::byte> staging = fabric_->staging->bytes().subspan(offset, bytes);
  // Marks every block so that a transfer that wrote nothing fails the CRC check.
  for (std::uint64_t k = 0; k < split.blocks; ++k) {
    std::memset(staging.data() + k * split.block_bytes, 0xa5, 8);
  }
  std::vector<std::string>& keys = it->second;
  std::vector<wire::FetchKey> fetch(keys.size());
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (keys[k].size() != fetch[k].size()) return Status::Internal("probe key of a wrong size");
    std::memcpy(fetch[k].data(), keys[k].data(), fetch[k].size());
  }
  const auto start = SteadyClock::now();
  KVF_ASSIGN_OR_RETURN(const std::vector<client::CacheHostSession::ReadResult> got,
                       session_->Fetch(fetch, "", {offset, split.block_bytes}));
  const double us = MicrosSince(start);
  for (std::uint64_t k = 0; k < split.blocks; ++k) {
    if (got[k].status.code() == StatusCode::kUnavailable) {
      return Status::FailedPrecondition(
          "--cache-host " + address_ +
          " holds a probe block on NVMe only, not in its host pool: the pool is too small (or "
          "its watermarks demote the probe blocks); lower --max-bytes or give the daemon a "
          "larger --host-pool-bytes");
    }
    KVF_RETURN_IF_ERROR(got[k].status.WithContext("Fetch of probe block " + std::to_string(k)));
    if (got[k].tier != v1::TIER_HOST) {
      return Status::FailedPrecondition(
          "--cache-host " + address_ +
          " served a probe block from NVMe, not its host pool: "
          "the pool is too small (or its watermarks demote the probe blocks); lower "
          "--max-bytes or give the daemon a larger --host-pool-bytes");
    }
    const auto bytes_read = staging.subspan(k * split.block_bytes, split.block_bytes);
    if (crc32c::Value(bytes_read) != got[k].crc32c) {
      return Status::DataLoss("--cache-host " + address_ + ": probe block " + std::to_string(k) +
                              " of " + FormatBytes(bytes) + " read back with a CRC32C mismatch");
    }
  }
  return us;
}

StatusOr<double> CacheHostTarget::TimedPut(std::uint64_t bytes) {
  KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
  const std::vector<std::uint32_t>& crcs = Crcs(split);
  const std::vector<std::string> keys = NewKeys(split.blocks);
  const auto start = SteadyClock::now();
  KVF_RETURN_IF_ERROR(Put(split, keys, crcs));
  const double us = MicrosSince(start);
  KVF_RETURN_IF_ERROR(DeleteKeys(keys));
  return us;
}

std::unique_ptr<grpc::ClientContext> CacheHostTarget::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  return ctx;
}

std::uint32_t CacheHostTarget::TtlMs() const {
  const std::uint32_t most = limits_.max_ttl_ms();
  return most == 0 ? kProbeTtlMs : std::min(kProbeTtlMs, most);
}

Status CacheHostTarget::Call(const char* rpc, const grpc::Status& g) const {
  if (g.ok()) return Status::OK();
  return FromGrpcStatus(g).WithContext(std::string(rpc) + " on --cache-host " + address_);
}

StatusOr<BlockSplit> CacheHostTarget::Split(std::uint64_t bytes) const {
  if (bytes > limits_.max_batch_payload_bytes()) {
    return Status::InvalidArgument("--max-bytes " + FormatBytes(bytes) + " exceeds " + address_ +
                                   "'s max_batch_payload_bytes " +
                                   FormatBytes(limits_.max_batch_payload_bytes()));
  }
  KVF_ASSIGN_OR_RETURN(BlockSplit split, SplitIntoBlocks(bytes, max_block_bytes_, kBytesPerLayer));
  if (split.blocks > limits_.max_keys_per_batch()) {
    return Status::InvalidArgument(
        FormatBytes(bytes) + " in blocks of " + FormatBytes(split.block_bytes) + " is " +
        std::to_string(split.blocks) + " blocks, above " + address_ + "'s max_keys_per_batch " +
        std::to_string(limits_.max_keys_per_batch()) +
        ": choose --min-bytes/--max-bytes that are multiples of 64 KiB");
  }
  return split;
}

std::vector<std::string> CacheHostTarget::NewKeys(std::uint64_t n) {
  std::vector<std::string> keys(n, std::string(32, '\0'));
  for (std::string& key : keys) {
    for (int w = 0; w < 4; ++w) {
      const std::uint64_t v = rng_();
      std::memcpy(key.data() + 8 * w, &v, 8);
    }
  }
  return keys;
}

const std::vector<std::uint32_t>& CacheHostTarget::Crcs(const BlockSplit& split) {
  std::vector<std::uint32_t>& crcs = crcs_[{split.block_bytes, split.blocks}];
  if (crcs.empty()) {
    const std::span<const std::byte> staging = fabric_->staging->bytes();
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      crcs.push_back(crc32c::Value(staging.subspan(k * split.block_bytes, split.block_bytes)));
    }
  }
  return crcs;
}

Status CacheHostTarget::Put(const BlockSplit& split, const std::vector<std::string>& keys,
                            const std::vector<std::uint32_t>& crcs) {
  v1::ModelFingerprint f;
  f.set_model_id("kvfabric/calibrate@1");
  f.set_first_layer(0);
  const ProbeGeometry geometry = GeometryFor(split.block_bytes);
  f.set_layer_count(geometry.layers);
  f.set_dtype(v1::DTYPE_FP16);
  f.set_kv_heads(geometry.kv_heads);
  f.set_head_dim(64);
  f.set_tokens_per_block(16);
  f.set_tp_rank(0);
  f.set_tp_size(1);
  f.set_layout_version(1);
  std::vector<client::CacheHostSession::StoreBlock> blocks(split.blocks);
  for (std::uint64_t k = 0; k < split.blocks; ++k) {
    v1::BlockDescriptor& b = blocks[k].descriptor;
    b.set_key(keys[k]);
    b.set_payload_bytes(split.block_bytes);
    b.set_representation(v1::REPRESENTATION_EXACT);
    b.set_format_version(kBlockFormatVersion);
    b.set_token_count(16);
    b.set_prefix_tokens(16 * k);
    blocks[k].crc32c = crcs[k];
  }
  return AllOk(session_->Store(f, blocks, {0, split.block_bytes}, TtlMs()),
               "Store on --cache-host " + address_);
}

Status CacheHostTarget::DeleteKeys(const std::vector<std::string>& keys) {
  if (session_ == nullptr) return Status::OK();  // nothing was put
  const std::size_t batch = std::max<std::uint32_t>(1, limits_.max_keys_per_batch());
  for (std::size_t first = 0; first < keys.size(); first += batch) {
    const std::size_t n = std::min(keys.size() - first, batch);
    KVF_ASSIGN_OR_RETURN(const std::vector<Status> got,
                         session_->Delete(std::span<const std::string>(keys).subspan(first, n)));
    for (const Status& s : got) {
      if (!s.ok() && !s.IsNotFound()) {
        return s.WithContext("Delete of a probe block on --cache-host " + address_);
      }
    }
  }
  return Status::OK();
}

StatusOr<double> CacheHostProbe::Measure(std::uint64_t bytes) {
  return get_ ? session_->TimedGet(bytes) : session_->TimedPut(bytes);
}

IngestProbe::IngestProbe(std::vector<CacheHostTarget*> targets, std::uint64_t slice_bytes,
                         std::string what, bool transfers_only)
    : targets_(std::move(targets)),
      slice_bytes_(slice_bytes),
      what_(std::move(what)),
      transfers_only_(transfers_only),
      results_(targets_.size()),
      ends_(targets_.size()) {
  for (std::size_t i = 1; i < targets_.size(); ++i) workers_.emplace_back([this, i] { Worker(i); });
}

IngestProbe::~IngestProbe() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void IngestProbe::Worker(std::size_t i) {
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t share = 0;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      share = share_;
    }
    SteadyClock::time_point end;
    Status s = TimedRead(i, share, &end);
    {
      std::lock_guard<std::mutex> l(mu_);
      results_[i] = std::move(s);
      ends_[i] = end;
      --pending_;
    }
    cv_.notify_all();
  }
}

Status IngestProbe::TimedRead(std::size_t i, std::uint64_t bytes, SteadyClock::time_point* end) {
  const auto begin = SteadyClock::now();
  StatusOr<double> us = targets_[i]->TimedGet(bytes, i * slice_bytes_);
  // The fetch's own end (its CRC check after it is not counted), or the read's.
  *end = us.ok() ? begin + std::chrono::duration_cast<SteadyClock::duration>(
                               std::chrono::duration<double, std::micro>(*us))
                 : SteadyClock::now();
  return us.status();
}

StatusOr<double> IngestProbe::Measure(std::uint64_t bytes) {
  const std::uint64_t n = targets_.size();
  if (bytes % n != 0 || bytes / n > slice_bytes_) {
    return Status::Internal(what_ + " of " + FormatBytes(bytes) + " over " + std::to_string(n) +
                            " reads: not whole probe sizes");
  }
  const auto start = SteadyClock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    share_ = bytes / n;
    pending_ = n - 1;
    ++generation_;
  }
  cv_.notify_all();
  SteadyClock::time_point end0;
  Status first = TimedRead(0, bytes / n, &end0);
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return pending_ == 0; });
  double us = MicrosSince(start);
  if (transfers_only_) {
    SteadyClock::time_point last = end0;
    for (std::size_t i = 1; i < n; ++i) last = std::max(last, ends_[i]);
    us = std::chrono::duration<double, std::micro>(last - start).count();
  }
  KVF_RETURN_IF_ERROR(first.WithContext(what_ + ", " + targets_[0]->address()));
  for (std::size_t i = 1; i < n; ++i) {
    KVF_RETURN_IF_ERROR(results_[i].WithContext(what_ + ", " + targets_[i]->address()));
  }
  return us;
}

}  // namespace kvfabric::cli::calibrate_internal

#endif  // KVF_HAVE_UCX
