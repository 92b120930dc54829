// GPU benchmark driver (bench/gpu/run.sh builds and runs it on a GPU machine):
//
//   1. copy and merge figures of cuda_device_bench.h (H2D through the Device vs
//      plain cudaMemcpy; MergeAttentionStates vs the HBM bandwidth);
//   2. decode attention over a 262,144-token history that lives in pinned host
//      memory, streamed through a DeviceArena far smaller than the history by
//      client/streaming_attention (the device-agnostic streaming path) on
//      CreateCudaDevice.
//
// Model shape: 32 layers x 8 KV heads x 128 head dim, fp16 K/V, 32 query heads
// (GQA 4:1); 4 KiB of K+V per token per layer, so 262,144 tokens are 32 GiB of
// history. One decode step is StreamingAttention::Decode for each of the 32
// layers (each streams 1 GiB: every tile is copied host->device into a staging
// buffer, attended and merged as it lands). If the 32 GiB cannot be pinned the
// bench falls back to a one-layer history and says so.
//
// The device holds exactly the arena: kernel scratch + staging_buffers
// buffers of one tile's K and V + a floor of two pool pages (tens of MiB).
// "Budget respected" is shown three ways: the arena's own accounting (peak
// staging pages in use vs the staging pages, pool pages held), and
// cudaMemGetInfo sampled after every layer (device memory in use at its peak
// minus before the device was created, vs the arena size).
//
// Each block size in --tokens-per-block reuses the same pinned bytes (the fill
// is layout-agnostic), so 16-token blocks show the cost of 32 KiB copies next to
// 256-token blocks' 512 KiB copies. The timed loop stops at a layer boundary
// once --seconds-per-config has passed, and reports the layers it timed.
//
// Flags (--name=value): --tokens=262144 --layers=32 --tokens-per-block=256,16
// --tile-tokens=4096 --staging-buffers=2 --page-bytes=2MiB --steps=2
// --seconds-per-config=20 --check=1 (FP64 check of layer 0, first block size)
// --device=0. Without a CUDA device it prints one line and exits 0.
//
// A benchmark, not a test: it prints figures and ratios measured in the same
// run, and thresholds nothing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench/gpu/cuda_device_bench.h"
#include "client/device_arena.h"
#include "client/streaming_attention.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "core/units.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/cuda_probe.h"
#include "gpu/device.h"
#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/reference_attention.h"

namespace kvfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kKvHeads = 8;
constexpr std::uint32_t kHeadDim = 128;
constexpr std::uint32_t kQHeads = 32;
constexpr KvDtype kDtype = KvDtype::kFp16;
constexpr std::uint64_t kTokenBytes = std::uint64_t{kKvHeads} * kHeadDim * 2;  // K or V row

struct Flags {
  std::uint32_t tokens = 262144;
  std::uint32_t layers = 32;
  std::vector<std::uint32_t> tokens_per_block = {256, 16};
  std::uint32_t tile_tokens = 4096;
  std::uint32_t staging_buffers = 2;
  std::uint64_t page_bytes = 2ull << 20;
  std::uint32_t steps = 2;
  double seconds_per_config = 20;
  bool check = true;
  int device = 0;
};

