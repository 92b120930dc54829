// cluster_planner_bench: kvfabric's fetch-or-recompute plans judged by what they cost on a real
// embedded cluster, against always-fetch, always-recompute and an oracle, through a slowdown.
//
// Setup (one process): two cache-host daemons (bench-a, bench-b) on loopback with the kernel
// TCP data plane, small host pools and NVMe tiers under --work-dir (blocks spill to NVMe, so
// histories mix tiers), `kvfabric calibrate`'s probes against them, placement with that
// calibration, the real client, and the synthetic transformer of client/synthetic_transformer.h
// as the engine (real prefill compute, probed and stated to placement at Open).
//
// Trace: --documents histories of mixed lengths (--min-tokens .. --max-tokens) are prefilled
// and written back once (warm-up). Then three phases of --requests requests each, served by
// --concurrency threads at once: a request is a prefix of a random document (at least a quarter
// of it). Between phases 1 and 2 bench-a's data-plane sends are capped at --slow-rate bytes/s
// (SO_MAX_PACING_RATE on its TCP connections): fetching from it turns slow. Between phases 2
// and 3 the cap is lifted: plans avoid bench-a by then, and only placement's retrials of it
// (placement_node.h, RETRIALS; --retrial-interval-ms) can learn that it recovered.
//
// Each request runs, back to back on its thread, under:
//   kvfabric          Match (placement's plan) then Load
//   always-fetch      every cached block fetched from its first replica (the planner's own
//                     replica order), the rest recomputed
//   always-recompute  every block prefilled
//   kvfabric again    the same plan executed again right after (no new Match): the noise floor
// and each one's load time (Load to the last block landed, ContextReport::load_us) is recorded.
// Oracle = per request, the fastest of the three policies' measured times: a policy that knew
// after the fact which would win. Nothing is written back during the phases (the warm-up cached
// everything), but a fetch changes the tiers: a block a daemon staged from NVMe for it stays
// in that daemon's host pool (and may push another out), so the policy that fetches second
// often finds more of the request in host pools. The three policies therefore run in all six
// orders by turns (kOrders): each fetches first in half the requests. The repeat of kvfabric's
// plan always runs right after it, on whatever its first run staged.
//
// The noise floor beside the oracle: the repeat of kvfabric's plan does identical work, so its
// ratio to the first run is the machine's noise (printed as p10..p90), and the per-request
// minimum of the two runs against the first run is what taking a minimum over noisy draws gains
// on identical work: the oracle, a minimum over three draws, carries at least that advantage.
//
// Prints per phase: total load time per policy and kvfabric / oracle, kvfabric against each
// fixed policy, the noise floor, kvfabric's measured/predicted per side (the fetch runs' end and
// the recompute runs' time), plan kinds, blocks kvfabric fetched from bench-a; and N: the
// transfers placement observed on bench-a's path after the cap before its model followed
// (the lower fitted bandwidth of its two sources within 2x of the cap); retrial plans per phase,
// and how long after the cap was lifted placement restored bench-a's figures. --per-request
// prints every request's figures, retrial plans marked. Not a test (no assertions).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "cli/calibrate_command.h"
#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "client/synthetic_transformer.h"
#include "core/bus_cost_model.h"
#include "core/recompute_probe.h"
#include "core/units.h"
#include "gpu/device.h"
#include "server/embedded_cluster.h"
#include "server/placement/placement_node.h"

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Args {
  std::uint32_t layers = 8;
  std::uint32_t documents = 8;
  std::uint32_t min_tokens = 512;
  std::uint32_t max_tokens = 4096;
  std::uint32_t requests = 32;  // per phase
  std::uint32_t concurrency = 2;
  std::uint64_t slow_rate = 40'000'000;
  // Placement's retrials of the slowed daemon (placement_node.h, RETRIALS): shorter than the
  // service's 5 s and 300 s, so that phase 3 (a minute or so) sees one.
  std::uint32_t retrial_interval_ms = 1000;
  std::uint32_t retrial_max_interval_ms = 8000;
  std::uint64_t host_pool_bytes = std::uint64_t{96} << 20;
  std::string work_dir = "/tmp";
  std::uint64_t seed = 1;
  bool per_request = false;
  bool learn_split_overlap = true;
};

// kKvfabricAgain runs kvfabric's plan a second time; it is not a policy of its own.
enum Policy {
  kKvfabric = 0,
  kAlwaysFetch = 1,
  kAlwaysRecompute = 2,
  kPolicies = 3,
  kKvfabricAgain = 3,
  kRuns = 4
};
// The orders the policies run in, by turns: each policy runs before each other in three of
// the six, and every two neighbours are each other's mirror, so any even count of requests is
// balanced.
constexpr Policy kOrders[][kPolicies] = {
    {kKvfabric, kAlwaysFetch, kAlwaysRecompute}, {kAlwaysRecompute, kAlwaysFetch, kKvfabric},
    {kAlwaysFetch, kKvfabric, kAlwaysRecompute}, {kAlwaysRecompute, kKvfabric, kAlwaysFetch},
    {kKvfabric, kAlwaysRecompute, kAlwaysFetch}, {kAlwaysFetch, kAlwaysRecompute, kKvfabric}};
