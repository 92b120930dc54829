// Directory: placement's in-memory map from (namespace, block key) to the daemons that hold the
// block, rebuilt from the daemons' ReportBlocks events (placement.proto). Advisory: the daemons
// are the source of truth, so a stale entry costs a client a NOT_FOUND and a fallback (counted
// through ReportStale), never a wrong byte.
//
// Entry: up to Options::max_replicas replicas, one per daemon, each with the tiers the daemon
// holds the block on (host pool, NVMe or both: a daemon that promotes a block for a read keeps
// its NVMe copy), its payload bytes and representation; plus a hit count (Lookup touches and
// the daemons' reported hit counts) and the time of the last access.
//
// Events (BlockEventKind, values equal kvfabric.v1.BlockEventKind), for a replica of the
// reporting daemon:
//   COMMITTED, PRESENT  the block is on `tier`: add the replica or add the tier.
//   DEMOTED             moved host -> NVMe: the tiers become {nvme}.
//   PROMOTED            moved NVMe -> host: the tiers become {host}. (The daemon may keep the
//                       NVMe copy; if it is evicted from host later, the directory forgets a copy
//                       that exists: a missed fetch, never a wrong one.)
//   EVICTED             left `tier`: remove that tier (unspecified: every tier); the replica
//                       goes when it has none left.
//   DELETED, CORRUPTED  gone from the daemon: remove the replica.
// Hosts are declared with SetHostIncarnation before their events count; events for an unknown
// host or from another incarnation than the declared one are ignored and counted. A new
// incarnation drops every replica of the old one.
//
// Bounds: at most Options::max_entries entries; adding one more drops the least recently
// accessed entry (LRU by Lookup touches and by events that add a replica), counted. A replica
// beyond max_replicas is refused, counted. Namespaces are interned (one string per distinct
// namespace that ever had an entry; tenants are few).
//
// Cost: Apply and Lookup O(1) expected per key (plus O(replicas) <= 8); DropHost and a
// snapshot's end O(entries of that host) through a per-host reverse index.
//
// Memory: per entry one hash-map node (key, replica vector, counters, LRU links) and its bucket,
// about 120 bytes, plus a heap block of 24 bytes per replica and one pointer per replica in its
// host's reverse index: about 200 bytes for an entry with two replicas.
//
// Thread safety: not synchronised; the owner (PlacementNode) holds a mutex.
#ifndef KVFABRIC_SERVER_PLACEMENT_DIRECTORY_H_
#define KVFABRIC_SERVER_PLACEMENT_DIRECTORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_key.h"
#include "server/placement/planner.h"

namespace kvfabric::placement {

// Values equal kvfabric.v1.BlockEventKind.
enum class BlockEventKind : std::uint8_t {
  kUnspecified = 0,
  kCommitted = 1,
  kDemoted = 2,
  kPromoted = 3,
  kEvicted = 4,
  kDeleted = 5,
  kCorrupted = 6,
  kPresent = 7,
};

// One event of a daemon's block report (kvfabric.v1.BlockEvent, the fields the directory uses).
struct BlockEvent {
  BlockEventKind kind = BlockEventKind::kUnspecified;
  std::string ns;
  BlockKey key;
  // Tier after the event, or the tier the block left (EVICTED, DELETED, CORRUPTED).
  Tier tier = Tier::kUnspecified;
  std::uint64_t payload_bytes = 0;
  // kvfabric.v1.Representation value; 0 if unknown.
  std::uint8_t representation = 0;
  // Accesses on the daemon since commit.
  std::uint64_t hit_count = 0;
};

// One daemon's copy of a block.
struct DirectoryReplica {
  std::string host_id;
  std::uint64_t incarnation = 0;
  bool on_host = false;
  bool on_nvme = false;
  std::uint64_t payload_bytes = 0;
  std::uint8_t representation = 0;

  // The tier a fetch would read from: host if the block is in the host pool, else NVMe.
  Tier best_tier() const { return on_host ? Tier::kHost : Tier::kNvme; }
};

struct DirectoryEntry {
  // In the order the replicas were added.
  std::vector<DirectoryReplica> replicas;
  std::uint64_t hit_count = 0;
  std::uint64_t last_access_us = 0;
};

struct DirectoryCounters {
  // Gauges.
  std::uint64_t entries = 0;
  std::uint64_t replicas = 0;
  std::uint64_t hosts = 0;
  std::uint64_t namespaces = 0;
  // Counters.
  std::uint64_t events_applied = 0;
  // From an unknown host or an incarnation other than the declared one.
  std::uint64_t events_ignored_incarnation = 0;
  // Unspecified kind, or a tier other than host/nvme where one is needed.
  std::uint64_t events_ignored_malformed = 0;
  // Events that removed or changed a replica the directory did not have (reordered or lost
  // reports; harmless).
  std::uint64_t events_without_replica = 0;
  // Entries dropped to stay within max_entries.
  std::uint64_t entries_evicted = 0;
  // Replicas refused because the entry had max_replicas already.
  std::uint64_t replicas_refused = 0;
  // Replicas removed because a client reported a NOT_FOUND (ReportStale found one to remove).
  std::uint64_t stale_replicas_removed = 0;
  // ReportStale calls naming a replica the directory no longer had.
  std::uint64_t stale_reports_unmatched = 0;
  // Replicas dropped with their host (DropHost, a new incarnation) or by a full snapshot.
  std::uint64_t replicas_dropped_with_host = 0;
  std::uint64_t replicas_dropped_by_snapshot = 0;
};

class Directory {
 public:
  struct Options {
    // Most entries held. Default 4 Mi (about 800 MiB with two replicas each): 4 TiB of cached
    // KV at 1 MiB blocks. Full: the least recently accessed entry goes.
    std::size_t max_entries = std::size_t{4} << 20;
    // Most replicas per entry (kvfabric.v1.Limits.max_replicas). Default 8; at most 8.
    std::size_t max_replicas = 8;
  };

