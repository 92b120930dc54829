#include "server/cache_host/cache_host_metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <exception>
#include <iterator>
#include <string_view>
#include <utility>

#include "server/cache_host/eviction_policy.h"
#include "server/cache_host/host_page_pool.h"

namespace kvfabric::cache_host {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr std::string_view kPrefix = "kvfabric_cache_host_";

using Sample = metrics::MetricSample;

void Emit(std::vector<MetricFamily>& out, MetricType type, std::string_view name,
          std::string_view help, std::vector<Sample> samples) {
  metrics::AppendFamily(out, kPrefix, type, name, help, std::move(samples));
}

void Gauge(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
           std::vector<Sample> samples) {
  Emit(out, MetricType::Gauge, name, help, std::move(samples));
}

void Counter(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
             std::vector<Sample> samples) {
  Emit(out, MetricType::Counter, name, help, std::move(samples));
}

Sample S(double value, std::vector<ClientMetric::Label> labels = {}) {
  return Sample{value, std::move(labels)};
}

double Bool(bool b) { return b ? 1.0 : 0.0; }

// One sample per eviction action of `counts` (indexed by EvictionAction),
// labelled `label`="drop-host-copy" / "demote" / "evict".
std::vector<Sample> ByAction(const std::uint64_t (&counts)[4], const std::string& label) {
  std::vector<Sample> out;
  for (EvictionAction action :
       {EvictionAction::kDropHostCopy, EvictionAction::kDemote, EvictionAction::kEvict}) {
    out.push_back(S(counts[static_cast<std::size_t>(action)],
                    {{label, std::string(EvictionActionName(action))}}));
  }
  return out;
}

// The names ServingStateName (cache_host_node.cc) gives, in enum order; kept
// here so that this library does not link the node.
constexpr std::array<std::pair<ServingState, std::string_view>, 4> kServingStates = {{
    {ServingState::kStarting, "starting"},
    {ServingState::kServing, "serving"},
    {ServingState::kDraining, "draining"},
    {ServingState::kStopped, "stopped"},
}};

// Length of the valid UTF-8 sequence at the start of `s`, or 0 if it is not
// one (overlong forms, surrogates and code points above U+10FFFF are invalid).
std::size_t Utf8SequenceLength(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](std::size_t i, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return i < s.size() && b(i) >= lo && b(i) <= hi;
  };
  const unsigned lead = b(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return cont(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned lo = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = lead == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned lo = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = lead == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// `tenant` as a label value: the exposition format is UTF-8, and tenant names
// are arbitrary bytes (block_key.h), so each byte that does not start a valid
// sequence is written as the four characters \xNN (NN upper-case hex).
std::string TenantLabel(std::string_view tenant) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(tenant.size());
  while (!tenant.empty()) {
    const std::size_t n = Utf8SequenceLength(tenant);
    if (n == 0) {
      const auto byte = static_cast<unsigned char>(tenant[0]);
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
      tenant.remove_prefix(1);
    } else {
      out.append(tenant.substr(0, n));
      tenant.remove_prefix(n);
    }
  }
  return out;
}

std::uint64_t NamespaceSize(const NamespaceUsage& u) {
  return u.host_bytes + u.reserved_bytes + u.nvme_bytes;
}

void EmitNamespaces(const std::vector<NamespaceUsage>& namespaces, std::size_t series,
                    std::vector<MetricFamily>& out) {
  // The `series` largest, largest first; ties by name so that the chosen set
  // does not flap between scrapes.
  std::vector<const NamespaceUsage*> order;
  order.reserve(namespaces.size());
  for (const NamespaceUsage& u : namespaces) order.push_back(&u);
  const auto larger = [](const NamespaceUsage* a, const NamespaceUsage* b) {
    const std::uint64_t sa = NamespaceSize(*a);
    const std::uint64_t sb = NamespaceSize(*b);
    return sa != sb ? sa > sb : a->tenant < b->tenant;
  };
  const std::size_t shown = std::min({order.size(), series, kMaxNamespaceSeries});
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    larger);

  std::vector<Sample> bytes, reserved, quota, blocks, lookups;
  for (std::size_t i = 0; i < shown; ++i) {
    const NamespaceUsage& u = *order[i];
    const std::string ns = TenantLabel(u.tenant);
    bytes.push_back(S(u.host_bytes, {{"namespace", ns}, {"tier", "host"}}));
    bytes.push_back(S(u.nvme_bytes, {{"namespace", ns}, {"tier", "nvme"}}));
    reserved.push_back(S(u.reserved_bytes, {{"namespace", ns}}));
    if (u.quota_bytes != 0) quota.push_back(S(u.quota_bytes, {{"namespace", ns}}));
    blocks.push_back(S(u.host_blocks, {{"namespace", ns}, {"tier", "host"}}));
    blocks.push_back(S(u.nvme_blocks, {{"namespace", ns}, {"tier", "nvme"}}));
    lookups.push_back(S(u.hits, {{"namespace", ns}, {"result", "hit"}}));
    lookups.push_back(S(u.misses, {{"namespace", ns}, {"result", "miss"}}));
  }
  std::uint64_t other_host = 0, other_nvme = 0, other_reserved = 0;
  for (std::size_t i = shown; i < order.size(); ++i) {
    other_host += order[i]->host_bytes;
    other_nvme += order[i]->nvme_bytes;
    other_reserved += order[i]->reserved_bytes;
  }

  Gauge(out, "namespaces", "Namespaces (tenants) the block index knows, with or without series.",
        {S(namespaces.size())});
  Gauge(out, "namespace_bytes",
        "Bytes of a namespace's blocks by tier: host = resident whole pages, nvme = record bytes "
        "on NVMe. Only the largest namespaces (--metrics-namespace-series of them, at most 256; "
        "none by default); the rest are in namespace_other_bytes.",
        std::move(bytes));
  Gauge(out, "namespace_reserved_bytes",
        "Host bytes (whole pages) a namespace has reserved for writes in flight.",
        std::move(reserved));
  Gauge(out, "namespace_quota_bytes",
        "A namespace's quota on host bytes (resident + reserved); only namespaces with a quota.",
        std::move(quota));
  Gauge(out, "namespace_blocks", "Blocks of a namespace with a copy in the tier.",
        std::move(blocks));
  Counter(out, "namespace_lookups_total",
          "Lease entries of a namespace that found (hit) or did not find (miss) their block.",
          std::move(lookups));
  Gauge(out, "namespace_other_bytes",
        "Bytes of the namespaces without series of their own, summed, by tier (host, nvme, "
        "reserved).",
        {S(other_host, {{"tier", "host"}}), S(other_nvme, {{"tier", "nvme"}}),
         S(other_reserved, {{"tier", "reserved"}})});
}

}  // namespace