Status ParseU32(std::string_view name, std::string_view text, std::uint32_t* out) {
  std::uint64_t v = 0;
  if (text.empty()) return Status::InvalidArgument(std::string(name) + ": empty");
  for (char c : text) {
    if (c < '0' || c > '9' || v > std::numeric_limits<std::uint32_t>::max()) {
      return Status::InvalidArgument(std::string(name) +
                                     ": not a 32-bit count: " + std::string(text));
    }
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > std::numeric_limits<std::uint32_t>::max()) {
    return Status::InvalidArgument(std::string(name) + ": too large: " + std::string(text));
  }
  *out = static_cast<std::uint32_t>(v);
  return Status::OK();
}

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const std::size_t eq = arg.find('=');
    if (arg.substr(0, 2) != "--" || eq == std::string_view::npos) {
      return Status::InvalidArgument("expected --name=value, got " + std::string(arg));
    }
    const std::string_view name = arg.substr(2, eq - 2);
    const std::string_view value = arg.substr(eq + 1);
    std::uint32_t u = 0;
    if (name == "tokens") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &f.tokens));
    } else if (name == "layers") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &f.layers));
    } else if (name == "tokens-per-block") {
      f.tokens_per_block.clear();
      std::string_view rest = value;
      while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        KVF_RETURN_IF_ERROR(ParseU32(name, rest.substr(0, comma), &u));
        f.tokens_per_block.push_back(u);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (name == "tile-tokens") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &f.tile_tokens));
    } else if (name == "staging-buffers") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &f.staging_buffers));
    } else if (name == "page-bytes") {
      KVF_ASSIGN_OR_RETURN(f.page_bytes, ParseBytes(value));
    } else if (name == "steps") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &f.steps));
    } else if (name == "seconds-per-config") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &u));
      f.seconds_per_config = u;
    } else if (name == "check") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &u));
      f.check = u != 0;
    } else if (name == "device") {
      KVF_RETURN_IF_ERROR(ParseU32(name, value, &u));
      f.device = static_cast<int>(u);
    } else {
      return Status::InvalidArgument("unknown flag --" + std::string(name));
    }
  }
  if (f.tokens == 0 || f.layers == 0 || f.tokens_per_block.empty() || f.tile_tokens == 0 ||
      f.steps == 0) {
    return Status::InvalidArgument(
        "--tokens, --layers, --tokens-per-block, --tile-tokens and "
        "--steps must be positive");
  }
  for (std::uint32_t tpb : f.tokens_per_block) {
    if (tpb == 0 || f.tile_tokens % tpb != 0) {
      return Status::InvalidArgument("--tile-tokens " + std::to_string(f.tile_tokens) +
                                     " must be a multiple of every --tokens-per-block");
    }
  }
  return f;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Fills `bytes` with fp16 N(0, 1) values: a 64 MiB random pattern, replicated
// by one thread per core (32 GiB in a few seconds).
void FillHistory(std::span<std::byte> bytes) {
  constexpr std::size_t kPattern = 64ull << 20;
  std::vector<std::uint16_t> pattern(kPattern / 2);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::uint16_t& h : pattern) h = gpu::FloatToFp16Bits(normal(rng));
  const std::size_t chunks = (bytes.size() + kPattern - 1) / kPattern;
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t c = t; c < chunks; c += threads) {
        const std::size_t n = std::min(kPattern, bytes.size() - c * kPattern);
        std::memcpy(bytes.data() + c * kPattern, pattern.data(), n);
      }
    });
  }
  for (std::thread& w : workers) w.join();
}

struct Row {
  std::uint32_t tokens_per_block = 0;
  std::uint32_t layers_timed = 0;
  double seconds = 0;
  double ms_per_layer = 0;
  double token_layers_per_s = 0;
  double h2d_gbs = 0;
  std::uint32_t peak_staging = 0, staging_pages = 0, peak_pool_held = 0;
  std::uint64_t quarantines = 0;
};

struct Memory {
  std::uint64_t used_before = 0;  // before the attention device was created
  std::uint64_t peak_used = 0;    // max over samples after every layer
};

