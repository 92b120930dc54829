#include "cli/demo_command.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "cli/calibrate_command.h"
#include "cli/json_text.h"
#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "client/synthetic_transformer.h"
#include "core/bus_cost_model.h"
#include "core/config/unit_flags.h"
#include "core/mutex.h"
#include "core/recompute_probe.h"
#include "core/units.h"
#include "gpu/device.h"
#include "metrics/scrape_config.h"
#include "server/embedded_cluster.h"
#include "server/placement/placement_node.h"

namespace kvfabric::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct PlanStats {
  std::uint32_t count = 0;
  double predicted_us = 0;
  double measured_us = 0;
};

struct Totals {
  std::uint64_t tokens_host_tier = 0;
  std::uint64_t tokens_nvme_tier = 0;
  std::uint64_t tokens_recomputed = 0;
  std::map<std::string, PlanStats> plans;
  std::uint32_t checks = 0;
  std::uint32_t check_failures = 0;
  std::uint64_t h2d_bytes = 0;  // attention tiles streamed host -> device
  double attend_us = 0;
  std::uint64_t largest_history_bytes = 0;
  // Each side of every plan: when its last run ended, predicted and measured.
  PlanStats fetch_side, recompute_side;
  // The engine stand-in's prefill calls: their time and size.
  double prefill_us = 0;
  std::uint64_t prefill_tokens = 0, prefill_pairs = 0;
  std::uint32_t prefill_calls = 0;
  // measured / predicted load time of each turn.
  std::vector<double> turn_ratios;
};

class Demo {
 public:
  explicit Demo(const DemoArgs& a) : a_(a) {}

  // Plaintext on 127.0.0.1, or mutual TLS with the --tls-* files.
  GrpcSecurityOptions Security() const {
    GrpcSecurityOptions s;
    if (a_.tls_ca.empty() && a_.tls_cert.empty()) {
      s.insecure = true;
    } else {
      s.cert_file = a_.tls_cert;
      s.key_file = a_.tls_key;
      s.ca_file = a_.tls_ca;
    }
    return s;
  }
  ~Demo();
  Status Run();

 private:
  Status Validate();
  Status StartCluster();
  Status OpenClient();
  Status Prefill(const client::RecomputeRequest& r, std::span<std::byte> out);
  // The prefill probe of the engine stand-in: its shapes and harness (prints what it will do).
  Status PreparePrefillProbe();
  // Prints the fit (and the split overlap, when calibration measured it).
  void PrintPrefillFit(double seconds) const;
  Status RunTurn(std::uint32_t index, std::uint32_t conversation, std::uint32_t turn);
  void PrintSummary(double seconds) const;
  // --keep-running: a prometheus.yml scraping every process of the demo.
  void PrintScrapeConfig() const;
  void PrintJson(double seconds) const;

  const DemoArgs a_;
  ModelFingerprint model_;
  std::uint64_t block_bytes_ = 0;
  std::string dir_;
  std::unique_ptr<server::EmbeddedCluster> cluster_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::SyntheticTransformer> engine_;
  std::unique_ptr<client::SyntheticPrefillProbe> prefill_harness_;
  RecomputeProbeOptions prefill_probe_options_;
  RecomputeProbeReport prefill_probe_;
  std::optional<SplitOverlapReport> split_overlap_;
  std::string split_overlap_from_;                  // CalibrationReport::split_overlap_from
  std::vector<std::vector<std::uint32_t>> tokens_;  // per conversation, its longest history
  std::vector<std::vector<BlockKey>> keys_;         // per conversation
  std::uint32_t total_turns_ = 0;
  Mutex mu_;
  // The conversation each context serves.
  std::map<client::ContextId, std::uint32_t> context_conversation_ KVF_GUARDED_BY(mu_);
  std::mt19937_64 rng_;
  Totals t_;
};