const char* const kPolicyNames[] = {"kvfabric", "always-fetch", "always-recompute",
                                    "kvfabric again"};

struct Outcome {
  double us[kRuns] = {0, 0, 0, 0};
  std::string kind;
  std::uint32_t blocks = 0;
  std::uint32_t fetched_from_a = 0;
  double predicted_us = 0;
  // kvfabric's plan: the last fetched block's predicted and measured landing, and the recompute
  // runs' predicted and measured durations (each run from the later of its predicted start and
  // the previous run's end; summed), in µs after Load.
  double fetch_predicted_us = 0, fetch_measured_us = 0;
  double recompute_predicted_us = 0, recompute_measured_us = 0;
  // kvfabric's run: its streams cut as stragglers (client/straggler_cut.h), past their cut-off
  // and projected past it (runs whose failure says so; a stream's runs share its failure).
  std::set<std::string> cut_past, cut_projected;
  // The daemon the plan retried on its figures from before its slowdown (RETRIALS), or "".
  std::string retrial;
  std::string explanation;
  client::MatchResult match;
};

class Bench {
 public:
  explicit Bench(const Args& a) : a_(a) {}
  ~Bench() {
    client_.reset();
    device_.reset();
    cluster_.reset();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  Status Run();

 private:
  Status Start();
  Status Prefill(const client::RecomputeRequest& r, std::span<std::byte> out);
  StatusOr<double> Execute(Policy policy, std::uint32_t doc, std::uint32_t blocks,
                           Outcome* outcome);
  StatusOr<client::ContextReport> Load(const client::MatchResult& match, std::uint32_t doc,
                                       std::uint32_t blocks);
  StatusOr<client::MatchResult> FixedPlan(Policy policy, std::span<const BlockKey> chain);
  Status Phase(const char* name, std::vector<Outcome>* out);
  void Report(const char* name, const std::vector<Outcome>& o) const;
  // Each daemon's paths in placement's model: beta, whether slowed (and from what), change
  // points, restores and refits.
  void PrintDaemonPaths() const;
  double FittedBetaOfA() const;
  std::uint64_t ObservationsOfA() const;

  const Args a_;
  ModelFingerprint model_;
  std::uint64_t block_bytes_ = 0;
  std::string dir_;
  std::unique_ptr<server::EmbeddedCluster> cluster_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::SyntheticTransformer> engine_;
  std::vector<std::vector<std::uint32_t>> tokens_;
  std::vector<std::vector<BlockKey>> keys_;
  std::mutex mu_;
  std::map<client::ContextId, std::uint32_t> doc_of_;
  std::mt19937_64 rng_;
};

Status Bench::Start() {
  model_.model_id = "kvfabric-bench/synthetic-" + std::to_string(a_.layers) + "L";
  model_.layer_count = a_.layers;
  model_.kv_heads = 8;
  model_.head_dim = 128;
  model_.tokens_per_block = 16;
  model_.dtype = KvDtype::kFp16;
  KVF_ASSIGN_OR_RETURN(block_bytes_, model_.BlockBytes());
  std::string tmpl = a_.work_dir + "/kvfabric-cluster-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Status::FailedPrecondition("cannot make a folder under " + a_.work_dir);
  }
  dir_ = tmpl;
  server::EmbeddedClusterOptions co;
  for (const char* name : {"bench-a", "bench-b"}) {
    server::EmbeddedDaemonOptions d;
    d.host_id = name;
    d.host_pool_bytes = a_.host_pool_bytes;
    d.host_page_bytes = block_bytes_;
    d.nvme_dir = dir_ + "/" + name;
    d.nvme_capacity_bytes = std::uint64_t{2} << 30;
    d.nvme_segment_bytes = std::uint64_t{64} << 20;
    d.model = model_;
    d.history_tokens = a_.max_tokens;
    d.data_transport = "tcp";
    co.daemons.push_back(std::move(d));
  }
  co.membership_ttl = std::chrono::seconds(10);
  co.placement_learns_split_overlap = a_.learn_split_overlap;
  co.placement_retrial_interval = std::chrono::milliseconds(a_.retrial_interval_ms);
  co.placement_retrial_max_interval = std::chrono::milliseconds(a_.retrial_max_interval_ms);
  KVF_ASSIGN_OR_RETURN(cluster_, server::EmbeddedCluster::StartDaemons(co));