// FP64 check of layer 0: max |error| of output and lse, and whether any is NaN.
Status CheckAgainstFp64(const client::HistoryLayout& layout, std::span<const std::byte> history,
                        std::uint32_t tokens, float scale, std::span<const float> q,
                        std::span<const float> out, std::span<const float> lse) {
  const std::uint64_t layer_bytes = 2 * std::uint64_t{layout.tokens_per_block} * kTokenBytes;
  const std::uint64_t block_stride = layout.layers * layer_bytes;
  std::vector<std::byte> k(std::uint64_t{tokens} * kTokenBytes), v(k.size());
  for (std::uint32_t t = 0; t < tokens; ++t) {
    const std::uint64_t at = (t / layout.tokens_per_block) * block_stride +
                             (t % layout.tokens_per_block) * kTokenBytes;  // layer 0
    std::memcpy(&k[t * kTokenBytes], &history[at], kTokenBytes);
    std::memcpy(&v[t * kTokenBytes], &history[at + layer_bytes / 2], kTokenBytes);
  }
  std::vector<double> exact_out(out.size()), exact_lse(lse.size());
  const auto start = Clock::now();
  KVF_RETURN_IF_ERROR(gpu::NaiveAttentionFp64({kQHeads, kKvHeads, kHeadDim, kDtype}, scale, tokens,
                                              q, k, v, exact_out, exact_lse));
  double out_err = 0, lse_err = 0;
  bool nan = false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    nan = nan || std::isnan(out[i]);
    out_err = std::max(out_err, std::abs(out[i] - exact_out[i]));
  }
  for (std::size_t h = 0; h < lse.size(); ++h) {
    nan = nan || std::isnan(lse[h]);
    lse_err = std::max(lse_err, std::abs(lse[h] - exact_lse[h]));
  }
  std::printf(
      "check: layer 0 vs FP64 softmax over %u tokens (%.1f s): max |output error| %.3g, "
      "max |lse error| %.3g, NaN: %s\n",
      tokens, Seconds(start), out_err, lse_err, nan ? "YES" : "none");
  return Status::OK();
}

StatusOr<Row> RunConfig(const Flags& flags, std::uint32_t layers, std::uint32_t tpb,
                        gpu::Device& device, std::uint64_t arena_bytes,
                        const client::DeviceArenaOptions& arena_options,
                        const gpu::PinnedHostBuffer& history, std::span<const float> query,
                        bool check, Memory* memory) {
  client::HistoryLayout layout{layers, tpb, kKvHeads, kHeadDim, kDtype, 0};
  client::StreamingAttentionOptions options;
  options.num_q_heads = kQHeads;
  options.tile_tokens = flags.tile_tokens;
  options.staging_buffers = flags.staging_buffers;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<client::DeviceArena> arena,
                       client::DeviceArena::Create(arena_bytes, arena_options));
  KVF_ASSIGN_OR_RETURN(
      std::unique_ptr<client::StreamingAttention> attention,
      client::StreamingAttention::Create(device, *arena, arena->scratch(), layout, options));
  std::copy(query.begin(), query.end(), attention->query().begin());
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  std::uint64_t step = 0;

  // Warm-up (and the FP64 check): layer 0 once.
  KVF_RETURN_IF_ERROR(attention->Decode(1, 0, step++, 1, history, flags.tokens, scale));
  if (check) {
    KVF_RETURN_IF_ERROR(CheckAgainstFp64(layout, history.bytes(), flags.tokens, scale, query,
                                         attention->output(), attention->lse()));
  }

  Row row;
  row.tokens_per_block = tpb;
  const auto start = Clock::now();
  bool out_of_time = false;
  for (std::uint32_t s = 0; s < flags.steps && !out_of_time; ++s, ++step) {
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      KVF_RETURN_IF_ERROR(attention->Decode(1, layer, step, 1, history, flags.tokens, scale));
      ++row.layers_timed;
      KVF_ASSIGN_OR_RETURN(const DeviceMemory m, QueryDeviceMemory(flags.device));
      memory->peak_used = std::max(memory->peak_used, m.used_bytes());
      if (Seconds(start) > flags.seconds_per_config) {
        out_of_time = true;
        break;
      }
    }
  }
  row.seconds = Seconds(start);
  row.ms_per_layer = row.seconds / row.layers_timed * 1e3;
  row.token_layers_per_s = static_cast<double>(flags.tokens) * row.layers_timed / row.seconds;
  row.h2d_gbs = row.token_layers_per_s * 2 * kTokenBytes / 1e9;
  const client::DeviceArenaMetrics am = arena->metrics();
  row.peak_staging = am.peak_staging_in_use;
  row.staging_pages = am.staging_pages;
  row.peak_pool_held = am.peak_held_pages;
  row.quarantines = attention->stager().metrics().quarantines;
  return row;
}