Demo::~Demo() {
  client_.reset();
  engine_.reset();
  device_.reset();
  cluster_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status Demo::Validate() {
  model_.model_id = "kvfabric-demo/synthetic-" + std::to_string(a_.layers) + "L";
  model_.layer_count = a_.layers;
  model_.kv_heads = a_.kv_heads;
  model_.head_dim = a_.head_dim;
  model_.tokens_per_block = a_.tokens_per_block;
  KVF_ASSIGN_OR_RETURN(model_.dtype, ParseKvDtype(a_.dtype));
  KVF_RETURN_IF_ERROR(model_.Validate().WithContext("demo model (--layers, --kv-heads, ...)"));
  KVF_ASSIGN_OR_RETURN(block_bytes_, model_.BlockBytes());
  const std::uint64_t tpb = a_.tokens_per_block;
  if (a_.conversations == 0 || a_.turns == 0) {
    return Status::InvalidArgument("--conversations and --turns must be at least 1");
  }
  if (a_.system_prompt_tokens % tpb != 0 || a_.max_history_tokens % tpb != 0 ||
      a_.max_history_tokens <= a_.system_prompt_tokens) {
    return Status::InvalidArgument(
        "--system-prompt-tokens (" + std::to_string(a_.system_prompt_tokens) +
        ") and --max-history-tokens (" + std::to_string(a_.max_history_tokens) +
        ") must be multiples of --tokens-per-block (" + std::to_string(tpb) +
        "), the history longer than the prompt");
  }
  if (a_.check_layers > a_.layers) {
    return Status::InvalidArgument("--check-layers " + std::to_string(a_.check_layers) +
                                   " exceeds --layers " + std::to_string(a_.layers));
  }
  client::SyntheticTransformerOptions eo;
  eo.model = model_;
  eo.hidden = a_.prefill_hidden;
  eo.ffn = a_.prefill_ffn;
  eo.depth = a_.prefill_depth;
  eo.vocab = a_.prefill_vocab;
  eo.max_context_tokens = a_.max_history_tokens;
  eo.tile_tokens = a_.tile_tokens;
  eo.weight_seed = a_.seed;
  auto engine = client::SyntheticTransformer::Create(eo);
  if (!engine.ok()) {
    return engine.status().WithContext(
        "the demo's prefill (--prefill-hidden, --prefill-depth, ...)");
  }
  engine_ = std::move(*engine);
  // Each daemon must hold a few blocks; the client holds one history.
  if (a_.host_pool_bytes < 8 * block_bytes_) {
    return Status::InvalidArgument("--host-pool-bytes " + FormatBytes(a_.host_pool_bytes) +
                                   " holds fewer than 8 blocks of " + FormatBytes(block_bytes_));
  }
  return Status::OK();
}

Status Demo::StartCluster() {
  std::string tmpl = a_.work_dir + "/kvfabric-demo-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Status::FailedPrecondition("cannot make a temporary folder under " + a_.work_dir +
                                      " (--work-dir): " + std::strerror(errno));
  }
  dir_ = tmpl;
  server::EmbeddedClusterOptions co;
  for (const char* name : {"demo-a", "demo-b"}) {
    server::EmbeddedDaemonOptions d;
    d.host_id = name;
    d.host_pool_bytes = a_.host_pool_bytes;
    d.host_page_bytes = std::bit_floor(std::max<std::uint64_t>(block_bytes_, 4096));
    d.nvme_dir = dir_ + "/" + name + "-nvme";
    d.nvme_capacity_bytes = a_.nvme_capacity_bytes;
    d.nvme_segment_bytes = std::uint64_t{64} << 20;
    d.model = model_;
    d.history_tokens = a_.max_history_tokens;
    d.data_transport = a_.data_transport;
    co.daemons.push_back(std::move(d));
  }
  co.membership_ttl = std::chrono::seconds(10);
  co.security = Security();
  std::printf("gRPC: %s\n", DescribeSecurity(co.security, "127.0.0.1", /*server=*/true).c_str());
  std::printf("starting 2 cache-host daemons (host pool %s each, NVMe tier %s each under %s)\n",
              FormatBytes(a_.host_pool_bytes).c_str(),
              FormatBytes(a_.nvme_capacity_bytes).c_str(), dir_.c_str());
  std::fflush(stdout);
  KVF_ASSIGN_OR_RETURN(cluster_, server::EmbeddedCluster::StartDaemons(co));

  KVF_RETURN_IF_ERROR(PreparePrefillProbe());
  const PrefillProbe prefill = [this](std::uint64_t n, std::uint64_t p) {
    return prefill_harness_->Run(n, p);
  };
  const auto prefill_start = Clock::now();
  BusCalibration calibration;
  if (a_.calibrate) {
    std::vector<std::string> grpc, admin;
    for (const auto& d : cluster_->daemons()) {
      grpc.push_back(d.grpc_address);
      admin.push_back(d.admin_address);
    }
    CalibrateArgs ca =
        EmbeddedClusterCalibrateArgs(grpc, admin, dir_, a_.calibrate_max_bytes, a_.data_transport);
    ca.security = Security();
    // The prefill is probed with the calibration, which also measures how much it and a fetch
    // from a daemon slow each other (the split overlap s).
    CalibrateContext cc;
    cc.prefill = prefill;
    cc.prefill_model_id = model_.model_id;
    cc.prefill_options = prefill_probe_options_;
    const auto start = Clock::now();
    std::printf(
        "calibrating the bus cost model (probes of %s to %s), the prefill and their "
        "overlap...\n",
        FormatBytes(ca.min_bytes).c_str(), FormatBytes(ca.max_bytes).c_str());
    std::fflush(stdout);
    KVF_ASSIGN_OR_RETURN(CalibrationReport report, RunCalibrate(ca, cc));
    for (const PathCalibration& p : report.calibration.paths) {
      std::fputs(FormatPathCalibrationLine(p).c_str(), stdout);
    }
    for (const PathOutcome& p : report.paths) {
      if (!p.concurrency) continue;
      std::printf("  concurrency gain %-9s %s\n", p.host_id.c_str(),
                  FormatConcurrencyGain(*p.concurrency).c_str());
    }
    std::printf("  calibrated in %.1f s\n", Seconds(Clock::now() - start));
    if (!report.prefill) return Status::Internal("calibration returned no prefill fit");
    prefill_probe_ = std::move(*report.prefill);
    split_overlap_ = report.split_overlap;
    split_overlap_from_ = report.split_overlap_from;
    calibration = std::move(report.calibration);
  } else {
    KVF_ASSIGN_OR_RETURN(prefill_probe_, ProbeRecompute(prefill, prefill_probe_options_));
  }
  PrintPrefillFit(Seconds(Clock::now() - prefill_start));
  return cluster_->StartPlacement(calibration);
}

