// StreamingAttention (client/streaming_attention.h) on a real device: the
// streamed result equals fully resident attention over the same tile order,
// bit for bit, on the same device, and lies within the FP64 tolerance of
// gpu/kernels/attention_test_util.h.
//
// "Fully resident" is computed on the device under test by ResidentAttention
// below: the whole layer's K and V are copied into the device arena once, then
// DecodeAttentionTile runs over consecutive tile_tokens slices of it and the
// tile states are folded left to right with the same 2-state
// MergeAttentionStates (running state first, then the tile) that
// StreamingAttention uses. The CUDA kernels are not bit-identical to the CPU
// ones (gpu/cuda/attention_kernels.cuh), so the resident result on a GPU must
// come from the GPU.
//
// Every case runs on the CPU backend too (which keeps the test's own logic
// honest on machines without a GPU) and on CUDA device 0; the CUDA cases skip,
// with one line saying why, when ProbeCuda() finds no device.
//
// The device arena is split in two: [0, budget) is the DeviceArena the
// streaming path works in (scratch, two staging buffers, a floor of pool
// pages), far smaller than the histories; the resident region after it holds
// the whole history for the reference run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "client/device_arena.h"
#include "client/streaming_attention.h"
#include "core/status.h"
#include "core/statusor.h"
#include "core/testing/test_seed.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/cuda_probe.h"
#include "gpu/device.h"
#include "gpu/kernel_args.h"
#include "gpu/kernels/attention_test_util.h"

namespace kvfabric::client {
namespace {

using gpu::testing::Logits;
using gpu::testing::Problem;
using gpu::testing::State;

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kAlign = 256;

std::uint64_t AlignUp(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::uint32_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

gpu::Deadline Soon() { return std::chrono::steady_clock::now() + std::chrono::seconds(30); }

// Fully resident tiled attention on a Device: the reference the streaming
// path must match bit for bit. Owns a pinned host buffer and two events; uses
// the arena bytes [region.offset, region.offset + region.bytes) of the device,
// which nothing else may use. One thread drives it.
class ResidentAttention {
 public:
  // Arena bytes needed for `shape` and histories of up to `max_tokens` tokens.
  static std::uint64_t RegionBytes(const gpu::AttentionShape& shape, std::uint32_t max_tokens) {
    const std::uint64_t q = std::uint64_t{shape.num_q_heads} * shape.head_dim * 4;
    const std::uint64_t l = std::uint64_t{shape.num_q_heads} * 4;
    return AlignUp(q) + 2 * AlignUp(KvBytes(shape, max_tokens)) + 2 * AlignUp(2 * q) +
           2 * AlignUp(2 * l);
  }

  // REQUIRES: region.offset is 256-byte aligned, region.bytes >= RegionBytes.
  static StatusOr<std::unique_ptr<ResidentAttention>> Create(gpu::Device& device,
                                                             gpu::DeviceRange region,
                                                             const gpu::AttentionShape& shape,
                                                             std::uint32_t max_tokens,
                                                             std::uint32_t tile_tokens) {
    std::unique_ptr<ResidentAttention> r(
        new ResidentAttention(device, shape, max_tokens, tile_tokens));
    const std::uint64_t q = std::uint64_t{shape.num_q_heads} * shape.head_dim * 4;
    const std::uint64_t l = std::uint64_t{shape.num_q_heads} * 4;
    const std::uint64_t kv = KvBytes(shape, max_tokens);
    std::uint64_t at = region.offset;
    r->query_ = {at, q};
    at += AlignUp(q);
    r->keys_ = at;
    at += AlignUp(kv);
    r->values_ = at;
    at += AlignUp(kv);
    for (int p = 0; p < 2; ++p) {
      r->states_[p] = {at, 2 * q};
      at += AlignUp(2 * q);
    }
    for (int p = 0; p < 2; ++p) {
      r->lses_[p] = {at, 2 * l};
      at += AlignUp(2 * l);
    }
    if (at > region.offset + region.bytes) {
      return Status::InvalidArgument("resident region too small: need " +
                                     std::to_string(at - region.offset));
    }
    // Host side: [q | K | V | out | lse], each 256-byte aligned.
    KVF_ASSIGN_OR_RETURN(r->host_, device.AllocatePinnedHost(AlignUp(q) + 2 * AlignUp(kv) +
                                                             AlignUp(q) + AlignUp(l)));
    KVF_ASSIGN_OR_RETURN(r->copied_, device.CreateEvent());
    KVF_ASSIGN_OR_RETURN(r->computed_, device.CreateEvent());
    KVF_ASSIGN_OR_RETURN(r->returned_, device.CreateEvent());
    return r;
  }

  // Attention of p.q over p's whole history, tile by tile, on the device.
  // REQUIRES: p.shape equals the shape given to Create, p.tokens <= max_tokens.
  Status Run(const Problem& p, State* result) {
    const std::uint64_t q = query_.bytes;
    const std::uint64_t l = std::uint64_t{shape_.num_q_heads} * 4;
    const std::uint64_t kv_max = AlignUp(KvBytes(shape_, max_tokens_));
    const std::uint64_t token_bytes = KvBytes(shape_, 1);
    const std::span<std::byte> h = host_->bytes();
    const std::span<std::byte> host_q = h.subspan(0, q);
    const std::span<std::byte> host_k = h.subspan(AlignUp(q), p.k.size());
    const std::span<std::byte> host_v = h.subspan(AlignUp(q) + kv_max, p.v.size());
    const std::span<std::byte> host_out = h.subspan(AlignUp(q) + 2 * kv_max, q);
    const std::span<std::byte> host_lse = h.subspan(2 * AlignUp(q) + 2 * kv_max, l);
    std::memcpy(host_q.data(), p.q.data(), q);
    if (p.tokens > 0) {
      std::memcpy(host_k.data(), p.k.data(), p.k.size());
      std::memcpy(host_v.data(), p.v.data(), p.v.size());
    }
    KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(host_q, query_));
    if (p.tokens > 0) {
      KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(host_k, {keys_, p.k.size()}));
      KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(host_v, {values_, p.v.size()}));
    }
    KVF_RETURN_IF_ERROR(device_.Record(*copied_, gpu::Queue::kHostToDevice));
    KVF_RETURN_IF_ERROR(device_.QueueWaitEvent(gpu::Queue::kCompute, *copied_));

