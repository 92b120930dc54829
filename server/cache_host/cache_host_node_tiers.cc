// CacheHostNode, its tiers: NVMe recovery at start-up, staging NVMe blocks
// into the host pool for leases, eviction passes and demotions (see the class
// comment in cache_host_node.h). The RPC side is in cache_host_node.cc.
#include <algorithm>
#include <cstring>

#include "core/block_format.h"
#include "core/mutex.h"
#include "core/units.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane.h"
#include "server/cache_host/node_keys.h"
#include "server/cache_host/nvme_catalog.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {

using internal::DigestOf;
using internal::NvmeKeyOf;
using internal::KeyOf;
using internal::Ns;

Status CacheHostNode::RecoverNvme() {
  if (options_.nvme.env == nullptr) options_.nvme.env = env_;
  KVF_ASSIGN_OR_RETURN(NvmeTier::OpenResult opened, NvmeTier::Open(options_.nvme));
  nvme_ = std::move(opened.tier);
  recovery_ = opened.report;
  CatalogRecovery catalog_report;
  KVF_ASSIGN_OR_RETURN(catalog_, NvmeCatalog::Open(options_.nvme.env, options_.nvme.dir,
                                                   &catalog_report));
  std::vector<BlockDigest> live;
  live.reserve(opened.blocks.size());
  for (const RecoveredBlock& b : opened.blocks) {
    std::optional<CatalogEntry> entry = catalog_->Find(b.header.key);
    // The header's key must be the NVMe key of the record's (tenant, key).
    StatusOr<BlockDigest> expected =
        entry.has_value() ? NvmeKeyOf(entry->tenant, KeyOf(entry->block_key))
                          : StatusOr<BlockDigest>(Status::NotFound("no catalog record"));
    if (!expected.ok() || *expected != b.header.key) {
      // Demoted without a durable catalog record cannot happen (the record is
      // synced first); a block left by another tool, or by a build whose NVMe
      // keys were not per namespace (catalog version 1), is not ours to serve.
      ++recovery_orphans_;
      nvme_->Remove(b.location, b.header.key).IgnoreError();
      continue;
    }
    const BlockKey key = KeyOf(entry->block_key);
    BlockMeta meta;
    meta.bytes = b.header.payload_bytes;
    meta.representation = b.header.representation;
    meta.fingerprint = b.header.fingerprint;
    meta.tokens = b.header.tokens;
    meta.token_offset = entry->token_offset;
    meta.dtype = b.header.dtype;
    meta.layers = b.header.layers;
    meta.kv_heads = b.header.kv_heads;
    meta.head_dim = b.header.head_dim;
    Status s = table_->AdoptRecovered(Ns(entry->tenant), key, meta, b.header.payload_crc32c,
                                      b.location);
    if (!s.ok()) {
      ++recovery_orphans_;
      spdlog::warn("NVMe recovery: block {} of namespace \"{}\" not re-indexed: {}", key.ToHex(),
                   entry->tenant, s.ToString());
      nvme_->Remove(b.location, b.header.key).IgnoreError();
      continue;
    }
    live.push_back(b.header.key);
  }
  KVF_RETURN_IF_ERROR(catalog_->Compact(live));
  for (int i = 0; i < std::max(1, options_.staging_buffers); ++i) {
    KVF_ASSIGN_OR_RETURN(AlignedBuffer buf,
                         AlignedBuffer::Allocate(options_.nvme.max_group_bytes, nvme_->alignment()));
    MutexLock lock(&staging_mu_);  // no other thread yet (Start); for the analysis
    staging_free_.push_back(std::move(buf));
  }
  spdlog::info(
      "NVMe recovery in {}: {} blocks recovered ({}), dropped {} torn, {} corrupt, {} "
      "duplicate, {} without a catalog record; {} segments",
      options_.nvme.dir, live.size(), FormatBytes(recovery_.recovered_bytes),
      recovery_.dropped_torn, recovery_.dropped_corrupt, recovery_.dropped_duplicate,
      recovery_orphans_, recovery_.segments);
  return Status::OK();
}

CacheHostNode::~CacheHostNode() { Shutdown(std::chrono::milliseconds(0)); }