void Demo::PrintScrapeConfig() const {
  std::vector<metrics::ScrapeJob> jobs = {
      {"kvfabric-placement", {}}, {"kvfabric-cached", {}}, {"kvfabric-client", {}}};
  if (!cluster_->placement_metrics_url().empty()) {
    jobs[0].targets.push_back(metrics::HostPortOfUrl(cluster_->placement_metrics_url()));
  }
  for (const auto& d : cluster_->daemons()) {
    if (!d.metrics_url.empty()) jobs[1].targets.push_back(metrics::HostPortOfUrl(d.metrics_url));
  }
  if (!client_->metrics_url().empty()) {
    jobs[2].targets.push_back(metrics::HostPortOfUrl(client_->metrics_url()));
  }
  metrics::ScrapeConfigOptions o;
  o.interval_s = 5;
  o.rule_files = {"deploy/prometheus/kvfabric-rules.yml", "deploy/prometheus/kvfabric-alerts.yml"};
  std::printf(
      "\nPrometheus scrape config for this cluster: save it as kvfabric-demo.yml in the "
      "repository root and run\n  prometheus --config.file=kvfabric-demo.yml\n(the dashboard: "
      "deploy/grafana/kvfabric.json; the jobs are deploy/prometheus/prometheus.yml's)\n"
      "---\n%s---\n",
      metrics::PrometheusScrapeConfig(jobs, o).c_str());
}

Status Demo::OpenClient() {
  gpu::DeviceOptions dopts;
  dopts.arena_bytes = a_.device_arena_bytes;
  KVF_ASSIGN_OR_RETURN(device_, gpu::CreateCpuDevice(dopts));
  client::ClientOptions o;
  o.placement_address = cluster_->placement_address();
  o.security = Security();
  o.security.client_auth.clear();
  o.model = model_;
  o.device = device_.get();
  o.num_q_heads = a_.num_q_heads;
  o.data_transport = a_.data_transport;
  o.tile_tokens = a_.tile_tokens;
  o.staging_bytes = std::max<std::uint64_t>(std::uint64_t{64} << 20, 4 * block_bytes_);
  // One conversation's longest history: the demo serves one turn at a time.
  // Allocated and pre-faulted at Open, so no turn faults in fresh memory.
  o.history_pool_bytes = a_.max_history_tokens / a_.tokens_per_block * block_bytes_;
  o.max_context_tokens = a_.max_history_tokens;
  o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
    return Prefill(r, out);
  };
  // The engine states what its prefill costs; placement refits it from
  // every prefill this client measures.
  o.prefill = prefill_probe_.parameters;
  // A cluster kept running for Prometheus gets the engine's view too.
  if (a_.keep_running) o.metrics_address = "127.0.0.1:0";
  KVF_ASSIGN_OR_RETURN(client_, client::Client::Open(std::move(o)));
  return Status::OK();
}

Status Demo::PreparePrefillProbe() {
  std::printf("%s\n", engine_->Describe().c_str());
  RecomputeProbeOptions& po = prefill_probe_options_;
  po.repeats = a_.prefill_probe_repeats;
  // The default grid and two shapes at the demo's own scale (its calls prefill up to a quarter
  // of the longest history at once).
  po.shapes = RecomputeShapesUpTo(a_.max_history_tokens);
  std::uint64_t max_n = 0, max_p = 0;
  for (const RecomputeShape& sh : po.shapes) {
    max_n = std::max(max_n, sh.tokens);
    max_p = std::max(max_p, sh.prefix_tokens);
  }
  // The split-overlap probe prefills 1024 tokens after none.
  max_n = std::max<std::uint64_t>(max_n, 1024);
  std::printf(
      "its prefill is probed for t = c0 + c1 n + c2 n (p + n/2) at %zu shapes, n in 16..%llu, p "
      "in 0..%llu\n",
      po.shapes.size(), static_cast<unsigned long long>(max_n),
      static_cast<unsigned long long>(max_p));
  std::fflush(stdout);
  KVF_ASSIGN_OR_RETURN(prefill_harness_,
                       client::SyntheticPrefillProbe::Create(engine_.get(), max_n, max_p));
  return Status::OK();
}