const std::vector<double>& TransferSecondsBuckets() {
  static const std::vector<double> kBuckets = {
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5,    10,
  };
  return kBuckets;
}

const std::vector<double>& TransferSizeBuckets() {
  static const std::vector<double> kBuckets = [] {
    std::vector<double> b;
    for (double v = 4096; v <= 256.0 * 1024 * 1024; v *= 4) b.push_back(v);
    return b;
  }();
  return kBuckets;
}

std::vector<MetricFamily> SnapshotFamilies(const CacheHostSnapshot& s, std::size_t namespace_series) {
  std::vector<MetricFamily> out;
  out.reserve(64);

  // ---- Daemon ----
  std::vector<Sample> serving;
  for (const auto& [state, name] : kServingStates) {
    serving.push_back(S(Bool(s.state == state), {{"state", std::string(name)}}));
  }
  Gauge(out, "serving", "1 for the daemon's serving state (starting, serving, draining, stopped).",
        std::move(serving));
  Gauge(out, "uptime_seconds", "Seconds since the daemon started.", {S(s.uptime_us / 1e6)});
  Gauge(out, "eviction_policy_info", "1, labelled with the eviction policy (--eviction-policy).",
        {S(1, {{"policy", s.policy}})});
  Gauge(out, "memory_locked", "1 if the host pool is locked in RAM (mlock), 0 if it may swap.",
        {S(Bool(s.memory_locked))});
  Gauge(out, "data_plane_endpoints", "Transport endpoints (client connections) the data plane has.",
        {S(s.data_plane_endpoints)});
  const DataPlaneStats& dp = s.data_plane;
  Counter(out, "data_connections_refused_total",
          "Data-plane connections closed at accept: over --max-data-connections or "
          "--max-data-connections-per-host.",
          {S(dp.connections_refused)});
  Counter(
      out, "data_connections_closed_total",
      "Data-plane connections the daemon closed, by reason: idle (--data-idle-timeout), "
      "overloaded (requests plus unread replies over --max-requests-per-connection), "
      "transfer_timeout (--transfer-timeout), unauthenticated (a request before a good session "
      "proof, --data-plane-auth).",
      {S(dp.closed_idle, {{"reason", "idle"}}), S(dp.closed_overloaded, {{"reason", "overloaded"}}),
       S(dp.closed_transfer_timeout, {{"reason", "transfer_timeout"}}),
       S(dp.closed_unauthenticated, {{"reason", "unauthenticated"}})});
  Counter(out, "data_stores_total",
          "kStore requests answered (one data-plane round trip: reserve, pull, CRC check, "
          "commit), and the blocks they committed.",
          {S(dp.stores, {{"what", "requests"}}), S(dp.stored_blocks, {{"what", "blocks"}})});
  Counter(out, "data_sessions_verified_total",
          "Data-plane connections that proved a gRPC session (kHello, --data-plane-auth).",
          {S(dp.sessions_verified)});
  Counter(out, "transfers_refused_total",
          "Data-plane requests refused before moving bytes (unknown grant, wrong token, range "
          "outside the grant).",
          {S(s.transfers_refused)});
  Gauge(out, "grants_active", "Write and read grants (client lease ids) not yet ended.",
        {S(s.grants_active)});
  Counter(out, "grants_expired_total", "Grants ended by their TTL rather than by the client.",
          {S(s.grants_expired)});

  // ---- Host page pool ----
  const PagePoolCounts& p = s.pages;
  Gauge(out, "pool_pages", "Host pool pages by state; the states sum to the pool's pages.",
        {S(p.free, {{"state", std::string(PageStateName(PageState::kFree))}}),
         S(p.reserved, {{"state", std::string(PageStateName(PageState::kReserved))}}),
         S(p.committed, {{"state", std::string(PageStateName(PageState::kCommitted))}}),
         S(p.staging, {{"state", std::string(PageStateName(PageState::kStaging))}})});
  Gauge(out, "pool_leased_pages",
        "Host pool pages pinned by a read lease or a demotion in flight (also counted by state).",
        {S(p.leased)});
  Gauge(out, "pool_page_bytes", "Bytes of one host pool page (--host-page-bytes).",
        {S(s.page_bytes)});
  Gauge(out, "pool_free_extents",
        "Runs of contiguous free pages (1: all free pages are contiguous; more: fragmented).",
        {S(p.free_extents)});
  Gauge(out, "pool_largest_free_extent_pages", "Pages in the longest run of free pages.",
        {S(p.largest_free_extent)});
  Counter(
      out, "pool_allocations_total",
      "Page allocations, by whether the pages came as one run or were split into several.",
      {S(p.allocations - std::min(p.allocations, p.split_allocations), {{"layout", "contiguous"}}),
       S(p.split_allocations, {{"layout", "split"}})});
  Counter(out, "pool_allocation_refusals_total",
          "Page allocations refused because the free pages could not hold the block.",
          {S(p.allocation_refusals)});

  // ---- Tiers ----
  Gauge(
      out, "tier_bytes",
      "Bytes of committed blocks by tier: host = committed pages x page bytes, nvme = record "
      "bytes of live blocks.",
      {S(static_cast<double>(p.committed) * static_cast<double>(s.page_bytes), {{"tier", "host"}}),
       S(s.nvme.live_bytes, {{"tier", "nvme"}})});
  Gauge(out, "tier_capacity_bytes", "Capacity of each tier in bytes (nvme: 0 without a tier).",
        {S(static_cast<double>(p.pages) * static_cast<double>(s.page_bytes), {{"tier", "host"}}),
         S(s.nvme_enabled ? s.nvme_capacity_bytes : 0, {{"tier", "nvme"}})});
  Gauge(out, "nvme_enabled", "1 if the daemon has an NVMe tier (--nvme-dir).",
        {S(Bool(s.nvme_enabled))});

  // ---- Lease table ----
  const LeaseTableCounters& t = s.table;
  Counter(out, "reservations_total", "Write reservations granted (one per block).",
          {S(t.reservations)});
  Counter(out, "reservations_refused_total",
          "Write reservations refused: quota = the namespace's --quota, pool = no room even after "
          "eviction.",
          {S(t.quota_refusals, {{"reason", "quota"}}), S(t.pool_refusals, {{"reason", "pool"}})});
  Counter(out, "commits_total", "Blocks committed (payload CRC matched, block published).",
          {S(t.commits)});
  Counter(out, "commit_conflicts_total",
          "Reservations refused because the block was committed or reserved by another writer "
          "(first writer wins).",
          {S(t.already_exists)});
  Counter(out, "lease_lookups_total",
          "Lease entries by outcome: hit = in the host pool, miss = not cached, nvme = only on "
          "NVMe (staged first).",
          {S(t.hits, {{"result", "hit"}}), S(t.misses, {{"result", "miss"}}),
           S(t.nvme_only, {{"result", "nvme"}})});
  Gauge(out, "leases_active", "Live lease-table entries: write = reservations, read = read leases.",
        {S(t.active_reservations, {{"kind", "write"}}), S(t.active_leases, {{"kind", "read"}})});
  Counter(
      out, "leases_expired_total",
      "Lease-table entries ended by their TTL: write = reservations never committed, read = "
      "read leases never released.",
      {S(t.reservations_expired, {{"kind", "write"}}), S(t.leases_expired, {{"kind", "read"}})});
  Counter(out, "deletes_total", "Blocks deleted on request.", {S(t.deletes)});

  // ---- Eviction, demotion, promotion ----
  Counter(out, "evictions_total",
          "Blocks the eviction policy moved out of the host pool, by action: drop-host-copy (NVMe "
          "copy kept), demote (copied to NVMe), evict (dropped from the cache).",
          ByAction(s.evictions_by_action, "reason"));
  Gauge(out, "pages_demoting", "Host pages pinned by demotions in flight.", {S(t.pages_demoting)});
  Counter(out, "demotions_total", "Host-to-NVMe copies by stage.",
          {S(t.demotions_started, {{"result", "started"}}),
           S(t.demotions_completed, {{"result", "completed"}}),
           S(t.demotions_aborted, {{"result", "aborted"}})});
  Counter(out, "promotions_total", "NVMe-to-host staging reads by stage.",
          {S(t.promotions_started, {{"result", "started"}}),
           S(t.promotions_completed, {{"result", "completed"}}),
           S(t.promotions_failed, {{"result", "failed"}})});
  Counter(out, "staging_reads_total", "NVMe reads that staged a block into host pages for a lease.",
          {S(s.staging_reads)});
  Counter(out, "staging_waits_total",
          "Leases that found another lease staging the same block from NVMe and waited for its "
          "read (instead of reading it again or refusing the block).",
          {S(s.staging_waits)});
  Counter(
      out, "crc_failures_total",
      "Payloads that failed their CRC32C: commit = the client's bytes in the pages (not "
      "published), nvme_read = a block read from NVMe (removed).",
      {S(t.crc_failures, {{"where", "commit"}}), S(s.nvme.crc_failures, {{"where", "nvme_read"}})});

  // ---- NVMe tier ----
  const NvmeTierStats& n = s.nvme;
  Counter(out, "nvme_bytes_written_total", "Record bytes (padded) of demotions made durable.",
          {S(n.bytes_written)});
  Counter(out, "nvme_group_syncs_total", "fdatasync calls issued by NVMe group commits.",
          {S(n.group_syncs)});
  Counter(out, "nvme_group_commits_total", "NVMe group commits (demotions written together).",
          {S(n.groups)});
  Counter(out, "nvme_demotions_failed_total", "Demotions the NVMe tier failed to make durable.",
          {S(n.demotions_failed)});
  Gauge(out, "nvme_demotion_backing_off",
        "1 while demotion to NVMe is off after failures (a full or failing disk: eviction drops "
        "host-only blocks instead, retried after 1 s doubling to 30 s); 0 when the tier takes "
        "blocks.",
        {S(s.demotion_backing_off ? 1.0 : 0.0)});
  Counter(out, "nvme_read_errors_total", "NVMe reads that failed with an I/O error (block kept).",
          {S(n.read_errors)});
  Gauge(out, "nvme_segments", "NVMe segment files.", {S(n.segments)});
  Gauge(out, "nvme_used_bytes", "Bytes the NVMe segment files occupy (live and dead records).",
        {S(n.used_bytes)});
  Gauge(out, "nvme_live_blocks", "Blocks on NVMe that can be read.", {S(n.live_blocks)});

  // ---- Recovery (facts about this start, hence gauges) ----
  const NvmeRecoveryReport& r = s.recovery;
  Gauge(out, "recovered_blocks", "Intact NVMe blocks recovered at start-up.", {S(r.recovered)});
  Gauge(out, "recovery_dropped_blocks",
        "NVMe blocks dropped at start-up: torn = incomplete record, corrupt = failed CRC, "
        "duplicate = older copy of a key, orphan = no catalog record.",
        {S(r.dropped_torn, {{"reason", "torn"}}), S(r.dropped_corrupt, {{"reason", "corrupt"}}),
         S(r.dropped_duplicate, {{"reason", "duplicate"}}),
         S(s.recovery_orphans, {{"reason", "orphan"}})});

  // ---- Compact converter (compact_converter.h; zero with --compact-threads=0) ----
  const CompactConversionStats& c = s.compact;
  Gauge(out, "compact_threads",
        "Threads converting exact blocks to compact copies (--compact-threads; 0: off).",
        {S(c.threads)});
  Gauge(out, "compact_queue_blocks", "Committed blocks waiting for conversion to a compact copy.",
        {S(c.queued)});
  Counter(out, "compact_converted_total", "Compact copies published beside their exact blocks.",
          {S(c.converted)});
  std::vector<Sample> failed;
  for (std::size_t i = 0; i < kCompactFailureKinds; ++i) {
    failed.push_back(
        S(c.failed[i],
          {{"reason", std::string(CompactFailureName(static_cast<CompactFailure>(i)))}}));
  }
  Counter(out, "compact_failures_total",
          "Conversions that made no copy (the block stays exact only): encode = the codec refused "
          "it (non-finite value), no_saving = the copy would not be smaller, too_large = past the "
          "converter's buffers, evicted = the block left the host pool first, error = other.",
          std::move(failed));
  Counter(out, "compact_dropped_total",
          "Pending conversions dropped because the queue was full (--compact-queue-blocks).",
          {S(c.dropped)});
  Counter(out, "compact_paused_total",
          "Times conversion was put off: free host bytes under --compact-min-free-bytes (or the "
          "high watermark's reserve) with the copy placed, or the reservation refused.",
          {S(c.paused)});
  Counter(out, "compact_paused_for_load_total",
          "Times conversion was put off because more than --compact-pause-leases read leases "
          "were held (clients' loads come first).",
          {S(c.paused_for_load)});
  Counter(out, "compact_written_bytes_total", "Payload bytes of the compact copies published.",
          {S(c.bytes_written)});
  Counter(out, "compact_source_bytes_total",
          "Payload bytes of the exact blocks that got a compact copy.",
          {S(c.exact_bytes_converted)});
  Counter(out, "compact_seconds_total",
          "Time the converter's threads spent on conversions (read, encode, publish), in seconds.",
          {S(c.seconds)});

  // ---- Compact copies eviction keeps (eviction_policy.h, "Compact copies") ----
  Gauge(out, "compact_keep_budget_bytes",
        "Host bytes compact copies may hold while eviction has taken their exact blocks' host "
        "copies (--compact-keep-bytes; 0: no preference).",
        {S(s.compact_keep_budget_bytes)});
  Gauge(out, "compact_kept_bytes",
        "Resident host bytes of the compact copies eviction kept in the pool after taking their "
        "exact blocks' host copies (at most compact_keep_budget_bytes).",
        {S(t.compact_kept_bytes)});
  Gauge(out, "compact_kept_blocks",
        "Compact copies eviction kept in the host pool after taking their exact blocks' host "
        "copies.",
        {S(t.compact_kept_blocks)});
  Counter(out, "compact_kept_evictions_total",
          "Exact blocks whose host copy eviction took while keeping their compact copy in the "
          "pool, by the exact block's action: drop-host-copy, demote, evict.",
          ByAction(s.compact_kept_by_action, "action"));
  std::vector<Sample> copies;
  for (CompactOutcome o : {CompactOutcome::kCopyOverBudget, CompactOutcome::kCopyLastResort}) {
    copies.push_back(S(s.compact_copies_evicted[static_cast<std::size_t>(o)],
                       {{"reason", std::string(CompactOutcomeName(o))}}));
  }
  Counter(out, "compact_evicted_total",
          "Compact copies eviction took out of the host pool as copies: over_budget = to keep the "
          "kept copies within --compact-keep-bytes (a newer copy ranked after them, or their "
          "exact block left with no room), last_resort = kept or held copies taken when nothing "
          "else was left. Also counted in evictions_total by action.",
          std::move(copies));

  EmitNamespaces(s.namespaces, namespace_series, out);
  return out;
}