    gpu::AttentionTileArgs tile;
    tile.shape = shape_;
    tile.scale = p.scale;
    tile.query = query_;
    gpu::MergeStatesArgs merge;
    merge.num_states = 2;
    merge.num_heads = shape_.num_q_heads;
    merge.head_dim = shape_.head_dim;
    std::uint32_t pair = 0;
    if (p.tokens == 0) {
      tile.tokens = 0;
      tile.keys = tile.values = {query_.offset, 0};
      tile.output = {states_[0].offset, q};
      tile.lse = {lses_[0].offset, l};
      KVF_RETURN_IF_ERROR(device_.DecodeAttentionTile(tile));
    }
    for (std::uint32_t first = 0; first < p.tokens; first += tile_tokens_) {
      const std::uint32_t n = std::min(tile_tokens_, p.tokens - first);
      const std::uint64_t slot = first == 0 ? 0 : 1;
      tile.tokens = n;
      tile.keys = {keys_ + first * token_bytes, n * token_bytes};
      tile.values = {values_ + first * token_bytes, n * token_bytes};
      tile.output = {states_[pair].offset + slot * q, q};
      tile.lse = {lses_[pair].offset + slot * l, l};
      KVF_RETURN_IF_ERROR(device_.DecodeAttentionTile(tile));
      if (slot == 1) {  // running state (slot 0) first, then the tile
        merge.outputs = states_[pair];
        merge.lses = lses_[pair];
        merge.output = {states_[1 - pair].offset, q};
        merge.lse = {lses_[1 - pair].offset, l};
        KVF_RETURN_IF_ERROR(device_.MergeAttentionStates(merge));
        pair = 1 - pair;
      }
    }
    KVF_RETURN_IF_ERROR(device_.Record(*computed_, gpu::Queue::kCompute));
    KVF_RETURN_IF_ERROR(device_.QueueWaitEvent(gpu::Queue::kDeviceToHost, *computed_));
    KVF_RETURN_IF_ERROR(device_.CopyDeviceToHost({states_[pair].offset, q}, host_out));
    KVF_RETURN_IF_ERROR(device_.CopyDeviceToHost({lses_[pair].offset, l}, host_lse));
    KVF_RETURN_IF_ERROR(device_.Record(*returned_, gpu::Queue::kDeviceToHost));
    KVF_RETURN_IF_ERROR(returned_->Wait(Soon()));
    result->out.resize(q / 4);
    result->lse.resize(shape_.num_q_heads);
    std::memcpy(result->out.data(), host_out.data(), q);
    std::memcpy(result->lse.data(), host_lse.data(), l);
    return Status::OK();
  }