void Demo::PrintPrefillFit(double seconds) const {
  const RecomputeParameters& r = prefill_probe_.parameters;
  std::printf(
      "  prefill                      %s   worst out-of-sample %5.1f%%, noise floor %5.1f%% (%llu "
      "calls, %.1f s)\n",
      FormatRecomputeModel(r).c_str(), 100 * prefill_probe_.worst_abs_error,
      100 * prefill_probe_.noise_floor_ratio,
      static_cast<unsigned long long>(prefill_probe_.samples), seconds);
  if (split_overlap_) {
    std::printf("  split overlap                %s (reads from %s)\n",
                FormatSplitOverlap(*split_overlap_).c_str(), split_overlap_from_.c_str());
  }
  std::printf("  e.g. %s; fetching it: %s of KV\n",
              ExplainRecompute(r, a_.tokens_per_block, a_.system_prompt_tokens).c_str(),
              FormatBytes(block_bytes_).c_str());
  std::fflush(stdout);
}

// The engine's prefill: the synthetic transformer over the context's tokens
// (a block's stored KV is the generator's, a function of its key, i.e. of its
// whole prefix, as a real model's is).
Status Demo::Prefill(const client::RecomputeRequest& r, std::span<std::byte> out) {
  std::uint32_t conversation = 0;
  {
    MutexLock l(&mu_);
    auto it = context_conversation_.find(r.context);
    if (it == context_conversation_.end()) return Status::Internal("prefill of an unknown context");
    conversation = it->second;
  }
  const std::vector<BlockKey>& keys = keys_[conversation];
  const std::vector<std::uint32_t>& tokens = tokens_[conversation];
  if (r.first_token + r.tokens > tokens.size()) {
    return Status::Internal("prefill beyond the conversation's tokens");
  }
  // Per loader thread, reused: a warm turn allocates nothing here.
  thread_local std::vector<std::uint64_t> seeds;
  seeds.clear();
  for (std::uint32_t i = 0; i < r.block_count; ++i) {
    const std::uint32_t b = r.first_block + i;
    seeds.push_back(b < keys.size() ? client::SeedFromKey(keys[b], a_.seed)
                                    : client::SeedFromKey(keys.back(), a_.seed + b + 1));
  }
  const auto start = Clock::now();
  KVF_ASSIGN_OR_RETURN(
      const client::PrefillResult result,
      engine_->Prefill(r.prefix, r.first_block, std::span(tokens).subspan(r.first_token, r.tokens),
                       seeds, out));
  const double us = Seconds(Clock::now() - start) * 1e6;
  MutexLock l(&mu_);
  t_.prefill_us += us;
  t_.prefill_tokens += r.tokens;
  t_.prefill_pairs += result.attention_pairs;
  ++t_.prefill_calls;
  return Status::OK();
}

