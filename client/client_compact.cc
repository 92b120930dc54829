// Client::Impl and compact copies (docs/compact.md, issue 24): the accuracy
// policy's text form, fetching a compact run's blocks, the probe of what a
// compact token adds to a decode step, and reading a compact block back.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "core/crc32c.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

namespace kvfabric::client {
namespace {

using Clock = std::chrono::steady_clock;
using internal::HostDown;
using internal::KeyBytes;
using internal::MicrosSince;

}  // namespace

// ---------------------------------------------------------------- policy

StatusOr<AccuracyPolicy> AccuracyPolicy::Parse(std::string_view text) {
  AccuracyPolicy p;
  if (text == "exact") return p;
  constexpr std::string_view kPrefix = "compact_after=";
  if (text.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view n = text.substr(kPrefix.size());
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), v);
    if (!n.empty() && ec == std::errc() && end == n.data() + n.size()) {
      p.compact_after_tokens = v;
      return p;
    }
  }
  return Status::InvalidArgument("accuracy policy \"" + std::string(text) +
                                 "\": expected \"exact\" or \"compact_after=N\" (N tokens)");
}

std::string AccuracyPolicy::ToString() const {
  return compact_after_tokens ? "compact_after=" + std::to_string(*compact_after_tokens) : "exact";
}

// ---------------------------------------------------------------- fetch

Status Client::Impl::FetchCompactFrom(Context& c, const MatchResult::Host& host,
                                      std::vector<std::uint32_t>* blocks,
                                      std::uint64_t* moved_bytes) {
  auto daemon = GetDaemon(host);
  if (!daemon.ok()) return daemon.status();
  const std::shared_ptr<Daemon> d = std::move(*daemon);
  std::vector<std::uint32_t> left, on_nvme;
  Status first;
  bool down = false;
  // Lands what `results` say arrived: the CRC the daemon committed the copy
  // with, over the copy's bytes at the start of the page.
  auto land = [&](std::span<const std::uint32_t> batch, std::span<const Daemon::ReadResult> results,
                  bool from_lease) {
    FetchTally tally;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      const std::uint32_t b = batch[k];
      const Daemon::ReadResult& r = results[k];
      Status s = r.status;
      if (s.ok() && r.payload_bytes != compact_bytes_) {
        // Every size from the network is checked before the bytes are used.
        s = Status::DataLoss("block " + std::to_string(b) + ": daemon placed " +
                             std::to_string(r.payload_bytes) + " bytes of its compact copy; " +
                             std::to_string(compact_bytes_) + " expected");
      } else if (s.ok()) {
        *moved_bytes += compact_bytes_;
        const std::span<std::byte> bytes = BlockBytes(c, b).subspan(0, compact_bytes_);
        if (crc32c::Value(bytes) == r.crc32c) {
          tally.landed.push_back({b, 0, o_.model.layer_count});
          tally.bytes += compact_bytes_;
          (from_lease && r.tier == v1::TIER_NVME ? tally.nvme_tier : tally.host_tier) +=
              compact_bytes_;
          continue;
        }
        ++tally.crc_failures;
        s = Status::DataLoss("block " + std::to_string(b) +
                             ": compact copy received does not match its committed CRC32C");
      } else if (s.IsUnavailable() && !from_lease) {
        on_nvme.push_back(b);  // not in the host pool now: the control plane stages it
        continue;
      } else if (s.IsNotFound()) {
        v1::StaleEntry e;
        e.set_host_id(d->host_id());
        e.set_key(KeyBytes(CompactInt8BlockKey(c.match.chain[b])));
        MutexLock l(&c.mu);
        c.stale.push_back(std::move(e));
      }
      if (first.ok()) first = s.WithContext("compact copy of block " + std::to_string(b));
      left.push_back(b);
    }
    {
      MutexLock l(&c.mu);
      for (const FetchTally::Landed& x : tally.landed) c.compact[x.block] = 1;
    }
    if (!tally.landed.empty()) {
      MutexLock l(&metrics_mu_);
      m_.compact_blocks_fetched += tally.landed.size();
      m_.compact_bytes_fetched += tally.bytes;
    }
    RecordFetch(c, tally);
  };
  auto request_failed = [&](std::span<const std::uint32_t> batch, const Status& s) {
    if (HostDown(s)) {
      ReplacePages(c, batch);
      down = true;
    }
    if (first.ok()) first = s.WithContext("daemon " + host.host_id);
    left.insert(left.end(), batch.begin(), batch.end());
  };
  std::vector<wire::FetchKey> keys;
  std::vector<std::string> lease_keys;
  for (std::size_t i = 0; i < blocks->size(); i += fetch_batch_) {
    const std::span<const std::uint32_t> batch(blocks->data() + i,
                                               std::min(fetch_batch_, blocks->size() - i));
    if (down) {
      left.insert(left.end(), batch.begin(), batch.end());
      continue;
    }
    keys.clear();
    for (std::uint32_t b : batch) keys.push_back(CompactInt8BlockKey(c.match.chain[b]).bytes());
    const std::vector<std::uint64_t> offsets = PageOffsets(c, batch);
    const SlotLayout slots(offsets, compact_bytes_, kHistoryRegionId);
    std::uint64_t throttled = 0;
    auto got = d->FetchWithin(keys, fingerprint_digest_, slots, o_.transfer_timeout, &throttled);
    if (throttled != 0) {
      MutexLock l(&metrics_mu_);
      m_.fetch_requests_throttled += throttled;
    }
    if (!got.ok()) {
      request_failed(batch, got.status().WithContext("data-plane fetch of compact copies"));
      continue;
    }
    land(batch, *got, /*from_lease=*/false);
  }
  // Copies on the daemon's NVMe only: its control plane's Lease stages them.
  for (std::size_t i = 0; i < on_nvme.size(); i += fetch_batch_) {
    const std::span<const std::uint32_t> batch(on_nvme.data() + i,
                                               std::min(fetch_batch_, on_nvme.size() - i));
    if (down) {
      left.insert(left.end(), batch.begin(), batch.end());
      continue;
    }
    lease_keys.clear();
    for (std::uint32_t b : batch)
      lease_keys.push_back(KeyBytes(CompactInt8BlockKey(c.match.chain[b])));
    const std::vector<std::uint64_t> offsets = PageOffsets(c, batch);
    const SlotLayout slots(offsets, compact_bytes_, kHistoryRegionId);
    auto got = d->LeaseGet(lease_keys, fingerprint_digest_, o_.lease_ttl_ms, slots);
    if (!got.ok()) {
      request_failed(batch, got.status());
      continue;
    }
    land(batch, *got, /*from_lease=*/true);
  }
  if (down) DropDaemon(d);
  std::sort(left.begin(), left.end());
  left.erase(std::unique(left.begin(), left.end()), left.end());
  *blocks = std::move(left);
  return first;
}

