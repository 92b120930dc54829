#include "client/streaming_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "client/device_arena.h"
#include "core/testing/test_seed.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/kernels/attention_test_util.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/reference_attention.h"

// Every heap allocation in this binary, on any thread. Relaxed: a pure event
// counter, read by the test thread after Decode's final wait has ordered the
// device threads' work before it.
namespace {
std::atomic<std::uint64_t> g_allocations{0};

void* CountedAlloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* CountedAlignedAlloc(std::size_t n, std::align_val_t a) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t align = static_cast<std::size_t>(a);
  void* p = nullptr;
  if (posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, n == 0 ? 1 : n) == 0) {
    return p;
  }
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return CountedAlloc(n); }
void* operator new[](std::size_t n) { return CountedAlloc(n); }
void* operator new(std::size_t n, std::align_val_t a) { return CountedAlignedAlloc(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return CountedAlignedAlloc(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace kvfabric::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr std::uint64_t kPage = 4096;
// How far a history with compact blocks may decode from exact attention over
// the exact values (relative L2 error per output head; absolute lse error).
constexpr double kMixedRelativeError = 3e-2;
constexpr double kMixedLseError = 2e-2;

struct Shape {
  KvDtype dtype = KvDtype::kFp16;
  std::uint32_t q_heads = 8;
  std::uint32_t kv_heads = 2;  // GQA: 4 query heads per kv head
  std::uint32_t head_dim = 64;
  std::uint32_t tokens_per_block = 16;
  std::uint32_t tile_tokens = 64;
  std::uint32_t layers = 3;
};

std::uint64_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A device, an arena far smaller than the histories, and the attention.
class StreamingAttentionTest : public ::testing::Test {
 protected:
  void Build(const Shape& shape, std::uint32_t max_tokens,
             milliseconds fence_timeout = milliseconds(10000)) {
    // Users of the device go first.
    attention_.reset();
    history_.reset();
    arena_.reset();
    device_.reset();
    shape_ = shape;
    layout_ = {
        shape.layers, shape.tokens_per_block, shape.kv_heads, shape.head_dim, shape.dtype, 0};
    options_.num_q_heads = shape.q_heads;
    options_.tile_tokens = shape.tile_tokens;
    options_.staging_buffers = 2;
    options_.fence_timeout = fence_timeout;
    DeviceArenaOptions ao;
    ao.page_bytes = kPage;
    ao.staging_pages = 2 * static_cast<std::uint32_t>(
                               StreamingAttention::PagesPerBuffer(layout_, options_, kPage));
    ao.scratch_bytes = StreamingAttention::ScratchBytes(layout_, options_);
    ao.context_floor_pages = 2;
    const std::uint64_t arena_bytes = ao.scratch_bytes + (ao.staging_pages + 2) * kPage;
    gpu::DeviceOptions dopt;
    dopt.arena_bytes = arena_bytes;
    auto d = gpu::CreateCpuDevice(dopt, gpu::CpuDeviceOptions());
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = std::move(d).value();
    auto a = DeviceArena::Create(device_->arena_bytes(), ao);
    ASSERT_TRUE(a.ok()) << a.status();
    arena_ = std::move(a).value();
    auto sa = StreamingAttention::Create(*device_, *arena_, arena_->scratch(), layout_, options_);
    ASSERT_TRUE(sa.ok()) << sa.status();
    attention_ = std::move(sa).value();

    token_bytes_ = std::uint64_t{shape.kv_heads} * shape.head_dim * KvDtypeSize(shape.dtype);
    layer_bytes_ = 2 * shape.tokens_per_block * token_bytes_;
    const std::uint64_t blocks = (max_tokens + shape.tokens_per_block - 1) / shape.tokens_per_block;
    auto h = device_->AllocatePinnedHost(std::max<std::uint64_t>(1, blocks) * shape.layers *
                                         layer_bytes_);
    ASSERT_TRUE(h.ok()) << h.status();
    history_ = std::move(h).value();
  }

  // Fills every layer of `tokens` tokens with values drawn from N(0, sigma),
  // and the unused rows of a partial last block with NaNs (never read).
  void FillHistory(std::uint32_t tokens, std::mt19937_64& rng, float sigma = 1.0f) {
    std::normal_distribution<float> dist(0.0f, sigma);
    std::span<std::byte> h = history_->bytes();
    const float nan = std::nanf("");
    const std::size_t elem = KvDtypeSize(shape_.dtype);
    for (std::size_t i = 0; i + elem <= h.size(); i += elem)
      gpu::testing::Store(shape_.dtype, nan, &h[i]);
    const std::uint64_t row_elems = std::uint64_t{shape_.kv_heads} * shape_.head_dim;
    for (std::uint32_t l = 0; l < shape_.layers; ++l) {
      for (std::uint32_t t = 0; t < tokens; ++t) {
        for (int kv = 0; kv < 2; ++kv) {
          std::byte* row = RowAt(l, t, kv);
          for (std::uint64_t e = 0; e < row_elems; ++e) {
            gpu::testing::Store(shape_.dtype, dist(rng), row + e * elem);
          }
        }
      }
    }
    for (float& q : attention_->query()) q = dist(rng);
  }

  std::byte* RowAt(std::uint32_t layer, std::uint32_t token, int kv) {
    const std::uint32_t tpb = shape_.tokens_per_block;
    return history_->bytes().data() + (token / tpb) * shape_.layers * layer_bytes_ +
           layer * layer_bytes_ + kv * (layer_bytes_ / 2) + (token % tpb) * token_bytes_;
  }

  // The layer's K (kv = 0) or V (kv = 1) as one contiguous [tokens, ...] array.
  std::vector<std::byte> Contiguous(std::uint32_t layer, std::uint32_t tokens, int kv) {
    std::vector<std::byte> out(std::uint64_t{tokens} * token_bytes_);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      std::memcpy(out.data() + t * token_bytes_, RowAt(layer, t, kv), token_bytes_);
    }
    return out;
  }

  gpu::AttentionShape KernelShape() const {
    return {shape_.q_heads, shape_.kv_heads, shape_.head_dim, shape_.dtype};
  }

  // Streams `layer` and checks: bit-identical to TiledAttentionHost over the
  // same tiles, within tolerance of FP64, no NaN.
  void ExpectMatchesReferences(std::uint32_t layer, std::uint32_t tokens, float scale,
                               std::uint64_t step) {
    ASSERT_TRUE(attention_->Decode(1, layer, step, 1, *history_, tokens, scale).ok());
    const std::vector<std::byte> k = Contiguous(layer, tokens, 0);
    const std::vector<std::byte> v = Contiguous(layer, tokens, 1);
    const std::size_t elems = std::size_t{shape_.q_heads} * shape_.head_dim;
    std::vector<float> q(attention_->query().begin(), attention_->query().end());
    std::vector<float> ref_out(elems), ref_lse(shape_.q_heads);
    ASSERT_TRUE(gpu::TiledAttentionHost(KernelShape(), scale, tokens, shape_.tile_tokens, q, k, v,
                                        ref_out, ref_lse)
                    .ok());
    std::vector<double> exact_out(elems), exact_lse(shape_.q_heads);
    ASSERT_TRUE(
        gpu::NaiveAttentionFp64(KernelShape(), scale, tokens, q, k, v, exact_out, exact_lse).ok());
    std::span<const float> out = attention_->output();
    std::span<const float> lse = attention_->lse();
    // What float arithmetic can promise against FP64, per query head h: a
    // logit scale * (q . k) summed in float in any order (FMA or not) is off
    // by at most E_t = |scale| * (gamma_d + u) * sum_j |q_j k_tj| (Higham,
    // gamma_d = d u / (1 - d u), u = 2^-24), so each softmax weight is off by
    // a factor within exp(+-2 E), E = max_t E_t, and each output by at most
    // (exp(2 E) - 1) * max |v| on top of the usual rounding. Ordinary logits
    // make it negligible; huge ones (|s| in the thousands) make it dominate,
    // whatever the kernel.
    const double u = std::ldexp(1.0, -24);
    const double d = shape_.head_dim;
    const double gamma = d * u / (1 - d * u) + u;
    const std::size_t elem = KvDtypeSize(shape_.dtype);
    const std::uint32_t group = shape_.q_heads / shape_.kv_heads;
    std::vector<double> logit_err(shape_.q_heads, 0.0), v_max(shape_.q_heads, 0.0);
    for (std::uint32_t h = 0; h < shape_.q_heads; ++h) {
      const std::uint32_t kvh = h / group;
      for (std::uint32_t t = 0; t < tokens; ++t) {
        double sum = 0;
        for (std::uint32_t j = 0; j < shape_.head_dim; ++j) {
          const std::size_t at = (std::size_t{t} * shape_.kv_heads + kvh) * shape_.head_dim + j;
          sum += std::fabs(double{q[h * shape_.head_dim + j]}) *
                 std::fabs(double{gpu::testing::Load(shape_.dtype, &k[at * elem])});
          v_max[h] = std::max<double>(v_max[h],
                                      std::fabs(gpu::testing::Load(shape_.dtype, &v[at * elem])));
        }
        logit_err[h] = std::max(logit_err[h], std::fabs(double{scale}) * gamma * sum);
      }
    }
    for (std::size_t i = 0; i < elems; ++i) {
      ASSERT_EQ(Bits(out[i]), Bits(ref_out[i]))
          << "output " << i << ": " << out[i] << " vs resident " << ref_out[i] << ", tokens "
          << tokens;
      ASSERT_FALSE(std::isnan(out[i]));
      const std::size_t h = i / shape_.head_dim;
      ASSERT_NEAR(out[i], exact_out[i],
                  2e-4 * (1 + std::fabs(exact_out[i])) + std::expm1(2 * logit_err[h]) * v_max[h])
          << "output " << i << ", tokens " << tokens << ", logit error bound " << logit_err[h];
    }
    for (std::uint32_t h = 0; h < shape_.q_heads; ++h) {
      ASSERT_EQ(Bits(lse[h]), Bits(ref_lse[h])) << "lse " << h << ", tokens " << tokens;
      if (tokens == 0) {
        ASSERT_TRUE(std::isinf(lse[h]) && lse[h] < 0);
      } else {
        ASSERT_NEAR(lse[h], exact_lse[h], 2e-5 * (1 + std::fabs(exact_lse[h])) + logit_err[h]);
      }
    }
  }

  // Replaces every block b with flags[b] != 0 by its compact_int8 payload
  // (EncodeCompactInt8 of its exact payload, written at the block's start),
  // as a compact copy fetched instead of the exact block lies in the history.
  // The rest of the block becomes 0xff bytes (NaN in every dtype), so a read
  // of exact rows from a compact block shows.
  void CompactBlocks(const std::vector<std::uint8_t>& flags) {
    const std::uint32_t tpb = shape_.tokens_per_block;
    const gpu::CompactShape cs{shape_.dtype, shape_.layers, tpb, shape_.kv_heads, shape_.head_dim};
    const std::uint64_t payload = shape_.layers * layer_bytes_;
    std::vector<std::byte> compact(
        gpu::CompactPayloadBytes(shape_.layers, tpb, shape_.kv_heads, shape_.head_dim));
    for (std::size_t b = 0; b < flags.size(); ++b) {
      if (flags[b] == 0) continue;
      std::byte* block = history_->bytes().data() + b * payload;
      ASSERT_TRUE(gpu::EncodeCompactInt8(cs, {block, payload}, compact).ok()) << "block " << b;
      std::memset(block, 0xff, payload);
      std::memcpy(block, compact.data(), compact.size());
    }
  }

  // The host-side fold of the tiles the class comment of streaming_attention.h
  // describes, written out independently: a tile is a run of blocks of one
  // representation, capped at tile_tokens (exact) or min(tile_tokens,
  // kMaxCompactTileTokens) (compact); compact tiles by
  // DecodeAttentionCompactInt8Blocks over the blocks' slices in host memory,
  // exact tiles by cpu_kernels::DecodeAttentionTile; folded left to right,
  // running state first, by MergeStates(2, ...), as TiledAttentionHost does.
  gpu::testing::State MixedHostFold(std::uint32_t layer, std::uint32_t tokens, float scale,
                                    const std::vector<std::uint8_t>& flags) {
    const std::uint32_t tpb = shape_.tokens_per_block;
    const std::size_t heads = shape_.q_heads, elems = heads * shape_.head_dim;
    const std::uint64_t slice = 2 * gpu::CompactHalfBytes(tpb, shape_.kv_heads, shape_.head_dim);
    const std::uint64_t payload = shape_.layers * layer_bytes_;
    const std::vector<std::byte> k = Contiguous(layer, tokens, 0);
    const std::vector<std::byte> v = Contiguous(layer, tokens, 1);
    const std::vector<float> q(attention_->query().begin(), attention_->query().end());
    gpu::testing::State running{std::vector<float>(elems), std::vector<float>(heads)};
    std::vector<float> states(2 * elems), lses(2 * heads);
    for (std::uint32_t t0 = 0; t0 < tokens;) {
      const bool compact = flags[t0 / tpb] != 0;
      const std::uint32_t cap =
          compact ? std::min(shape_.tile_tokens, gpu::kMaxCompactTileTokens) / tpb * tpb
                  : shape_.tile_tokens;
      std::uint32_t n = 0;
      while (t0 + n < tokens && n < cap && (flags[(t0 + n) / tpb] != 0) == compact) {
        n += std::min(tpb, tokens - t0 - n);
      }
      float* out = t0 == 0 ? running.out.data() : states.data() + elems;
      float* lse = t0 == 0 ? running.lse.data() : lses.data() + heads;
      if (compact) {
        std::vector<const std::byte*> slices;
        for (std::uint32_t b = t0 / tpb; b < (t0 + n) / tpb; ++b) {
          slices.push_back(history_->bytes().data() + b * payload + layer * slice);
        }
        gpu::DecodeAttentionCompactInt8Blocks(
            {shape_.q_heads, shape_.kv_heads, shape_.head_dim, KvDtype::kInt8}, scale, tpb,
            static_cast<std::uint32_t>(slices.size()), q.data(), slices.data(), out, lse);
      } else {
        gpu::cpu_kernels::DecodeAttentionTile(KernelShape(), scale, n, q.data(),
                                              k.data() + t0 * token_bytes_,
                                              v.data() + t0 * token_bytes_, out, lse);
      }
      if (t0 != 0) {
        std::copy(running.out.begin(), running.out.end(), states.begin());
        std::copy(running.lse.begin(), running.lse.end(), lses.begin());
        gpu::cpu_kernels::MergeStates(2, shape_.q_heads, shape_.head_dim, states.data(),
                                      lses.data(), running.out.data(), running.lse.data());
      }
      t0 += n;
    }
    return running;
  }

  // Decodes `layer` over the history with `flags` (CompactBlocks applied
  // first) and checks: bit-identical to MixedHostFold; within the stated
  // tolerance of exact FP64 attention over the exact values the compact
  // blocks replaced. Returns the largest relative error of an output head
  // and the largest lse error.
  std::pair<double, double> ExpectMixedMatches(std::uint32_t layer, std::uint32_t tokens,
                                               float scale, const std::vector<std::uint8_t>& flags,
                                               std::uint64_t step) {
    const std::vector<std::byte> k = Contiguous(layer, tokens, 0);
    const std::vector<std::byte> v = Contiguous(layer, tokens, 1);
    const std::vector<float> q(attention_->query().begin(), attention_->query().end());
    const std::size_t heads = shape_.q_heads, dim = shape_.head_dim;
    std::vector<double> exact(heads * dim), exact_lse(heads);
    EXPECT_TRUE(
        gpu::NaiveAttentionFp64(KernelShape(), scale, tokens, q, k, v, exact, exact_lse).ok());
    CompactBlocks(flags);
    const std::uint32_t blocks = (tokens + shape_.tokens_per_block - 1) / shape_.tokens_per_block;
    const HostHistory history =
        HostHistory::Contiguous(history_->bytes().data(), blocks, shape_.layers * layer_bytes_)
            .WithCompact(flags);
    const Status s = attention_->Decode(1, layer, step, 1, history, tokens, scale);
    EXPECT_TRUE(s.ok()) << s;
    const gpu::testing::State want = MixedHostFold(layer, tokens, scale, flags);
    std::span<const float> out = attention_->output();
    std::span<const float> lse = attention_->lse();
    std::pair<double, double> worst{0, 0};
    for (std::size_t h = 0; h < heads; ++h) {
      double err = 0, norm = 0;
      for (std::size_t d = 0; d < dim; ++d) {
        const std::size_t i = h * dim + d;
        EXPECT_EQ(Bits(out[i]), Bits(want.out[i]))
            << "output " << i << ": " << out[i] << " vs the host fold " << want.out[i];
        err += (out[i] - exact[i]) * (out[i] - exact[i]);
        norm += exact[i] * exact[i];
      }
      EXPECT_EQ(Bits(lse[h]), Bits(want.lse[h])) << "lse " << h;
      // compact_int8's error (docs/compact.md): each element within half its
      // scale step. Measured here over 12 seeds (N(0, 1) KV, 8 query heads
      // of 64): relative output error <= 1.3e-2, lse error <= 5.6e-3.
      EXPECT_LT(std::sqrt(err / norm), kMixedRelativeError) << "head " << h;
      EXPECT_NEAR(lse[h], exact_lse[h], kMixedLseError) << "head " << h;
      worst.first = std::max(worst.first, std::sqrt(err / norm));
      worst.second = std::max(worst.second, std::fabs(lse[h] - exact_lse[h]));
    }
    return worst;
  }

  Shape shape_;
  HistoryLayout layout_;
  StreamingAttentionOptions options_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<StreamingAttention> attention_;
  std::unique_ptr<gpu::PinnedHostBuffer> history_;
  std::uint64_t token_bytes_ = 0;
  std::uint64_t layer_bytes_ = 0;
};

TEST_F(StreamingAttentionTest, BitIdenticalToFullyResidentTiledAttentionForEveryDtype) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.BitIdenticalToFullyResidentTiledAttentionForEveryDtype"));
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    Shape shape;
    shape.dtype = dtype;
    Build(shape, 1000);
    std::uint64_t step = 0;
    for (std::uint32_t tokens : {1u, 15u, 16u, 64u, 100u, 257u, 1000u}) {
      SCOPED_TRACE(std::string(KvDtypeName(dtype)) + " tokens " + std::to_string(tokens));
      FillHistory(tokens, rng);
      ExpectMatchesReferences(1, tokens, 1.0f / std::sqrt(64.0f), step++);
      ExpectMatchesReferences(2, tokens, 1.0f / std::sqrt(64.0f), step++);
    }
  }
}