 private:
  ResidentAttention(gpu::Device& device, const gpu::AttentionShape& shape, std::uint32_t max_tokens,
                    std::uint32_t tile_tokens)
      : device_(device), shape_(shape), max_tokens_(max_tokens), tile_tokens_(tile_tokens) {}

  static std::uint64_t KvBytes(const gpu::AttentionShape& s, std::uint32_t tokens) {
    return std::uint64_t{tokens} * s.num_kv_heads * s.head_dim * KvDtypeSize(s.dtype);
  }

  gpu::Device& device_;
  const gpu::AttentionShape shape_;
  const std::uint32_t max_tokens_;
  const std::uint32_t tile_tokens_;
  gpu::DeviceRange query_;
  std::uint64_t keys_ = 0, values_ = 0;
  gpu::DeviceRange states_[2], lses_[2];
  std::unique_ptr<gpu::PinnedHostBuffer> host_;
  std::unique_ptr<gpu::Event> copied_, computed_, returned_;
};

enum class Backend { kCpu, kCuda };

std::string BackendName(Backend b) { return b == Backend::kCpu ? "Cpu" : "Cuda"; }
void PrintTo(Backend b, std::ostream* os) { *os << BackendName(b); }

// Probes CUDA once per process; without a device, prints the one line that
// says why the CUDA cases skip.
bool CudaPresent() {
  static const bool present = [] {
    const cuda::CudaProbeResult probe = cuda::ProbeCuda();
    if (!probe.devices.empty()) return true;
    std::fprintf(stderr, "no CUDA device, skipping the CUDA cases: %s\n",
                 probe.status.ToString().c_str());
    return false;
  }();
  return present;
}

struct Shape {
  KvDtype dtype = KvDtype::kFp16;
  std::uint32_t q_heads = 8;
  std::uint32_t kv_heads = 2;  // GQA: 4 query heads per kv head
  std::uint32_t head_dim = 128;
  std::uint32_t tokens_per_block = 16;
  std::uint32_t tile_tokens = 64;
  std::uint32_t layers = 2;
};

std::string Describe(const Shape& s) {
  return std::string(KvDtypeName(s.dtype)) + " q" + std::to_string(s.q_heads) + "/kv" +
         std::to_string(s.kv_heads) + " d" + std::to_string(s.head_dim) + " tile " +
         std::to_string(s.tile_tokens);
}

class StreamingAttentionDeviceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kCuda && !CudaPresent()) GTEST_SKIP() << "no CUDA device";
  }

  std::mt19937_64 Rng(const std::string& test) {
    return std::mt19937_64(
        TestSeed("StreamingAttentionDeviceTest." + test + "/" + BackendName(GetParam())));
  }

  void Build(const Shape& shape, std::uint32_t max_tokens) {
    // Users of the device go first.
    resident_.reset();
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
    DeviceArenaOptions ao;
    ao.page_bytes = kPage;
    ao.staging_pages = 2 * static_cast<std::uint32_t>(
                               StreamingAttention::PagesPerBuffer(layout_, options_, kPage));
    ao.scratch_bytes = StreamingAttention::ScratchBytes(layout_, options_);
    ao.context_floor_pages = 2;
    budget_bytes_ = AlignUp(ao.scratch_bytes) + (ao.staging_pages + 2) * kPage;
    const std::uint64_t resident_bytes = ResidentAttention::RegionBytes(KernelShape(), max_tokens);
    gpu::DeviceOptions dopt;
    dopt.arena_bytes = budget_bytes_ + resident_bytes;
    auto d = GetParam() == Backend::kCpu ? gpu::CreateCpuDevice(dopt) : gpu::CreateCudaDevice(dopt);
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = std::move(d).value();
    auto a = DeviceArena::Create(budget_bytes_, ao);
    ASSERT_TRUE(a.ok()) << a.status();
    arena_ = std::move(a).value();
    auto sa = StreamingAttention::Create(*device_, *arena_, arena_->scratch(), layout_, options_);
    ASSERT_TRUE(sa.ok()) << sa.status();
    attention_ = std::move(sa).value();
    auto r = ResidentAttention::Create(*device_, {budget_bytes_, resident_bytes}, KernelShape(),
                                       max_tokens, shape.tile_tokens);
    ASSERT_TRUE(r.ok()) << r.status();
    resident_ = std::move(r).value();

    token_bytes_ = std::uint64_t{shape.kv_heads} * shape.head_dim * KvDtypeSize(shape.dtype);
    layer_bytes_ = 2 * std::uint64_t{shape.tokens_per_block} * token_bytes_;
    const std::uint64_t blocks = (max_tokens + shape.tokens_per_block - 1) / shape.tokens_per_block;
    auto h = device_->AllocatePinnedHost(std::max<std::uint64_t>(1, blocks) * shape.layers *
                                         layer_bytes_);
    ASSERT_TRUE(h.ok()) << h.status();
    history_ = std::move(h).value();
    // NaN everywhere no problem is written: rows past the history's end and
    // other layers. Reading any of them would poison the result.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::size_t elem = KvDtypeSize(shape.dtype);
    std::span<std::byte> bytes = history_->bytes();
    for (std::size_t i = 0; i + elem <= bytes.size(); i += elem) {
      gpu::testing::Store(shape.dtype, nan, &bytes[i]);
    }
  }

  gpu::AttentionShape KernelShape() const {
    return {shape_.q_heads, shape_.kv_heads, shape_.head_dim, shape_.dtype};
  }

  std::byte* RowAt(std::uint32_t layer, std::uint32_t token, int kv) {
    const std::uint32_t tpb = shape_.tokens_per_block;
    return history_->bytes().data() + std::uint64_t{token / tpb} * shape_.layers * layer_bytes_ +
           layer * layer_bytes_ + kv * (layer_bytes_ / 2) + (token % tpb) * token_bytes_;
  }

  // Writes p's K and V into `layer` of the host history, in block layout.
  void Scatter(std::uint32_t layer, const Problem& p) {
    for (std::uint32_t t = 0; t < p.tokens; ++t) {
      std::memcpy(RowAt(layer, t, 0), p.k.data() + t * token_bytes_, token_bytes_);
      std::memcpy(RowAt(layer, t, 1), p.v.data() + t * token_bytes_, token_bytes_);
    }
  }

  // Streams `layer` of the history (holding p) and checks it against the
  // resident run bit for bit and against FP64 within tolerance.
  void ExpectStreamedMatchesResident(std::uint32_t layer, const Problem& p, std::uint64_t step,
                                     const std::string& what) {
    std::copy(p.q.begin(), p.q.end(), attention_->query().begin());
    const Status s = attention_->Decode(1, layer, step, 1, *history_, p.tokens, p.scale);
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    State streamed{{attention_->output().begin(), attention_->output().end()},
                   {attention_->lse().begin(), attention_->lse().end()}};
    State resident;
    const Status r = resident_->Run(p, &resident);
    ASSERT_TRUE(r.ok()) << what << ": " << r;
    ASSERT_EQ(streamed.out.size(), resident.out.size());
    for (std::size_t i = 0; i < streamed.out.size(); ++i) {
      ASSERT_EQ(Bits(streamed.out[i]), Bits(resident.out[i]))
          << what << ": output " << i << " streamed " << streamed.out[i] << " resident "
          << resident.out[i];
    }
    for (std::size_t h = 0; h < streamed.lse.size(); ++h) {
      ASSERT_EQ(Bits(streamed.lse[h]), Bits(resident.lse[h]))
          << what << ": lse " << h << " streamed " << streamed.lse[h] << " resident "
          << resident.lse[h];
    }
    if (p.tokens == 0) {
      for (float o : streamed.out) ASSERT_EQ(Bits(o), 0u) << what;
      for (float x : streamed.lse) ASSERT_TRUE(std::isinf(x) && x < 0) << what;
      return;
    }
    const std::uint32_t tiles = (p.tokens + shape_.tile_tokens - 1) / shape_.tile_tokens;
    gpu::testing::ExpectNearFp64(p, streamed, tiles, what);
  }

  Shape shape_;
  HistoryLayout layout_;
  StreamingAttentionOptions options_;
  std::uint64_t budget_bytes_ = 0;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<StreamingAttention> attention_;
  std::unique_ptr<ResidentAttention> resident_;
  std::unique_ptr<gpu::PinnedHostBuffer> history_;
  std::uint64_t token_bytes_ = 0;
  std::uint64_t layer_bytes_ = 0;
};