  std::vector<std::string> grpc, admin;
  for (const auto& d : cluster_->daemons()) {
    grpc.push_back(d.grpc_address);
    admin.push_back(d.admin_address);
  }
  client::SyntheticTransformerOptions eo;
  eo.model = model_;
  eo.depth = 1;
  eo.max_context_tokens = a_.max_tokens;
  eo.concurrency = a_.concurrency + 1;
  eo.weight_seed = a_.seed;
  KVF_ASSIGN_OR_RETURN(engine_, client::SyntheticTransformer::Create(eo));
  std::printf("%s\n", engine_->Describe().c_str());

  // Calibration as an operator runs it (kvfabric calibrate --prefill-probe): the bus paths, the
  // engine's prefill probed on a scratch history, and how much a prefill and a fetch from both
  // daemons slow each other (the split overlap s; without it placement assumed full overlap
  // until three finished splits taught it, and on 2 vCPUs the first splits of phase 1 lost to
  // fetching everything). The fit is stated at Open too.
  const std::uint64_t tpb = model_.tokens_per_block;
  cli::CalibrateContext cc;
  cc.prefill_options.repeats = 2;
  std::uint64_t max_n = 1024, max_p = 0;  // the split-overlap probe prefills 1024 after 0
  for (const RecomputeShape& s : DefaultRecomputeShapes()) {
    if (s.tokens + s.prefix_tokens > a_.max_tokens) continue;
    cc.prefill_options.shapes.push_back(s);
    max_n = std::max(max_n, s.tokens);
    max_p = std::max(max_p, s.prefix_tokens);
  }
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<client::SyntheticPrefillProbe> harness,
                       client::SyntheticPrefillProbe::Create(engine_.get(), max_n, max_p));
  cc.prefill = [&](std::uint64_t n, std::uint64_t p) { return harness->Run(n, p); };
  cc.prefill_model_id = model_.model_id;
  const cli::CalibrateArgs ca =
      cli::EmbeddedClusterCalibrateArgs(grpc, admin, dir_, std::uint64_t{16} << 20, "tcp");
  KVF_ASSIGN_OR_RETURN(cli::CalibrationReport report, cli::RunCalibrate(ca, cc));
  std::printf("calibration (probes 256 KiB .. 16 MiB):\n");
  for (const PathCalibration& p : report.calibration.paths) {
    std::fputs(cli::FormatPathCalibrationLine(p).c_str(), stdout);
  }
  if (!report.prefill) return Status::Internal("calibration returned no prefill fit");
  const RecomputeProbeReport& pr = *report.prefill;
  std::printf("prefill probe: %s, worst out-of-sample %.1f%%, noise floor %.1f%%\n",
              FormatRecomputeModel(pr.parameters).c_str(), 100 * pr.worst_abs_error,
              100 * pr.noise_floor_ratio);
  if (report.split_overlap) {
    std::printf("split overlap: %s (reads from %s)\n",
                FormatSplitOverlap(*report.split_overlap).c_str(),
                report.split_overlap_from.c_str());
  }
  KVF_RETURN_IF_ERROR(cluster_->StartPlacement(report.calibration));

  gpu::DeviceOptions dopts;
  dopts.arena_bytes = std::uint64_t{16} << 20;
  KVF_ASSIGN_OR_RETURN(device_, gpu::CreateCpuDevice(dopts));
  client::ClientOptions o;
  o.placement_address = cluster_->placement_address();
  o.security.insecure = true;  // the embedded cluster: plaintext on 127.0.0.1
  o.model = model_;
  o.device = device_.get();
  o.num_q_heads = 8;
  o.data_transport = "tcp";
  o.staging_bytes = std::uint64_t{64} << 20;
  o.history_pool_bytes = (a_.concurrency + 1) * (a_.max_tokens / tpb) * block_bytes_;
  o.max_context_tokens = a_.max_tokens;
  o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
    return Prefill(r, out);
  };
  o.prefill = pr.parameters;
  KVF_ASSIGN_OR_RETURN(client_, client::Client::Open(std::move(o)));
  return Status::OK();
}

Status Bench::Prefill(const client::RecomputeRequest& r, std::span<std::byte> out) {
  std::uint32_t doc = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    doc = doc_of_.at(r.context);
  }
  const std::vector<BlockKey>& keys = keys_[doc];
  thread_local std::vector<std::uint64_t> seeds;
  seeds.clear();
  for (std::uint32_t i = 0; i < r.block_count; ++i) {
    seeds.push_back(client::SeedFromKey(keys[r.first_block + i], a_.seed));
  }
  return engine_
      ->Prefill(r.prefix, r.first_block, std::span(tokens_[doc]).subspan(r.first_token, r.tokens),
                seeds, out)
      .status();
}