TEST_F(StreamingAttentionTest, AdversarialLogitsAndOneTokenTilesStayExactAndFinite) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.AdversarialLogitsAndOneTokenTilesStayExactAndFinite"));
  Shape shape;
  shape.tokens_per_block = 1;
  shape.tile_tokens = 1;  // one-token tiles: one merge per token
  shape.head_dim = 32;
  Build(shape, 200);
  FillHistory(200, rng, 4.0f);
  ExpectMatchesReferences(0, 200, 20.0f, 0);  // huge logits (|s| in the thousands)
  ExpectMatchesReferences(0, 200, 1e-6f, 1);  // tiny logits: nearly uniform
  ExpectMatchesReferences(0, 7, 1.0f, 2);
}

TEST_F(StreamingAttentionTest, ZeroTokensGiveTheEmptyState) {
  Build(Shape(), 16);
  for (float& q : attention_->query()) q = 1.0f;
  ASSERT_TRUE(attention_->Decode(1, 0, 0, 1, *history_, 0, 0.125f).ok());
  for (float o : attention_->output()) EXPECT_EQ(Bits(o), 0u);
  for (float l : attention_->lse()) EXPECT_TRUE(std::isinf(l) && l < 0);
}

TEST_F(StreamingAttentionTest, HistoryFarLargerThanTheArenaStaysWithinTheStagingBudget) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.HistoryFarLargerThanTheArenaStaysWithinTheStagingBudget"));
  Build(Shape(), 4096);
  FillHistory(4096, rng);
  ASSERT_GT(history_->bytes().size(), 10 * device_->arena_bytes());
  ExpectMatchesReferences(1, 4096, 0.125f, 0);
  const DeviceArenaMetrics m = arena_->metrics();
  EXPECT_EQ(m.peak_staging_in_use, m.staging_pages);  // two buffers, reserved once
  EXPECT_EQ(m.peak_held_pages, 0u);                   // the pool is never touched
  const StagerMetrics s = attention_->stager().metrics();
  EXPECT_EQ(s.leases, 4096u / 64);
  EXPECT_EQ(s.fence_waits, 2 * (s.leases - 2));  // every reuse waited on copy + compute
}

