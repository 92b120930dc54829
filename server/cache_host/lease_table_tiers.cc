// LeaseTable and the tiers (lease_table.h, "Eviction" and "Staging"):
// eviction passes, demotions to NVMe and their outcome, staging NVMe blocks
// back into the pool, and re-indexing what NVMe recovery found. Split from
// lease_table.cc.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_key.h"
#include "core/mutex.h"
#include "server/cache_host/lease_table.h"

namespace kvfabric::cache_host {

StatusOr<EvictionPassResult> LeaseTable::MakeRoom(const EvictionPolicy& policy,
                                                  const EvictionRequest& req) {
  KVF_RETURN_IF_ERROR(req.watermarks.Validate());
  const std::uint64_t now = clock_();
  EvictionPassResult out;
  MutexLock lock(&mu_);
  std::optional<NamespaceId> scope;
  if (req.scope.has_value()) {
    scope = index_.FindNamespace(*req.scope);
    if (!scope.has_value()) return out;  // a namespace with no blocks has nothing to give
  }
  std::vector<EvictionCandidate> candidates;
  // Compact copies (eviction_policy.h): the copies among the candidates, and
  // the exact blocks with a host copy whose copy they may be (with their
  // candidate index, or kNoHeldCopy when they are not candidates).
  const bool keep = options_.compact_keep.budget_bytes > 0;
  std::unordered_map<SlotKey, std::size_t, SlotKeyHash> copies;
  std::vector<std::pair<std::size_t, const BlockEntry*>> exact_in_host;
  index_.ForEach(scope, [&](const BlockEntry& e) {
    if (!InHost(e.tier)) return;
    const bool candidate = e.read_pins == 0 && !e.demoting;
    if (keep && e.compact_key.has_value()) {
      exact_in_host.emplace_back(candidate ? candidates.size() : kNoHeldCopy, &e);
    }
    if (!candidate) return;
    if (keep && e.meta.representation != BlockRepresentation::kExact) {
      copies.emplace(SlotKey{e.ns, e.key}, candidates.size());
    }
    candidates.push_back(EvictionCandidate{
        .ns = e.ns,
        .key = e.key,
        .tier = e.tier,
        .bytes = e.meta.bytes,
        .pages = e.host_pages.TotalPages(),
        .resident_bytes = e.host_resident_bytes,
        .tokens = e.meta.tokens,
        .token_offset = e.meta.token_offset,
        .last_access_us = e.last_access_us,
        .hit_count = e.hit_count,
        .compact_role = keep && e.compact_kept ? CompactRole::kKept : CompactRole::kNone,
    });
  });
  for (const auto& [exact, e] : exact_in_host) {
    auto it = copies.find(SlotKey{e->ns, *e->compact_key});
    if (it == copies.end() || candidates[it->second].compact_role == CompactRole::kKept) continue;
    candidates[it->second].compact_role = CompactRole::kHeld;
    if (exact != kNoHeldCopy) candidates[exact].held_copy = it->second;
  }
  const PagePoolCounts counts = pool_->Counts();
  EvictionTrigger trigger;
  trigger.pool_pages = counts.pages;
  trigger.occupied_pages =
      counts.pages - counts.free - std::min(counts.pages - counts.free, c_.pages_demoting);
  trigger.pages_needed = req.pages_needed;
  trigger.watermarks = req.watermarks;
  trigger.nvme_enabled = req.nvme_enabled;
  trigger.nvme_free_bytes = req.nvme_free_bytes;
  trigger.nvme_record_alignment = req.nvme_record_alignment;
  trigger.nvme_off_reason = req.nvme_off_reason;
  trigger.compact_keep_bytes = options_.compact_keep.budget_bytes;
  trigger.compact_kept_bytes = index_.compact_kept_bytes();
  out.decisions = PlanEviction(policy, std::move(candidates), trigger, now);

  for (EvictionDecision& d : out.decisions) {
    BlockEntry* e = index_.FindMutable(d.ns, d.key);
    const PageRuns pages = e->host_pages;
    // A kept copy that leaves (even to NVMe, still in flight) no longer
    // counts against the budget; the copy a decision keeps does.
    if (e->compact_kept) KVF_RETURN_IF_ERROR(index_.SetCompactKept(d.ns, d.key, false));
    if (d.compact == CompactOutcome::kCopyKept) {
      KVF_RETURN_IF_ERROR(index_.SetCompactKept(d.ns, d.compact_key, true));
    }
    switch (d.action) {
      case EvictionAction::kDropHostCopy:
        KVF_RETURN_IF_ERROR(pool_->Free(pages));
        KVF_RETURN_IF_ERROR(index_.ReplaceLocation(d.ns, d.key, BlockTier::kNvme, {}, 0, e->nvme));
        out.pages_freed += pages.TotalPages();
        ++c_.dropped_host_copies;
        break;
      case EvictionAction::kEvict:
        KVF_RETURN_IF_ERROR(pool_->Free(pages));
        KVF_RETURN_IF_ERROR(index_.Remove(d.ns, d.key).status());
        out.pages_freed += pages.TotalPages();
        ++c_.evictions;
        break;
      case EvictionAction::kDemote:
        KVF_RETURN_IF_ERROR(pool_->Pin(pages));
        e->demoting = true;
        c_.pages_demoting += pages.TotalPages();
        out.demotions.push_back({d.ns, d.key, pages, e->meta, e->crc32c});
        ++c_.demotions_started;
        break;
    }
    d.tenant = index_.Usage(d.ns).tenant;
    decisions_.Record(d);
  }
  for (const EvictionDecision& d : out.decisions) {
    if (d.action == EvictionAction::kEvict) index_.ReclaimIfEmpty(d.ns);
  }
  return out;
}

Status LeaseTable::CompleteDemotion(NamespaceId ns, const BlockKey& key,
                                    const NvmeLocation& location) {
  MutexLock lock(&mu_);
  BlockEntry* e = ns < index_.namespace_count() ? index_.FindMutable(ns, key) : nullptr;
  if (e == nullptr || !e->demoting) {
    return Status::FailedPrecondition("block " + key.ToHex() + " has no demotion in flight");
  }
  const PageRuns pages = e->host_pages;
  KVF_RETURN_IF_ERROR(pool_->Unpin(pages));
  e->demoting = false;
  c_.pages_demoting -= pages.TotalPages();
  ++c_.demotions_completed;
  if (e->read_pins > 0) {
    // A reader leased it meanwhile: keep the host copy; a later pass drops it
    // (step 1) once the lease is gone. Its compact copy is held again until then.
    HoldCopyLocked(ns, e->compact_key);
    return index_.ReplaceLocation(ns, key, BlockTier::kBoth, pages, e->host_resident_bytes,
                                  location);
  }
  KVF_RETURN_IF_ERROR(pool_->Free(pages));
  return index_.ReplaceLocation(ns, key, BlockTier::kNvme, {}, 0, location);
}

Status LeaseTable::AbortDemotion(NamespaceId ns, const BlockKey& key) {
  MutexLock lock(&mu_);
  BlockEntry* e = ns < index_.namespace_count() ? index_.FindMutable(ns, key) : nullptr;
  if (e == nullptr || !e->demoting) {
    return Status::FailedPrecondition("block " + key.ToHex() + " has no demotion in flight");
  }
  KVF_RETURN_IF_ERROR(pool_->Unpin(e->host_pages));
  e->demoting = false;
  c_.pages_demoting -= e->host_pages.TotalPages();
  ++c_.demotions_aborted;
  return Status::OK();
}

std::vector<EvictionDecision> LeaseTable::Explain(const Namespace& ns, const BlockKey& key) const {
  return decisions_.Find(ns.tenant, key);
}

StatusOr<std::optional<PromotionOrder>> LeaseTable::BeginPromotion(NamespaceId ns,
                                                                   const BlockKey& key) {
  MutexLock lock(&mu_);
  BlockEntry* e = ns < index_.namespace_count() ? index_.FindMutable(ns, key) : nullptr;
  if (e == nullptr) return Status::NotFound("block " + key.ToHex() + " is not cached");
  if (InHost(e->tier)) return std::optional<PromotionOrder>();  // staged by another lease
  if (e->promoting) {
    return Status::Aborted("block " + key.ToHex() + " is being staged by another lease");
  }
  auto runs = pool_->Allocate(pool_->PagesFor(e->meta.bytes), PageState::kStaging);
  if (!runs.ok()) {
    ++c_.pool_refusals;
    return runs.status().WithContext("stage block " + key.ToHex() + " from NVMe");
  }
  e->promoting = true;
  ++c_.promotions_started;
  return std::optional<PromotionOrder>(PromotionOrder{ns, key, *runs, e->nvme, e->meta, e->crc32c});
}

Status LeaseTable::CompletePromotion(const PromotionOrder& order,
                                     std::vector<std::uint32_t> layer_crcs) {
  MutexLock lock(&mu_);
  BlockEntry* e = index_.FindMutable(order.ns, order.key);
  if (e == nullptr || !e->promoting) {
    return Status::FailedPrecondition("block " + order.key.ToHex() +
                                      " has no staging read in flight");
  }
  KVF_RETURN_IF_ERROR(pool_->Transition(order.pages, PageState::kStaging, PageState::kCommitted));
  e->promoting = false;
  e->last_access_us = clock_();
  if (layer_crcs.size() == e->meta.layers) e->layer_crc32c = std::move(layer_crcs);
  ++c_.promotions_completed;
  HoldCopyLocked(order.ns, e->compact_key);  // the exact block is back in the pool
  promotion_cv_.NotifyAll();
  return index_.ReplaceLocation(order.ns, order.key, BlockTier::kBoth, order.pages,
                                order.pages.TotalPages() * pool_->page_bytes(), e->nvme);
}

bool LeaseTable::AwaitPromotion(NamespaceId ns, const BlockKey& key,
                                std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  for (;;) {
    const BlockEntry* e = ns < index_.namespace_count() ? index_.Find(ns, key) : nullptr;
    if (e == nullptr || !e->promoting) return true;
    if (promotion_cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) {
      e = ns < index_.namespace_count() ? index_.Find(ns, key) : nullptr;
      return e == nullptr || !e->promoting;
    }
  }
}

StatusOr<std::optional<BlockEntry>> LeaseTable::AbortPromotion(const PromotionOrder& order,
                                                               bool remove_block) {
  MutexLock lock(&mu_);
  BlockEntry* e = index_.FindMutable(order.ns, order.key);
  if (e == nullptr || !e->promoting) {
    return Status::FailedPrecondition("block " + order.key.ToHex() +
                                      " has no staging read in flight");
  }
  KVF_RETURN_IF_ERROR(pool_->Free(order.pages));
  e->promoting = false;
  ++c_.promotions_failed;
  promotion_cv_.NotifyAll();
  if (!remove_block) return std::optional<BlockEntry>();
  KVF_ASSIGN_OR_RETURN(BlockEntry removed, index_.Remove(order.ns, order.key));
  index_.ReclaimIfEmpty(order.ns);
  return std::optional<BlockEntry>(std::move(removed));
}

Status LeaseTable::AdoptRecovered(const Namespace& ns, const BlockKey& key, const BlockMeta& meta,
                                  std::uint32_t crc32c, const NvmeLocation& location) {
  const std::optional<BlockKey> compact_key = CompactKeyOf(key, meta.representation);
  MutexLock lock(&mu_);
  KVF_ASSIGN_OR_RETURN(const NamespaceId id, index_.InternNamespace(ns));
  BlockEntry e;
  e.ns = id;
  e.key = key;
  e.meta = meta;
  e.crc32c = crc32c;
  e.tier = BlockTier::kNvme;
  e.nvme = location;
  e.committed_us = clock_();
  e.last_access_us = e.committed_us;
  e.compact_key = compact_key;
  KVF_RETURN_IF_ERROR(index_.Publish(std::move(e)));
  ++c_.recovered;
  return Status::OK();
}

std::optional<BlockKey> LeaseTable::CompactKeyOf(const BlockKey& key,
                                                 BlockRepresentation representation) const {
  const CompactKeepOptions& o = options_.compact_keep;
  if (o.budget_bytes == 0 || representation != BlockRepresentation::kExact) return std::nullopt;
  // Validate() made sure of the codec, so this fails only if SHA-256 does.
  StatusOr<BlockKey> k = CompactBlockKey(key, o.codec, o.codec_version);
  if (!k.ok()) return std::nullopt;
  return *k;
}

void LeaseTable::HoldCopyLocked(NamespaceId ns, const std::optional<BlockKey>& compact_key) {
  if (!compact_key.has_value()) return;
  const BlockEntry* copy = index_.Find(ns, *compact_key);
  if (copy != nullptr && copy->compact_kept)
    index_.SetCompactKept(ns, *compact_key, false).IgnoreError();
}

}  // namespace kvfabric::cache_host
