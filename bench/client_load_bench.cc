// client_load_bench: what libkvfabric moves between two cache-host daemons and
// an engine's history pool, against baselines measured in the same run
// (STYLE.md: figures and ratios, no assertions).
//
//   1. memcpy of one history's bytes, one thread and two threads (the copy
//      a load cannot beat: every byte lands once in the history pool); the
//      CRC32C paths, and the checked copy (copy and CRC) each way.
//   2. write-back: one context saves every layer of a history; GB/s from the
//      first Save to Finish. Three ways, each the first save of a new client
//      (whose Open started its data sessions with the daemons in the
//      background, ClientOptions::connect_at_open):
//      Place then gRPC Reserve, the daemon's pull from staging, Commit; Place
//      then kStore with one saver thread; the default (kStore, two saver
//      threads pipelining batches). Then the default once the sessions are
//      open: the median of three saves of three new histories. Against
//      memcached PUT of the same number of blocks of the same size, at 1 and
//      4 connections, warmed up by one untimed put (the median of three
//      each), sent from one buffer that stays in cache and from as many
//      distinct bytes as the history (as the write-back reads its blocks).
//   3. load: 1, 2, 4 and 8 contexts at once each load the whole history
//      (a fetch_all plan over both daemons); aggregate and per-context GB/s,
//      time to layer 0 ready and to every layer ready, and the plan's
//      predicted load time against the measured one (placement refits its
//      bus model from every load, so later rows predict better).
//
// Two in-process daemons (server/embedded_cluster.h, UCX over shared memory
// by default), a client with fetch_depth requests in flight per daemon. The
// engine's prefill writes a known pattern and takes 50 us per token (as it
// tells placement), so plans fetch what is cached; loaded blocks are checked
// against the pattern.
//
// Usage: client_load_bench [--tokens N] [--block-tokens N] [--transport ucx|tcp]
//                          [--depth N] [--contexts 1,2,4,8] [--daemons 1|2]
//                          [--layers L]  (1..32; heads = 32/L so blocks stay 2 MiB)
//                          [--prefill-us-per-token X]  (default 50; the engine's prefill)
//                          [--warmup N]  (N loads of one context before the rows, of
//                          prefixes of 1/16 .. all of the history in turn, so that
//                          placement's online fit sees several sizes; default 0)
//                          [--no-populate]  (the daemons do not populate their
//                          mappings of the client's pool when they import it)
//                          [--client-checks]  (daemon_checks_landing = false: the
//                          client reads every landed byte again for its CRC)
//                          [--save-threads N]  (the default client's save_threads;
//                          default the client's default, 2)
//                          [--compact-after exact,0,4096,16384]  (issue 24: the
//                          daemons convert every block to compact_int8 copies;
//                          then one load per accuracy policy listed, bytes per
//                          token and load time against the exact row)
//                          [--compact-extra-decode-us X]  (the client's extra
//                          decode µs per compact token; default: measured at Open)
// Defaults: 32768 tokens, 256 tokens per block (2 MiB blocks of a 4-layer,
// 8 x 64 fp16 model), ucx, depth 4.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "bench/copy_baselines.h"
#include "bench/kv_baselines.h"
#include "client/kvfabric_client.h"
#include "gpu/cpu/cpu_device.h"
#include "server/embedded_cluster.h"
#include "server/placement/placement_node.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace kc = kvfabric::client;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Fail(const kvfabric::Status& s) {
  std::fprintf(stderr, "client_load_bench: %s\n", s.ToString().c_str());
  return 1;
}

// The bytes the "engine" writes for block b of the chain: a word per 8 bytes
// derived from (b, offset), so a block in the wrong place or torn is seen.
// Four fp16 values per word with bit 14 clear (exponent <= 15: finite, below
// 2 in magnitude), so that the daemons' compact converter can encode them.
std::uint64_t Word(std::uint64_t block, std::uint64_t offset) {
  return ((block * 0x9e3779b97f4a7c15ull) ^ (offset * 0xbf58476d1ce4e5b9ull)) &
         0xbfffbfffbfffbfffull;
}
void FillBlock(std::uint64_t block, std::span<std::byte> out) {
  for (std::uint64_t o = 0; o + 8 <= out.size(); o += 8) {
    const std::uint64_t w = Word(block, o);
    std::memcpy(out.data() + o, &w, 8);
  }
}
bool BlockIntact(std::uint64_t block, std::span<const std::byte> in) {
  for (std::uint64_t o = 0; o + 8 <= in.size(); o += 4096) {  // a word per page
    std::uint64_t w;
    std::memcpy(&w, in.data() + o, 8);
    if (w != Word(block, o)) return false;
  }
  return true;
}