// ---- CacheHostMetrics ----

// The Build*().Register() calls throw only for invalid or duplicate names,
// which are constants here (and every one is exercised by the tests).
CacheHostMetrics::CacheHostMetrics(SnapshotSource source, std::size_t namespace_series)
    : source_(std::move(source)),
      namespace_series_(std::min(namespace_series, kMaxNamespaceSeries)),
      registry_(std::make_shared<prometheus::Registry>()) {
  auto& seconds = prometheus::BuildHistogram()
                      .Name(std::string(kPrefix) + "transfer_seconds")
                      .Help("Duration of data-plane transfers that completed, in seconds.")
                      .Register(*registry_);
  auto& size = prometheus::BuildHistogram()
                   .Name(std::string(kPrefix) + "transfer_size_bytes")
                   .Help("Payload bytes of data-plane transfers that completed.")
                   .Register(*registry_);
  auto& bytes = prometheus::BuildCounter()
                    .Name(std::string(kPrefix) + "transfer_bytes_total")
                    .Help("Payload bytes moved by data-plane transfers that completed.")
                    .Register(*registry_);
  auto& failures = prometheus::BuildCounter()
                       .Name(std::string(kPrefix) + "transfer_failures_total")
                       .Help("Data-plane transfers that failed after they were allowed.")
                       .Register(*registry_);
  const std::array<std::pair<Direction*, const char*>, 2> directions = {{
      {&put_, "put"},
      {&get_, "get"},
  }};
  for (const auto& [direction, name] : directions) {
    const prometheus::Labels labels = {{"direction", name}};
    direction->seconds = &seconds.Add(labels, TransferSecondsBuckets());
    direction->size = &size.Add(labels, TransferSizeBuckets());
    direction->bytes = &bytes.Add(labels);
    direction->failures = &failures.Add(labels);
  }
}