  explicit Directory(const Options& options);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // Declares host_id's current incarnation. If the host was known with another incarnation,
  // its replicas are dropped first. Returns the replicas dropped.
  std::size_t SetHostIncarnation(std::string_view host_id, std::uint64_t incarnation);
  // Forgets the host and drops its replicas (it left, its lease expired). Returns the replicas
  // dropped; 0 for an unknown host.
  std::size_t DropHost(std::string_view host_id);
  // The declared incarnation, or 0 for an unknown host.
  std::uint64_t HostIncarnation(std::string_view host_id) const;
  // Replicas the directory holds for the host.
  std::size_t HostReplicas(std::string_view host_id) const;

  // Applies events in order (see the file comment). Returns how many were applied (0 when the
  // host is unknown or `incarnation` is not its declared one). `now_us` stamps new entries.
  std::size_t Apply(std::string_view host_id, std::uint64_t incarnation,
                    std::span<const BlockEvent> events, std::uint64_t now_us);

  // Full snapshot: BeginSnapshot, then Apply of the snapshot's PRESENT events (and any events
  // between), then EndSnapshot drops the host's replicas that nothing since BeginSnapshot
  // mentioned. Returns the replicas dropped. A host without a snapshot in progress: 0.
  void BeginSnapshot(std::string_view host_id);
  std::size_t EndSnapshot(std::string_view host_id);

  // The entry of each key (empty replicas: unknown). With `touch`, every key found counts as
  // an access: hit_count + 1 and last access = now_us (moved to the LRU front).
  std::vector<DirectoryEntry> Lookup(std::string_view ns, std::span<const BlockKey> keys,
                                     bool touch, std::uint64_t now_us);
  // One entry, without touching it.
  DirectoryEntry Get(std::string_view ns, const BlockKey& key) const;

  // A client got NOT_FOUND from `host_id` for (ns, key): drop that replica. Returns whether one
  // was removed (both outcomes are counted).
  bool ReportStale(std::string_view ns, const BlockKey& key, std::string_view host_id);

  DirectoryCounters counters() const;
  std::size_t size() const { return map_.size(); }

 private:
  struct EntryKey {
    std::uint32_t ns = 0;
    BlockKey key;
    friend bool operator==(const EntryKey&, const EntryKey&) = default;
  };
  struct EntryKeyHash {
    std::size_t operator()(const EntryKey& k) const noexcept;
  };
  struct Entry;
  using Node = std::pair<const EntryKey, Entry>;
  struct Replica {
    std::uint32_t host = 0;      // slot in hosts_
    std::uint32_t host_pos = 0;  // position in hosts_[host].nodes
    std::uint32_t snapshot = 0;  // hosts_[host].snapshot when last mentioned
    std::uint8_t tiers = 0;      // bit 0: host pool, bit 1: NVMe
    std::uint8_t representation = 0;
    std::uint64_t payload_bytes = 0;
  };
  struct Entry {
    std::vector<Replica> replicas;
    std::uint64_t hit_count = 0;
    std::uint64_t last_access_us = 0;
    Node* lru_prev = nullptr;  // towards the most recent
    Node* lru_next = nullptr;  // towards the least recent
  };
  struct Host {
    std::string id;
    std::uint64_t incarnation = 0;
    // Generation of the snapshot in progress (0 = none); replicas mentioned since its start
    // carry it.
    std::uint32_t snapshot = 0;
    std::uint32_t next_snapshot = 1;
    std::vector<Node*> nodes;  // every entry holding a replica of this host
  };
  using Map = std::unordered_map<EntryKey, Entry, EntryKeyHash>;
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>()(s);
    }
  };
  template <typename V>
  using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

  std::uint32_t InternNamespace(std::string_view ns);
  bool FindNamespace(std::string_view ns, std::uint32_t* id) const;
  int FindHost(std::string_view host_id) const;
  // Applies one event of host slot `h`; false if it was ignored as malformed.
  bool ApplyOne(std::uint32_t h, const BlockEvent& e, std::uint64_t now_us);
  // Removes replica `r` of `node` (and the node if it has none left). Returns true if the node
  // was erased.
  bool RemoveReplica(Node* node, std::size_t r);
  std::size_t DropAllOf(std::uint32_t h);
  void EraseNode(Node* node);
  void LruUnlink(Node* node);
  void LruPushFront(Node* node);
  DirectoryEntry ToEntry(const Node& node) const;

  const Options options_;
  Map map_;
  Node* lru_head_ = nullptr;  // most recent
  Node* lru_tail_ = nullptr;  // least recent
  std::vector<Host> hosts_;
  std::vector<std::uint32_t> free_hosts_;
  StringMap<std::uint32_t> host_by_id_;
  std::vector<std::string> namespaces_;
  StringMap<std::uint32_t> namespace_by_name_;
  std::uint64_t replicas_ = 0;
  DirectoryCounters counters_;
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_DIRECTORY_H_
