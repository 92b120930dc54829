#include "server/placement/directory.h"

#include <algorithm>

namespace kvfabric::placement {
namespace {

constexpr std::uint8_t kHostBit = 1;
constexpr std::uint8_t kNvmeBit = 2;

std::uint8_t TierBit(Tier tier) {
  switch (tier) {
    case Tier::kHost:
      return kHostBit;
    case Tier::kNvme:
      return kNvmeBit;
    default:
      return 0;
  }
}

Directory::Options Sanitize(Directory::Options o) {
  o.max_entries = std::max<std::size_t>(o.max_entries, 1);
  o.max_replicas = std::clamp<std::size_t>(o.max_replicas, 1, 8);
  return o;
}

}  // namespace

std::size_t Directory::EntryKeyHash::operator()(const EntryKey& k) const noexcept {
  return BlockKey::Hash()(k.key) ^ (std::size_t{k.ns} * 0x9E3779B97F4A7C15ull);
}

Directory::Directory(const Options& options) : options_(Sanitize(options)) {}

Directory::~Directory() = default;

std::uint32_t Directory::InternNamespace(std::string_view ns) {
  auto it = namespace_by_name_.find(ns);
  if (it != namespace_by_name_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(namespaces_.size());
  namespaces_.emplace_back(ns);
  namespace_by_name_.emplace(std::string(ns), id);
  return id;
}

bool Directory::FindNamespace(std::string_view ns, std::uint32_t* id) const {
  auto it = namespace_by_name_.find(ns);
  if (it == namespace_by_name_.end()) return false;
  *id = it->second;
  return true;
}

int Directory::FindHost(std::string_view host_id) const {
  auto it = host_by_id_.find(host_id);
  return it == host_by_id_.end() ? -1 : static_cast<int>(it->second);
}

std::size_t Directory::SetHostIncarnation(std::string_view host_id, std::uint64_t incarnation) {
  const int found = FindHost(host_id);
  if (found >= 0) {
    Host& host = hosts_[found];
    if (host.incarnation == incarnation) return 0;
    const std::size_t dropped = DropAllOf(static_cast<std::uint32_t>(found));
    host.incarnation = incarnation;
    host.snapshot = 0;
    return dropped;
  }
  std::uint32_t slot;
  if (!free_hosts_.empty()) {
    slot = free_hosts_.back();
    free_hosts_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(hosts_.size());
    hosts_.emplace_back();
  }
  Host& host = hosts_[slot];
  host.id = std::string(host_id);
  host.incarnation = incarnation;
  host_by_id_.emplace(host.id, slot);
  return 0;
}

std::size_t Directory::DropHost(std::string_view host_id) {
  const int found = FindHost(host_id);
  if (found < 0) return 0;
  const auto slot = static_cast<std::uint32_t>(found);
  const std::size_t dropped = DropAllOf(slot);
  host_by_id_.erase(host_by_id_.find(host_id));
  hosts_[slot] = Host{};
  free_hosts_.push_back(slot);
  return dropped;
}

std::uint64_t Directory::HostIncarnation(std::string_view host_id) const {
  const int found = FindHost(host_id);
  return found < 0 ? 0 : hosts_[found].incarnation;
}

std::size_t Directory::HostReplicas(std::string_view host_id) const {
  const int found = FindHost(host_id);
  return found < 0 ? 0 : hosts_[found].nodes.size();
}

std::size_t Directory::DropAllOf(std::uint32_t h) {
  // Walk from the back: RemoveReplica swaps the host's last node into the removed position, so
  // popping from the back keeps every unvisited node in front of the cursor.
  std::size_t dropped = 0;
  while (!hosts_[h].nodes.empty()) {
    Node* node = hosts_[h].nodes.back();
    auto& reps = node->second.replicas;
    for (std::size_t r = 0; r < reps.size(); ++r) {
      if (reps[r].host == h) {
        RemoveReplica(node, r);
        ++dropped;
        break;
      }
    }
  }
  counters_.replicas_dropped_with_host += dropped;
  return dropped;
}

void Directory::BeginSnapshot(std::string_view host_id) {
  const int found = FindHost(host_id);
  if (found < 0) return;
  Host& host = hosts_[found];
  if (host.next_snapshot == 0) host.next_snapshot = 1;  // 0 means "none"; skip it on wrap
  host.snapshot = host.next_snapshot++;
}

std::size_t Directory::EndSnapshot(std::string_view host_id) {
  const int found = FindHost(host_id);
  if (found < 0 || hosts_[found].snapshot == 0) return 0;
  const auto h = static_cast<std::uint32_t>(found);
  const std::uint32_t generation = hosts_[h].snapshot;
  std::size_t dropped = 0;
  // Back to front: a removal swaps an already-visited node into the cursor's position.
  for (std::size_t i = hosts_[h].nodes.size(); i-- > 0;) {
    Node* node = hosts_[h].nodes[i];
    auto& reps = node->second.replicas;
    for (std::size_t r = 0; r < reps.size(); ++r) {
      if (reps[r].host != h) continue;
      if (reps[r].snapshot != generation) {
        RemoveReplica(node, r);
        ++dropped;
      }
      break;
    }
  }
  hosts_[h].snapshot = 0;
  counters_.replicas_dropped_by_snapshot += dropped;
  return dropped;
}

std::size_t Directory::Apply(std::string_view host_id, std::uint64_t incarnation,
                             std::span<const BlockEvent> events, std::uint64_t now_us) {
  const int found = FindHost(host_id);
  if (found < 0 || hosts_[found].incarnation != incarnation) {
    counters_.events_ignored_incarnation += events.size();
    return 0;
  }
  std::size_t applied = 0;
  for (const BlockEvent& e : events) {
    if (ApplyOne(static_cast<std::uint32_t>(found), e, now_us)) {
      ++applied;
    } else {
      ++counters_.events_ignored_malformed;
    }
  }
  counters_.events_applied += applied;
  return applied;
}

bool Directory::ApplyOne(std::uint32_t h, const BlockEvent& e, std::uint64_t now_us) {
  std::uint8_t set_tiers = 0;    // upsert with these tiers
  bool replace_tiers = false;    // ... replacing the replica's tiers rather than adding
  std::uint8_t clear_tiers = 0;  // remove these tiers
  switch (e.kind) {
    case BlockEventKind::kCommitted:
    case BlockEventKind::kPresent:
      set_tiers = TierBit(e.tier);
      if (set_tiers == 0) return false;
      break;
    case BlockEventKind::kDemoted:
      set_tiers = kNvmeBit;
      replace_tiers = true;
      break;
    case BlockEventKind::kPromoted:
      set_tiers = kHostBit;
      replace_tiers = true;
      break;
    case BlockEventKind::kEvicted:
      clear_tiers = TierBit(e.tier);
      if (clear_tiers == 0) clear_tiers = kHostBit | kNvmeBit;
      break;
    case BlockEventKind::kDeleted:
    case BlockEventKind::kCorrupted:
      clear_tiers = kHostBit | kNvmeBit;
      break;
    default:
      return false;
  }
  Host& host = hosts_[h];

  if (clear_tiers != 0) {
    std::uint32_t ns;
    Map::iterator it;
    if (!FindNamespace(e.ns, &ns) || (it = map_.find(EntryKey{ns, e.key})) == map_.end()) {
      ++counters_.events_without_replica;
      return true;
    }
    Node* node = &*it;
    auto& reps = node->second.replicas;
    for (std::size_t r = 0; r < reps.size(); ++r) {
      if (reps[r].host != h) continue;
      reps[r].tiers &= static_cast<std::uint8_t>(~clear_tiers);
      reps[r].snapshot = host.snapshot;
      if (reps[r].tiers == 0) RemoveReplica(node, r);
      return true;
    }
    ++counters_.events_without_replica;
    return true;
  }

  // Upsert.
  const EntryKey key{InternNamespace(e.ns), e.key};
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (map_.size() >= options_.max_entries && lru_tail_ != nullptr) {
      Node* victim = lru_tail_;
      while (!RemoveReplica(victim, victim->second.replicas.size() - 1)) {
      }
      ++counters_.entries_evicted;
    }
    it = map_.try_emplace(key).first;
    it->second.last_access_us = now_us;
    LruPushFront(&*it);
  }
  Node* node = &*it;
  Entry& entry = node->second;
  entry.hit_count = std::max(entry.hit_count, e.hit_count);
  for (Replica& rep : entry.replicas) {
    if (rep.host != h) continue;
    // A snapshot is authoritative about tiers too: its first mention of a replica replaces
    // the tiers, later ones (the same block on the other tier) add to them.
    const bool first_in_snapshot =
        host.snapshot != 0 && rep.snapshot != host.snapshot && e.kind == BlockEventKind::kPresent;
    rep.tiers = replace_tiers || first_in_snapshot
                    ? set_tiers
                    : static_cast<std::uint8_t>(rep.tiers | set_tiers);
    if (e.payload_bytes != 0) rep.payload_bytes = e.payload_bytes;
    if (e.representation != 0) rep.representation = e.representation;
    rep.snapshot = host.snapshot;
    return true;
  }
  if (entry.replicas.size() >= options_.max_replicas) {
    ++counters_.replicas_refused;
    return true;
  }
  Replica rep;
  rep.host = h;
  rep.host_pos = static_cast<std::uint32_t>(host.nodes.size());
  rep.snapshot = host.snapshot;
  rep.tiers = set_tiers;
  rep.representation = e.representation;
  rep.payload_bytes = e.payload_bytes;
  entry.replicas.push_back(rep);
  host.nodes.push_back(node);
  ++replicas_;
  // A new copy counts as an access: recently written blocks are likely to be read.
  entry.last_access_us = std::max(entry.last_access_us, now_us);
  LruUnlink(node);
  LruPushFront(node);
  return true;
}

bool Directory::RemoveReplica(Node* node, std::size_t r) {
  auto& reps = node->second.replicas;
  const Replica rep = reps[r];
  std::vector<Node*>& nodes = hosts_[rep.host].nodes;
  Node* last = nodes.back();
  nodes[rep.host_pos] = last;
  nodes.pop_back();
  if (last != node) {
    for (Replica& moved : last->second.replicas) {
      if (moved.host == rep.host) {
        moved.host_pos = rep.host_pos;
        break;
      }
    }
  }
  reps.erase(reps.begin() + static_cast<std::ptrdiff_t>(r));
  --replicas_;
  if (!reps.empty()) return false;
  EraseNode(node);
  return true;
}

void Directory::EraseNode(Node* node) {
  LruUnlink(node);
  map_.erase(node->first);
}

void Directory::LruUnlink(Node* node) {
  Entry& e = node->second;
  if (e.lru_prev != nullptr) {
    e.lru_prev->second.lru_next = e.lru_next;
  } else if (lru_head_ == node) {
    lru_head_ = e.lru_next;
  }
  if (e.lru_next != nullptr) {
    e.lru_next->second.lru_prev = e.lru_prev;
  } else if (lru_tail_ == node) {
    lru_tail_ = e.lru_prev;
  }
  e.lru_prev = e.lru_next = nullptr;
}

void Directory::LruPushFront(Node* node) {
  Entry& e = node->second;
  e.lru_prev = nullptr;
  e.lru_next = lru_head_;
  if (lru_head_ != nullptr) lru_head_->second.lru_prev = node;
  lru_head_ = node;
  if (lru_tail_ == nullptr) lru_tail_ = node;
}

DirectoryEntry Directory::ToEntry(const Node& node) const {
  DirectoryEntry out;
  out.hit_count = node.second.hit_count;
  out.last_access_us = node.second.last_access_us;
  out.replicas.reserve(node.second.replicas.size());
  for (const Replica& r : node.second.replicas) {
    const Host& host = hosts_[r.host];
    out.replicas.push_back({host.id, host.incarnation, (r.tiers & kHostBit) != 0,
                            (r.tiers & kNvmeBit) != 0, r.payload_bytes, r.representation});
  }
  return out;
}

std::vector<DirectoryEntry> Directory::Lookup(std::string_view ns, std::span<const BlockKey> keys,
                                              bool touch, std::uint64_t now_us) {
  std::vector<DirectoryEntry> out(keys.size());
  std::uint32_t id;
  if (!FindNamespace(ns, &id)) return out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto it = map_.find(EntryKey{id, keys[i]});
    if (it == map_.end()) continue;
    Node* node = &*it;
    if (touch) {
      ++node->second.hit_count;
      node->second.last_access_us = std::max(node->second.last_access_us, now_us);
      LruUnlink(node);
      LruPushFront(node);
    }
    out[i] = ToEntry(*node);
  }
  return out;
}