Status CacheHostNode::Stage(NamespaceId ns, const BlockKey& key) {
  const auto deadline = std::chrono::steady_clock::now() + options_.reserve_wait;
  bool made_room = false;
  std::optional<PromotionOrder> order;
  for (;;) {
    StatusOr<std::optional<PromotionOrder>> begun = table_->BeginPromotion(ns, key);
    // Staged meanwhile (by the lease waited for below, or by one that ran
    // between this lease's first look and now): nothing to read; the caller
    // leases the host copy.
    if (begun.ok() && !begun->has_value()) return Status::OK();
    if (begun.ok()) {
      order = std::move(**begun);
      break;
    }
    const StatusCode code = begun.status().code();
    if (code == StatusCode::kAborted) {
      // Another lease is staging this block (two contexts loading the same
      // prefix, a shared system prompt): its read brings the same bytes into
      // the pool, so wait for it (up to reserve_wait) and lease its copy,
      // rather than refuse the block and send the client to recompute it.
      if (!table_->AwaitPromotion(ns, key, deadline)) {
        return Status::Unavailable("block " + key.ToHex() +
                                   " is still being staged from NVMe by another lease after "
                                   "reserve_wait; retry");
      }
      ++staging_waits_;
      continue;
    }
    if (code == StatusCode::kResourceExhausted && !made_room) {
      made_room = true;
      auto meta = table_->Lookup(Ns(table_->TenantName(ns)), key);
      MakeRoomAndWait(std::nullopt, meta.ok() ? pool_->PagesFor(meta->meta.bytes) : 1, deadline);
      continue;
    }
    return begun.status();
  }
  // While it is promoting the block cannot go, so neither can its namespace:
  // its tenant (and NVMe key) are read now, before AbortPromotion may remove
  // the block and let the namespace be reclaimed.
  const std::string tenant = table_->TenantName(ns);
  const StatusOr<BlockDigest> nvme_key = NvmeKeyOf(tenant, key);
  AlignedBuffer buffer;
  {
    MutexLock lock(&staging_mu_);
    staging_cv_.Wait(&staging_mu_,
                     [&]() KVF_REQUIRES(staging_mu_) { return !staging_free_.empty(); });
    buffer = std::move(staging_free_.back());
    staging_free_.pop_back();
  }
  Status status;
  std::vector<std::uint32_t> layer_crcs;
  if (nvme_->ReadBufferBytes(order->nvme) > buffer.size()) {
    status = Status::Internal("staging buffer of " + std::to_string(buffer.size()) +
                              " bytes cannot hold a record of " +
                              std::to_string(order->nvme.bytes));
  } else if (!nvme_key.ok()) {
    status = nvme_key.status();
  } else {
    auto header = nvme_->Read(order->nvme, *nvme_key, buffer.span(), &layer_crcs);
    if (header.ok() && header->payload_bytes != order->meta.bytes) {
      status = Status::DataLoss("NVMe block " + key.ToHex() + " has " +
                                std::to_string(header->payload_bytes) + " bytes, the index " +
                                std::to_string(order->meta.bytes));
    } else if (!header.ok()) {
      status = header.status();
    } else {
      pool_->CopyIn(order->pages, buffer.span().subspan(kBlockHeaderBytes, order->meta.bytes));
    }
  }
  {
    MutexLock lock(&staging_mu_);
    staging_free_.push_back(std::move(buffer));
  }
  staging_cv_.NotifyOne();
  ++staging_reads_;
  if (status.ok()) {
    KVF_RETURN_IF_ERROR(table_->CompletePromotion(*order, std::move(layer_crcs)));
    if (has_sink_.load()) {
      Emit({{BlockEventKind::kPromoted, tenant, key, order->meta, order->crc32c,
             BlockTier::kBoth, 0}});
    }
    return Status::OK();
  }
  const bool corrupt = status.code() == StatusCode::kDataLoss;
  if (corrupt) ++staging_crc_failures_;
  auto removed = table_->AbortPromotion(*order, corrupt);
  if (corrupt) {
    spdlog::error("NVMe block {} failed verification and was removed: {}", key.ToHex(),
                  status.ToString());
    if (removed.ok() && removed->has_value()) {
      if (nvme_key.ok()) {
        nvme_->Remove((*removed)->nvme, *nvme_key).IgnoreError();  // gone already if CRC failed
        catalog_->Forget(*nvme_key);
      }
      if (has_sink_.load()) {
        Emit({{BlockEventKind::kCorrupted, tenant, key, {}, 0, BlockTier::kNvme,
               0}});
      }
    }
  }
  return status;
}

