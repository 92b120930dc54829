#include "server/cache_host/cache_host_node.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/block_format.h"
#include "core/mutex.h"
#include "core/units.h"
#include "server/cache_host/data_plane.h"
#include "server/cache_host/node_keys.h"
#include "server/cache_host/nvme_catalog.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {

using internal::Ns;

std::string_view EvictionPolicyKindName(EvictionPolicyKind kind) {
  return kind == EvictionPolicyKind::kLru ? "lru" : "cost-aware";
}

StatusOr<EvictionPolicyKind> ParseEvictionPolicyKind(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::kLru;
  if (name == "cost-aware") return EvictionPolicyKind::kCostAware;
  return Status::InvalidArgument("--eviction-policy \"" + std::string(name) +
                                 "\": expected lru or cost-aware");
}

std::string_view ServingStateName(ServingState state) {
  switch (state) {
    case ServingState::kStarting:
      return "starting";
    case ServingState::kServing:
      return "serving";
    case ServingState::kDraining:
      return "draining";
    case ServingState::kStopped:
      return "stopped";
  }
  return "unknown";
}

CacheHostNode::CacheHostNode(CacheHostOptions options, transport::Transport* transport, Env* env)
    : options_(std::move(options)),
      transport_(transport),
      env_(env),
      start_us_(env->NowMicros()) {}

Status CacheHostNode::ReloadCostModel(const CostAwareOptions& figures) {
  auto* cost_aware = dynamic_cast<CostAwarePolicy*>(policy_.get());
  if (cost_aware == nullptr) {
    return Status::FailedPrecondition("eviction policy " + std::string(policy_->name()) +
                                      " uses no cost figures (--eviction-policy)");
  }
  return cost_aware->Update(figures);
}

StatusOr<std::string> CacheHostNode::CheckOptions(const CacheHostOptions& options) {
  if (options.host_id.empty()) return Status::InvalidArgument("--host-id must not be empty");
  KVF_RETURN_IF_ERROR(options.watermarks.Validate());
  KVF_RETURN_IF_ERROR(ValidatePoolSizes(options.pool));
  if (options.default_ttl_us == 0 || options.default_ttl_us > options.leases.max_ttl_us) {
    return Status::InvalidArgument("default TTL " + std::to_string(options.default_ttl_us) +
                                   " us must be in (0, --max-lease-ttl]");
  }
  if (options.reservation_ttl_us == 0 || options.reservation_ttl_us > options.leases.max_ttl_us) {
    return Status::InvalidArgument("--reservation-ttl " +
                                   std::to_string(options.reservation_ttl_us) +
                                   " us must be in (0, --max-lease-ttl]");
  }
  if (!options.nvme.dir.empty() && options.nvme.capacity_bytes == 0) {
    return Status::InvalidArgument("--nvme-capacity-bytes is required with --nvme-dir");
  }
  if (!options.nvme.dir.empty()) {
    // The tier's own checks, at the smallest alignment a device may ask for
    // (Open repeats them with the device's).
    KVF_RETURN_IF_ERROR(ValidateNvmeTierOptions(options.nvme, Env::kDefaultDirectIoAlignment));
  }
  const CompactKeepOptions& keep = options.leases.compact_keep;
  KVF_RETURN_IF_ERROR(keep.Validate(options.pool.pool_bytes));
  KVF_ASSIGN_OR_RETURN(std::string out, DescribePoolArithmetic(options.pool, options.models,
                                                               options.watermarks.high));
  if (keep.budget_bytes == 0) {
    return out + "compact copies: no eviction preference (--compact-keep-bytes 0)\n";
  }
  const std::uint64_t page = options.pool.page_bytes;
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%.1f%%",
                100.0 * static_cast<double>(keep.budget_bytes) /
                    static_cast<double>(options.pool.pool_bytes));
  return out + "compact copies: eviction keeps up to " + FormatBytesExact(keep.budget_bytes) +
         " = " + std::to_string(keep.budget_bytes / page) + " pages x " + FormatBytes(page) + " (" +
         percent + " of the host pool; --compact-keep-bytes) of " + keep.codec +
         " copies whose exact blocks it took out of the pool; kept bytes <= budget\n";
}