TEST_F(StreamingAttentionTest, HungCopyQuarantinesUntilDrainThenDecodesExactly) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.HungCopyQuarantinesUntilDrainThenDecodesExactly"));
  Build(Shape(), 512, milliseconds(100));
  FillHistory(512, rng);
  gpu::CpuDeviceTestHooks* hooks = gpu::TEST_CpuDeviceHooks(*device_);
  ASSERT_NE(hooks, nullptr);
  hooks->HangNextEvents(gpu::Queue::kHostToDevice, 1);  // the query copy's fence
  Status s = attention_->Decode(1, 0, 0, 1, *history_, 512, 0.125f);
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("quarantined"), std::string::npos) << s;
  EXPECT_TRUE(attention_->stager().quarantined());
  s = attention_->Decode(1, 0, 1, 1, *history_, 512, 0.125f);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(attention_->Drain(steady_clock::now() + milliseconds(50)).ok());
  hooks->ReleaseHangs(gpu::Queue::kHostToDevice);
  ASSERT_TRUE(attention_->Drain(steady_clock::now() + std::chrono::seconds(10)).ok());
  ExpectMatchesReferences(0, 512, 0.125f, 2);
}

TEST_F(StreamingAttentionTest, DeviceErrorOnTheOutputQuarantines) {
  std::mt19937_64 rng(TestSeed("StreamingAttentionTest.DeviceErrorOnTheOutputQuarantines"));
  Build(Shape(), 100);
  FillHistory(100, rng);
  gpu::CpuDeviceTestHooks* hooks = gpu::TEST_CpuDeviceHooks(*device_);
  ASSERT_NE(hooks, nullptr);
  hooks->FailNextEvents(gpu::Queue::kDeviceToHost, 1);  // the output copy's fence
  Status s = attention_->Decode(1, 0, 0, 1, *history_, 100, 0.125f);
  ASSERT_EQ(s.code(), StatusCode::kInternal) << s;
  EXPECT_TRUE(attention_->stager().quarantined());
  EXPECT_EQ(attention_->Decode(1, 0, 1, 1, *history_, 100, 0.125f).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(attention_->Drain(steady_clock::now() + std::chrono::seconds(10)).ok());
  ExpectMatchesReferences(0, 100, 0.125f, 2);
}

TEST_F(StreamingAttentionTest, RefusesBadOptionsAndShortHistories) {
  Build(Shape(), 64);
  StreamingAttentionOptions o = options_;
  o.tile_tokens = 24;  // not a multiple of 16
  auto bad = StreamingAttention::Create(*device_, *arena_, arena_->scratch(), layout_, o);
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status();
  o = options_;
  o.num_q_heads = 3;
  bad = StreamingAttention::Create(*device_, *arena_, arena_->scratch(), layout_, o);
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status();
  bad = StreamingAttention::Create(*device_, *arena_, {0, 16}, layout_, options_);
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status();
  EXPECT_TRUE(attention_->Decode(1, 0, 0, 1, *history_, 65, 0.1f).IsInvalidArgument());
  EXPECT_TRUE(attention_->Decode(1, 3, 0, 1, *history_, 16, 0.1f).IsInvalidArgument());
}

// Flags for `tokens`: every block older than the newest `exact_tail` tokens
// compact (the last, partly filled block always stays exact).
std::vector<std::uint8_t> CompactOlderThan(std::uint32_t tokens, std::uint32_t tpb,
                                           std::uint32_t exact_tail) {
  const std::uint32_t blocks = (tokens + tpb - 1) / tpb;
  std::vector<std::uint8_t> flags(blocks, 0);
  for (std::uint32_t b = 0; b < blocks; ++b) {
    flags[b] = (b + 1) * tpb + exact_tail <= tokens ? 1 : 0;
  }
  return flags;
}

TEST_F(StreamingAttentionTest, MixedHistoryEqualsTheHostFoldBitForBitForEveryDtype) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.MixedHistoryEqualsTheHostFoldBitForBitForEveryDtype"));
  std::pair<double, double> worst{0, 0};
  auto keep_worst = [&](std::pair<double, double> e) {
    worst = {std::max(worst.first, e.first), std::max(worst.second, e.second)};
  };
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    Shape shape;
    shape.dtype = dtype;
    Build(shape, 1000);
    const std::uint32_t tpb = shape.tokens_per_block;
    std::uint64_t step = 0;
    // Compact older blocks, exact newer ones, a partial last block exact.
    for (std::uint32_t exact_tail : {0u, 40u, 300u, 990u}) {
      SCOPED_TRACE(std::string(KvDtypeName(dtype)) + " exact tail " + std::to_string(exact_tail));
      FillHistory(1000, rng);
      keep_worst(
          ExpectMixedMatches(1, 1000, 0.125f, CompactOlderThan(1000, tpb, exact_tail), step++));
    }
    // Representations that change every few blocks: many cuts, short tiles.
    for (std::uint32_t tokens : {16u, 100u, 512u}) {
      SCOPED_TRACE(std::string(KvDtypeName(dtype)) + " random flags, tokens " +
                   std::to_string(tokens));
      std::vector<std::uint8_t> flags((tokens + tpb - 1) / tpb);
      for (std::uint8_t& f : flags) f = rng() % 3 == 0 ? 0 : 1;
      if (tokens % tpb != 0) flags.back() = 0;
      FillHistory(tokens, rng);
      keep_worst(ExpectMixedMatches(2, tokens, 0.125f, flags, step++));
    }
  }
  std::printf(
      "against exact attention: largest relative error of an output head %.3g (asserted < "
      "%.3g), largest lse error %.3g (asserted < %.3g)\n",
      worst.first, kMixedRelativeError, worst.second, kMixedLseError);
}