Status Demo::RunTurn(std::uint32_t index, std::uint32_t conversation, std::uint32_t turn) {
  const std::uint64_t tpb = a_.tokens_per_block;
  const std::uint64_t final_tokens = tokens_[conversation].size();
  const std::uint64_t grown = (final_tokens - a_.system_prompt_tokens) * (turn + 1) / a_.turns;
  const std::uint64_t tokens = std::max(a_.system_prompt_tokens + tpb,
                                        (a_.system_prompt_tokens + grown) / tpb * tpb);
  const std::vector<BlockKey>& all = keys_[conversation];
  const std::vector<BlockKey> chain(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(tokens / tpb));
  const auto start = Clock::now();
  KVF_ASSIGN_OR_RETURN(client::MatchResult match, client_->Match(chain, 0));
  KVF_ASSIGN_OR_RETURN(client::ContextId ctx, client_->NewContext(tokens));
  {
    MutexLock l(&mu_);
    context_conversation_[ctx] = conversation;
  }
  // A live line on a terminal while the turn runs; the summary line replaces it.
  const bool live = isatty(STDOUT_FILENO) != 0;
  auto progress = [&](const char* phase, std::uint32_t done, std::uint32_t of) {
    if (!live) return;
    std::printf("\r[%u/%u] conversation %c turn %u: %6llu tokens | plan %-13s | %s %u/%u   ",
                index + 1, total_turns_, static_cast<char>('A' + conversation), turn + 1,
                static_cast<unsigned long long>(tokens), match.kind.c_str(), phase, done, of);
    std::fflush(stdout);
  };
  KVF_RETURN_IF_ERROR(client_->Load(match, ctx));
  progress("loading, layers ready", 0, a_.layers);
  for (std::uint32_t l = 0; l < a_.layers; ++l) {
    KVF_RETURN_IF_ERROR(client_->WaitLayer(ctx, l));
    progress("loading, layers ready", l + 1, a_.layers);
  }
  // Write back what is not cached yet (placement skips blocks it knows).
  for (std::uint32_t l = 0; l < a_.layers; ++l) KVF_RETURN_IF_ERROR(client_->Save(ctx, l, 0, chain));
  // One decode step over every layer; a sample checked bit for bit.
  KVF_ASSIGN_OR_RETURN(const client::HostHistory history, client_->History(ctx));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::size_t qn = std::size_t{a_.num_q_heads} * a_.head_dim;
  std::vector<float> q(qn), out(qn), lse(a_.num_q_heads), ref_out(qn), ref_lse(a_.num_q_heads);
  std::uint32_t checks = 0, failures = 0;
  const auto attend_start = Clock::now();
  double check_s = 0;
  for (std::uint32_t l = 0; l < a_.layers; ++l) {
    progress("decode, layers attended", l, a_.layers);
    for (float& x : q) x = dist(rng_);
    KVF_RETURN_IF_ERROR(client_->Attend(ctx, l, index, q, out, lse));
    const bool check = a_.check_layers > 0 &&
                       l % std::max<std::uint32_t>(1, a_.layers / a_.check_layers) == 0 &&
                       checks < a_.check_layers;
    if (!check) continue;
    const auto c0 = Clock::now();
    KVF_RETURN_IF_ERROR(client::ResidentAttention(model_, a_.num_q_heads, a_.tile_tokens, history,
                                                  static_cast<std::uint32_t>(tokens), l, q,
                                                  ref_out, ref_lse));
    ++checks;
    if (std::memcmp(out.data(), ref_out.data(), qn * 4) != 0 ||
        std::memcmp(lse.data(), ref_lse.data(), lse.size() * 4) != 0) {
      ++failures;
      std::fprintf(stderr, "EXACTNESS FAILURE: turn %u layer %u differs from resident attention\n",
                   index + 1, l);
    }
    check_s += Seconds(Clock::now() - c0);
  }
  t_.attend_us += (Seconds(Clock::now() - attend_start) - check_s) * 1e6;
  t_.h2d_bytes += tokens * block_bytes_ / tpb;  // every layer's K and V, once
  KVF_ASSIGN_OR_RETURN(client::ContextReport report, client_->Finish(ctx));
  {
    MutexLock l(&mu_);
    context_conversation_.erase(ctx);
  }
  const std::uint64_t host_tokens = report.fetch_from_host_tier_bytes / block_bytes_ * tpb;
  const std::uint64_t nvme_tokens = report.fetch_from_nvme_tier_bytes / block_bytes_ * tpb;
  const std::uint64_t recomputed = std::uint64_t{report.blocks_recomputed} * tpb;
  t_.tokens_host_tier += host_tokens;
  t_.tokens_nvme_tier += nvme_tokens;
  t_.tokens_recomputed += recomputed;
  PlanStats& ps = t_.plans[report.kind];
  ++ps.count;
  ps.predicted_us += report.predicted_us;
  ps.measured_us += report.load_us;
  const double ratio = report.predicted_us > 0 ? report.load_us / report.predicted_us : 0.0;
  t_.turn_ratios.push_back(ratio);
  PlanStats fetch_turn, recompute_turn;
  for (const client::RunOutcome& run : report.runs) {
    PlanStats& side = run.fetch ? fetch_turn : recompute_turn;
    side.count = 1;
    side.predicted_us = std::max(side.predicted_us, run.predicted_end_us);
    side.measured_us = std::max(side.measured_us, run.measured_end_us);
  }
  for (auto [side, turn_side] : {std::pair{&t_.fetch_side, &fetch_turn},
                                 std::pair{&t_.recompute_side, &recompute_turn}}) {
    side->count += turn_side->count;
    side->predicted_us += turn_side->predicted_us;
    side->measured_us += turn_side->measured_us;
  }
  t_.checks += checks;
  t_.check_failures += failures;
  t_.largest_history_bytes = std::max(t_.largest_history_bytes, tokens / tpb * block_bytes_);
  if (live) std::printf("\r");
  std::printf(
      "[%u/%u] conversation %c turn %u: %6llu tokens | plan %-13s predicted %7.0f ms, "
      "load %7.0f ms (x%.2f) | host %6llu, nvme %6llu, recomputed %6llu tokens | exact "
      "%u/%u | %.1f s\n",
      index + 1, total_turns_, static_cast<char>('A' + conversation), turn + 1,
      static_cast<unsigned long long>(tokens), report.kind.c_str(), report.predicted_us / 1000,
      report.load_us / 1000, ratio, static_cast<unsigned long long>(host_tokens),
      static_cast<unsigned long long>(nvme_tokens), static_cast<unsigned long long>(recomputed),
      checks - failures, checks, Seconds(Clock::now() - start));
  std::fflush(stdout);
  return Status::OK();
}