DirectoryEntry Directory::Get(std::string_view ns, const BlockKey& key) const {
  std::uint32_t id;
  if (!FindNamespace(ns, &id)) return {};
  auto it = map_.find(EntryKey{id, key});
  return it == map_.end() ? DirectoryEntry{} : ToEntry(*it);
}

bool Directory::ReportStale(std::string_view ns, const BlockKey& key, std::string_view host_id) {
  std::uint32_t id;
  const int h = FindHost(host_id);
  Map::iterator it;
  if (h >= 0 && FindNamespace(ns, &id) && (it = map_.find(EntryKey{id, key})) != map_.end()) {
    auto& reps = it->second.replicas;
    for (std::size_t r = 0; r < reps.size(); ++r) {
      if (reps[r].host == static_cast<std::uint32_t>(h)) {
        RemoveReplica(&*it, r);
        ++counters_.stale_replicas_removed;
        return true;
      }
    }
  }
  ++counters_.stale_reports_unmatched;
  return false;
}

DirectoryCounters Directory::counters() const {
  DirectoryCounters c = counters_;
  c.entries = map_.size();
  c.replicas = replicas_;
  c.hosts = host_by_id_.size();
  c.namespaces = namespaces_.size();
  return c;
}

}  // namespace kvfabric::placement