// Compact tiles stop at kMaxCompactTileTokens even where tile_tokens is larger.
TEST_F(StreamingAttentionTest, CompactTilesAreCappedAtTheKernelsLimit) {
  std::mt19937_64 rng(TestSeed("StreamingAttentionTest.CompactTilesAreCappedAtTheKernelsLimit"));
  Shape shape;
  shape.layers = 1;
  shape.tile_tokens = 2 * gpu::kMaxCompactTileTokens;
  Build(shape, 9000);
  FillHistory(9000, rng);
  ExpectMixedMatches(0, 9000, 0.125f, CompactOlderThan(9000, shape.tokens_per_block, 100), 0);
  // Compact [0, 4096), compact [4096, 8192), compact [8192, 8896), exact [8896, 9000).
  EXPECT_EQ(attention_->stager().metrics().leases, 4u);
}

TEST_F(StreamingAttentionTest, RefusesCompactFlagsItCannotDecodeBeforeEnqueuing) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.RefusesCompactFlagsItCannotDecodeBeforeEnqueuing"));
  Build(Shape(), 100);
  FillHistory(100, rng);
  const std::uint64_t payload = shape_.layers * layer_bytes_;
  const HostHistory history = HostHistory::Contiguous(history_->bytes().data(), 7, payload);
  std::vector<std::uint8_t> flags(7, 0);
  Status s = attention_->Decode(1, 0, 0, 1, history.WithCompact({flags.data(), 6}), 100, 0.1f);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("6 compact flags for the 7 blocks"), std::string::npos) << s;
  flags[6] = 1;  // the partly filled last block (4 of 16 tokens)
  s = attention_->Decode(1, 0, 0, 1, history.WithCompact(flags), 100, 0.1f);
  EXPECT_NE(s.message().find("block 6 is compact but only 4 of its 16 tokens"), std::string::npos)
      << s;
  // Nothing was enqueued or leased: the next decode runs.
  EXPECT_EQ(attention_->stager().metrics().leases, 0u);
  ExpectMatchesReferences(0, 100, 0.125f, 0);

  // One token per block, fp16, 2 x 64: a compact half (128 codes and 256
  // bytes of key scales) outgrows the exact half (256 bytes), so the staging
  // sized for exact tiles could not hold a compact tile.
  Shape tiny;
  tiny.tokens_per_block = 1;
  tiny.tile_tokens = 4;
  Build(tiny, 8);
  FillHistory(8, rng);
  std::vector<std::uint8_t> all(8, 1);
  s = attention_->Decode(
      1, 0, 0, 1,
      HostHistory::Contiguous(history_->bytes().data(), 8, shape_.layers * layer_bytes_)
          .WithCompact(all),
      8, 0.1f);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("cannot decode compact blocks"), std::string::npos) << s;
}