StatusOr<client::MatchResult> Bench::FixedPlan(Policy policy, std::span<const BlockKey> chain) {
  client::MatchResult m;
  m.chain.assign(chain.begin(), chain.end());
  const auto n = static_cast<std::uint32_t>(chain.size());
  std::uint32_t first_recompute = 0;
  if (policy == kAlwaysFetch) {
    m.kind = "fetch_all";
    KVF_ASSIGN_OR_RETURN(placement::ChainLocations loc,
                         cluster_->placement_node()->Locate("", chain));
    for (const placement::MemberRecord& h : loc.hosts) {
      m.hosts.push_back({h.host_id, h.grpc_address, h.transport_address});
    }
    for (std::uint32_t b = 0; b < loc.cached_prefix_blocks; ++b) {
      const placement::LocatedReplica& r = loc.blocks[b].front();
      const std::string tier = r.tier == Tier::kNvme ? "nvme" : "host";
      if (!m.runs.empty() && m.runs.back().fetch && m.runs.back().host == r.host_index &&
          m.runs.back().tier == tier) {
        ++m.runs.back().block_count;
        continue;
      }
      client::MatchResult::Run run;
      run.first_block = b;
      run.block_count = 1;
      run.fetch = true;
      run.host = r.host_index;
      run.tier = tier;
      m.runs.push_back(run);
    }
    first_recompute = loc.cached_prefix_blocks;
    m.cached_prefix_blocks = loc.cached_prefix_blocks;
  } else {
    m.kind = "recompute_all";
  }
  if (first_recompute < n) {
    client::MatchResult::Run run;
    run.first_block = first_recompute;
    run.block_count = n - first_recompute;
    m.runs.push_back(run);
  }
  return m;
}

StatusOr<client::ContextReport> Bench::Load(const client::MatchResult& match, std::uint32_t doc,
                                            std::uint32_t blocks) {
  KVF_ASSIGN_OR_RETURN(const client::ContextId ctx,
                       client_->NewContext(std::uint64_t{blocks} * model_.tokens_per_block));
  {
    std::lock_guard<std::mutex> l(mu_);
    doc_of_[ctx] = doc;
  }
  Status s = client_->Load(match, ctx);
  for (std::uint32_t l = 0; s.ok() && l < a_.layers; ++l) s = client_->WaitLayer(ctx, l);
  StatusOr<client::ContextReport> report = client_->Finish(ctx);
  {
    std::lock_guard<std::mutex> l(mu_);
    doc_of_.erase(ctx);
  }
  KVF_RETURN_IF_ERROR(s);
  return report;
}

StatusOr<double> Bench::Execute(Policy policy, std::uint32_t doc, std::uint32_t blocks,
                                Outcome* outcome) {
  const std::span<const BlockKey> chain(keys_[doc].data(), blocks);
  client::MatchResult fixed;
  const client::MatchResult* match = &outcome->match;  // kvfabric's, made by Phase
  if (policy == kAlwaysFetch || policy == kAlwaysRecompute) {
    KVF_ASSIGN_OR_RETURN(fixed, FixedPlan(policy, chain));
    match = &fixed;
  }
  KVF_ASSIGN_OR_RETURN(const client::ContextReport report, Load(*match, doc, blocks));
  if (policy == kKvfabric) {
    outcome->kind = report.kind;
    outcome->predicted_us = report.predicted_us;
    outcome->explanation = match->explanation;
    StatusOr<placement::PlanExplanation> why = cluster_->placement_node()->Explain(match->plan_id);
    const std::size_t at = why.ok() ? why->text.find("retrial of ") : std::string::npos;
    if (at != std::string::npos)
      outcome->retrial = why->text.substr(at + 11, why->text.find(':', at) - at - 11);
    double previous_end_measured = 0, previous_end_predicted = 0;
    for (std::size_t i = 0; i < report.runs.size(); ++i) {
      const client::RunOutcome& r = report.runs[i];
      if (r.fetch) {
        if (r.failure.find("stream cut after") != std::string::npos) {
          (r.failure.find("would end at") != std::string::npos ? outcome->cut_projected
                                                               : outcome->cut_past)
              .insert(r.host_id);
        }
        if (r.host_id == "bench-a") outcome->fetched_from_a += r.block_count;
        outcome->fetch_predicted_us = std::max(outcome->fetch_predicted_us, r.predicted_end_us);
        outcome->fetch_measured_us = std::max(outcome->fetch_measured_us, r.measured_end_us);
      } else {
        const double start_predicted =
            i < match->runs.size() ? match->runs[i].predicted_start_us : previous_end_predicted;
        outcome->recompute_predicted_us += r.predicted_end_us - start_predicted;
        // A recompute run starts when the blocks before it landed (the prefill attends to them).
        outcome->recompute_measured_us +=
            r.measured_end_us - (r.first_block == 0 ? 0 : previous_end_measured);
      }
      previous_end_measured = std::max(previous_end_measured, r.measured_end_us);
      previous_end_predicted = std::max(previous_end_predicted, r.predicted_end_us);
    }
  }
  return report.load_us;
}

