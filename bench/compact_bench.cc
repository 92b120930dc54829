// compact_bench: what the compact_int8 codec (gpu/kernels/compact_int8.h,
// docs/compact.md) buys and costs for one long history, measured in one run
// against exact:
//   - bytes per token moved, with compact allowed for pages older than the
//     newest N tokens (compact_after = 0, 4K, 16K; exact = never);
//   - the attention output's error against exact (max and mean relative, per
//     head, over random queries), for this codec and for the alternative it
//     was chosen over (keys scaled per token instead of per channel);
//   - decode time per token on the CPU backend: exact tiles, and exact tiles
//     for the newest tokens with compact blocks before them, merged by LSE;
//   - the same decode through the CPU Device path (client StreamingAttention
//     over a pinned host history with compact blocks flagged: host->device
//     copies into two staging buffers, DecodeAttentionTile or
//     DecodeAttentionCompactTile per tile, MergeAttentionStates), against its
//     all-exact run in the same process.
// The history is synthetic, shaped like real KV: keys with outlier channels
// (a few channels 20x the rest), values whose size varies by token.
//
//   bazel run -c opt //bench:compact_bench -- [--tokens 32768] [--heads 8] [--dim 128]
//       [--q-heads 32] [--queries 16] [--seed 1]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/device_arena.h"
#include "client/host_history.h"
#include "client/streaming_attention.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