StatusOr<std::unique_ptr<CacheHostNode>> CacheHostNode::Create(CacheHostOptions options,
                                                               transport::Transport* transport,
                                                               Env* env) {
  KVF_RETURN_IF_ERROR(CheckOptions(options).status());
  std::unique_ptr<CacheHostNode> node(new CacheHostNode(std::move(options), transport, env));
  KVF_RETURN_IF_ERROR(node->Start());
  return node;
}

Status CacheHostNode::Start() {
  KVF_ASSIGN_OR_RETURN(arithmetic_, CheckOptions(options_));
  const std::uint64_t pool_bytes =
      options_.pool.pool_bytes / options_.pool.page_bytes * options_.pool.page_bytes;
  PoolMemory memory;
  if (options_.transport_allocates_pool) {
    KVF_ASSIGN_OR_RETURN(pool_region_,
                         transport_->AllocateMemory(pool_bytes, transport::MemoryKind::kHost));
    memory.bytes = pool_region_->bytes();
  } else {
    KVF_ASSIGN_OR_RETURN(memory, AllocateAnonymousPoolMemory(pool_bytes, options_.huge_pages));
    pool_owner_ = memory.owner;
    KVF_ASSIGN_OR_RETURN(pool_region_,
                         transport_->RegisterMemory(memory.bytes, transport::MemoryKind::kHost));
  }
  KVF_ASSIGN_OR_RETURN(pool_, HostPagePool::Create(options_.pool, memory));
  for (const std::string& line : Split(arithmetic_)) spdlog::info("{}", line);
  if (options_.prefault) {
    spdlog::info("host pool: {}", pool_->PreFault(env_).ToString());
  }
  if (options_.policy == EvictionPolicyKind::kLru) {
    policy_ = std::make_unique<LruPolicy>();
  } else {
    if (options_.cost_aware.host_fetch.beta_bytes_per_s <= 0 ||
        options_.cost_aware.nvme_fetch.beta_bytes_per_s <= 0) {
      return Status::InvalidArgument("cost-aware eviction needs bandwidths > 0 (calibration)");
    }
    policy_ = std::make_unique<CostAwarePolicy>(options_.cost_aware);
  }
  // Per-namespace byte caps left at 0: half the pool each, so one tenant can
  // never reserve or pin everything (LeaseTableOptions).
  if (options_.leases.max_reserved_bytes_per_namespace == 0) {
    options_.leases.max_reserved_bytes_per_namespace = pool_->pool_bytes() / 2;
  }
  if (options_.leases.max_leased_bytes_per_namespace == 0) {
    options_.leases.max_leased_bytes_per_namespace = pool_->pool_bytes() / 2;
  }
  table_ = std::make_unique<LeaseTable>(
      pool_.get(), [env = env_] { return env->NowMicros(); }, options_.leases);
  for (const auto& [tenant, bytes] : options_.quotas) {
    KVF_RETURN_IF_ERROR(table_->SetQuota(Ns(tenant), bytes).WithContext("--quota " + tenant));
  }
  if (!options_.nvme.dir.empty()) KVF_RETURN_IF_ERROR(RecoverNvme());
  KVF_ASSIGN_OR_RETURN(data_plane_,
                       DataPlane::Start(this, transport_, options_.transport_address,
                                        options_.data_plane, [env = env_] { return env->NowMicros(); }));
  maintenance_ = std::thread([this] { MaintenanceLoop(); });
  state_.store(ServingState::kServing);
  spdlog::info("cache host {}: serving; data plane on {} ({}), eviction {}, NVMe tier {}",
               options_.host_id, data_plane_->address(), transport_->name(), policy_->name(),
               nvme_ ? options_.nvme.dir : std::string("off"));
  return Status::OK();
}