void CacheHostNode::DropNvmeCopy(const std::string& tenant, const BlockEntry& removed) {
  if (!nvme_ || !OnNvme(removed.tier)) return;
  // By name: the namespace's id may have been reclaimed with its last block.
  StatusOr<BlockDigest> nvme_key = NvmeKeyOf(tenant, removed.key);
  if (!nvme_key.ok()) {
    spdlog::error("NVMe copy of {} not removed: {}", removed.key.ToHex(),
                  nvme_key.status().ToString());
    return;
  }
  // The tier's tombstone is synced before Remove returns: the delete survives
  // a restart. The catalog record left behind names a block that no longer
  // exists, which recovery never looks up (it is driven by the tier's blocks)
  // and the next compaction drops.
  nvme_->Remove(removed.nvme, *nvme_key).IgnoreError();
  catalog_->Forget(*nvme_key);
}


std::uint64_t CacheHostNode::RunEviction(std::optional<Namespace> scope,
                                         std::uint64_t pages_needed) {
  EvictionRequest req;
  req.watermarks = options_.watermarks;
  req.nvme_enabled = nvme_ != nullptr;
  if (nvme_ != nullptr) {
    // Room on the tier: its free bytes less what is being demoted now (a
    // full tier makes eviction drop instead of demote).
    const std::uint64_t free = nvme_free_bytes();
    const std::uint64_t in_flight = table_->Counters().pages_demoting * pool_->page_bytes();
    req.nvme_free_bytes = free - std::min(free, in_flight);
    req.nvme_record_alignment = nvme_->alignment();
    MutexLock lock(&demotion_mu_);
    const std::uint64_t now = NowUs();
    if (now < demotion_backoff_until_us_) {
      req.nvme_enabled = false;
      req.nvme_off_reason = "demotions to NVMe are failing (" +
                            std::to_string(demotion_failures_) + " so far, last: " +
                            last_demotion_error_ + "); retrying in " +
                            std::to_string((demotion_backoff_until_us_ - now) / 1000) + " ms";
    }
  }
  req.scope = std::move(scope);
  req.pages_needed = pages_needed;
  auto pass = table_->MakeRoom(*policy_, req);
  if (!pass.ok()) {
    spdlog::error("eviction pass failed: {}", pass.status().ToString());
    return 0;
  }
  if (has_sink_.load()) {
    std::vector<BlockEventRecord> events;
    for (const EvictionDecision& d : pass->decisions) {
      if (d.action == EvictionAction::kEvict) {
        events.push_back({BlockEventKind::kEvicted, d.tenant, d.key, {}, 0, BlockTier::kHost, 0});
      } else if (d.action == EvictionAction::kDropHostCopy) {
        auto e = table_->Lookup(Ns(d.tenant), d.key);
        if (e.ok()) {
          events.push_back({BlockEventKind::kDemoted, d.tenant, d.key, e->meta, e->crc32c,
                            BlockTier::kNvme, e->hit_count});
        }
      }
    }
    Emit(std::move(events));
  }
  StartDemotions(std::move(pass->demotions));
  return pass->pages_freed;
}

bool CacheHostNode::MakeRoomAndWait(std::optional<Namespace> scope, std::uint64_t pages,
                                    std::chrono::steady_clock::time_point deadline) {
  std::uint64_t done_before = 0;
  std::uint64_t failures_before = 0;
  {
    MutexLock lock(&demotion_mu_);
    done_before = demotions_done_;
    failures_before = demotion_failures_;
  }
  const std::uint64_t freed = RunEviction(std::move(scope), pages);
  // Demotions count from the moment the table marked them (a background pass
  // may still be syncing their catalog records), hence pages_demoting.
  MutexLock lock(&demotion_mu_);
  // Demotions that failed at once (a catalog append on a full disk) turned
  // demotion off: the caller's next pass evicts instead, so that is progress.
  const bool in_flight =
      table_->Counters().pages_demoting > 0 || demotion_failures_ > failures_before;
  demotion_cv_.WaitUntil(&demotion_mu_, deadline, [&]() KVF_REQUIRES(demotion_mu_) {
    return table_->Counters().pages_demoting == 0 || demotions_done_ > done_before ||
           pool_->Counts().free >= pages;
  });
  return freed > 0 || in_flight;
}