TEST_P(StreamingAttentionDeviceTest, StreamedEqualsResidentBitForBitAcrossLengthsDtypesAndGqa) {
  std::mt19937_64 rng = Rng("StreamedEqualsResidentBitForBitAcrossLengthsDtypesAndGqa");
  const Shape shapes[] = {
      {KvDtype::kFp16, 8, 2, 128, 16, 64, 2},    // GQA 4:1
      {KvDtype::kBf16, 8, 2, 128, 16, 64, 2},    // GQA 4:1
      {KvDtype::kFp16, 32, 8, 128, 16, 128, 2},  // the model shape's heads
      {KvDtype::kBf16, 4, 1, 256, 16, 48, 2},    // multi-query, tile not a power of two
      {KvDtype::kFp32, 4, 4, 64, 16, 64, 2},     // no grouping
  };
  constexpr std::uint32_t kMaxTokens = 2049;
  for (const Shape& shape : shapes) {
    Build(shape, kMaxTokens);
    if (HasFatalFailure()) return;
    std::uint64_t step = 0;
    for (std::uint32_t tokens : {1u, 15u, 16u, 63u, 64u, 65u, 100u, 257u, 1000u, kMaxTokens}) {
      const std::uint32_t layer = step % 2;
      const Problem p = gpu::testing::MakeProblem(rng, shape.dtype, shape.q_heads, shape.kv_heads,
                                                  shape.head_dim, tokens, Logits::kNormal);
      Scatter(layer, p);
      ExpectStreamedMatchesResident(layer, p, step++,
                                    Describe(shape) + " tokens " + std::to_string(tokens));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(StreamingAttentionDeviceTest, AdversarialLogitsStayBitExactAndFinite) {
  std::mt19937_64 rng = Rng("AdversarialLogitsStayBitExactAndFinite");
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16}) {
    const Shape shape{dtype, 8, 2, 64, 16, 64, 1};
    Build(shape, 777);
    if (HasFatalFailure()) return;
    std::uint64_t step = 0;
    for (Logits logits : {Logits::kHuge, Logits::kTiny, Logits::kAllEqual}) {
      const Problem p = gpu::testing::MakeProblem(rng, dtype, shape.q_heads, shape.kv_heads,
                                                  shape.head_dim, 777, logits);
      Scatter(0, p);
      ExpectStreamedMatchesResident(0, p, step++,
                                    Describe(shape) + " " + gpu::testing::Name(logits));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(StreamingAttentionDeviceTest, OneTokenTilesMergeOncePerTokenAndStayBitExact) {
  std::mt19937_64 rng = Rng("OneTokenTilesMergeOncePerTokenAndStayBitExact");
  const Shape shape{KvDtype::kFp16, 8, 2, 64, 1, 1, 1};
  Build(shape, 200);
  if (HasFatalFailure()) return;
  const Problem p = gpu::testing::MakeProblem(rng, shape.dtype, shape.q_heads, shape.kv_heads,
                                              shape.head_dim, 200, Logits::kNormal);
  Scatter(0, p);
  ExpectStreamedMatchesResident(0, p, 0, "one-token tiles");
  EXPECT_EQ(attention_->stager().metrics().leases, 200u);
}

TEST_P(StreamingAttentionDeviceTest, ZeroTokensGiveTheEmptyStateOnBothPaths) {
  std::mt19937_64 rng = Rng("ZeroTokensGiveTheEmptyStateOnBothPaths");
  Build(Shape(), 16);
  if (HasFatalFailure()) return;
  const Problem p = gpu::testing::MakeProblem(rng, KvDtype::kFp16, 8, 2, 128, 0, Logits::kNormal);
  ExpectStreamedMatchesResident(0, p, 0, "zero tokens");
}

TEST_P(StreamingAttentionDeviceTest, HistoryFarLargerThanTheBudgetStreamsWithinIt) {
  std::mt19937_64 rng = Rng("HistoryFarLargerThanTheBudgetStreamsWithinIt");
  constexpr std::uint32_t kTokens = 8192 + 40;  // not a multiple of the tile
  const Shape shape{KvDtype::kFp16, 8, 2, 128, 16, 64, 2};
  Build(shape, kTokens);
  if (HasFatalFailure()) return;
  ASSERT_GT(history_->bytes().size(), 20 * budget_bytes_);
  const Problem p = gpu::testing::MakeProblem(rng, shape.dtype, shape.q_heads, shape.kv_heads,
                                              shape.head_dim, kTokens, Logits::kNormal);
  Scatter(1, p);

  // A canary over every device byte outside the streaming budget: the
  // streamed decode must leave it untouched.
  const std::uint64_t outside = device_->arena_bytes() - budget_bytes_;
  std::vector<std::byte> canary(outside);
  for (std::size_t i = 0; i < canary.size(); ++i) canary[i] = std::byte(i * 131 + 7);
  ASSERT_TRUE(device_->TEST_Write(canary, {budget_bytes_, outside}).ok());
  std::copy(p.q.begin(), p.q.end(), attention_->query().begin());
  ASSERT_TRUE(attention_->Decode(1, 1, 0, 1, *history_, kTokens, p.scale).ok());
  std::vector<std::byte> after(outside);
  ASSERT_TRUE(device_->TEST_Read({budget_bytes_, outside}, after).ok());
  EXPECT_TRUE(after == canary) << "the streamed decode wrote outside its " << budget_bytes_
                               << "-byte budget";

  const DeviceArenaMetrics m = arena_->metrics();
  EXPECT_EQ(m.peak_staging_in_use, m.staging_pages);  // two buffers, reserved once
  EXPECT_EQ(m.peak_held_pages, 0u);                   // the pool is never touched
  const StagerMetrics s = attention_->stager().metrics();
  EXPECT_EQ(s.leases, (kTokens + 63) / 64);
  EXPECT_EQ(s.fence_waits, 2 * (s.leases - 2));  // every reuse waited on copy + compute
  EXPECT_EQ(s.quarantines, 0u);

  // The same step again, now against the resident run (which overwrites the
  // canary region with the whole history).
  ExpectStreamedMatchesResident(1, p, 1, "8232 tokens");
}

INSTANTIATE_TEST_SUITE_P(Backends, StreamingAttentionDeviceTest,
                         ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

}  // namespace
}  // namespace kvfabric::client