std::vector<std::string> CacheHostNode::Split(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string CacheHostNode::transport_address() const {
  return data_plane_ ? data_plane_->address() : std::string();
}

std::uint64_t CacheHostNode::NowUs() const { return env_->NowMicros(); }

std::uint64_t CacheHostNode::EffectiveTtl(std::uint64_t ttl_us) const {
  return ttl_us == 0 ? options_.default_ttl_us : ttl_us;
}

std::vector<ByteExtent> CacheHostNode::ExtentsOf(const PageRuns& pages,
                                                 std::uint64_t bytes) const {
  std::vector<ByteExtent> out;
  std::uint64_t left = bytes;
  for (const PageRun& r : pages) {
    if (left == 0) break;
    const std::uint64_t run_bytes = std::uint64_t{r.count} * pool_->page_bytes();
    const std::uint64_t len = std::min(run_bytes, left);
    out.push_back({std::uint64_t{r.first} * pool_->page_bytes(), len});
    left -= len;
  }
  return out;
}

Status CacheHostNode::CheckAdmitting() const {
  switch (state_.load()) {
    case ServingState::kServing:
      return Status::OK();
    case ServingState::kStarting:
      return Status::Unavailable("cache host " + options_.host_id + " is starting");
    case ServingState::kDraining:
      return Status::Unavailable("cache host " + options_.host_id +
                                 " is draining: no new reservations or leases");
    case ServingState::kStopped:
      break;
  }
  return Status::Unavailable("cache host " + options_.host_id + " is stopped");
}

// ---------------------------------------------------------------- Reserve

StatusOr<ReserveBatch> CacheHostNode::Reserve(const Namespace& ns,
                                              std::span<const ReserveEntry> entries,
                                              std::uint64_t ttl_us) {
  return ReserveImpl(ns, entries, ttl_us, /*make_room=*/true);
}

StatusOr<ReserveBatch> CacheHostNode::ReserveImpl(const Namespace& ns,
                                                  std::span<const ReserveEntry> entries,
                                                  std::uint64_t ttl_us, bool make_room) {
  KVF_RETURN_IF_ERROR(CheckAdmitting());
  ttl_us = std::min(ttl_us == 0 ? options_.reservation_ttl_us : ttl_us,
                    options_.reservation_ttl_us);
  ReserveBatch out;
  out.results.resize(entries.size());
  Grant grant;
  grant.write = true;
  grant.tenant = ns.tenant;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ReserveEntry& e = entries[i];
    auto r = table_->Reserve(ns, e.key, e.meta, ttl_us);
    // Make room among this namespace's own blocks, wait for the demotions
    // that started (ours or a background pass's), and retry, until the block
    // fits, nothing more can be freed, or reserve_wait has passed. A pass
    // frees pages until the pool can hold the block; over a quota it must
    // also free what brings the namespace back under it: pages_needed = free
    // pages + the overshoot.
    const auto give_up = std::chrono::steady_clock::now() + options_.reserve_wait;
    while (make_room && !r.ok() && r.status().code() == StatusCode::kResourceExhausted &&
           std::chrono::steady_clock::now() < give_up) {
      const std::uint64_t block_pages = pool_->PagesFor(e.meta.bytes);
      std::uint64_t pages = block_pages;
      if (auto usage = table_->Usage(ns); usage.ok() && usage->quota_bytes > 0) {
        const std::uint64_t want =
            usage->host_bytes + usage->reserved_bytes + block_pages * pool_->page_bytes();
        if (want > usage->quota_bytes) {
          const std::uint64_t over = (want - usage->quota_bytes + pool_->page_bytes() - 1) /
                                     pool_->page_bytes();
          pages = std::max(pages, pool_->Counts().free + over);
        }
      }
      const bool progress = MakeRoomAndWait(ns, pages, give_up);
      r = table_->Reserve(ns, e.key, e.meta, ttl_us);
      if (!progress) break;  // nothing evictable and nothing in flight: refuse now
    }
    if (!r.ok()) {
      out.results[i].status = r.status();
      continue;
    }
    out.results[i].extents = ExtentsOf(r->pages, e.meta.bytes);
    grant.blocks.push_back({e.key, r->id, r->pages, e.meta.bytes});
  }
  if (grant.blocks.empty()) return out;
  MutexLock lock(&mu_);
  grant.token = NewToken();
  grant.expires_at_us = NowUs() + ttl_us;
  out.grant = {NewGrantId(), ttl_us, grant.token};
  grants_.emplace(out.grant.lease_id, std::move(grant));
  return out;
}

// ---------------------------------------------------------------- Commit

