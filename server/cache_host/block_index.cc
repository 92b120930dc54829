#include "server/cache_host/block_index.h"

#include <utility>

#include "core/units.h"

namespace kvfabric::cache_host {

BlockIndex::BlockIndex(BlockIndexOptions options) : options_(options) {}

StatusOr<NamespaceId> BlockIndex::InternNamespace(const Namespace& ns) {
  auto it = ids_.find(ns.tenant);
  if (it != ids_.end()) return it->second;
  KVF_RETURN_IF_ERROR(ns.Validate());
  if (live_namespaces() >= options_.max_namespaces) {
    return Status::ResourceExhausted(
        "namespace \"" + ns.tenant + "\" refused: " + std::to_string(live_namespaces()) +
        " namespaces hold blocks, reservations, leases or quotas already, the limit set by "
        "--max-namespaces");
  }
  NamespaceId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
    usage_[id] = NamespaceUsage{.tenant = ns.tenant};
    live_[id] = 1;
  } else {
    id = static_cast<NamespaceId>(usage_.size());
    usage_.push_back(NamespaceUsage{.tenant = ns.tenant});
    live_.push_back(1);
  }
  ids_.emplace(ns.tenant, id);
  return id;
}

bool BlockIndex::ReclaimIfEmpty(NamespaceId id) {
  if (!live(id)) return false;
  const NamespaceUsage& u = usage_[id];
  if (u.blocks != 0 || u.reserved_bytes != 0 || u.reservations != 0 || u.leases != 0 ||
      u.quota_bytes != 0) {
    return false;
  }
  ids_.erase(u.tenant);
  usage_[id] = NamespaceUsage{};
  live_[id] = 0;
  free_ids_.push_back(id);
  return true;
}

std::optional<NamespaceId> BlockIndex::FindNamespace(const Namespace& ns) const {
  auto it = ids_.find(ns.tenant);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

Status BlockIndex::SetQuota(const Namespace& ns, std::uint64_t quota_bytes) {
  KVF_ASSIGN_OR_RETURN(const NamespaceId id, InternNamespace(ns));
  usage_[id].quota_bytes = quota_bytes;
  return Status::OK();
}

Status BlockIndex::CheckQuota(NamespaceId ns, std::uint64_t more_bytes) const {
  const NamespaceUsage& u = usage_[ns];
  if (u.quota_bytes == 0) return Status::OK();
  if (u.host_bytes + u.reserved_bytes + more_bytes <= u.quota_bytes) return Status::OK();
  return Status::ResourceExhausted(
      "quota of namespace \"" + u.tenant + "\": resident " + FormatBytesExact(u.host_bytes) +
      " + reserved " + FormatBytesExact(u.reserved_bytes) + " + this block " +
      FormatBytesExact(more_bytes) + " > quota " + FormatBytesExact(u.quota_bytes) +
      "; raise the namespace's quota or let eviction free its blocks");
}

void BlockIndex::ChargeReserved(NamespaceId ns, std::int64_t delta) {
  usage_[ns].reserved_bytes += static_cast<std::uint64_t>(delta);
}

const BlockEntry* BlockIndex::Find(NamespaceId ns, const BlockKey& key) const {
  auto it = entries_.find(Slot{ns, key});
  return it == entries_.end() ? nullptr : &it->second;
}

BlockEntry* BlockIndex::FindMutable(NamespaceId ns, const BlockKey& key) {
  auto it = entries_.find(Slot{ns, key});
  return it == entries_.end() ? nullptr : &it->second;
}

void BlockIndex::Account(const BlockEntry& e, int sign) {
  NamespaceUsage& u = usage_[e.ns];
  const auto s = static_cast<std::uint64_t>(static_cast<std::int64_t>(sign));
  u.blocks += s;
  u.host_blocks += s * (InHost(e.tier) ? 1 : 0);
  u.nvme_blocks += s * (OnNvme(e.tier) ? 1 : 0);
  u.host_bytes += s * (InHost(e.tier) ? e.host_resident_bytes : 0);
  u.nvme_bytes += s * (OnNvme(e.tier) ? e.nvme.bytes : 0);
  if (e.compact_kept && InHost(e.tier)) {
    compact_kept_bytes_ += s * e.host_resident_bytes;
    compact_kept_blocks_ += s;
  }
}

Status BlockIndex::Publish(BlockEntry entry) {
  const Slot slot{entry.ns, entry.key};
  if (entries_.count(slot) != 0) {
    return Status::AlreadyExists("block " + entry.key.ToHex() + " is already published");
  }
  if (!InHost(entry.tier)) {
    entry.host_pages = PageRuns{};
    entry.host_resident_bytes = 0;
  }
  Account(entry, +1);
  entries_.emplace(slot, std::move(entry));
  return Status::OK();
}

StatusOr<BlockEntry> BlockIndex::Remove(NamespaceId ns, const BlockKey& key) {
  auto it = entries_.find(Slot{ns, key});
  if (it == entries_.end()) return Status::NotFound("block " + key.ToHex() + " is not indexed");
  BlockEntry e = std::move(it->second);
  entries_.erase(it);
  Account(e, -1);
  return e;
}

Status BlockIndex::ReplaceLocation(NamespaceId ns, const BlockKey& key, BlockTier tier,
                                   const PageRuns& host_pages, std::uint64_t host_resident_bytes,
                                   const NvmeLocation& nvme) {
  BlockEntry* e = FindMutable(ns, key);
  if (e == nullptr) return Status::NotFound("block " + key.ToHex() + " is not indexed");
  Account(*e, -1);
  e->tier = tier;
  e->host_pages = InHost(tier) ? host_pages : PageRuns{};
  e->host_resident_bytes = InHost(tier) ? host_resident_bytes : 0;
  e->nvme = OnNvme(tier) ? nvme : NvmeLocation{};
  if (!InHost(tier)) e->compact_kept = false;  // kept means kept in the host pool
  Account(*e, +1);
  return Status::OK();
}

Status BlockIndex::SetCompactKept(NamespaceId ns, const BlockKey& key, bool kept) {
  BlockEntry* e = FindMutable(ns, key);
  if (e == nullptr) return Status::NotFound("block " + key.ToHex() + " is not indexed");
  if (kept && !InHost(e->tier)) {
    return Status::FailedPrecondition("block " + key.ToHex() + " has no host copy to keep (tier " +
                                      std::string(BlockTierName(e->tier)) + ")");
  }
  Account(*e, -1);
  e->compact_kept = kept;
  Account(*e, +1);
  return Status::OK();
}

void BlockIndex::ForEach(std::optional<NamespaceId> only,
                         const std::function<void(const BlockEntry&)>& fn) const {
  for (const auto& [slot, entry] : entries_) {
    if (!only.has_value() || slot.ns == *only) fn(entry);
  }
}

}  // namespace kvfabric::cache_host