// ---------------------------------------------------------------- decode cost

void Client::Impl::ProbeCompactDecode() {
  if (o_.compact_extra_decode_us_per_token) {
    compact_extra_decode_us_ = *o_.compact_extra_decode_us_per_token;
    return;
  }
  if (compact_bytes_ == 0) return;
  // One layer slice of 16 blocks (or as many as fit one compact call), every
  // layer of the model: the exact kernel against the compact one on the same
  // values, best of 5 each (the least disturbed run).
  const ModelFingerprint& f = o_.model;
  const std::uint32_t bt = f.tokens_per_block;
  const std::uint32_t blocks =
      std::max<std::uint32_t>(1, std::min<std::uint32_t>(16, gpu::kMaxCompactTileTokens / bt));
  const std::uint32_t tokens = blocks * bt;
  const std::uint64_t elems = std::uint64_t{tokens} * f.kv_heads * f.head_dim;
  std::vector<float> k(elems), v(elems), q(std::uint64_t{o_.num_q_heads} * f.head_dim);
  std::vector<float> out(q.size()), lse(o_.num_q_heads);
  std::uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  };
  for (float& e : k) e = next();
  for (float& e : v) e = next();
  for (float& e : q) e = next();
  // The values in the model's KV dtype: K and V tiles for the exact kernel,
  // and per block a one-layer exact block (K then V) encoded into its
  // compact slice.
  const std::uint64_t es = f.dtype == KvDtype::kFp32 ? 4 : 2;
  auto to_dtype = [&](const float* in, std::uint64_t n, std::byte* out) {
    for (std::uint64_t i = 0; i < n; ++i) {
      if (es == 4) {
        std::memcpy(out + i * 4, in + i, 4);
      } else {
        const std::uint16_t h =
            f.dtype == KvDtype::kFp16 ? gpu::FloatToFp16Bits(in[i]) : gpu::FloatToBf16Bits(in[i]);
        std::memcpy(out + i * 2, &h, 2);
      }
    }
  };
  std::vector<std::byte> kx(elems * es), vx(elems * es);
  to_dtype(k.data(), elems, kx.data());
  to_dtype(v.data(), elems, vx.data());
  const std::uint64_t half = gpu::CompactHalfBytes(bt, f.kv_heads, f.head_dim);
  std::vector<std::byte> compact(blocks * 2 * half);
  std::vector<const std::byte*> slices(blocks);
  const std::uint64_t block_elems = std::uint64_t{bt} * f.kv_heads * f.head_dim;
  std::vector<std::byte> one(2 * block_elems * es);
  for (std::uint32_t b = 0; b < blocks; ++b) {
    std::memcpy(one.data(), kx.data() + b * block_elems * es, block_elems * es);
    std::memcpy(one.data() + block_elems * es, vx.data() + b * block_elems * es, block_elems * es);
    const gpu::CompactShape shape{f.dtype, 1, bt, f.kv_heads, f.head_dim};
    if (Status e = gpu::EncodeCompactInt8(
            shape, one, std::span<std::byte>(compact).subspan(b * 2 * half, 2 * half));
        !e.ok()) {
      Log().warn("kvfabric client: compact decode probe: {}; compact tokens cost nothing extra",
                 e.ToString());
      return;
    }
    slices[b] = compact.data() + b * 2 * half;
  }
  const gpu::AttentionShape shape{o_.num_q_heads, f.kv_heads, f.head_dim, f.dtype};
  const float scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  auto best = [](auto&& fn) {
    double b = 1e300;
    for (int r = 0; r < 5; ++r) {
      const auto t = Clock::now();
      fn();
      b = std::min(b, MicrosSince(t));
    }
    return b;
  };
  const double exact_us = best([&] {
    gpu::cpu_kernels::DecodeAttentionTile(
        shape, scale, tokens, q.data(), reinterpret_cast<const std::byte*>(k.data()),
        reinterpret_cast<const std::byte*>(v.data()), out.data(), lse.data());
  });
  const double compact_us = best([&] {
    gpu::DecodeAttentionCompactInt8Blocks(shape, scale, bt, blocks, q.data(), slices.data(),
                                          out.data(), lse.data());
  });
  compact_extra_decode_us_ =
      std::max(0.0, (compact_us - exact_us) / tokens) * static_cast<double>(f.layer_count);
  Log().info(
      "kvfabric client: compact decode probe ({} tokens, {} query heads, {}, CPU kernels): exact "
      "{:.1f} us, compact {:.1f} us per layer; a compact token adds {:.4f} us per decode step "
      "over {} layers (compact_extra_decode_us_per_token; set it for a GPU device)",
      tokens, o_.num_q_heads, KvDtypeName(f.dtype), exact_us, compact_us, compact_extra_decode_us_,
      f.layer_count);
}