void Demo::PrintSummary(double seconds) const {
  const client::ClientMetrics m = client_->metrics();
  const std::uint64_t total = t_.tokens_host_tier + t_.tokens_nvme_tier + t_.tokens_recomputed;
  auto pct = [&](std::uint64_t x) { return total == 0 ? 0.0 : 100.0 * x / total; };
  std::printf("\nkvfabric demo: %u turns of %u conversations in %.1f s\n\n", total_turns_,
              a_.conversations, seconds);
  std::printf("tokens served          %12s %12s %12s %12s\n", "daemon host", "daemon NVMe",
              "recomputed", "total");
  std::printf("                       %12llu %12llu %12llu %12llu\n",
              static_cast<unsigned long long>(t_.tokens_host_tier),
              static_cast<unsigned long long>(t_.tokens_nvme_tier),
              static_cast<unsigned long long>(t_.tokens_recomputed),
              static_cast<unsigned long long>(total));
  std::printf("                       %11.1f%% %11.1f%% %11.1f%%\n\n", pct(t_.tokens_host_tier),
              pct(t_.tokens_nvme_tier), pct(t_.tokens_recomputed));
  std::printf("plans (load time)      %6s %15s %15s %10s\n", "count", "predicted ms", "measured ms",
              "meas/pred");
  for (const auto& [kind, ps] : t_.plans) {
    std::printf("  %-20s %6u %15.0f %15.0f %10.2f\n", kind.c_str(), ps.count,
                ps.predicted_us / 1000, ps.measured_us / 1000,
                ps.predicted_us > 0 ? ps.measured_us / ps.predicted_us : 0.0);
  }
  // Each side ends with its last run: the fetch side is the bus model's
  // prediction, the recompute side the prefill model's.
  for (auto [name, ps] : {std::pair{"fetch side", &t_.fetch_side},
                          std::pair{"recompute side", &t_.recompute_side}}) {
    std::printf("  %-20s %6u %15.0f %15.0f %10.2f\n", name, ps->count, ps->predicted_us / 1000,
                ps->measured_us / 1000,
                ps->predicted_us > 0 ? ps->measured_us / ps->predicted_us : 0.0);
  }
  std::uint32_t within = 0;
  double lo = 0, hi = 0;
  for (std::size_t i = 0; i < t_.turn_ratios.size(); ++i) {
    const double r = t_.turn_ratios[i];
    if (r >= 0.85 && r <= 1.15) ++within;
    lo = i == 0 ? r : std::min(lo, r);
    hi = i == 0 ? r : std::max(hi, r);
  }
  std::printf(
      "  turns within 0.85-1.15x of their prediction: %u of %zu (measured/predicted "
      "%.2f..%.2f)\n",
      within, t_.turn_ratios.size(), lo, hi);
  std::printf(
      "  engine stand-in: %u prefill calls of %llu tokens (%llu attention pairs) took "
      "%.0f ms of real compute\n",
      t_.prefill_calls, static_cast<unsigned long long>(t_.prefill_tokens),
      static_cast<unsigned long long>(t_.prefill_pairs), t_.prefill_us / 1000);
  const RecomputeParameters& stated = prefill_probe_.parameters;
  std::printf("\nrecompute model          %10s %12s %16s %14s %8s %10s %s\n", "c0", "c1 /token",
              "c2 /token^2", "c3 /prefix tok", "calls", "median err", "worst err");
  std::printf(
      "  stated at Open (probe) %10s %12s %16s %14s %8llu %9.1f%% %8.1f%% (noise floor "
      "%.1f%%)\n",
      FormatMicros(stated.c0_us).c_str(), FormatMicros(stated.c1_us_per_token).c_str(),
      FormatMicros(stated.c2_us_per_token2).c_str(),
      FormatMicros(stated.c3_us_per_prefix_token).c_str(),
      static_cast<unsigned long long>(prefill_probe_.samples),
      100 * prefill_probe_.median_abs_error, 100 * prefill_probe_.worst_abs_error,
      100 * prefill_probe_.noise_floor_ratio);
  if (const placement::PlacementNode* node = cluster_->placement_node()) {
    for (const CalibratedCostModel::RecomputeReport& m : node->Snapshot().models) {
      if (m.model_id != model_.model_id) continue;
      std::printf(
          "  placement now (%s, %llu refits) %s %12s %16s %14s %8llu %9.1f%% %8.1f%% "
          "(out of sample: each call against the fit before it)\n",
          std::string(ParameterSourceName(m.provenance.source)).c_str(),
          static_cast<unsigned long long>(m.provenance.refits),
          FormatMicros(m.parameters.c0_us).c_str(),
          FormatMicros(m.parameters.c1_us_per_token).c_str(),
          FormatMicros(m.parameters.c2_us_per_token2).c_str(),
          FormatMicros(m.parameters.c3_us_per_prefix_token).c_str(),
          static_cast<unsigned long long>(m.error.count), 100 * std::fabs(m.error.median),
          100 * m.error.worst_abs);
      std::printf(
          "  split overlap s = %.2f (0: prefill and fetch overlap, 1: serial) from %.0f finished "
          "splits; split plans measured/predicted median %+.1f%%, worst %.1f%%\n",
          m.parameters.split_serial_fraction, m.split_effective_observations,
          100 * m.split_error.median, 100 * m.split_error.worst_abs);
    }
  }
  std::printf("\nbytes moved            %12s %10s %10s\n", "bytes", "seconds", "GB/s");
  auto row = [](const char* what, std::uint64_t bytes, double us) {
    std::printf("  %-20s %12s %10.2f %10.2f\n", what, FormatBytes(bytes).c_str(), us / 1e6,
                us > 0 ? bytes / us / 1e3 : 0.0);
  };
  row("daemon -> client", m.bytes_fetched, static_cast<double>(m.fetch_us));
  row("client -> daemon", m.bytes_saved, static_cast<double>(m.save_us));
  row("host -> device", t_.h2d_bytes, t_.attend_us);
  std::printf("  (host -> device: attention tiles streamed on the CPU backend; its time is the "
              "decode step's)\n\n");
  std::printf("device arena: peak %u of %u pages (%s budget; largest history %s)\n",
              m.peak_arena_pages, m.arena_pages, FormatBytes(a_.device_arena_bytes).c_str(),
              FormatBytes(t_.largest_history_bytes).c_str());
  std::printf("fallbacks: %llu runs recomputed after a failed fetch, %llu from a replica; "
              "CRC failures %llu\n",
              static_cast<unsigned long long>(m.fallbacks_to_recompute),
              static_cast<unsigned long long>(m.fallbacks_to_replica),
              static_cast<unsigned long long>(m.crc_failures));
  std::printf("exactness: %u of %u sampled decode steps bit-identical to fully resident "
              "attention\n\n",
              t_.checks - t_.check_failures, t_.checks);
  std::printf("metrics:\n  placement  %s\n", cluster_->placement_metrics_url().c_str());
  for (const auto& d : cluster_->daemons()) {
    std::printf("  %-10s %s\n", d.host_id.c_str(), d.metrics_url.c_str());
  }
}