CacheHostMetrics::~CacheHostMetrics() = default;

std::vector<MetricFamily> CacheHostMetrics::Collect() const {
  std::vector<MetricFamily> families;
  if (source_) families = SnapshotFamilies(source_(), namespace_series_);
  std::vector<MetricFamily> transfers = registry_->Collect();
  families.insert(families.end(), std::make_move_iterator(transfers.begin()),
                  std::make_move_iterator(transfers.end()));
  return families;
}

void CacheHostMetrics::ObserveTransfer(bool write, std::uint64_t bytes, std::uint64_t micros,
                                       const Status& status) {
  const Direction& d = write ? put_ : get_;
  if (!status.ok()) {
    d.failures->Increment();
    return;
  }
  d.seconds->Observe(static_cast<double>(micros) / 1e6);
  d.size->Observe(static_cast<double>(bytes));
  d.bytes->Increment(static_cast<double>(bytes));
}

TransferObserver CacheHostMetrics::ObserverFor(const std::shared_ptr<CacheHostMetrics>& self) {
  return [weak = std::weak_ptr<CacheHostMetrics>(self)](
             bool write, std::uint64_t bytes, std::uint64_t micros, const Status& status) {
    if (std::shared_ptr<CacheHostMetrics> metrics = weak.lock()) {
      metrics->ObserveTransfer(write, bytes, micros, status);
    }
  };
}

}  // namespace kvfabric::cache_host