void CacheHostNode::NoteDemotion(const Status& status, std::uint64_t count) {
  const std::uint64_t now = NowUs();
  MutexLock lock(&demotion_mu_);
  if (status.ok()) {
    demotion_backoff_us_ = 0;  // the tier takes blocks again
    return;
  }
  // A failed demotion (a full tier or filesystem, an I/O error) turns
  // demotion off for a while: eviction drops host-only blocks instead (the
  // pool keeps serving), then tries the tier again. 1 s, doubling to 30 s
  // while failures continue.
  demotion_failures_ += count;
  demotion_failures_unlogged_ += count;
  last_demotion_error_ = status.ToString();
  demotion_backoff_us_ = std::clamp<std::uint64_t>(demotion_backoff_us_ * 2, 1'000'000, 30'000'000);
  demotion_backoff_until_us_ = now + demotion_backoff_us_;
  if (now >= next_demotion_log_us_) {
    spdlog::warn(
        "NVMe: {} demotions failed since the last report ({} in all); blocks stay in the host "
        "pool and eviction drops instead of demoting for {} s. Last error: {}",
        demotion_failures_unlogged_, demotion_failures_, demotion_backoff_us_ / 1'000'000,
        last_demotion_error_);
    demotion_failures_unlogged_ = 0;
    next_demotion_log_us_ = now + 10'000'000;  // at most one line per 10 s
  }
}

void CacheHostNode::MaybeCompactCatalog() {
  if (catalog_ == nullptr) return;
  // Every demotion appends a record; removed and re-demoted blocks leave
  // superseded ones behind. Rewrite once they outnumber the live ones
  // (plus slack, so small catalogs are left alone). A catalog whose failed
  // append could not be rolled back (a full or failing disk) refuses appends
  // until rewritten: repair it the same way once the backoff allows another
  // try. A failure counts as a failed demotion (backoff, rate-limited log).
  const CatalogStats c = catalog_->stats();
  const bool repair = !catalog_->healthy();
  if (!repair && c.records <= 2 * c.live_entries + 4096) return;
  {
    MutexLock lock(&demotion_mu_);
    if (NowUs() < demotion_backoff_until_us_) return;
  }
  if (Status s = catalog_->Compact(); !s.ok()) {
    NoteDemotion(s.WithContext(repair ? "repairing the NVMe catalog" : "compacting the NVMe catalog"));
  }
}

