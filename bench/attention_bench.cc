// attention_bench: CPU-backend figures for the device working set, each as a
// ratio against a baseline measured in the same run (STYLE.md: benchmarks
// print figures and ratios; no assertions).
//
//   1. memcpy bandwidth (256 MiB, DRAM-resident): the baseline.
//   2. LSE merge throughput (cpu_kernels::MergeStates, bytes of states read
//      per second) as a fraction of memcpy bandwidth.
//   3. tiled decode attention throughput (cpu_kernels via TiledAttentionHost,
//      bytes of K and V read per second) as a fraction of memcpy bandwidth.
//   4. streaming one layer through a bounded arena (StreamingAttention on the
//      CPU device: two staging buffers) versus fully resident tiled attention,
//      at 8K, 32K and 128K tokens, for 8 KV heads x 128 head dim fp16 with 32
//      query heads (one layer of a 32-layer model per step).
//
// Usage: attention_bench [max_tokens]   (default 131072)
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/device_arena.h"
#include "client/streaming_attention.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/reference_attention.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace kc = kvfabric::client;
namespace kg = kvfabric::gpu;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double MemcpyGBps() {
  const std::size_t n = std::size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  std::memcpy(b.data(), a.data(), n);  // touch
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, 2.0 * n / Seconds(t0, Clock::now()) / 1e9);  // read + write
  }
  return best;
}