StatusOr<std::vector<Status>> CacheHostNode::Commit(const Namespace& ns, const GrantRef& ref,
                                                    std::span<const CommitEntry> entries,
                                                    bool release_uncommitted) {
  const std::uint64_t lease_id = ref.lease_id;
  // Resolve every entry to its reservation under the lock; commit (CRC over
  // the pages) outside it.
  std::vector<Status> out(entries.size());
  std::vector<std::pair<std::size_t, std::size_t>> todo;  // (entry, grant block)
  std::vector<std::uint64_t> sub_ids;
  {
    MutexLock lock(&mu_);
    auto it = FindOwnedGrant(ns, ref);
    if (it == grants_.end() || !it->second.write) {
      return Status::NotFound("write lease " + std::to_string(lease_id) +
                              " is unknown or ended (expired, released, or the daemon "
                              "restarted), or the access token is not its");
    }
    Grant& g = it->second;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      auto b = std::find_if(g.blocks.begin(), g.blocks.end(),
                            [&](const GrantBlock& gb) { return gb.key == entries[i].key; });
      if (b == g.blocks.end() || b->released) {
        out[i] = Status::NotFound("block " + entries[i].key.ToHex() +
                                  " is not reserved under lease " + std::to_string(lease_id));
      } else if (!b->committed) {
        todo.emplace_back(i, static_cast<std::size_t>(b - g.blocks.begin()));
        sub_ids.push_back(b->sub_id);
      }
    }
  }
  std::vector<Status> results(todo.size());
  for (std::size_t k = 0; k < todo.size(); ++k) {
    const CommitEntry& e = entries[todo[k].first];
    results[k] = table_->Commit(sub_ids[k], e.crc32c, e.landed_slice_crcs);
  }
  std::vector<std::uint64_t> to_abort;
  {
    MutexLock lock(&mu_);
    auto it = grants_.find(lease_id);
    for (std::size_t k = 0; k < todo.size(); ++k) {
      out[todo[k].first] = results[k];
      if (it == grants_.end()) continue;
      GrantBlock& b = it->second.blocks[todo[k].second];
      if (results[k].ok()) {
        b.committed = true;
      } else if (results[k].code() == StatusCode::kDataLoss ||
                 results[k].code() == StatusCode::kNotFound) {
        b.released = true;  // the table dropped the reservation
      }
    }
    if (it != grants_.end()) {
      bool open = false;
      for (GrantBlock& b : it->second.blocks) {
        if (b.committed || b.released) continue;
        if (release_uncommitted) {
          to_abort.push_back(b.sub_id);
          b.released = true;
        } else {
          open = true;
        }
      }
      if (!open) grants_.erase(it);
    }
  }
  for (std::uint64_t id : to_abort) table_->Abort(id).IgnoreError();  // expiry frees it otherwise
  if (has_sink_.load()) {
    std::vector<BlockEventRecord> events;
    for (std::size_t k = 0; k < todo.size(); ++k) {
      if (!results[k].ok()) continue;
      const BlockKey& key = entries[todo[k].first].key;
      auto e = table_->Lookup(ns, key);
      if (!e.ok()) continue;  // evicted or deleted already: its own event follows
      events.push_back({BlockEventKind::kCommitted, ns.tenant, key, e->meta, e->crc32c,
                        BlockTier::kHost, 0});
    }
    Emit(std::move(events));
  }
  return out;
}

// ---------------------------------------------------------------- Lease