Status Bench::Phase(const char* name, std::vector<Outcome>* out) {
  out->assign(a_.requests, Outcome{});
  std::vector<std::pair<std::uint32_t, std::uint32_t>> reqs;  // (doc, blocks)
  for (std::uint32_t i = 0; i < a_.requests; ++i) {
    const auto doc = static_cast<std::uint32_t>(rng_() % keys_.size());
    const auto all = static_cast<std::uint32_t>(keys_[doc].size());
    const std::uint32_t lo = std::max<std::uint32_t>(1, all / 4);
    reqs.emplace_back(doc, lo + static_cast<std::uint32_t>(rng_() % (all - lo + 1)));
  }
  std::atomic<std::uint32_t> next{0};
  Status first_error;
  std::mutex error_mu;
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < a_.concurrency; ++t) {
    threads.emplace_back([&] {
      for (std::uint32_t i; (i = next.fetch_add(1)) < reqs.size();) {
        Outcome& o = (*out)[i];
        o.blocks = reqs[i].second;
        // The policies in the six orders by turns (kOrders), so each runs before each other
        // in half the requests: a fetch leaves the cluster warmer for the next (a block
        // staged from NVMe stays in the daemon's host pool), and with three orders in a
        // cycle kvfabric fetched before always-fetch in two of them. kvfabric's Match comes right
        // before its load, as in an engine: the plan holds its bytes on placement's path load until
        // the load finishes, and other plans queue behind them. Its repeat runs right after it, on
        // the same plan.
        for (int k = 0; k < kPolicies; ++k) {
          const Policy p = kOrders[i % std::size(kOrders)][k];
          if (p == kKvfabric) {
            const std::span<const BlockKey> chain(keys_[reqs[i].first].data(), reqs[i].second);
            StatusOr<client::MatchResult> match = client_->Match(chain, 0, /*explain=*/true);
            if (!match.ok()) {
              std::lock_guard<std::mutex> l(error_mu);
              if (first_error.ok()) first_error = match.status().WithContext("Match");
              return;
            }
            o.match = *std::move(match);
          }
          for (const Policy run : {p, kKvfabricAgain}) {
            if (run == kKvfabricAgain && p != kKvfabric) break;
            StatusOr<double> us = Execute(run, reqs[i].first, reqs[i].second, &o);
            if (!us.ok()) {
              std::lock_guard<std::mutex> l(error_mu);
              if (first_error.ok()) first_error = us.status().WithContext(kPolicyNames[run]);
              return;
            }
            o.us[run] = *us;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  KVF_RETURN_IF_ERROR(first_error);
  Report(name, *out);
  PrintDaemonPaths();
  return Status::OK();
}

// bench-a's two sources (planner.h, FETCH MODEL): its host pool (remote->local) and its NVMe
// tier (nvme->host, observed over the whole staged path, the capped send included). The cap
// shows in whichever carried bench-a's bytes: the fitted beta is the lower of the two learned
// ones, the observations those of both.
void Bench::PrintDaemonPaths() const {
  std::printf("  placement's model of the daemons' paths now:\n");
  for (const auto& r : cluster_->placement_node()->Snapshot().paths) {
    if (r.host_id.empty() || r.path == BusPath::kLocalHostToRemoteHost) continue;
    std::printf(
        "    %-9s %-28s beta %-12s %-26s %3llu scored, %llu change points, %llu restores, %llu "
        "refits\n",
        r.host_id.c_str(), std::string(BusPathName(r.path)).c_str(),
        FormatRate(r.parameters.beta_bytes_per_s).c_str(),
        r.healthy ? ("slowed from " + FormatRate(r.healthy->beta_bytes_per_s)).c_str() : "",
        static_cast<unsigned long long>(r.error.count),
        static_cast<unsigned long long>(r.provenance.change_points),
        static_cast<unsigned long long>(r.provenance.restores),
        static_cast<unsigned long long>(r.provenance.refits));
  }
}

double Bench::FittedBetaOfA() const {
  double beta = 0;
  for (const auto& r : cluster_->placement_node()->Snapshot().paths) {
    if ((r.path == BusPath::kRemoteHostToLocalHost || r.path == BusPath::kNvmeToHost) &&
        r.host_id == "bench-a") {
      const double b = r.parameters.beta_bytes_per_s;
      beta = beta == 0 ? b : std::min(beta, b);
    }
  }
  return beta;
}

std::uint64_t Bench::ObservationsOfA() const {
  std::uint64_t n = 0;
  for (const auto& r : cluster_->placement_node()->Snapshot().paths) {
    if ((r.path == BusPath::kRemoteHostToLocalHost || r.path == BusPath::kNvmeToHost) &&
        r.host_id == "bench-a") {
      n += r.error.count;
    }
  }
  return n;
}

void Bench::Report(const char* name, const std::vector<Outcome>& o) const {
  double total[kRuns] = {0, 0, 0, 0}, oracle = 0, min_of_two = 0;
  double fetch_pred = 0, fetch_meas = 0, rc_pred = 0, rc_meas = 0;
  std::vector<double> repeat_ratio;
  std::map<std::string, int> kinds;
  std::uint64_t blocks = 0, from_a = 0, within = 0, cut_past = 0, cut_projected = 0, retrials = 0;
  for (const Outcome& x : o) {
    for (int p = 0; p < kRuns; ++p) total[p] += x.us[p];
    oracle += *std::min_element(std::begin(x.us), std::begin(x.us) + kPolicies);
    min_of_two += std::min(x.us[kKvfabric], x.us[kKvfabricAgain]);
    if (x.us[kKvfabric] > 0) repeat_ratio.push_back(x.us[kKvfabricAgain] / x.us[kKvfabric]);
    ++kinds[x.kind];
    retrials += x.retrial.empty() ? 0 : 1;
    cut_past += x.cut_past.size();
    cut_projected += x.cut_projected.size();
    blocks += x.blocks;
    from_a += x.fetched_from_a;
    fetch_pred += x.fetch_predicted_us;
    fetch_meas += x.fetch_measured_us;
    rc_pred += x.recompute_predicted_us;
    rc_meas += x.recompute_measured_us;
    const double r = x.predicted_us > 0 ? x.us[kKvfabric] / x.predicted_us : 0;
    if (r >= 0.85 && r <= 1.15) ++within;
  }
  std::printf("\n%s: %zu requests, %llu blocks\n", name, o.size(),
              static_cast<unsigned long long>(blocks));
  if (a_.per_request) {
    std::printf("  %4s %6s %-30s %10s %10s %10s %10s %10s %7s  %s\n", "req", "blocks",
                "kvfabric plan", "predicted", "kvfabric", "again", "fetch-all", "recompute",
                "k/orc", "cut (past, projected)");
    for (std::size_t i = 0; i < o.size(); ++i) {
      const Outcome& x = o[i];
      const double orc = *std::min_element(std::begin(x.us), std::begin(x.us) + kPolicies);
      std::printf("  %4zu %6u %-30s %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %6.2fx  %zu, %zu\n", i,
                  x.blocks,
                  (x.kind + (x.retrial.empty() ? "" : " (retrial " + x.retrial + ")")).c_str(),
                  x.predicted_us / 1e3, x.us[kKvfabric] / 1e3, x.us[kKvfabricAgain] / 1e3,
                  x.us[kAlwaysFetch] / 1e3, x.us[kAlwaysRecompute] / 1e3,
                  orc > 0 ? x.us[kKvfabric] / orc : 0, x.cut_past.size(), x.cut_projected.size());
    }
  }
  std::printf("  %-18s %12s %14s\n", "policy", "load s", "vs oracle");
  for (int p = 0; p < kRuns; ++p) {
    std::printf("  %-18s %12.2f %13.2fx\n", kPolicyNames[p], total[p] / 1e6, total[p] / oracle);
  }
  std::printf("  %-18s %12.2f %13.2fx\n", "oracle", oracle / 1e6, 1.0);
  std::printf(
      "  kvfabric / always-fetch %.2fx, / always-recompute %.2fx; measured/predicted "
      "within 0.85-1.15 for %llu of %zu\n",
      total[kKvfabric] / total[kAlwaysFetch], total[kKvfabric] / total[kAlwaysRecompute],
      static_cast<unsigned long long>(within), o.size());
  std::printf(
      "  noise floor: the same plan run again took %.2fx (p10..p90 per request %.2f..%.2f); the "
      "per-request minimum of the two runs is %.2fx of the first: a minimum over noisy draws of "
      "identical work gains that much, and the oracle is a minimum over three draws\n",
      total[kKvfabricAgain] / total[kKvfabric], bench::Percentile(repeat_ratio, 0.1),
      bench::Percentile(repeat_ratio, 0.9), min_of_two / total[kKvfabric]);
  std::printf(
      "  kvfabric's sides, measured/predicted: fetch (last block landed) %.2fx (%.2f / %.2f s), "
      "recompute runs %.2fx (%.2f / %.2f s)\n",
      fetch_pred > 0 ? fetch_meas / fetch_pred : 0, fetch_meas / 1e6, fetch_pred / 1e6,
      rc_pred > 0 ? rc_meas / rc_pred : 0, rc_meas / 1e6, rc_pred / 1e6);
  if (!o.empty()) {
    std::printf("  the last kvfabric plan (measured %.1f ms, predicted %.1f ms):\n%s\n",
                o.back().us[kKvfabric] / 1e3, o.back().predicted_us / 1e3,
                o.back().explanation.c_str());
  }
  std::printf("  kvfabric plans:");
  for (const auto& [k, n] : kinds) std::printf(" %s %d", k.c_str(), n);
  std::printf("; blocks fetched from bench-a: %llu (%.0f%%)\n",
              static_cast<unsigned long long>(from_a), blocks ? 100.0 * from_a / blocks : 0.0);
  std::printf(
      "  kvfabric's streams cut as stragglers: %llu past their cut-off, %llu projected past it; "
      "plans that retried a daemon on its figures from before a slowdown: %llu\n",
      static_cast<unsigned long long>(cut_past), static_cast<unsigned long long>(cut_projected),
      static_cast<unsigned long long>(retrials));
}

Status Bench::Run() {
  if (a_.min_tokens < 16 || a_.max_tokens < a_.min_tokens || a_.documents == 0 ||
      a_.requests == 0 || a_.concurrency == 0) {
    return Status::InvalidArgument(
        "need 16 <= --min-tokens <= --max-tokens, --documents, "
        "--requests and --concurrency >= 1");
  }
  KVF_RETURN_IF_ERROR(Start());
  rng_.seed(a_.seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(a_.seed));
  // Documents, prefilled and written back once.
  const auto start = Clock::now();
  for (std::uint32_t d = 0; d < a_.documents; ++d) {
    const std::uint32_t span = (a_.max_tokens - a_.min_tokens) / 16;
    const std::uint32_t tokens = a_.min_tokens + 16 * (span == 0 ? 0 : rng_() % (span + 1));
    std::vector<std::uint32_t> t(tokens);
    for (auto& x : t) x = static_cast<std::uint32_t>(rng_() % 128000);
    KVF_ASSIGN_OR_RETURN(std::vector<BlockKey> keys, client_->KeyTokens(t));
    tokens_.push_back(std::move(t));
    keys_.push_back(std::move(keys));
    KVF_ASSIGN_OR_RETURN(const client::MatchResult m, FixedPlan(kAlwaysRecompute, keys_.back()));
    KVF_ASSIGN_OR_RETURN(const client::ContextId ctx, client_->NewContext(tokens));
    {
      std::lock_guard<std::mutex> l(mu_);
      doc_of_[ctx] = d;
    }
    KVF_RETURN_IF_ERROR(client_->Load(m, ctx));
    for (std::uint32_t l = 0; l < a_.layers; ++l) {
      KVF_RETURN_IF_ERROR(client_->WaitLayer(ctx, l));
      KVF_RETURN_IF_ERROR(client_->Save(ctx, l, 0, keys_.back()));
    }
    KVF_RETURN_IF_ERROR(client_->Finish(ctx).status());
  }
  std::printf("warm-up: %u documents of %u..%u tokens prefilled and written back in %.1f s\n",
              a_.documents, a_.min_tokens, a_.max_tokens, Seconds(Clock::now() - start));

  std::vector<Outcome> before, after;
  KVF_RETURN_IF_ERROR(Phase("phase 1 (both daemons at full speed)", &before));
  const std::uint64_t obs_at_cap = ObservationsOfA();
  KVF_RETURN_IF_ERROR(cluster_->SetDaemonSendRate(0, a_.slow_rate));
  std::printf(
      "\nbench-a's sends capped at %s/s (fitted beta of bench-a, the lower of its two sources: "
      "%s)\n",
      FormatBytes(a_.slow_rate).c_str(), FormatRate(FittedBetaOfA()).c_str());
  // Adaptation: transfers observed on bench-a's path until its fitted bandwidth is within 2x of
  // the cap, watched while phase 2 runs.
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> adapted_after{0};
  std::thread watch([&] {
    while (!done.load()) {
      const double beta = FittedBetaOfA();
      if (beta > 0 && beta <= 2.0 * static_cast<double>(a_.slow_rate) && adapted_after == 0) {
        adapted_after = ObservationsOfA() - obs_at_cap;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Status s = Phase("phase 2 (bench-a slowed)", &after);
  done = true;
  watch.join();
  KVF_RETURN_IF_ERROR(s);
  std::printf(
      "\nN = %llu transfers on bench-a's path after the cap before placement's model "
      "followed (fitted beta %s, cap %s/s)\n",
      static_cast<unsigned long long>(adapted_after.load()), FormatRate(FittedBetaOfA()).c_str(),
      FormatBytes(a_.slow_rate).c_str());

  // Phase 3: the cap is lifted. Plans avoid bench-a by now, so only a retrial (placement_node.h,
  // RETRIALS) can show that it recovered: watched as the time until the first retrial restores
  // a path of bench-a (fully, or scaled by its miss when it ran within 4x of the old figures).
  const placement::PlacementSnapshot at_lift = cluster_->placement_node()->Snapshot();
  KVF_RETURN_IF_ERROR(cluster_->SetDaemonSendRate(0, 0));
  const auto lifted = Clock::now();
  std::printf(
      "\nbench-a's cap lifted (fitted beta of bench-a %s; %llu retrials so far: %llu found it "
      "still slow, %llu recovered)\n",
      FormatRate(FittedBetaOfA()).c_str(), static_cast<unsigned long long>(at_lift.retrials),
      static_cast<unsigned long long>(at_lift.retrials_still_slow),
      static_cast<unsigned long long>(at_lift.retrials_restored));
  done = false;
  std::atomic<double> restored_after_s{-1};
  auto restores_of_a = [&] {
    std::uint64_t n = 0;
    for (const auto& r : cluster_->placement_node()->Snapshot().paths) {
      if (r.host_id == "bench-a") n += r.provenance.restores;
    }
    return n;
  };
  bool slowed_at_lift = false;
  for (const auto& r : at_lift.paths) {
    slowed_at_lift = slowed_at_lift || (r.host_id == "bench-a" && r.healthy.has_value());
  }
  const std::uint64_t restores_at_lift = restores_of_a();
  std::thread recovery([&] {
    while (!done.load()) {
      if (restored_after_s < 0 && restores_of_a() > restores_at_lift) {
        restored_after_s = Seconds(Clock::now() - lifted);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<Outcome> recovered;
  s = Phase("phase 3 (bench-a's cap lifted)", &recovered);
  done = true;
  recovery.join();
  KVF_RETURN_IF_ERROR(s);
  const placement::PlacementSnapshot end = cluster_->placement_node()->Snapshot();
  std::printf(
      "\nrecovery: %llu retrials since the cap was lifted (%llu restored, %llu still slow); "
      "bench-a's figures from before the cap: %s; fitted beta of bench-a now %s "
      "(--retrial-interval-ms %u, --retrial-max-interval-ms %u)\n",
      static_cast<unsigned long long>(end.retrials - at_lift.retrials),
      static_cast<unsigned long long>(end.retrials_restored - at_lift.retrials_restored),
      static_cast<unsigned long long>(end.retrials_still_slow - at_lift.retrials_still_slow),
      !slowed_at_lift ? "none kept (no path of bench-a was slowed from confirmed figures)"
      : restored_after_s >= 0
          ? ("first restored " + std::to_string(restored_after_s.load()).substr(0, 5) +
             " s after the cap was lifted")
                .c_str()
          : "not restored",
      FormatRate(FittedBetaOfA()).c_str(), a_.retrial_interval_ms, a_.retrial_max_interval_ms);
  return Status::OK();
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) {
  kvfabric::Args a;
  CLI::App app{"cluster_planner_bench: plans judged by what they cost on an embedded cluster"};
  app.add_option("--layers", a.layers, "model layers (default 8; blocks of 512 KiB)");
  app.add_option("--documents", a.documents, "histories cached at warm-up (default 8)");
  app.add_option("--min-tokens", a.min_tokens, "shortest history (default 512)");
  app.add_option("--max-tokens", a.max_tokens, "longest history (default 4096)");
  app.add_option("--requests", a.requests, "requests per phase (default 32)");
  app.add_option("--concurrency", a.concurrency, "contexts loading at once (default 2)");
  app.add_option("--slow-rate", a.slow_rate, "bench-a's send cap in phase 2, bytes/s (40e6)");
  app.add_option("--retrial-interval-ms", a.retrial_interval_ms,
                 "placement's --retrial-interval, in ms (1000; 0: no retrials)");
  app.add_option("--retrial-max-interval-ms", a.retrial_max_interval_ms,
                 "placement's --retrial-max-interval, in ms (8000)");
  app.add_option("--host-pool-bytes", a.host_pool_bytes, "host pool per daemon (96 MiB)");
  app.add_option("--work-dir", a.work_dir, "where the NVMe tiers go (/tmp)");
  app.add_option("--seed", a.seed, "trace seed (default 1)");
  app.add_flag("--per-request", a.per_request, "print every request's figures");
  bool fixed_overlap = false;
  app.add_flag("--no-split-learning", fixed_overlap,
               "placement keeps split overlap s = 0 (the model before it learned s)");
  CLI11_PARSE(app, argc, argv);
  a.learn_split_overlap = !fixed_overlap;
  spdlog::set_level(spdlog::level::warn);
  kvfabric::Bench bench(a);
  const kvfabric::Status s = bench.Run();
  if (!s.ok()) {
    std::fprintf(stderr, "cluster_planner_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