// ---------------------------------------------------------------- reading

StatusOr<bool> Client::Impl::BlockIsCompact(ContextId id, std::uint32_t block) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  KVF_RETURN_IF_ERROR(internal::BlockInRange(*c, id, block));
  MutexLock l(&c->mu);
  return block < c->compact.size() && c->compact[block] != 0;
}

Status Client::Impl::DecodeBlock(ContextId id, std::uint32_t block, std::span<float> out) {
  KVF_ASSIGN_OR_RETURN(const bool compact, BlockIsCompact(id, block));
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  const ModelFingerprint& f = o_.model;
  const std::uint64_t elems =
      std::uint64_t{f.layer_count} * 2 * f.tokens_per_block * f.kv_heads * f.head_dim;
  if (out.size() != elems) {
    return Status::InvalidArgument("client: DecodeBlock into " + std::to_string(out.size()) +
                                   " floats; a block of this model has " + std::to_string(elems));
  }
  const std::span<const std::byte> page = BlockBytes(*c, block);
  if (compact) {
    const gpu::CompactShape shape{f.dtype, f.layer_count, f.tokens_per_block, f.kv_heads,
                                  f.head_dim};
    return gpu::DecodeCompactInt8(shape, page.subspan(0, compact_bytes_), out);
  }
  switch (f.dtype) {
    case KvDtype::kFp32:
      std::memcpy(out.data(), page.data(), elems * sizeof(float));
      return Status::OK();
    case KvDtype::kFp16:
    case KvDtype::kBf16: {
      const auto* h = reinterpret_cast<const std::uint16_t*>(page.data());
      for (std::uint64_t i = 0; i < elems; ++i) {
        out[i] =
            f.dtype == KvDtype::kFp16 ? gpu::Fp16BitsToFloat(h[i]) : gpu::Bf16BitsToFloat(h[i]);
      }
      return Status::OK();
    }
    default:
      return Status::FailedPrecondition("client: DecodeBlock of a model whose KV dtype is " +
                                        std::string(KvDtypeName(f.dtype)) +
                                        " (fp16, bf16 and fp32 only)");
  }
}

}  // namespace kvfabric::client