StatusOr<LeaseBatch> CacheHostNode::Lease(const Namespace& ns, std::span<const BlockKey> keys,
                                          const LeaseRequestOptions& options) {
  KVF_RETURN_IF_ERROR(CheckAdmitting());
  const std::uint64_t ttl_us = EffectiveTtl(options.ttl_us);
  const FingerprintDigest* expected =
      options.expected_fingerprint.has_value() ? &*options.expected_fingerprint : nullptr;
  KVF_ASSIGN_OR_RETURN(ReadLease first, table_->Lease(ns, keys, ttl_us, expected,
                                                      options.layer_crcs, options.count_access));
  LeaseBatch out;
  out.results.resize(keys.size());
  std::vector<std::uint64_t> table_leases;
  if (first.id != 0) table_leases.push_back(first.id);

  // Outcomes of the first pass; NVMe-only blocks are staged, in order, and
  // (prefix_only) only up to the first key that cannot be served.
  std::size_t prefix_end = keys.size();
  std::vector<BlockKey> staged;
  std::vector<std::size_t> staged_index;
  const std::optional<NamespaceId> ns_id = table_->FindNamespace(ns);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const LeasedBlock& b = first.blocks[i];
    LeaseEntryResult& r = out.results[i];
    r.meta = b.meta;
    r.crc32c = b.crc32c;
    if (options.prefix_only && prefix_end < keys.size()) {
      r.status = Status::Aborted("not attempted: an earlier key of the prefix was not served");
      continue;
    }
    Status s;
    switch (b.outcome) {
      case LeaseOutcome::kLeased:
        r.extents = ExtentsOf(b.pages, b.bytes);
        r.layer_crc32c = std::move(first.blocks[i].layer_crc32c);
        break;
      case LeaseOutcome::kMissing:
        s = Status::NotFound("block " + b.key.ToHex() + " is not cached here");
        break;
      case LeaseOutcome::kFingerprintMismatch:
        s = Status::FailedPrecondition("block " + b.key.ToHex() +
                                       " belongs to another model fingerprint");
        break;
      case LeaseOutcome::kBusy:  // Stage waits for the other lease's staging read
      case LeaseOutcome::kNvmeOnly:
        if (options.host_only) {
          s = Status::Unavailable("block " + b.key.ToHex() +
                                  " rests on NVMe only; lease it through the control plane, "
                                  "which stages it");
          break;
        }
        s = (nvme_ && ns_id.has_value()) ? Stage(*ns_id, b.key)
                                         : Status::Internal("NVMe block without an NVMe tier");
        if (s.ok()) {
          r.staged_from_nvme = true;
          staged.push_back(b.key);
          staged_index.push_back(i);
        }
        break;
    }
    r.status = s;
    if (!s.ok() && options.prefix_only) prefix_end = i;
  }
  if (!staged.empty()) {
    auto second = table_->Lease(ns, staged, ttl_us, expected, false, options.count_access);
    if (second.ok() && second->id != 0) table_leases.push_back(second->id);
    for (std::size_t k = 0; k < staged.size(); ++k) {
      LeaseEntryResult& r = out.results[staged_index[k]];
      if (second.ok() && second->blocks[k].outcome == LeaseOutcome::kLeased) {
        r.extents = ExtentsOf(second->blocks[k].pages, second->blocks[k].bytes);
      } else {
        r.status = Status::Unavailable("block " + staged[k].ToHex() +
                                       " was evicted again while being staged; retry");
        if (options.prefix_only && staged_index[k] < prefix_end) prefix_end = staged_index[k];
      }
    }
  }
  if (options.prefix_only && prefix_end < keys.size()) {
    // Only keys[0, prefix_end) stay leased: re-lease that prefix alone.
    for (std::uint64_t id : table_leases) table_->Release(id).IgnoreError();
    table_leases.clear();
    for (std::size_t i = prefix_end + 1; i < keys.size(); ++i) {
      if (out.results[i].status.code() != StatusCode::kAborted) {
        out.results[i].status =
            Status::Aborted("not attempted: an earlier key of the prefix was not served");
      }
      out.results[i].extents.clear();
    }
    if (prefix_end > 0) {
      auto again =
          table_->Lease(ns, keys.first(prefix_end), ttl_us, expected, false, options.count_access);
      if (!again.ok()) return again.status();
      if (again->id != 0) table_leases.push_back(again->id);
      for (std::size_t i = 0; i < prefix_end; ++i) {
        const LeasedBlock& b = again->blocks[i];
        if (b.outcome == LeaseOutcome::kLeased) {
          out.results[i].extents = ExtentsOf(b.pages, b.bytes);
        } else {
          out.results[i].status = Status::Unavailable("block " + b.key.ToHex() +
                                                      " left the host pool meanwhile; retry");
          out.results[i].extents.clear();
        }
      }
    }
  }
  Grant grant;
  grant.write = false;
  grant.tenant = ns.tenant;
  grant.read_leases = table_leases;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const LeaseEntryResult& r = out.results[i];
    if (!r.status.ok() || r.extents.empty()) continue;
    // Which table lease pins it: the one whose BeginReadRange accepts it is
    // found at transfer time; record the page runs for the range lookup.
    GrantBlock gb;
    gb.key = keys[i];
    gb.bytes = r.meta.bytes;
    for (const ByteExtent& x : r.extents) {
      PageRun run{static_cast<std::uint32_t>(x.offset / pool_->page_bytes()),
                  static_cast<std::uint32_t>(pool_->PagesFor(x.length))};
      gb.pages.runs[gb.pages.size++] = run;
    }
    grant.blocks.push_back(gb);
  }
  if (grant.blocks.empty()) {
    for (std::uint64_t id : table_leases) table_->Release(id).IgnoreError();
    return out;
  }
  MutexLock lock(&mu_);
  grant.token = NewToken();
  grant.expires_at_us = NowUs() + ttl_us;
  out.grant = {NewGrantId(), ttl_us, grant.token};
  grants_.emplace(out.grant.lease_id, std::move(grant));
  return out;
}