namespace {

using kvfabric::KvDtype;
using namespace kvfabric::gpu;

struct Args {
  std::uint32_t tokens = 32768, heads = 8, dim = 128, q_heads = 32, queries = 16;
  std::uint32_t block = 16, tile = 256;
  std::uint64_t seed = 1;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const auto v = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--tokens")
      a.tokens = static_cast<std::uint32_t>(v);
    else if (k == "--heads")
      a.heads = static_cast<std::uint32_t>(v);
    else if (k == "--dim")
      a.dim = static_cast<std::uint32_t>(v);
    else if (k == "--q-heads")
      a.q_heads = static_cast<std::uint32_t>(v);
    else if (k == "--queries")
      a.queries = static_cast<std::uint32_t>(v);
    else if (k == "--seed")
      a.seed = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  a.tokens = a.tokens / a.tile * a.tile;
  return a;
}

// One layer's K and V, [tokens][heads][dim] fp16 each.
struct History {
  std::vector<std::uint16_t> k, v;
};

History Make(const Args& a) {
  std::mt19937_64 rng(a.seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const std::size_t row = std::size_t{a.heads} * a.dim, total = std::size_t{a.tokens} * row;
  History h{std::vector<std::uint16_t>(total), std::vector<std::uint16_t>(total)};
  for (std::size_t i = 0; i < total; ++i) {
    const std::size_t channel = i % row, token = i / row;
    h.k[i] = FloatToFp16Bits(n(rng) * (channel % 17 == 3 ? 20.0f : 1.0f));
    h.v[i] = FloatToFp16Bits(n(rng) * (0.5f + static_cast<float>(token % 7)));
  }
  return h;
}

// Blocks [0, blocks) as compact_int8 payloads of one layer (K half, V half).
std::vector<std::byte> EncodeBlocks(const Args& a, const History& h, std::uint32_t blocks) {
  const std::size_t per = std::size_t{a.block} * a.heads * a.dim;
  const std::uint64_t payload = CompactPayloadBytes(1, a.block, a.heads, a.dim);
  std::vector<std::byte> out(blocks * payload), exact(per * 2 * 2);
  for (std::uint32_t b = 0; b < blocks; ++b) {
    std::memcpy(exact.data(), h.k.data() + b * per, per * 2);
    std::memcpy(exact.data() + per * 2, h.v.data() + b * per, per * 2);
    const kvfabric::Status s = EncodeCompactInt8({KvDtype::kFp16, 1, a.block, a.heads, a.dim},
                                                 exact, {out.data() + b * payload, payload});
    if (!s.ok()) {
      std::fprintf(stderr, "encode: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  return out;
}

// The alternative codec, for its error only: keys scaled per (token, head)
// like values (fp16 scales, int8, round to nearest even), dequantised back to
// fp16 (the rounding to fp16 adds < 2^-11 relative, far below int8's steps).
std::vector<std::uint16_t> PerToken(const Args& a, const std::vector<std::uint16_t>& x) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t r = 0; r < x.size() / a.dim; ++r) {
    float max_abs = 0;
    for (std::size_t d = 0; d < a.dim; ++d) {
      max_abs = std::max(max_abs, std::fabs(Fp16BitsToFloat(x[r * a.dim + d])));
    }
    const float s = Fp16BitsToFloat(FloatToFp16Bits(max_abs / 127.0f));
    for (std::size_t d = 0; d < a.dim; ++d) {
      const float v = Fp16BitsToFloat(x[r * a.dim + d]);
      const float q = s == 0 ? 0 : std::clamp(std::nearbyint(v / s), -127.0f, 127.0f);
      out[r * a.dim + d] = FloatToFp16Bits(q * s);
    }
  }
  return out;
}

struct State {
  std::vector<float> out, lse;
};

// Attention of q over the history: compact blocks for tokens [0, compact),
// exact tiles of `a.tile` after, merged by LSE in order.
State Attend(const Args& a, const std::uint16_t* keys, const std::uint16_t* values,
             const std::vector<std::byte>& compact, std::uint32_t compact_tokens,
             const std::vector<float>& q) {
  const AttentionShape shape{a.q_heads, a.heads, a.dim, KvDtype::kFp16};
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.dim));
  const std::size_t row = std::size_t{a.heads} * a.dim, qn = std::size_t{a.q_heads} * a.dim;
  // Compact blocks go a tile (a.tile tokens) per call, as exact tiles do.
  const std::uint32_t blocks_per_tile = a.tile / a.block;
  const std::uint32_t compact_tiles = compact_tokens / a.tile;
  const std::uint32_t tiles = (a.tokens - compact_tokens) / a.tile;
  const std::uint32_t states = compact_tiles + tiles;
  const std::uint32_t blocks = compact_tiles;  // states before the exact tiles
  std::vector<float> outs(std::size_t{states} * qn), lses(std::size_t{states} * a.q_heads);
  const std::uint64_t payload = CompactPayloadBytes(1, a.block, a.heads, a.dim);
  std::vector<const std::byte*> slices(blocks_per_tile);
  for (std::uint32_t c = 0; c < compact_tiles; ++c) {
    for (std::uint32_t b = 0; b < blocks_per_tile; ++b) {
      slices[b] = compact.data() + (std::size_t{c} * blocks_per_tile + b) * payload;
    }
    DecodeAttentionCompactInt8Blocks(shape, scale, a.block, blocks_per_tile, q.data(),
                                     slices.data(), outs.data() + c * qn,
                                     lses.data() + c * a.q_heads);
  }
  for (std::uint32_t t = 0; t < tiles; ++t) {
    const std::size_t first = compact_tokens + std::size_t{t} * a.tile;
    cpu_kernels::DecodeAttentionTile(
        shape, scale, a.tile, q.data(), reinterpret_cast<const std::byte*>(keys + first * row),
        reinterpret_cast<const std::byte*>(values + first * row), outs.data() + (blocks + t) * qn,
        lses.data() + (blocks + t) * a.q_heads);
  }
  State s{std::vector<float>(qn), std::vector<float>(a.q_heads)};
  cpu_kernels::MergeStates(states, a.q_heads, a.dim, outs.data(), lses.data(), s.out.data(),
                           s.lse.data());
  return s;
}

// Max and mean over heads of ||out - ref|| / ||ref||.
std::pair<double, double> RelativeError(const Args& a, const State& got, const State& ref) {
  double worst = 0, sum = 0;
  for (std::uint32_t hq = 0; hq < a.q_heads; ++hq) {
    double e = 0, n = 0;
    for (std::uint32_t d = 0; d < a.dim; ++d) {
      const double x = got.out[hq * a.dim + d], y = ref.out[hq * a.dim + d];
      e += (x - y) * (x - y);
      n += y * y;
    }
    const double r = std::sqrt(e / std::max(n, 1e-30));
    worst = std::max(worst, r);
    sum += r;
  }
  return {worst, sum / a.q_heads};
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Tokens older than the newest `after` (all of them for 0; none for -1, exact).
std::uint32_t CompactTokens(const Args& a, std::int64_t after) {
  return after < 0 ? 0 : static_cast<std::uint32_t>(std::max<std::int64_t>(0, a.tokens - after));
}

[[noreturn]] void Fail(const char* what, const kvfabric::Status& s) {
  std::fprintf(stderr, "compact_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// The decode through the CPU Device (client/streaming_attention.h): one layer,
// tiles of a.tile tokens, two staging buffers, the history in pinned host
// memory as blocks of [K, V] with compact blocks' payloads in place of the
// exact ones for tokens [0, compact_tokens). The settings take turns, three
// rounds of every query each (the history rewritten at every turn), so that
// a burst of load on a shared machine falls on all of them. Prints, per
// compact_after, the median time of one decode step, its ratio to the
// all-exact median of this run, the bytes copied host->device per step, and
// the largest relative difference of an output head from the in-memory
// Attend above (the same tiles, merged in another order).
void DevicePath(const Args& a, const History& h, const std::vector<std::byte>& compact,
                const std::vector<std::vector<float>>& queries) {
  namespace kc = kvfabric::client;
  const kc::HistoryLayout layout{1, a.block, a.heads, a.dim, KvDtype::kFp16, 0};
  kc::StreamingAttentionOptions so;
  so.num_q_heads = a.q_heads;
  so.tile_tokens = a.tile;
  kc::DeviceArenaOptions ao;
  ao.page_bytes = 64 << 10;
  ao.staging_pages = static_cast<std::uint32_t>(
      2 * kc::StreamingAttention::PagesPerBuffer(layout, so, ao.page_bytes));
  ao.scratch_bytes = kc::StreamingAttention::ScratchBytes(layout, so);
  ao.context_floor_pages = 2;
  DeviceOptions dopt;
  dopt.arena_bytes = ao.scratch_bytes + 256 + (ao.staging_pages + 2) * ao.page_bytes;
  auto device = CreateCpuDevice(dopt, CpuDeviceOptions{});
  if (!device.ok()) Fail("device", device.status());
  auto arena = kc::DeviceArena::Create((*device)->arena_bytes(), ao);
  if (!arena.ok()) Fail("arena", arena.status());
  auto sa = kc::StreamingAttention::Create(**device, **arena, (*arena)->scratch(), layout, so);
  if (!sa.ok()) Fail("streaming attention", sa.status());
  const std::uint32_t blocks = a.tokens / a.block;
  const std::size_t half = std::size_t{a.block} * a.heads * a.dim;  // elements
  const std::uint64_t exact_block = half * 2 * 2;
  const std::uint64_t compact_block = CompactPayloadBytes(1, a.block, a.heads, a.dim);
  auto pinned = (*device)->AllocatePinnedHost(std::uint64_t{blocks} * exact_block);
  if (!pinned.ok()) Fail("pinned history", pinned.status());
  std::byte* base = (*pinned)->bytes().data();
  std::vector<std::uint8_t> flags(blocks);
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.dim));

  constexpr std::int64_t kAfter[] = {-1, 16384, 4096, 0};  // -1: exact
  constexpr int kSettings = 4, kRounds = 3;
  std::vector<double> step_ms[kSettings];
  double worst[kSettings] = {};
  std::uint64_t step = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int setting = 0; setting < kSettings; ++setting) {
      const std::int64_t after = kAfter[setting];
      const std::uint32_t compact_tokens = CompactTokens(a, after);
      for (std::uint32_t b = 0; b < blocks; ++b) {
        std::byte* block = base + b * exact_block;
        flags[b] = (b + 1) * a.block <= compact_tokens ? 1 : 0;
        if (flags[b] != 0) {
          std::memcpy(block, compact.data() + b * compact_block, compact_block);
        } else {
          std::memcpy(block, h.k.data() + b * half, half * 2);
          std::memcpy(block + half * 2, h.v.data() + b * half, half * 2);
        }
      }
      const kc::HostHistory history =
          kc::HostHistory::Contiguous(base, blocks, exact_block).WithCompact(flags);
      for (std::size_t i = 0; i <= queries.size(); ++i) {  // query 0 twice: once to warm up
        const std::vector<float>& q = queries[i == 0 ? 0 : i - 1];
        std::copy(q.begin(), q.end(), (*sa)->query().begin());
        const auto start = std::chrono::steady_clock::now();
        const kvfabric::Status s = (*sa)->Decode(1, 0, step++, 1, history, a.tokens, scale);
        if (i > 0) step_ms[setting].push_back(1e3 * Seconds(start));
        if (!s.ok()) Fail("decode", s);
        if (round > 0 || i == 0) continue;
        const State in_memory = Attend(a, h.k.data(), h.v.data(), compact, compact_tokens, q);
        const State got{{(*sa)->output().begin(), (*sa)->output().end()},
                        {(*sa)->lse().begin(), (*sa)->lse().end()}};
        worst[setting] = std::max(worst[setting], RelativeError(a, got, in_memory).first);
      }
    }
  }
  std::printf(
      "\nthrough the CPU Device (StreamingAttention, tiles of %u tokens, 2 staging "
      "buffers; %s), median of %d rounds x %zu queries:\n%-16s %12s %10s %14s %18s\n",
      a.tile, (*device)->name().c_str(), kRounds, queries.size(), "compact_after", "decode ms",
      "vs exact", "H2D MB/step", "max rel diff");
  double exact_ms = 0;
  for (int setting = 0; setting < kSettings; ++setting) {
    std::vector<double>& t = step_ms[setting];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    const double ms = t[t.size() / 2];
    if (setting == 0) exact_ms = ms;
    const std::int64_t after = kAfter[setting];
    const std::uint32_t compact_tokens = CompactTokens(a, after);
    const double h2d = (static_cast<double>(compact_tokens) / a.block * compact_block +
                        static_cast<double>(a.tokens - compact_tokens) / a.block * exact_block) /
                       1e6;
    std::printf("%-16s %12.3f %9.3fx %14.1f %18.2e\n",
                after < 0 ? "exact" : std::to_string(after).c_str(), ms, ms / exact_ms, h2d,
                worst[setting]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const History h = Make(a);
  const std::uint64_t exact_block = std::uint64_t{a.block} * a.heads * a.dim * 2 * 2;
  const std::uint64_t compact_block = CompactPayloadBytes(1, a.block, a.heads, a.dim);
  std::printf(
      "compact_bench: %u tokens, %u KV heads x %u dims fp16, %u query heads, blocks of "
      "%u tokens; one layer; %u random queries; seed %llu; isa %s\n",
      a.tokens, a.heads, a.dim, a.q_heads, a.block, a.queries,
      static_cast<unsigned long long>(a.seed),
      cpu_kernels::KernelIsaName(cpu_kernels::BestKernelIsa()));
  std::printf("per token and layer: exact %.1f B, compact_int8 %.1f B (%.3fx)\n",
              static_cast<double>(exact_block) / a.block,
              static_cast<double>(compact_block) / a.block,
              static_cast<double>(compact_block) / static_cast<double>(exact_block));
  auto start = std::chrono::steady_clock::now();
  const std::vector<std::byte> compact = EncodeBlocks(a, h, a.tokens / a.block);
  const double encode_s = Seconds(start);
  std::printf("encode: %.1f MB of exact KV in %.3f s (%.2f GB/s, one thread)\n",
              static_cast<double>(a.tokens) * exact_block / a.block / 1e6, encode_s,
              static_cast<double>(a.tokens) * exact_block / a.block / encode_s / 1e9);
  const std::vector<std::uint16_t> alt_k = PerToken(a, h.k), alt_v = PerToken(a, h.v);

  std::mt19937_64 rng(a.seed ^ 0xabc);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<std::vector<float>> queries(a.queries,
                                          std::vector<float>(std::size_t{a.q_heads} * a.dim));
  for (auto& q : queries) {
    for (float& x : q) x = n(rng);
  }
  std::printf("\n%-16s %12s %10s %14s %14s %14s %12s\n", "compact_after", "bytes/token", "vs exact",
              "max rel err", "mean rel err", "alt max err", "decode ms");
  for (std::int64_t after :
       {std::int64_t{-1}, std::int64_t{16384}, std::int64_t{4096}, std::int64_t{0}}) {
    const std::uint32_t compact_tokens = CompactTokens(a, after);
    double worst = 0, mean = 0, alt_worst = 0, decode_s = 0;
    for (const auto& q : queries) {
      const State ref = Attend(a, h.k.data(), h.v.data(), compact, 0, q);
      start = std::chrono::steady_clock::now();
      const State got = Attend(a, h.k.data(), h.v.data(), compact, compact_tokens, q);
      decode_s += Seconds(start);
      const auto [w, m] = RelativeError(a, got, ref);
      worst = std::max(worst, w);
      mean += m / a.queries;
      // The alternative over the same compact range: its dequantised keys and
      // values there, exact after, through exact tiles.
      const std::size_t n = std::size_t{compact_tokens} * a.heads * a.dim;
      std::vector<std::uint16_t> mk(h.k), mv(h.v);
      std::copy(alt_k.begin(), alt_k.begin() + n, mk.begin());
      std::copy(alt_v.begin(), alt_v.begin() + n, mv.begin());
      const State alt_state = Attend(a, mk.data(), mv.data(), compact, 0, q);
      alt_worst = std::max(alt_worst, RelativeError(a, alt_state, ref).first);
    }
    const double bytes = (static_cast<double>(compact_tokens) * compact_block +
                          static_cast<double>(a.tokens - compact_tokens) * exact_block) /
                         a.block / a.tokens;
    std::printf("%-16s %12.1f %9.3fx %14.2e %14.2e %14.2e %12.3f\n",
                after < 0 ? "exact" : std::to_string(after).c_str(), bytes,
                bytes / (static_cast<double>(exact_block) / a.block), worst, mean,
                after < 0 ? 0.0 : alt_worst, 1e3 * decode_s / a.queries);
  }
  std::printf(
      "\n(alt: keys scaled per token instead of per channel, values as here, same "
      "bytes +-1%%; decode ms: one query over the whole history, one layer, one core)\n");
  DevicePath(a, h, compact, queries);
  std::printf(
      "(decode ms: one Decode step, copies and kernels on the device's queue threads; max rel "
      "diff: against the in-memory merge above)\n");
  return 0;
}