int Fail(const kvfabric::Status& s) {
  std::fprintf(stderr, "attention_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

// Usage: attention_bench [MAX_TOKENS] [--cpu-kernels=scalar]
int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  std::uint32_t max_tokens = 131072;
  kg::CpuDeviceOptions cpu_options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu-kernels=scalar") {
      cpu_options.scalar_kernels = true;
    } else if (arg == "--cpu-kernels=best") {
      cpu_options.scalar_kernels = false;
    } else if (!arg.empty() && arg[0] != '-') {
      max_tokens = static_cast<std::uint32_t>(std::atoi(arg.c_str()));
    } else {
      std::fprintf(stderr, "attention_bench: unknown flag %s\n", arg.c_str());
      return 2;
    }
  }
  constexpr std::uint32_t kQHeads = 32, kKvHeads = 8, kDim = 128, kTpb = 16, kTile = 256;
  const double mem = MemcpyGBps();
  std::printf("memcpy (256 MiB, read+write): %.2f GB/s\n", mem);

  // Merge throughput: 64 states of [32 heads, 128] fp32.
  {
    const std::uint32_t states = 64;
    std::vector<float> outs(std::size_t{states} * kQHeads * kDim, 0.5f), lses(states * kQHeads);
    for (std::size_t i = 0; i < lses.size(); ++i) lses[i] = static_cast<float>(i % 13);
    std::vector<float> out(kQHeads * kDim), lse(kQHeads);
    const int iters = 2000;
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      kg::cpu_kernels::MergeStates(states, kQHeads, kDim, outs.data(), lses.data(), out.data(),
                                   lse.data());
    }
    const double bytes = double(iters) * (outs.size() + lses.size()) * 4;
    const double gbps = bytes / Seconds(t0, Clock::now()) / 1e9;
    std::printf("merge (64 states x 32 heads x 128): %.2f GB/s of states = %.2f of memcpy\n", gbps,
                gbps / mem);
  }

  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const kg::AttentionShape shape{kQHeads, kKvHeads, kDim, kvfabric::KvDtype::kFp16};
  const float scale = 1.0f / std::sqrt(float(kDim));
  const std::uint64_t token_bytes = std::uint64_t{kKvHeads} * kDim * 2;

  // The decode kernel alone, on one 256-token tile that stays in cache: each
  // instruction set this CPU has, against memcpy.
  {
    const std::uint32_t n = kTile;
    std::vector<std::byte> k(std::uint64_t{n} * token_bytes), v(k.size());
    for (std::size_t i = 0; i < k.size(); i += 2) {
      const std::uint16_t kb = kg::FloatToFp16Bits(dist(rng)), vb = kg::FloatToFp16Bits(dist(rng));
      std::memcpy(&k[i], &kb, 2);
      std::memcpy(&v[i], &vb, 2);
    }
    std::vector<float> q(kQHeads * kDim), out(kQHeads * kDim), lse(kQHeads);
    for (float& x : q) x = dist(rng);
    double scalar_gbps = 0;
    for (auto isa : {kg::cpu_kernels::KernelIsa::kScalar, kg::cpu_kernels::KernelIsa::kAvx2}) {
      if (!kg::cpu_kernels::KernelIsaSupported(isa)) continue;
      const int iters = isa == kg::cpu_kernels::KernelIsa::kScalar ? 20 : 400;
      kg::cpu_kernels::DecodeAttentionTileWith(isa, shape, scale, n, q.data(), k.data(), v.data(),
                                               out.data(), lse.data());
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        kg::cpu_kernels::DecodeAttentionTileWith(isa, shape, scale, n, q.data(), k.data(), v.data(),
                                                 out.data(), lse.data());
      }
      const double gbps = double(iters) * 2.0 * k.size() / Seconds(t0, Clock::now()) / 1e9;
      if (isa == kg::cpu_kernels::KernelIsa::kScalar) scalar_gbps = gbps;
      std::printf(
          "decode kernel, %s, one %u-token fp16 tile in cache: %.2f GB/s of KV = %.2f of "
          "memcpy%s\n",
          kg::cpu_kernels::KernelIsaName(isa), n, gbps, gbps / mem,
          scalar_gbps > 0 && isa != kg::cpu_kernels::KernelIsa::kScalar
              ? (" = " + std::to_string(gbps / scalar_gbps).substr(0, 5) + "x scalar").c_str()
              : "");
    }
    std::printf("attention below runs %s (--cpu-kernels=scalar forces scalar)\n",
                kg::cpu_kernels::KernelIsaName(cpu_options.scalar_kernels
                                                   ? kg::cpu_kernels::KernelIsa::kScalar
                                                   : kg::cpu_kernels::BestKernelIsa()));
  }

  for (std::uint32_t tokens : {8192u, 32768u, 131072u}) {
    if (tokens > max_tokens) break;
    // Device: an arena of two staging buffers of one tile each plus scratch.
    kc::HistoryLayout layout{1, kTpb, kKvHeads, kDim, kvfabric::KvDtype::kFp16, 0};
    kc::StreamingAttentionOptions so;
    so.num_q_heads = kQHeads;
    so.tile_tokens = kTile;
    kc::DeviceArenaOptions ao;
    ao.page_bytes = 64 << 10;
    ao.staging_pages = 2 * kc::StreamingAttention::PagesPerBuffer(layout, so, ao.page_bytes);
    ao.scratch_bytes = kc::StreamingAttention::ScratchBytes(layout, so);
    ao.context_floor_pages = 2;
    kg::DeviceOptions dopt;
    dopt.arena_bytes = ao.scratch_bytes + 256 + (ao.staging_pages + 2) * ao.page_bytes;
    auto device = kg::CreateCpuDevice(dopt, cpu_options);
    if (!device.ok()) return Fail(device.status());
    auto arena = kc::DeviceArena::Create((*device)->arena_bytes(), ao);
    if (!arena.ok()) return Fail(arena.status());
    auto sa = kc::StreamingAttention::Create(**device, **arena, (*arena)->scratch(), layout, so);
    if (!sa.ok()) return Fail(sa.status());
    auto history = (*device)->AllocatePinnedHost(std::uint64_t{tokens} * 2 * token_bytes);
    if (!history.ok()) return Fail(history.status());
    // Host layout: blocks of [K 16 tokens][V 16 tokens]; contiguous copies for the resident run.
    std::vector<std::byte> k(std::uint64_t{tokens} * token_bytes), v(k.size());
    std::span<std::byte> h = (*history)->bytes();
    for (std::size_t i = 0; i < k.size(); i += 2) {
      const std::uint16_t kb = kg::FloatToFp16Bits(dist(rng)), vb = kg::FloatToFp16Bits(dist(rng));
      std::memcpy(&k[i], &kb, 2);
      std::memcpy(&v[i], &vb, 2);
    }
    const std::uint64_t block_half = std::uint64_t{kTpb} * token_bytes;
    for (std::uint64_t b = 0; b < tokens / kTpb; ++b) {
      std::memcpy(&h[2 * b * block_half], &k[b * block_half], block_half);
      std::memcpy(&h[(2 * b + 1) * block_half], &v[b * block_half], block_half);
    }
    for (float& q : (*sa)->query()) q = dist(rng);
    std::vector<float> q((*sa)->query().begin(), (*sa)->query().end());
    std::vector<float> out(kQHeads * kDim), lse(kQHeads);

    const int iters = tokens >= 131072 ? 2 : 5;
    auto s = kg::TiledAttentionHost(shape, scale, tokens, kTile, q, k, v, out, lse);  // warm
    if (!s.ok()) return Fail(s);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      s = kg::TiledAttentionHost(shape, scale, tokens, kTile, q, k, v, out, lse);
    }
    const double resident = Seconds(t0, Clock::now()) / iters;
    s = (*sa)->Decode(1, 0, 0, 1, **history, tokens, scale);  // warm
    if (!s.ok()) return Fail(s);
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) s = (*sa)->Decode(1, 0, i + 1, 1, **history, tokens, scale);
    if (!s.ok()) return Fail(s);
    const double streamed = Seconds(t0, Clock::now()) / iters;
    const bool same = std::memcmp(out.data(), (*sa)->output().data(), out.size() * 4) == 0;
    const double kv_bytes = 2.0 * k.size();
    std::printf(
        "%6u tokens: KV %.0f MiB/layer, arena %.2f MiB | resident tiled %.2f ms (%.2f GB/s = "
        "%.2f of memcpy) | streamed %.2f ms, %.2fx resident | bit-identical: %s | peak staging "
        "%u/%u pages\n",
        tokens, kv_bytes / (1 << 20), (*device)->arena_bytes() / double(1 << 20), resident * 1e3,
        kv_bytes / resident / 1e9, kv_bytes / resident / 1e9 / mem, streamed * 1e3,
        streamed / resident, same ? "yes" : "NO", (*arena)->metrics().peak_staging_in_use,
        (*arena)->metrics().staging_pages);
  }
  return 0;
}