// ---------------------------------------------------------------- Lookup / Delete

std::vector<LookupEntryResult> CacheHostNode::Lookup(const Namespace& ns,
                                                     std::span<const BlockKey> keys) {
  std::vector<LookupEntryResult> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto e = table_->Lookup(ns, keys[i]);
    if (!e.ok()) {
      out[i].status = e.status();
      continue;
    }
    out[i].meta = e->meta;
    out[i].crc32c = e->crc32c;
    out[i].tier = e->tier;
    out[i].active_leases = e->read_pins;
    out[i].hit_count = e->hit_count;
  }
  return out;
}

std::vector<Status> CacheHostNode::Delete(const Namespace& ns, std::span<const BlockKey> keys) {
  std::vector<Status> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto removed = table_->Delete(ns, keys[i]);
    if (!removed.ok()) {
      out[i] = removed.status();
      continue;
    }
    DropNvmeCopy(ns.tenant, *removed);
    if (has_sink_.load()) {
      Emit({{BlockEventKind::kDeleted, ns.tenant, keys[i], {}, 0, removed->tier, 0}});
    }
  }
  return out;
}

void CacheHostNode::set_block_event_sink(BlockEventSink sink) {
  MutexLock lock(&observer_mu_);
  event_sink_ = std::move(sink);
  has_sink_.store(static_cast<bool>(event_sink_) || static_cast<bool>(event_tap_));
}

void CacheHostNode::set_block_event_tap(BlockEventSink tap) {
  MutexLock lock(&observer_mu_);
  event_tap_ = std::move(tap);
  has_sink_.store(static_cast<bool>(event_sink_) || static_cast<bool>(event_tap_));
}

void CacheHostNode::Emit(std::vector<BlockEventRecord> events) {
  if (events.empty()) return;
  BlockEventSink sink, tap;
  {
    MutexLock lock(&observer_mu_);
    sink = event_sink_;
    tap = event_tap_;
  }
  if (tap) tap(sink ? events : std::move(events));
  if (sink) sink(std::move(events));
}

std::uint64_t CacheHostNode::active_leases() const { return table_->Counters().active_leases; }

std::uint64_t CacheHostNode::host_free_bytes() const {
  return pool_->Counts().free * pool_->page_bytes();
}

void CacheHostNode::set_transfer_observer(TransferObserver observer) {
  MutexLock lock(&observer_mu_);
  observer_ = std::move(observer);
}

void CacheHostNode::ObserveTransfer(bool write, std::uint64_t bytes, std::uint64_t micros,
                                    const Status& status) {
  MutexLock lock(&observer_mu_);
  if (observer_) observer_(write, bytes, micros, status);
}

// ---------------------------------------------------------------- State

CacheHostSnapshot CacheHostNode::Snapshot() const {
  CacheHostSnapshot s;
  s.state = state_.load();
  s.uptime_us = NowUs() - start_us_;
  s.policy = std::string(policy_->name());
  s.memory_locked = pool_->locked();
  s.page_bytes = pool_->page_bytes();
  s.pages = pool_->Counts();
  s.table = table_->Counters();
  s.namespaces = table_->Usages();
  s.nvme_enabled = nvme_ != nullptr;
  s.nvme_capacity_bytes = nvme_ ? options_.nvme.capacity_bytes : 0;
  if (nvme_) s.nvme = nvme_->stats();
  s.recovery = recovery_;
  s.recovery_orphans = recovery_orphans_;
  for (EvictionAction a :
       {EvictionAction::kDropHostCopy, EvictionAction::kDemote, EvictionAction::kEvict}) {
    s.evictions_by_action[static_cast<int>(a)] = table_->decisions().Count(a);
    s.compact_kept_by_action[static_cast<int>(a)] = table_->decisions().CountCopyKept(a);
  }
  s.compact_keep_budget_bytes = options_.leases.compact_keep.budget_bytes;
  for (CompactOutcome o : {CompactOutcome::kCopyOverBudget, CompactOutcome::kCopyLastResort}) {
    s.compact_copies_evicted[static_cast<int>(o)] = table_->decisions().CountCompact(o);
  }
  {
    MutexLock lock(&mu_);
    s.grants_active = grants_.size();
    s.grants_expired = grants_expired_;
  }
  s.staging_reads = staging_reads_.load();
  s.staging_waits = staging_waits_.load();
  s.staging_crc_failures = staging_crc_failures_.load();
  s.data_plane_endpoints = data_plane_ ? data_plane_->endpoints() : 0;
  if (data_plane_) s.data_plane = data_plane_->stats();
  s.transfers_refused = transfers_refused_.load();
  if (catalog_ != nullptr) s.catalog = catalog_->stats();
  {
    MutexLock lock(&demotion_mu_);
    s.demotion_failures = demotion_failures_;
    s.demotion_backing_off = NowUs() < demotion_backoff_until_us_;
  }
  return s;
}