void Demo::PrintJson(double seconds) const {
  const client::ClientMetrics m = client_->metrics();
  std::printf("{\"seconds\":%.3f,\"turns\":%u,\"tokens\":{\"host_tier\":%llu,\"nvme_tier\":%llu,"
              "\"recomputed\":%llu},\"plans\":{",
              seconds, total_turns_, static_cast<unsigned long long>(t_.tokens_host_tier),
              static_cast<unsigned long long>(t_.tokens_nvme_tier),
              static_cast<unsigned long long>(t_.tokens_recomputed));
  bool first = true;
  for (const auto& [kind, ps] : t_.plans) {
    std::printf("%s\"%s\":{\"count\":%u,\"predicted_us\":%.0f,\"measured_us\":%.0f}",
                first ? "" : ",", JsonEscape(kind).c_str(), ps.count, ps.predicted_us,
                ps.measured_us);
    first = false;
  }
  std::printf("},\"bytes\":{\"fetched\":%llu,\"fetch_us\":%llu,\"saved\":%llu,\"save_us\":%llu,"
              "\"host_to_device\":%llu},\"arena\":{\"peak_pages\":%u,\"pages\":%u},"
              "\"fallbacks_to_recompute\":%llu,\"checks\":%u,\"check_failures\":%u,"
              "\"metrics\":[\"%s\"",
              static_cast<unsigned long long>(m.bytes_fetched),
              static_cast<unsigned long long>(m.fetch_us),
              static_cast<unsigned long long>(m.bytes_saved),
              static_cast<unsigned long long>(m.save_us),
              static_cast<unsigned long long>(t_.h2d_bytes), m.peak_arena_pages, m.arena_pages,
              static_cast<unsigned long long>(m.fallbacks_to_recompute), t_.checks,
              t_.check_failures, JsonEscape(cluster_->placement_metrics_url()).c_str());
  for (const auto& d : cluster_->daemons()) std::printf(",\"%s\"", JsonEscape(d.metrics_url).c_str());
  std::printf("]}\n");
}

Status Demo::Run() {
  KVF_RETURN_IF_ERROR(Validate());
  const auto start = Clock::now();
  const std::uint64_t tpb = a_.tokens_per_block;
  std::printf("kvfabric demo: model %u layers x %u KV heads x %u dims, %s, %u-token blocks of %s; "
              "longest history %llu tokens = %s; device arena %s\n",
              a_.layers, a_.kv_heads, a_.head_dim, a_.dtype.c_str(), a_.tokens_per_block,
              FormatBytes(block_bytes_).c_str(),
              static_cast<unsigned long long>(a_.max_history_tokens),
              FormatBytes(a_.max_history_tokens / tpb * block_bytes_).c_str(),
              FormatBytes(a_.device_arena_bytes).c_str());
  KVF_RETURN_IF_ERROR(StartCluster());
  KVF_RETURN_IF_ERROR(OpenClient());
  std::printf("%s\n", client_->DescribeArena().c_str());
  std::printf("history pool: %s\n", client_->DescribeHistoryPool().c_str());

  // Conversations share the system prompt; conversation c grows to
  // max_history_tokens / 2^c tokens over its turns.
  rng_.seed(a_.seed);
  std::vector<std::uint32_t> system(a_.system_prompt_tokens);
  for (std::uint32_t& t : system) t = static_cast<std::uint32_t>(rng_() % 128000);
  for (std::uint32_t c = 0; c < a_.conversations; ++c) {
    std::uint64_t final_tokens = std::max(a_.system_prompt_tokens + tpb,
                                          (a_.max_history_tokens >> std::min(c, 30u)) / tpb * tpb);
    std::vector<std::uint32_t> tokens = system;
    while (tokens.size() < final_tokens) tokens.push_back(static_cast<std::uint32_t>(rng_() % 128000));
    KVF_ASSIGN_OR_RETURN(std::vector<BlockKey> keys, client_->KeyTokens(tokens));
    tokens_.push_back(std::move(tokens));
    keys_.push_back(std::move(keys));
  }
  total_turns_ = a_.conversations * a_.turns;
  std::uint32_t index = 0;
  for (std::uint32_t turn = 0; turn < a_.turns; ++turn) {
    for (std::uint32_t c = 0; c < a_.conversations; ++c) {
      KVF_RETURN_IF_ERROR(RunTurn(index++, c, turn));
    }
  }
  const double seconds = Seconds(Clock::now() - start);
  if (a_.json) {
    PrintJson(seconds);
  } else {
    PrintSummary(seconds);
  }
  std::fflush(stdout);
  if (a_.keep_running) {
    std::printf("--keep-running: the cluster stays up; placement at %s. Ctrl-C to stop.\n",
                cluster_->placement_address().c_str());
    PrintScrapeConfig();
    std::fflush(stdout);
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    int sig = 0;
    sigwait(&signals, &sig);
  }
  if (t_.check_failures > 0) {
    return Status::DataLoss(std::to_string(t_.check_failures) + " of " +
                            std::to_string(t_.checks) +
                            " exactness checks failed: streamed attention differs from resident");
  }
  return Status::OK();
}

}  // namespace

