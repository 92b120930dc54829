#include "client/client_prometheus.h"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "metrics/exposition.h"

namespace kvfabric::client {
namespace {

using metrics::MetricSample;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr std::string_view kPrefix = "kvfabric_client_";
constexpr std::array<std::string_view, 4> kKinds = {"recompute_all", "fetch_all", "split", "mixed"};

void Gauge(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
           std::vector<MetricSample> samples) {
  metrics::AppendFamily(out, kPrefix, MetricType::Gauge, name, help, std::move(samples));
}

void Counter(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
             std::vector<MetricSample> samples) {
  metrics::AppendFamily(out, kPrefix, MetricType::Counter, name, help, std::move(samples));
}

MetricSample S(double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
  return MetricSample{value, std::move(labels)};
}

const std::vector<double>& RatioBuckets() {
  static const std::vector<double> kBuckets = {0.25, 0.5, 0.75, 0.85, 0.95, 1.05,
                                               1.15, 1.5, 2,    3,    4,    8};
  return kBuckets;
}

}  // namespace

int PlanKindIndex(std::string_view kind) {
  for (std::size_t i = 0; i < kKinds.size(); ++i) {
    if (kKinds[i] == kind) return static_cast<int>(i);
  }
  return -1;
}

// The Build*().Register() calls throw only for invalid or duplicate names,
// which are constants here.
ClientPrometheus::ClientPrometheus(SnapshotSource source)
    : source_(std::move(source)), registry_(std::make_shared<prometheus::Registry>()) {
  auto& seconds = prometheus::BuildHistogram()
                      .Name("kvfabric_client_transfer_seconds")
                      .Help(
                          "Duration of data-plane batches this client drove, by bus path and "
                          "direction, in seconds.")
                      .Register(*registry_);
  auto& bytes = prometheus::BuildCounter()
                    .Name("kvfabric_client_transfer_bytes_total")
                    .Help(
                        "Payload bytes this client moved over the data plane, by bus path and "
                        "direction.")
                    .Register(*registry_);
  const std::pair<Direction*, prometheus::Labels> directions[] = {
      {&fetch_, {{"path", "remote_host_to_local_host"}, {"direction", "fetch"}}},
      {&save_, {{"path", "local_host_to_remote_host"}, {"direction", "save"}}},
  };
  for (const auto& [d, labels] : directions) {
    d->seconds = &seconds.Add(labels, metrics::LatencySecondsBuckets());
    d->bytes = &bytes.Add(labels);
  }
  auto& load = prometheus::BuildHistogram()
                   .Name("kvfabric_client_load_seconds")
                   .Help(
                       "Measured time from Load to the last run landed, by plan kind, in "
                       "seconds.")
                   .Register(*registry_);
  auto& predicted_total =
      prometheus::BuildCounter()
          .Name("kvfabric_client_load_predicted_seconds_total")
          .Help("Sum of placement's predicted load times of plans placement made, by kind.")
          .Register(*registry_);
  auto& measured_total =
      prometheus::BuildCounter()
          .Name("kvfabric_client_load_measured_seconds_total")
          .Help(
              "Sum of the measured load times of the same plans, by kind (divide by the "
              "predicted sum for the plans' time ratio).")
          .Register(*registry_);
  auto& ratio = prometheus::BuildHistogram()
                    .Name("kvfabric_client_load_time_ratio")
                    .Help(
                        "Measured over predicted load time of each plan placement made, by "
                        "kind (1: exact).")
                    .Register(*registry_);
  for (std::size_t i = 0; i < kKinds.size(); ++i) {
    const prometheus::Labels labels = {{"kind", std::string(kKinds[i])}};
    kinds_[i].measured = &load.Add(labels, metrics::LatencySecondsBuckets());
    kinds_[i].predicted_total = &predicted_total.Add(labels);
    kinds_[i].measured_total = &measured_total.Add(labels);
    kinds_[i].ratio = &ratio.Add(labels, RatioBuckets());
  }
  recompute_ = &prometheus::BuildHistogram()
                    .Name("kvfabric_client_recompute_seconds")
                    .Help(
                        "Duration of each call of the engine's prefill (recompute "
                        "callback), in seconds.")
                    .Register(*registry_)
                    .Add({}, metrics::LatencySecondsBuckets());
}

ClientPrometheus::~ClientPrometheus() = default;

void ClientPrometheus::ObserveTransfer(bool save, std::uint64_t bytes, double micros) {
  const Direction& d = save ? save_ : fetch_;
  d.seconds->Observe(micros / 1e6);
  d.bytes->Increment(static_cast<double>(bytes));
}

void ClientPrometheus::ObserveLoad(std::string_view kind, double predicted_us, double measured_us) {
  const int k = PlanKindIndex(kind);
  if (k < 0) return;
  Kind& s = kinds_[static_cast<std::size_t>(k)];
  s.measured->Observe(measured_us / 1e6);
  if (predicted_us < 0) return;
  s.predicted_total->Increment(predicted_us / 1e6);
  s.measured_total->Increment(measured_us / 1e6);
  if (predicted_us > 0) s.ratio->Observe(measured_us / predicted_us);
}

void ClientPrometheus::Detach() {
  MutexLock l(&source_mu_);
  source_ = nullptr;
}

void ClientPrometheus::ObserveRecompute(double micros) { recompute_->Observe(micros / 1e6); }

std::vector<MetricFamily> ClientPrometheus::Collect() const {
  std::vector<MetricFamily> out;
  std::optional<Snapshot> taken;
  {
    MutexLock l(&source_mu_);
    if (source_) taken = source_();
  }
  if (taken) {
    const Snapshot& snap = *taken;
    const ClientMetrics& m = snap.client;
    const DeviceArenaMetrics& a = snap.arena;
    Counter(out, "matches_total", "Match calls answered (by placement or planned locally).",
            {S(m.matches)});
    Counter(out, "plans_total", "Plans this client executed, by kind.",
            {S(m.plans_recompute_all, {{"kind", "recompute_all"}}),
             S(m.plans_fetch_all, {{"kind", "fetch_all"}}), S(m.plans_split, {{"kind", "split"}}),
             S(m.plans_mixed, {{"kind", "mixed"}})});
    Counter(out, "plans_local_total",
            "Matches planned locally (recompute everything) because placement did not answer.",
            {S(m.placement_unavailable)});
    Counter(out, "placement_calls_skipped_total",
            "Plan and Place calls not made while placement was backing off after it did not "
            "answer (1 s doubling to 30 s, jittered).",
            {S(m.placement_calls_skipped)});
    Counter(out, "blocks_fetched_total", "Blocks fetched from daemons into histories.",
            {S(m.blocks_fetched)});
    Counter(out, "compact_blocks_fetched_total",
            "Blocks fetched as their compact_int8 copies (compact_after requests), of "
            "blocks_fetched_total.",
            {S(m.compact_blocks_fetched)});
    Counter(out, "compact_bytes_fetched_total",
            "Bytes of compact_int8 copies fetched (compact_after requests).",
            {S(m.compact_bytes_fetched)});
    Counter(out, "plans_compact_total",
            "Plans with at least one run of compact copies (compact_after requests).",
            {S(m.plans_with_compact)});
    Counter(out, "blocks_recomputed_total",
            "Blocks produced by the engine's prefill (planned, or after a failed fetch).",
            {S(m.blocks_recomputed)});
    Counter(out, "tokens_recomputed_total", "Tokens produced by the engine's prefill.",
            {S(m.tokens_recomputed)});
    Counter(out, "fallbacks_total",
            "Runs (or parts of runs) whose planned fetch failed, by what served them instead "
            "(replica: another daemon; recompute: the engine's prefill).",
            {S(m.fallbacks_to_replica, {{"to", "replica"}}),
             S(m.fallbacks_to_recompute, {{"to", "recompute"}})});
    Counter(out, "blocks_fallen_back_total", "Blocks recomputed after a failed fetch.",
            {S(m.blocks_fallen_back)});
    Counter(out, "streams_cut_total",
            "Daemon streams of a load cut as stragglers (straggler_factor), their unlanded blocks "
            "falling back: past their cut-off, or projected past it from the rate they moved.",
            {S(m.streams_cut_past_cut_off, {{"why", "past_cut_off"}}),
             S(m.streams_cut_projected, {{"why", "projected"}})});
    Counter(out, "crc_failures_total",
            "Fetched blocks whose bytes did not match their committed CRC32C (refetched or "
            "recomputed, never used).",
            {S(m.crc_failures)});
    Counter(out, "fetch_bytes_checked_by_daemon_total",
            "Fetched bytes whose CRC32C the daemon checked where they landed in the history "
            "pool (daemon_checks_landing; the client checked the rest of bytes_fetched itself).",
            {S(m.bytes_checked_by_daemon)});
    Counter(out, "stale_entries_reported_total",
            "Directory entries reported to placement as stale (the daemon no longer had them).",
            {S(m.stale_entries_reported)});
    Counter(out, "saves_total",
            "Full blocks at the end of write-back, by outcome (written: stored by this client; "
            "cached: the cluster already held it; failed: not written back).",
            {S(m.blocks_saved, {{"outcome", "written"}}),
             S(m.blocks_already_cached, {{"outcome", "cached"}}),
             S(m.save_failures, {{"outcome", "failed"}})});
    Counter(out, "attends_total", "Attend calls (decode attention over a history).",
            {S(m.attends)});
    Counter(out, "attend_seconds_total", "Time spent in Attend, in seconds.",
            {S(m.attend_us / 1e6)});
    Gauge(out, "history_pool_pages",
          "History pool pages (one block each) by state: in_use by open contexts, or free.",
          {S(m.history_pages_in_use, {{"state", "in_use"}}),
           S(m.history_pool_pages - std::min(m.history_pool_pages, m.history_pages_in_use),
             {{"state", "free"}})});
    Gauge(out, "history_pool_page_bytes", "Bytes of one history pool page (one block).",
          {S(static_cast<double>(snap.block_bytes))});
    Gauge(out, "history_pool_peak_pages_in_use", "Most history pool pages in use at once.",
          {S(m.peak_history_pages_in_use)});
    const std::uint32_t reserved = a.committed_pages - std::min(a.committed_pages, a.held_pages);
    Gauge(out, "arena_pages",
          "Device arena pool pages by state: held (mapped for a context), reserved (promised "
          "to admitted contexts, not mapped), free.",
          {S(a.held_pages, {{"state", "held"}}), S(reserved, {{"state", "reserved"}}),
           S(a.free_pages, {{"state", "free"}})});
    Gauge(out, "arena_staging_pages", "Device arena staging pages by state.",
          {S(a.staging_in_use, {{"state", "in_use"}}),
           S(a.staging_pages - std::min(a.staging_pages, a.staging_in_use), {{"state", "free"}})});
    Gauge(out, "arena_contexts", "Contexts admitted to the device arena.", {S(a.contexts)});
    Counter(out, "arena_refusals_total",
            "Device arena refusals, by what was refused (admission of a context, a page, a "
            "staging buffer).",
            {S(a.admission_refusals, {{"what", "admission"}}),
             S(a.page_refusals, {{"what", "page"}}), S(a.staging_refusals, {{"what", "staging"}})});
  }
  std::vector<MetricFamily> observed = registry_->Collect();
  out.insert(out.end(), std::make_move_iterator(observed.begin()),
             std::make_move_iterator(observed.end()));
  out.push_back(metrics::BuildInfoFamily("client"));
  return out;
}

}  // namespace kvfabric::client