std::vector<EvictionDecision> CacheHostNode::ExplainEviction(const Namespace& ns,
                                                             const BlockKey& key) const {
  return table_->Explain(ns, key);
}

std::vector<EvictionDecision> CacheHostNode::RecentEvictions(std::size_t n,
                                                             const std::string* tenant) const {
  return table_->decisions().Recent(n, tenant);
}

std::size_t CacheHostNode::eviction_log_capacity() const { return table_->decisions().capacity(); }

ServingState CacheHostNode::Drain(bool resume) {
  ServingState expected = resume ? ServingState::kDraining : ServingState::kServing;
  const ServingState next = resume ? ServingState::kServing : ServingState::kDraining;
  if (state_.compare_exchange_strong(expected, next)) {
    spdlog::info("cache host {}: {}", options_.host_id,
                 resume ? "serving again" : "draining: no new reservations or leases");
  }
  return state_.load();
}

void CacheHostNode::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(shutdown_once_, [&] {
    if (state_.load() == ServingState::kServing) state_.store(ServingState::kDraining);
    const std::uint64_t until = NowUs() + static_cast<std::uint64_t>(grace.count()) * 1000;
    for (;;) {
      std::size_t open = 0;
      {
        MutexLock lock(&mu_);
        open = grants_.size();
      }
      if (open == 0 || NowUs() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    {
      MutexLock lock(&maintenance_mu_);
      stopping_ = true;
    }
    maintenance_cv_.NotifyAll();
    if (maintenance_.joinable()) maintenance_.join();
    if (data_plane_) data_plane_->Close();
    if (nvme_) {
      // Commits what is queued (the durability rule), then stops the committer.
      nvme_->Close().IgnoreError();
    }
    state_.store(ServingState::kStopped);
    spdlog::info("cache host {}: stopped", options_.host_id);
  });
}

void CacheHostNode::MaintenanceLoop() {
  MutexLock lock(&maintenance_mu_);
  while (!stopping_) {
    maintenance_cv_.WaitFor(&maintenance_mu_, options_.maintenance_interval);
    if (stopping_) break;
    lock.Unlock();
    MaintenanceStep();
    lock.Lock();
  }
}

void CacheHostNode::TEST_RunMaintenance() { MaintenanceStep(); }

void CacheHostNode::MaintenanceStep() {
  const std::uint64_t now = NowUs();
  table_->ExpireUntil(now);
  {
    MutexLock lock(&mu_);
    for (auto it = grants_.begin(); it != grants_.end();) {
      if (it->second.expires_at_us <= now) {
        ++grants_expired_;
        it = grants_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Background eviction only when occupancy passes the high watermark: the
  // pass looks at every host block, so it is not run otherwise.
  const PagePoolCounts c = pool_->Counts();
  const LeaseTableCounters t = table_->Counters();
  const std::uint64_t occupied = c.pages - c.free - std::min(c.pages - c.free, t.pages_demoting);
  if (static_cast<double>(occupied) > options_.watermarks.high * static_cast<double>(c.pages)) {
    RunEviction(std::nullopt, 0);
  }
  if (data_plane_) data_plane_->Sweep();
  MaybeCompactCatalog();
}

}  // namespace kvfabric::cache_host