void CacheHostNode::StartDemotions(std::vector<DemotionOrder> orders) {
  if (orders.empty()) return;
  // The catalog record goes first and is synced, so a block found on NVMe
  // after a crash always has its namespace (docs/nvme-tier.md).
  std::vector<CatalogEntry> records;
  records.reserve(orders.size());
  std::vector<BlockDigest> nvme_keys;
  nvme_keys.reserve(orders.size());
  for (const DemotionOrder& o : orders) {
    const std::string tenant = table_->TenantName(o.ns);
    StatusOr<BlockDigest> nvme_key = NvmeKeyOf(tenant, o.key);
    if (!nvme_key.ok()) {
      spdlog::error("{} demotions abandoned: {}", orders.size(), nvme_key.status().ToString());
      for (const DemotionOrder& d : orders) table_->AbortDemotion(d.ns, d.key).IgnoreError();
      return;
    }
    nvme_keys.push_back(*nvme_key);
    records.push_back(CatalogEntry{*nvme_key, DigestOf(o.key), tenant, o.meta.token_offset});
  }
  if (!catalog_->healthy()) MaybeCompactCatalog();  // repair first, if the backoff allows
  if (Status s = catalog_->AppendBatch(records); !s.ok()) {
    // As a failed demotion: counted, logged rate-limited, and demotion backs
    // off (a full filesystem fails the catalog first).
    for (const DemotionOrder& o : orders) table_->AbortDemotion(o.ns, o.key).IgnoreError();
    NoteDemotion(s.WithContext("NVMe catalog append"), orders.size());
    return;
  }
  {
    MutexLock lock(&demotion_mu_);
    demotions_in_flight_ += orders.size();
  }
  for (std::size_t i = 0; i < orders.size(); ++i) {
    DemotionOrder& o = orders[i];
    BlockHeader header;
    header.representation = o.meta.representation;
    header.dtype = o.meta.dtype;
    header.key = nvme_keys[i];
    header.fingerprint = o.meta.fingerprint;
    header.layers = o.meta.layers;
    header.tokens = o.meta.tokens;
    header.kv_heads = o.meta.kv_heads;
    header.head_dim = o.meta.head_dim;
    header.payload_bytes = o.meta.bytes;
    header.payload_crc32c = o.crc32c;
    auto finish = [this, ns = o.ns, key = o.key,
                   tenant = records[i].tenant](StatusOr<NvmeLocation> where) {
      Status s = where.ok() ? table_->CompleteDemotion(ns, key, *where)
                            : table_->AbortDemotion(ns, key);
      NoteDemotion(where.status());
      if (!where.ok()) {
        // Counted and logged (rate-limited) by NoteDemotion.
      } else if (!s.ok()) {
        spdlog::error("demotion of {} completed but not applied: {}", key.ToHex(), s.ToString());
      } else if (has_sink_.load()) {
        auto e = table_->Lookup(Ns(tenant), key);
        if (e.ok() && e->tier == BlockTier::kNvme) {
          Emit({{BlockEventKind::kDemoted, tenant, key, e->meta, e->crc32c, BlockTier::kNvme,
                 e->hit_count}});
        }
      }
      {
        MutexLock lock(&demotion_mu_);
        --demotions_in_flight_;
        ++demotions_done_;
      }
      demotion_cv_.NotifyAll();
    };
    if (o.pages.size == 1) {
      nvme_->Demote(header, pool_->RunBytes(o.pages.runs[0]).first(o.meta.bytes), finish);
      continue;
    }
    // A block split over several runs: gather it into a staging buffer first.
    AlignedBuffer buffer;
    {
      MutexLock lock(&staging_mu_);
      staging_cv_.Wait(&staging_mu_,
                       [&]() KVF_REQUIRES(staging_mu_) { return !staging_free_.empty(); });
      buffer = std::move(staging_free_.back());
      staging_free_.pop_back();
    }
    std::uint64_t pos = 0;
    for (const PageRun& r : o.pages) {
      auto bytes = pool_->RunBytes(r);
      const std::uint64_t n = std::min<std::uint64_t>(bytes.size(), o.meta.bytes - pos);
      if (pos + n > buffer.size()) break;
      std::memcpy(buffer.data() + pos, bytes.data(), n);
      pos += n;
    }
    auto* raw = new AlignedBuffer(std::move(buffer));
    nvme_->Demote(header, raw->span().first(std::min<std::uint64_t>(o.meta.bytes, raw->size())),
                  [this, raw, finish](StatusOr<NvmeLocation> where) {
                    finish(std::move(where));
                    {
                      MutexLock lock(&staging_mu_);
                      staging_free_.push_back(std::move(*raw));
                    }
                    delete raw;
                    staging_cv_.NotifyOne();
                  });
  }
}

std::vector<BlockEventRecord> CacheHostNode::SnapshotBlocks() const {
  std::vector<BlockEventRecord> out;
  std::vector<BlockEntry> entries = table_->Entries();
  out.reserve(entries.size());
  for (const BlockEntry& e : entries) {
    out.push_back({BlockEventKind::kPresent, table_->TenantName(e.ns), e.key, e.meta, e.crc32c,
                   e.tier, e.hit_count});
  }
  return out;
}

std::uint64_t CacheHostNode::nvme_free_bytes() const {
  if (!nvme_) return 0;
  const NvmeTierStats st = nvme_->stats();
  return options_.nvme.capacity_bytes > st.used_bytes ? options_.nvme.capacity_bytes - st.used_bytes
                                                      : 0;
}

}  // namespace kvfabric::cache_host