TEST_F(StreamingAttentionTest, MixedDecodeStepsAfterWarmUpAllocateNothing) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.MixedDecodeStepsAfterWarmUpAllocateNothing"));
  Build(Shape(), 300);
  FillHistory(300, rng);
  const std::vector<std::uint8_t> flags = CompactOlderThan(300, 16, 100);
  CompactBlocks(flags);
  const HostHistory history =
      HostHistory::Contiguous(history_->bytes().data(), 19, shape_.layers * layer_bytes_)
          .WithCompact(flags);
  for (std::uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(attention_->Decode(1, step % 3, step, 1, history, 300, 0.125f).ok());
  }
  const std::uint64_t before = g_allocations.load(std::memory_order_relaxed);
  bool all_ok = true;
  for (std::uint64_t step = 3; step < 503; ++step) {
    all_ok = attention_->Decode(1, step % 3, step, 1, history, 300, 0.125f).ok() && all_ok;
  }
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(g_allocations.load(std::memory_order_relaxed) - before, 0u);
}

TEST_F(StreamingAttentionTest, ThousandDecodeStepsAfterWarmUpAllocateNothing) {
  std::mt19937_64 rng(
      TestSeed("StreamingAttentionTest.ThousandDecodeStepsAfterWarmUpAllocateNothing"));
  Build(Shape(), 300);
  FillHistory(300, rng);
  for (std::uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(attention_->Decode(1, step % 3, step, 1, *history_, 300, 0.125f).ok());
  }
  const std::uint64_t before = g_allocations.load(std::memory_order_relaxed);
  bool all_ok = true;
  for (std::uint64_t step = 3; step < 1003; ++step) {
    const std::uint32_t tokens = 200 + static_cast<std::uint32_t>(step % 100);
    all_ok = attention_->Decode(1, step % 3, step, 1, *history_, tokens, 0.125f).ok() && all_ok;
  }
  const std::uint64_t allocations = g_allocations.load(std::memory_order_relaxed) - before;
  ASSERT_TRUE(all_ok);
  EXPECT_EQ(allocations, 0u);
  // The counter counts: one more std::string is one more allocation.
  std::string* probe = new std::string(100, 'x');
  EXPECT_GT(g_allocations.load(std::memory_order_relaxed), before + allocations);
  delete probe;
}

}  // namespace
}  // namespace kvfabric::client