CLI::App* AddDemoSubcommand(CLI::App& app, DemoArgs* a) {
  CLI::App* d = app.add_subcommand(
      "demo", "a long-context workload end to end on an embedded local cluster");
  d->add_option("--layers", a->layers, "model layers (default 32)");
  d->add_option("--tls-cert", a->tls_cert,
                "mutual TLS: PEM certificate (naming IP:127.0.0.1) of every embedded server and "
                "of the demo engine; with --tls-key and --tls-ca");
  d->add_option("--tls-key", a->tls_key, "PEM key of --tls-cert");
  d->add_option("--tls-ca", a->tls_ca, "PEM CA bundle that signed --tls-cert");
  d->add_option("--kv-heads", a->kv_heads, "KV heads (default 8)");
  d->add_option("--head-dim", a->head_dim, "elements per head (default 128)");
  d->add_option("--tokens-per-block", a->tokens_per_block, "tokens per block (default 16)");
  d->add_option("--dtype", a->dtype, "fp16 | bf16 | fp32 (default fp16)");
  d->add_option("--num-q-heads", a->num_q_heads, "query heads of the decode step (default 8)");
  d->add_option("--conversations", a->conversations, "conversations (default 3)");
  d->add_option("--turns", a->turns, "turns per conversation (default 3)");
  d->add_option("--max-history-tokens", a->max_history_tokens,
                "longest history, conversation A's last turn (default 16384)");
  d->add_option("--system-prompt-tokens", a->system_prompt_tokens,
                "shared system prompt (default 2048)");
  d->add_option("--check-layers", a->check_layers,
                "layers per turn checked against resident attention (default 2)");
  d->add_option("--prefill-hidden", a->prefill_hidden,
                "the prefill's synthetic transformer: residual width (default 256)");
  d->add_option("--prefill-ffn", a->prefill_ffn, "its MLP width (default 1024)");
  d->add_option("--prefill-depth", a->prefill_depth, "its decoder layers (default 1)");
  d->add_option("--prefill-vocab", a->prefill_vocab, "its vocabulary (default 16384)");
  d->add_option("--prefill-probe-repeats", a->prefill_probe_repeats,
                "repeats per shape of the prefill probe (default 2)");
  AddBytesOption(*d, "--host-pool-bytes", &a->host_pool_bytes, "host pool per daemon (1 GiB)");
  AddBytesOption(*d, "--nvme-capacity-bytes", &a->nvme_capacity_bytes,
                 "NVMe tier per daemon (4 GiB)");
  AddBytesOption(*d, "--device-arena-bytes", &a->device_arena_bytes,
                 "the client's device arena (16 MiB)");
  d->add_option("--tile-tokens", a->tile_tokens, "tokens per attention tile (default 256)");
  d->add_option("--data-transport", a->data_transport,
                "data plane of the daemons and the client: ucx (default) | tcp (kernel sockets)")
      ->check(CLI::IsMember({"ucx", "tcp"}));
  AddBytesOption(*d, "--calibrate-max-bytes", &a->calibrate_max_bytes,
                 "largest calibration probe (16 MiB)");
  d->add_flag("!--no-calibrate", a->calibrate, "skip calibration (placeholder bus figures)");
  d->add_option("--work-dir", a->work_dir, "where the temporary NVMe folder goes (/tmp)");
  d->add_option("--seed", a->seed, "workload seed (default 1)");
  d->add_flag("--keep-running", a->keep_running,
              "leave the cluster up after the summary (for a dashboard) until Ctrl-C");
  d->add_flag("--json", a->json, "print the summary as one JSON object");
  return d;
}

Status RunDemo(const DemoArgs& args) {
  // The daemons' and placement's info lines would bury the progress lines;
  // an explicit --log-level other than info still applies.
  if (spdlog::get_level() == spdlog::level::info) spdlog::set_level(spdlog::level::warn);
  if (args.keep_running) {
    // Before any thread starts, so that only sigwait takes these.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  }
  Demo demo(args);
  return demo.Run();
}

}  // namespace kvfabric::cli