int Main(int argc, char** argv) {
  StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const Flags flags = std::move(parsed).value();
  const cuda::CudaProbeResult probe = cuda::ProbeCuda();
  if (probe.devices.empty()) {
    std::printf("cuda_attention_bench: no CUDA device, nothing measured (%s)\n",
                probe.status.ToString().c_str());
    return 0;
  }
  if (flags.device < 0 || static_cast<std::size_t>(flags.device) >= probe.devices.size()) {
    std::fprintf(stderr, "cuda_attention_bench: --device=%d, this machine has %zu\n", flags.device,
                 probe.devices.size());
    return 2;
  }
  const cuda::CudaDeviceInfo& info = probe.devices[static_cast<std::size_t>(flags.device)];
  std::printf("device %d: %s, sm_%d%d, %s; runtime %d, driver %d; build for %s\n", flags.device,
              info.name.c_str(), info.compute_capability_major, info.compute_capability_minor,
              FormatBytes(info.total_memory_bytes).c_str(), probe.runtime_version,
              probe.driver_version, probe.compiled_archs.c_str());
  auto fail = [](const char* what, const Status& s) {
    std::fprintf(stderr, "cuda_attention_bench: %s: %s\n", what, s.ToString().c_str());
    return 1;
  };

  // 1. Copies and merges.
  StatusOr<CopyAndMergeFigures> cm = RunCopyAndMergeBench(flags.device);
  if (!cm.ok()) return fail("copy/merge bench", cm.status());
  std::printf("h2d: Device %.1f GB/s (%s copies), plain cudaMemcpy %.1f GB/s, ratio %.2f\n",
              cm->device_h2d_gbs, FormatBytes(cm->chunk_bytes).c_str(), cm->plain_h2d_gbs,
              cm->device_h2d_gbs / cm->plain_h2d_gbs);
  std::printf(
      "merge: %u states x %u heads x %u dim: %.2f us each, %.1f GB/s; HBM (d2d memcpy) "
      "%.1f GB/s; ratio %.2f\n",
      cm->merge_states, cm->merge_heads, cm->merge_head_dim, cm->merge_us, cm->merge_gbs,
      cm->hbm_gbs, cm->merge_gbs / cm->hbm_gbs);

  // 2. The arena: scratch + staging buffers + a floor of two pool pages.
  client::HistoryLayout sizing{
      flags.layers, flags.tokens_per_block[0], kKvHeads, kHeadDim, kDtype, 0};
  client::StreamingAttentionOptions sizing_options;
  sizing_options.num_q_heads = kQHeads;
  sizing_options.tile_tokens = flags.tile_tokens;
  client::DeviceArenaOptions ao;
  ao.page_bytes = flags.page_bytes;
  ao.staging_pages =
      flags.staging_buffers * static_cast<std::uint32_t>(client::StreamingAttention::PagesPerBuffer(
                                  sizing, sizing_options, flags.page_bytes));
  ao.scratch_bytes = client::StreamingAttention::ScratchBytes(sizing, sizing_options);
  ao.context_floor_pages = 2;
  const std::uint64_t arena_bytes =
      (ao.scratch_bytes + 255) / 256 * 256 + (ao.staging_pages + 2ull) * flags.page_bytes;

  Memory memory;
  StatusOr<DeviceMemory> before = QueryDeviceMemory(flags.device);
  if (!before.ok()) return fail("cudaMemGetInfo", before.status());
  memory.used_before = before->used_bytes();
  memory.peak_used = memory.used_before;
  gpu::DeviceOptions dopt;
  dopt.arena_bytes = arena_bytes;
  dopt.device_index = flags.device;
  StatusOr<std::unique_ptr<gpu::Device>> created = gpu::CreateCudaDevice(dopt);
  if (!created.ok()) return fail("CreateCudaDevice", created.status());
  std::unique_ptr<gpu::Device> device = std::move(created).value();

  // The history: every block size uses the same bytes (tokens x layers x K,V).
  std::uint32_t layers = flags.layers;
  auto history_bytes = [&](std::uint32_t l) {
    std::uint64_t most = 0;
    for (std::uint32_t tpb : flags.tokens_per_block) {
      const std::uint64_t blocks = (std::uint64_t{flags.tokens} + tpb - 1) / tpb;
      most = std::max(most, blocks * l * 2 * tpb * kTokenBytes);
    }
    return most;
  };
  auto start = Clock::now();
  StatusOr<std::unique_ptr<gpu::PinnedHostBuffer>> pinned =
      device->AllocatePinnedHost(history_bytes(layers));
  if (!pinned.ok() && layers > 1) {
    std::printf("could not pin %s for %u layers (%s); falling back to a one-layer history\n",
                FormatBytes(history_bytes(layers)).c_str(), layers,
                pinned.status().ToString().c_str());
    layers = 1;
    pinned = device->AllocatePinnedHost(history_bytes(layers));
  }
  if (!pinned.ok()) return fail("AllocatePinnedHost", pinned.status());
  std::unique_ptr<gpu::PinnedHostBuffer> history = std::move(pinned).value();
  const double pin_s = Seconds(start);
  start = Clock::now();
  FillHistory(history->bytes());
  std::printf(
      "history: %u tokens x %u layers x %u KV heads x %u dim fp16 = %s pinned in %.1f s, "
      "filled in %.1f s; arena %s (scratch %s + %u staging pages + 2 pool pages of %s) = "
      "1/%.0f of the history\n",
      flags.tokens, layers, kKvHeads, kHeadDim, FormatBytes(history->bytes().size()).c_str(), pin_s,
      Seconds(start), FormatBytes(arena_bytes).c_str(), FormatBytes(ao.scratch_bytes).c_str(),
      ao.staging_pages, FormatBytes(flags.page_bytes).c_str(),
      double(history->bytes().size()) / double(arena_bytes));
  std::vector<float> query(std::size_t{kQHeads} * kHeadDim);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& q : query) q = normal(rng);

  std::vector<Row> rows;
  bool check = flags.check;
  for (std::uint32_t tpb : flags.tokens_per_block) {
    StatusOr<Row> row =
        RunConfig(flags, layers, tpb, *device, arena_bytes, ao, *history, query, check, &memory);
    if (!row.ok()) return fail("streaming attention", row.status());
    check = false;
    rows.push_back(*row);
  }

  const std::uint64_t rise = memory.peak_used - std::min(memory.peak_used, memory.used_before);
  std::printf(
      "\n### %u-token decode attention, %u layers x %u KV heads x %u dim fp16, %u query "
      "heads, tiles of %u tokens, %u staging buffers\n\n",
      flags.tokens, layers, kKvHeads, kHeadDim, kQHeads, flags.tile_tokens, flags.staging_buffers);
  std::printf(
      "| tokens/block | layers timed | ms/layer | ms/step (%u layers) | token-layers/s | "
      "H2D GB/s | of cudaMemcpy peak | peak staging pages / budget | pool pages held | "
      "quarantines |\n",
      layers);
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %u | %u | %s | %s | %.3g | %s | %s | %u / %u | %u | %llu |\n",
                r.tokens_per_block, r.layers_timed, Fixed(r.ms_per_layer, 2).c_str(),
                Fixed(r.ms_per_layer * layers, 1).c_str(), r.token_layers_per_s,
                Fixed(r.h2d_gbs, 1).c_str(), Fixed(r.h2d_gbs / cm->plain_h2d_gbs, 2).c_str(),
                r.peak_staging, r.staging_pages, r.peak_pool_held,
                static_cast<unsigned long long>(r.quarantines));  // NOLINT(runtime/int)
  }
  const bool respected = rise <= arena_bytes + (64ull << 20);
  std::printf(
      "\ndevice memory (cudaMemGetInfo, whole device): %s in use before the device, %s at "
      "peak (sampled after every layer): +%s for an arena of %s, history %s; budget "
      "respected (rise <= arena + 64 MiB of streams/events): %s\n",
      FormatBytes(memory.used_before).c_str(), FormatBytes(memory.peak_used).c_str(),
      FormatBytes(rise).c_str(), FormatBytes(arena_bytes).c_str(),
      FormatBytes(history->bytes().size()).c_str(), respected ? "yes" : "NO");
  return 0;
}

}  // namespace
}  // namespace kvfabric::bench

int main(int argc, char** argv) { return kvfabric::bench::Main(argc, argv); }