struct LoadRun {
  double seconds = 0, layer0_s = 0, all_layers_s = 0, predicted_ms = 0, load_ms = 0;
  // From Load, as the client's report measured them.
  double layer0_ms = 0, all_layers_ms = 0;
  std::uint32_t fetched = 0, recomputed = 0;
  std::string kind;
  kvfabric::Status status;
  std::uint64_t plan_id = 0;
  // Placement's path load: how much later the plans made after this one, sharing its paths,
  // made its end (PlanExplanation::later_plans_delay_us); -1: not known.
  double later_delay_ms = -1;
};

}  // namespace

// Issue 24's measurement: one load of the whole history per accuracy policy,
// after the daemons converted every block; bytes per token moved and load
// time, against the policy `exact` measured in the same run.
int CompactRows(kvfabric::server::EmbeddedCluster& cluster, kc::Client& client,
                const std::vector<kvfabric::BlockKey>& chain,
                const std::vector<std::string>& policies, const kvfabric::ModelFingerprint& model,
                std::uint64_t tokens, double mem1) {
  const auto blocks = static_cast<std::uint32_t>(chain.size());
  const auto t0 = Clock::now();
  if (!cluster.WaitForCompactConversions(std::chrono::seconds(120))) {
    std::printf("compact: the daemons did not finish converting in 120 s\n");
  }
  // Placement lists the copies after the daemons' next report.
  for (const auto until = Clock::now() + std::chrono::seconds(10);;) {
    kc::MatchOptions mo;
    mo.explain = true;
    mo.accuracy.compact_after_tokens = 0;
    kc::MatchResult m;
    if (client.Match(chain, 0, mo, &m).ok() &&
        m.explanation.find("compact copies of " + std::to_string(blocks) + " blocks") !=
            std::string::npos) {
      break;
    }
    if (Clock::now() > until) {
      std::printf("compact: placement does not list every block's copy after 10 s\n");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf(
      "compact: every block converted and listed %.2f s after the write-back; a compact token "
      "adds %.4f us per decode step (%s)\n",
      Seconds(t0, Clock::now()), client.compact_extra_decode_us_per_token(),
      client.options().compact_extra_decode_us_per_token ? "--compact-extra-decode-us"
                                                         : "the client's probe at Open");
  double exact_ms = 0, exact_bytes = 0;
  for (const std::string& text : policies) {
    auto policy = kc::AccuracyPolicy::Parse(text);
    if (!policy.ok()) return Fail(policy.status());
    kc::MatchOptions mo;
    mo.explain = std::getenv("KVF_BENCH_EXPLAIN") != nullptr;
    mo.accuracy = *policy;
    kc::MatchResult match;
    if (auto s = client.Match(chain, 0, mo, &match); !s.ok()) return Fail(s);
    if (!match.explanation.empty()) std::printf("%s\n", match.explanation.c_str());
    auto ctx = client.NewContext(tokens);
    if (!ctx.ok()) return Fail(ctx.status());
    if (auto s = client.Load(match, *ctx); !s.ok()) return Fail(s);
    for (std::uint32_t l = 0; l < model.layer_count; ++l) {
      if (auto s = client.WaitLayer(*ctx, l); !s.ok()) return Fail(s);
    }
    std::uint32_t compact = 0, wrong = 0;
    for (std::uint32_t b = 0; b < blocks; ++b) {
      auto c = client.BlockIsCompact(*ctx, b);
      if (c.ok() && *c) {
        ++compact;
        continue;
      }
      auto payload = client.BlockPayload(*ctx, b);
      if (!payload.ok() || !BlockIntact(b, *payload)) ++wrong;
    }
    auto report = client.Finish(*ctx);
    if (!report.ok()) return Fail(report.status());
    const double ms = report->load_us / 1e3;
    const double bytes = static_cast<double>(report->bytes_fetched);
    if (text == "exact") {
      exact_ms = ms;
      exact_bytes = bytes;
    }
    std::printf(
        "%-20s plan %-9s representation %-18s %3u of %u blocks compact, %u recomputed, %u "
        "wrong; %.1f MiB fetched = %.0f bytes/token (%.3fx exact), load %.1f ms (%.2fx exact; "
        "%.2f GB/s = %.2fx memcpy), predicted %.1f ms + %.1f ms decode penalty\n",
        text.c_str(), match.kind.c_str(), match.representation.c_str(), compact, blocks,
        report->blocks_recomputed, wrong, bytes / 1048576.0, bytes / static_cast<double>(tokens),
        exact_bytes > 0 ? bytes / exact_bytes : 0.0, ms, exact_ms > 0 ? ms / exact_ms : 0.0,
        bytes / (ms / 1e3) / 1e9, bytes / (ms / 1e3) / 1e9 / mem1, match.predicted_us / 1e3,
        match.compact_penalty_us / 1e3);
  }
  return 0;
}

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  std::uint64_t tokens = 32768;
  std::uint32_t block_tokens = 256;
  std::string transport = "ucx";
  std::uint32_t depth = 4;
  std::vector<int> contexts = {1, 2, 4, 8};
  int daemons = 2;
  std::uint32_t layers = 4;
  double prefill_us_per_token = 50.0;
  // The daemons' copy helpers and streaming threshold (kvfabric-cached
  // --copy-threads, --streaming-copy-min-bytes); defaults as the daemon's.
  int copy_threads = kvfabric::server::EmbeddedDaemonOptions{}.copy_threads;
  std::uint64_t streaming_copy_min_bytes =
      kvfabric::server::EmbeddedDaemonOptions{}.streaming_copy_min_bytes;
  int warmup = 0;
  bool populate = true;
  bool client_checks = false;
  std::uint32_t save_threads = kc::ClientOptions().save_threads;
  std::vector<std::string> compact_policies;
  double compact_extra_us = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--no-populate") {
      populate = false;
      continue;
    }
    if (std::string(argv[i]) == "--client-checks") {
      client_checks = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "client_load_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    const std::string flag = argv[i], value = argv[++i];
    if (flag == "--tokens") {
      tokens = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--block-tokens") {
      block_tokens = static_cast<std::uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--transport") {
      transport = value;
    } else if (flag == "--daemons") {
      daemons = std::max(1, std::min(2, std::atoi(value.c_str())));
    } else if (flag == "--prefill-us-per-token") {
      prefill_us_per_token = std::strtod(value.c_str(), nullptr);
    } else if (flag == "--warmup") {
      warmup = std::max(0, std::atoi(value.c_str()));
    } else if (flag == "--layers") {
      layers = static_cast<std::uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--depth") {
      depth = static_cast<std::uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--save-threads") {
      save_threads = static_cast<std::uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--compact-after") {
      for (std::size_t p = 0; p < value.size();) {
        const std::size_t e = std::min(value.find(',', p), value.size());
        const std::string v = value.substr(p, e - p);
        compact_policies.push_back(v == "exact" ? v : "compact_after=" + v);
        p = e + 1;
      }
    } else if (flag == "--compact-extra-decode-us") {
      compact_extra_us = std::strtod(value.c_str(), nullptr);
    } else if (flag == "--copy-threads") {
      copy_threads = std::atoi(value.c_str());
    } else if (flag == "--streaming-copy-min-bytes") {
      streaming_copy_min_bytes = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--contexts") {
      contexts.clear();
      for (std::size_t p = 0; p < value.size();) {
        contexts.push_back(std::atoi(value.c_str() + p));
        p = value.find(',', p);
        p = p == std::string::npos ? value.size() : p + 1;
      }
    } else {
      std::fprintf(stderr, "client_load_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const int max_contexts = *std::max_element(contexts.begin(), contexts.end());

  kvfabric::ModelFingerprint model;
  model.model_id = "client-load-bench";
  // Layers x heads = 32 whatever --layers is (1..32), so a block of 256
  // tokens stays 2 MiB and only the layer slices' size changes.
  model.layer_count = layers;
  model.kv_heads = std::max<std::uint32_t>(1, 32 / std::max<std::uint32_t>(1, layers));
  model.head_dim = 64;
  model.dtype = kvfabric::KvDtype::kFp16;
  model.tokens_per_block = block_tokens;
  if (auto s = model.Validate(); !s.ok()) return Fail(s);
  const std::uint64_t block_bytes = *model.BlockBytes();
  const auto blocks = static_cast<std::uint32_t>(tokens / block_tokens);
  const std::uint64_t history_bytes = std::uint64_t{blocks} * block_bytes;
  std::printf(
      "history: %llu tokens = %u blocks of %.2f MiB (%u layers) = %.0f MiB; %s data plane, "
      "fetch depth %u\n",
      static_cast<unsigned long long>(tokens), blocks, block_bytes / 1048576.0, model.layer_count,
      history_bytes / 1048576.0, transport.c_str(), depth);

  const double mem1 = kvfabric::bench::MemcpyGBps(history_bytes, 1),
               mem2 = kvfabric::bench::MemcpyGBps(history_bytes, 2);
  std::printf("memcpy of one history: 1 thread %.2f GB/s, 2 threads %.2f GB/s\n", mem1, mem2);
  kvfabric::bench::PrintCrcAndCheckedCopy(history_bytes, mem1);

  // One or two daemons, together able to hold the three histories written
  // below (each write-back way writes its own) within a namespace's quota.
  kvfabric::server::EmbeddedClusterOptions co;
  for (const char* id : {"bench-a", "bench-b"}) {
    if (static_cast<int>(co.daemons.size()) == daemons) break;
    kvfabric::server::EmbeddedDaemonOptions d;
    d.host_id = id;
    // A namespace may fill half a pool by default (--quota), and eviction
    // (no NVMe tier here) drops a history's cheapest blocks, its first ones,
    // whatever was written last. So the pools hold every history the
    // write-back rows write (six without compact copies) within the quota:
    // two daemons, 4 histories each (one takes about 60% of the blocks); one
    // daemon, 8.
    d.host_pool_bytes = (daemons == 1 ? 16 : 8) * history_bytes + 16 * block_bytes;
    d.host_page_bytes = 1 << 20;
    d.copy_threads = copy_threads;
    d.streaming_copy_min_bytes = streaming_copy_min_bytes;
    d.data_transport = transport;
    d.metrics = false;
    d.populate_imports = populate;
    d.compact_threads = compact_policies.empty() ? 0 : 1;
    co.daemons.push_back(d);
  }
  co.placement_metrics = false;
  auto cluster = kvfabric::server::EmbeddedCluster::StartDaemons(co);
  if (!cluster.ok()) return Fail(cluster.status());
  if (auto s = (*cluster)->StartPlacement({}); !s.ok()) return Fail(s);

  kvfabric::gpu::DeviceOptions dopts;
  dopts.arena_bytes = 64 << 20;
  auto device = kvfabric::gpu::CreateCpuDevice(dopts);
  if (!device.ok()) return Fail(device.status());
  kc::ClientOptions o;
  o.placement_address = (*cluster)->placement_address();
  o.security.insecure = true;
  o.model = model;
  o.device = device->get();
  o.num_q_heads = std::max<std::uint32_t>(8, model.kv_heads);
  o.data_transport = transport;
  o.tile_tokens = block_tokens;
  o.staging_bytes = 16 * block_bytes;
  o.fetch_depth = depth;
  o.daemon_checks_landing = !client_checks;
  o.save_threads = save_threads;
  o.history_pool_bytes = std::uint64_t(max_contexts) * history_bytes;
  o.max_context_tokens = tokens;
  // The "engine" writes a known pattern and takes kPrefillUsPerToken per
  // token, as it states (a real model's prefill is far slower than a fetch of
  // its KV; placement refits the figure from what it measures, so the time
  // is spent, not just stated): every cached block is fetched.
  const double kPrefillUsPerToken = prefill_us_per_token;  // --prefill-us-per-token
  o.prefill = kvfabric::RecomputeParameters{0.0, kPrefillUsPerToken, 0.0, 0.0};
  if (compact_extra_us >= 0) o.compact_extra_decode_us_per_token = compact_extra_us;
  o.recompute = [&](const kc::RecomputeRequest& r, std::span<std::byte> out) {
    const auto until = Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(
                                          kPrefillUsPerToken * static_cast<double>(r.tokens)));
    for (std::uint32_t i = 0; i < r.block_count; ++i) {
      FillBlock(r.first_block + i, out.subspan(std::uint64_t{i} * block_bytes, block_bytes));
    }
    std::this_thread::sleep_until(until);
    return kvfabric::Status::OK();
  };
  const auto open_start = Clock::now();
  auto client = kc::Client::Open(kc::ClientOptions(o));  // o stays for the second client
  if (!client.ok()) return Fail(client.status());
  std::printf("client open (history pool of %d histories allocated, pinned, pre-faulted): %.2f s\n",
              max_contexts, Seconds(open_start, Clock::now()));

  std::vector<std::uint32_t> ids(tokens);
  for (std::uint64_t t = 0; t < tokens; ++t) ids[t] = static_cast<std::uint32_t>(t * 7919 % 128000);
  auto chain = (*client)->KeyTokens(ids);
  if (!chain.ok()) return Fail(chain.status());

  // Prefill once and write back, timing the saves (Save calls to Finish).
  auto write_back = [&](kc::Client& c, const std::vector<kvfabric::BlockKey>& keys, const char* how,
                        double* gbps_out = nullptr) -> kvfabric::Status {
    auto match = c.Match(keys, 0);
    if (!match.ok()) return match.status();
    auto ctx = c.NewContext(tokens);
    if (!ctx.ok()) return ctx.status();
    KVF_RETURN_IF_ERROR(c.Load(*match, *ctx));
    for (std::uint32_t l = 0; l < model.layer_count; ++l) KVF_RETURN_IF_ERROR(c.WaitLayer(*ctx, l));
    const auto t0 = Clock::now();
    for (std::uint32_t l = 0; l < model.layer_count; ++l) {
      KVF_RETURN_IF_ERROR(c.Save(*ctx, l, 0, keys));
    }
    auto report = c.Finish(*ctx);
    if (!report.ok()) return report.status();
    const double s = Seconds(t0, Clock::now());
    if (report->blocks_written != blocks) {
      return kvfabric::Status::Internal(std::string("write-back (") + how + ") wrote " +
                                        std::to_string(report->blocks_written) + " of " +
                                        std::to_string(blocks) + " blocks");
    }
    const double gbps = history_bytes / s / 1e9;
    std::printf("write-back (%s): %u blocks written in %.3f s = %.2f GB/s = %.2fx memcpy\n", how,
                report->blocks_written, s, gbps, gbps / mem1);
    if (gbps_out != nullptr) *gbps_out = gbps;
    return kvfabric::Status::OK();
  };
  // A chain of the same length as the history's, of tokens of its own.
  auto shifted_chain = [&](kc::Client& c, std::uint32_t shift) {
    std::vector<std::uint32_t> other(tokens);
    for (std::uint64_t t = 0; t < tokens; ++t) {
      other[t] = static_cast<std::uint32_t>((t * 7919 + shift) % 128000);
    }
    return c.KeyTokens(other);
  };
  // The Reserve / kPut / Commit path first, then kStore with one saver
  // thread, each by a client of one history of its own, on a chain of its
  // own (so the blocks are new to the daemons too).
  auto other_client = [&](bool store_by_key, std::uint32_t save_threads, std::uint32_t shift,
                          const char* how) -> kvfabric::Status {
    auto device2 = kvfabric::gpu::CreateCpuDevice(dopts);  // an arena of its own
    if (!device2.ok()) return device2.status();
    kc::ClientOptions ro = o;
    ro.device = device2->get();
    ro.store_by_key = store_by_key;
    ro.save_threads = save_threads;
    ro.history_pool_bytes = history_bytes;
    ro.metrics_address = "";
    auto c = kc::Client::Open(std::move(ro));
    if (!c.ok()) return c.status();
    auto other_chain = shifted_chain(**c, shift);
    if (!other_chain.ok()) return other_chain.status();
    return write_back(**c, *other_chain, how);
  };
  // With compact copies the pools hold one history and its copies only.
  // Then the default's first save, two more saves of new histories and the
  // history the loads below read: the median of the last three is the
  // write-back once the client's sessions are open.
  double steady_gbps = 0;
  if (compact_policies.empty()) {
    if (auto s = other_client(false, 1, 1,
                              "Place + gRPC Reserve / kPut / Commit, first save of a new client");
        !s.ok()) {
      return Fail(s);
    }
    if (auto s = other_client(true, 1, 2, "Place + kStore, one saver thread, first save");
        !s.ok()) {
      return Fail(s);
    }
    std::vector<double> steady;
    const std::string kstore =
        "Place + kStore, save_threads " + std::to_string(save_threads) +
        (save_threads == kc::ClientOptions().save_threads ? " (default)" : "");
    const std::string first_save = kstore + ", first save";
    const std::string open_save = kstore + ", sessions open";
    for (std::uint32_t shift : {3u, 4u, 5u}) {
      auto keys = shifted_chain(**client, shift);
      if (!keys.ok()) return Fail(keys.status());
      double gbps = 0;
      if (auto s = write_back(**client, *keys, shift == 3 ? first_save.c_str() : open_save.c_str(),
                              &gbps);
          !s.ok()) {
        return Fail(s);
      }
      if (shift != 3) steady.push_back(gbps);
    }
    double gbps = 0;
    if (auto s = write_back(**client, *chain, open_save.c_str(), &gbps); !s.ok()) {
      return Fail(s);
    }
    steady.push_back(gbps);
    steady_gbps = kvfabric::bench::Percentile(steady, 0.5);
    std::printf("write-back (%s, sessions open), median of %zu: %.2f GB/s = %.2fx memcpy\n",
                kstore.c_str(), steady.size(), steady_gbps, steady_gbps / mem1);
  } else if (auto s = write_back(**client, *chain, "Place + kStore"); !s.ok()) {
    return Fail(s);
  }
  // Daemons tell placement what they hold on their next report: wait (at
  // most 10 s) until its directory lists the whole history.
  for (const auto until = Clock::now() + std::chrono::seconds(10);;) {
    auto m = (*client)->Match(*chain, 0);
    if (m.ok() && m->cached_prefix_blocks == blocks) break;
    if (Clock::now() > until) {
      std::printf("placement's directory lists %u of %u blocks after 10 s\n",
                  m.ok() ? m->cached_prefix_blocks : 0, blocks);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!compact_policies.empty()) {
    return CompactRows(**cluster, **client, *chain, compact_policies, model, tokens, mem1);
  }
  // memcached PUT of the same bytes.
  {
    kvfabric::bench::BaselineServerOptions mo;
    mo.memcached_memory_mib = history_bytes / 1048576 * 2 + 64;
    auto server =
        kvfabric::bench::BaselineServer::Start(kvfabric::bench::BaselineKind::kMemcached, mo);
    if (!server.ok()) {
      std::printf("memcached: not run (%s)\n", server.status().ToString().c_str());
    } else {
      // memcached's first put takes its slab memory from the kernel (page
      // faults at a third of the later rate here): one untimed put first, as
      // the daemons' pools are pre-faulted.
      auto put = [&](int conns, bool distinct) {
        return kvfabric::bench::RunBaseline(
            kvfabric::bench::BaselineKind::kMemcached, kvfabric::bench::BaselineOp::kPut,
            (*server)->port(), block_bytes, history_bytes, conns,
            distinct ? history_bytes / static_cast<std::uint64_t>(conns) : 0);
      };
      if (auto warm = put(4, true); !warm.ok()) return Fail(warm.status());
      for (int conns : {1, 4}) {
        for (bool distinct : {false, true}) {
          std::vector<double> runs;
          for (int rep = 0; rep < 3; ++rep) {
            auto r = put(conns, distinct);
            if (!r.ok()) return Fail(r.status());
            runs.push_back(r->gbps);
          }
          const double median = kvfabric::bench::Percentile(runs, 0.5);
          std::printf(
              "memcached PUT of %u blocks of the same size, %d connection%s, from %s: median "
              "%.2f GB/s (%.2f-%.2f)",
              blocks, conns, conns == 1 ? "" : "s",
              distinct ? "as many distinct bytes as the history" : "one buffer in cache", median,
              *std::min_element(runs.begin(), runs.end()),
              *std::max_element(runs.begin(), runs.end()));
          if (steady_gbps > 0) {
            std::printf("; kvfabric's write-back (sessions open) %.2fx it", steady_gbps / median);
          }
          std::printf("\n");
        }
      }
    }
  }

  // Warm-up: loads of prefixes of 8, 16, 32, 64 and 128 blocks in turn (of a
  // 128-block history), one context at a time: transfers of several sizes, so
  // placement's online fit can tell each path's alpha from its beta.
  if (warmup > 0) {
    double ratio_sum = 0, ratio_worst = 1;
    int ratio_count = 0;
    for (int w = 0; w < warmup; ++w) {
      const std::uint32_t prefix = std::max<std::uint32_t>(1, blocks >> (4 - w % 5));
      const std::span<const kvfabric::BlockKey> part(chain->data(), prefix);
      auto match = (*client)->Match(part, 0);
      if (!match.ok()) return Fail(match.status());
      auto ctx = (*client)->NewContext(std::uint64_t{prefix} * block_tokens);
      if (!ctx.ok()) return Fail(ctx.status());
      if (auto s = (*client)->Load(*match, *ctx); !s.ok()) return Fail(s);
      auto report = (*client)->Finish(*ctx);
      if (!report.ok()) return Fail(report.status());
      if (w >= warmup - 5 && report->predicted_us > 0) {
        const double r = report->load_us / report->predicted_us;
        ratio_sum += r;
        ratio_worst = std::max(ratio_worst, std::max(r, 1 / r));
        ++ratio_count;
      }
    }
    std::printf(
        "warm-up: %d loads of 1/16 .. all of the history; the last %d loads took %.2fx their "
        "prediction on average (worst %.2fx off)\n",
        warmup, ratio_count, ratio_count ? ratio_sum / ratio_count : 0.0, ratio_worst);
  }

  // "One round trip" of the layer-0 target, measured here: a load of the
  // history's first block alone, from Load to its layer 0 in place (one
  // kFetch request and its answer, with everything a load does around it:
  // the loader threads, waking both sides' progress threads). Each starts
  // from idle, as each measured load below does (kIdleBeforeLoad: past the
  // transport's active_window, so the progress threads sleep again).
  constexpr auto kIdleBeforeLoad = std::chrono::milliseconds(50);
  double round_trip_ms = -1;
  {
    std::vector<double> trips;
    for (int rep = 0; rep < 5; ++rep) {
      std::this_thread::sleep_for(kIdleBeforeLoad);
      auto match = (*client)->Match(std::span<const kvfabric::BlockKey>(chain->data(), 1), 0);
      if (!match.ok()) return Fail(match.status());
      auto ctx = (*client)->NewContext(block_tokens);
      if (!ctx.ok()) return Fail(ctx.status());
      if (auto s = (*client)->Load(*match, *ctx); !s.ok()) return Fail(s);
      if (auto s = (*client)->WaitLayer(*ctx, 0); !s.ok()) return Fail(s);
      auto report = (*client)->Finish(*ctx);
      if (!report.ok()) return Fail(report.status());
      if (report->blocks_fetched == 1) trips.push_back(report->layer0_ready_us / 1e3);
    }
    if (trips.empty()) {
      std::printf("one round trip: not measured (the one-block plans did not fetch)\n");
    } else {
      round_trip_ms = kvfabric::bench::Percentile(trips, 0.5);
      std::printf(
          "one round trip (a one-block load from idle, Load to its layer 0 in place): median "
          "%.2f ms of %zu (%.2f-%.2f)\n",
          round_trip_ms, trips.size(), *std::min_element(trips.begin(), trips.end()),
          *std::max_element(trips.begin(), trips.end()));
    }
  }

  std::uint64_t throttled_before = (*client)->metrics().fetch_requests_throttled;
  std::uint64_t fetched_before = (*client)->metrics().bytes_fetched;
  std::uint64_t checked_before = (*client)->metrics().bytes_checked_by_daemon;
  for (int n : contexts) {
    std::this_thread::sleep_for(kIdleBeforeLoad);
    std::vector<LoadRun> runs(n);
    std::atomic<int> wrong{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        LoadRun& r = runs[i];
        const auto start = Clock::now();
        auto match = (*client)->Match(*chain, 0, std::getenv("KVF_BENCH_EXPLAIN") != nullptr);
        if (!match.ok()) {
          r.status = match.status();
          return;
        }
        if (!match->explanation.empty()) std::printf("%s\n", match->explanation.c_str());
        r.kind = match->kind;
        r.predicted_ms = match->predicted_us / 1e3;
        r.plan_id = match->plan_id;
        auto ctx = (*client)->NewContext(tokens);
        if (!ctx.ok()) {
          r.status = ctx.status();
          return;
        }
        r.status = (*client)->Load(*match, *ctx);
        for (std::uint32_t l = 0; r.status.ok() && l < model.layer_count; ++l) {
          r.status = (*client)->WaitLayer(*ctx, l);
          if (l == 0) r.layer0_s = Seconds(start, Clock::now());
        }
        r.all_layers_s = Seconds(start, Clock::now());
        if (r.status.ok()) {
          for (std::uint32_t b = 0; b < blocks; ++b) {
            auto payload = (*client)->BlockPayload(*ctx, b);
            if (!payload.ok() || !BlockIntact(b, *payload)) wrong.fetch_add(1);
          }
        }
        auto report = (*client)->Finish(*ctx);
        if (report.ok()) {
          r.fetched = report->blocks_fetched;
          r.load_ms = report->load_us / 1e3;
          r.layer0_ms = report->layer0_ready_us / 1e3;
          r.all_layers_ms = report->all_layers_ready_us / 1e3;
          r.recomputed = report->blocks_recomputed;
          // Finish reported the plan finished: placement has its measured time and the delay
          // the later plans added.
          if (r.plan_id != 0) {
            auto x = (*cluster)->placement_node()->Explain(r.plan_id);
            if (x.ok() && x->later_plans_delay_us)
              r.later_delay_ms = *x->later_plans_delay_us / 1e3;
          }
        } else if (r.status.ok()) {
          r.status = report.status();
        }
        r.seconds = r.all_layers_s;
      });
    }
    for (auto& t : threads) t.join();
    const double wall = Seconds(t0, Clock::now());
    const std::uint64_t throttled_now = (*client)->metrics().fetch_requests_throttled;
    const std::uint64_t fetched_now = (*client)->metrics().bytes_fetched;
    const std::uint64_t checked_now = (*client)->metrics().bytes_checked_by_daemon;
    double slowest = 0, layer0 = 0, all = 0, predicted = 0, measured = 0, layer0_load = 0,
           all_load = 0;
    std::uint32_t fetched = 0, recomputed = 0;
    std::string kinds;
    for (const LoadRun& r : runs) {
      if (!r.status.ok()) return Fail(r.status);
      slowest = std::max(slowest, r.seconds);
      layer0 += r.layer0_s / n;
      layer0_load += r.layer0_ms / n;
      all_load += r.all_layers_ms / n;
      predicted += r.predicted_ms / n;
      measured += r.load_ms / n;
      all += r.all_layers_s / n;
      fetched += r.fetched;
      recomputed += r.recomputed;
      if (kinds.find(r.kind) == std::string::npos) kinds += (kinds.empty() ? "" : ",") + r.kind;
    }
    const double aggregate = n * history_bytes / slowest / 1e9;
    const double per = history_bytes / all / 1e9;
    std::printf(
        "load, %d context%s (%s; %u blocks fetched, %u recomputed, %d wrong): aggregate %.2f GB/s "
        "= %.2fx memcpy (%.2fx 2-thread memcpy); per context %.2f GB/s; layer 0 ready at %.1f ms, "
        "every layer at %.1f ms (%.2f of it; target <= 1.5/%u = %.2f + one round trip), after "
        "Match; from Load: %.1f of %.1f ms = %.2f; plan predicted %.1f ms, load took %.1f ms "
        "(x%.2f); wall %.3f s; fetch requests refused for the daemons' lease bound and asked "
        "again: %llu; landed bytes checked by the daemons %.0f%%\n",
        n, n == 1 ? "" : "s", kinds.c_str(), fetched, recomputed, wrong.load(), aggregate,
        aggregate / mem1, aggregate / mem2, per, layer0 * 1e3, all * 1e3, layer0 / all,
        model.layer_count, 1.5 / model.layer_count, layer0_load, all_load, layer0_load / all_load,
        predicted, measured, measured / predicted, wall,
        static_cast<unsigned long long>(throttled_now - throttled_before),
        fetched_now == fetched_before ? 0.0
                                      : 100.0 * static_cast<double>(checked_now - checked_before) /
                                            static_cast<double>(fetched_now - fetched_before));
    // The target, per context: layer 0 ready (from Load) within
    // 1.5/L of the load (every layer, from Load) plus one round trip. Judged
    // on the contexts whose plans fetched every block: a recomputed block's
    // layers arrive together from the prefill (one block here is 256 tokens
    // of it), which holds layer 0 back by design.
    double fetched_layer0 = 0, fetched_all = 0, worst = 0;
    int judged = 0;
    for (const LoadRun& r : runs) {
      if (r.recomputed != 0) continue;
      ++judged;
      fetched_layer0 += r.layer0_ms;
      fetched_all += r.all_layers_ms;
      worst = std::max(worst,
                       r.layer0_ms / (1.5 / model.layer_count * r.all_layers_ms + round_trip_ms));
    }
    if (model.layer_count > 1 && round_trip_ms > 0 && judged == 0) {
      std::printf(
          "  layer 0 not judged: every plan recomputes blocks (%u in all), whose layers arrive "
          "together from the prefill\n",
          recomputed);
    } else if (model.layer_count > 1 && round_trip_ms > 0) {
      fetched_layer0 /= judged;
      fetched_all /= judged;
      const double bound = 1.5 / model.layer_count * fetched_all + round_trip_ms;
      std::printf(
          "  layer 0 from Load %.2f ms against 1.5/%u x %.1f ms + one round trip %.2f ms = %.2f "
          "ms: %s (mean of the %d of %d contexts that fetched every block, %.2f of their load; "
          "the worst context at %.2fx its own bound)\n",
          fetched_layer0, model.layer_count, fetched_all, round_trip_ms, bound,
          fetched_layer0 <= bound ? "within" : "over", judged, n, fetched_layer0 / fetched_all,
          worst);
    }
    // Per context, measured against predicted: as planned (the loads already admitted on its
    // paths), and with the loads admitted after it added (placement's path load shares each
    // path equally among the plans on it). With n contexts started together, the first plan
    // was priced alone; the ones after it explain the rest.
    if (n > 1) {
      std::vector<double> planned, shared;
      for (const LoadRun& r : runs) {
        if (r.predicted_ms <= 0 || r.load_ms <= 0) continue;
        planned.push_back(r.load_ms / r.predicted_ms);
        if (r.later_delay_ms >= 0)
          shared.push_back(r.load_ms / (r.predicted_ms + r.later_delay_ms));
      }
      std::sort(planned.begin(), planned.end());
      std::sort(shared.begin(), shared.end());
      auto range = [](const std::vector<double>& v) {
        if (v.empty()) return std::string("-");
        char b[96];
        std::snprintf(b, sizeof(b), "%.2f..%.2f (median %.2f, %zu)", v.front(), v.back(),
                      kvfabric::bench::Percentile(v, 0.5), v.size());
        return std::string(b);
      };
      std::printf(
          "  per context, load measured/predicted: as planned %s; with the plans admitted "
          "after it %s\n",
          range(planned).c_str(), range(shared).c_str());
    }
    throttled_before = throttled_now;
    fetched_before = fetched_now;
    checked_before = checked_now;
  }
  return 0;
}
