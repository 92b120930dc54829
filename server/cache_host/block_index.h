// BlockIndex: the cache host's map from (namespace, BlockKey) to where the
// block lives and what is known about it, with per-namespace accounting and
// quotas.
//
// Namespaces. Every entry belongs to one namespace (tenant). Namespaces are
// interned to small ids (NamespaceId) the first time a write or a quota names
// them, up to BlockIndexOptions::max_namespaces, so a stream of made-up tenant
// names cannot grow the index without bound; reads of an unknown tenant do not
// intern it. The map is keyed by (namespace id, key): a request for namespace A
// cannot see, lease or evict a block of namespace B even if it names B's key,
// and no lookup tells A whether B holds a key.
//
// Accounting, per namespace: bytes resident in the host pool (whole pages:
// pages x page_bytes, what the block actually costs the pool), bytes reserved
// for writes in flight, bytes on NVMe, and blocks. A quota bounds resident plus
// reserved host bytes; the lease table checks it at Reserve. A quota of 0
// means unlimited.
//
// Entry fields that affect accounting (tier, host pages, resident bytes, NVMe
// location, compact_kept) change only through Publish, Remove,
// ReplaceLocation and SetCompactKept. Fields the lease table keeps up to date
// on every access (pins, demoting, last access, hit count) may be changed
// through FindMutable.
//
// Kept compact copies (eviction_policy.h, "Compact copies"): the index sums
// the resident bytes of the blocks marked compact_kept that have a host copy
// (compact_kept_bytes(), the figure --compact-keep-bytes bounds). A block
// that loses its host copy (ReplaceLocation to NVMe only, Remove) is no
// longer kept.
//
// Thread safety: none. The index is owned by the LeaseTable, which serialises
// every call under its mutex.
#ifndef KVFABRIC_SERVER_CACHE_HOST_BLOCK_INDEX_H_
#define KVFABRIC_SERVER_CACHE_HOST_BLOCK_INDEX_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/block_format.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/block_location.h"

namespace kvfabric::cache_host {

using NamespaceId = std::uint32_t;

// What a writer declares about a block when it reserves pages for it.
struct BlockMeta {
  std::uint64_t bytes = 0;  // payload bytes, (0, kMaxBlockPayloadBytes]
  BlockRepresentation representation = BlockRepresentation::kExact;
  FingerprintDigest fingerprint{};
  std::uint32_t tokens = 0;        // tokens the block covers
  std::uint64_t token_offset = 0;  // tokens before it in its context (its position)
  // The block's shape, from its model fingerprint: written into the block
  // header when it is demoted to NVMe (core/block_format.h), which checks that
  // an exact block's bytes are layers x 2 x tokens x kv_heads x head_dim x
  // dtype size.
  KvDtype dtype = KvDtype::kFp16;
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
};

struct BlockEntry {
  NamespaceId ns = 0;
  BlockKey key;
  BlockMeta meta;
  std::uint32_t crc32c = 0;  // CRC32C of the payload, verified at commit
  // CRC32C of each layer slice (docs/block-format.md, version 2), folding to
  // crc32c: computed from the pages at commit, read (or computed) from the
  // NVMe record at promotion. Present whenever the block has a host copy and
  // its payload splits into meta.layers equal slices; empty otherwise (a
  // block recovered from NVMe before its first promotion). 4 bytes a layer.
  std::vector<std::uint32_t> layer_crc32c;
  BlockTier tier = BlockTier::kHost;
  PageRuns host_pages;                    // when InHost(tier)
  std::uint64_t host_resident_bytes = 0;  // host_pages x page_bytes; 0 when not in host
  NvmeLocation nvme;                      // when OnNvme(tier)
  std::uint64_t committed_us = 0;
  std::uint64_t last_access_us = 0;
  std::uint64_t hit_count = 0;
  std::uint32_t read_pins = 0;  // read leases holding the host pages
  bool demoting = false;        // a host -> NVMe copy is in flight (pages pinned)
  bool promoting = false;       // an NVMe -> host staging read is in flight
  // An exact block's compact copy would have this key (CompactBlockKey with
  // the lease table's CompactKeepOptions codec); set at publish while
  // --compact-keep-bytes > 0, nullopt otherwise and for compact blocks.
  std::optional<BlockKey> compact_key;
  // A compact copy that eviction kept in the host pool when it took its exact
  // block's host copy (see the class comment; SetCompactKept).
  bool compact_kept = false;
};

struct NamespaceUsage {
  std::string tenant;
  std::uint64_t quota_bytes = 0;     // host resident + reserved; 0 = unlimited
  std::uint64_t host_bytes = 0;      // resident in the host pool (whole pages)
  std::uint64_t reserved_bytes = 0;  // reserved for writes in flight (whole pages)
  std::uint64_t nvme_bytes = 0;      // NvmeLocation::bytes of its blocks on NVMe
  std::uint64_t blocks = 0;
  std::uint64_t host_blocks = 0;  // of which with a host copy
  std::uint64_t nvme_blocks = 0;  // of which with an NVMe copy
  std::uint64_t hits = 0;         // lease entries that found their block, since start
  std::uint64_t misses = 0;       // lease entries that did not
  // Held now, for the per-namespace limits (LeaseTableOptions).
  std::uint64_t reservations = 0;  // open write reservations
  std::uint64_t leases = 0;        // read leases
  std::uint64_t leased_bytes = 0;  // host bytes those leases pin (a block leased twice counts twice)
};

struct BlockIndexOptions {
  // Most distinct namespaces (--max-namespaces). Default 4096. Each costs a
  // few hundred bytes; the bound keeps invented tenant names from growing the
  // daemon's memory. A namespace that holds nothing (no block, reservation,
  // lease or quota) is reclaimed (ReclaimIfEmpty), so the bound counts
  // namespaces in use, not names ever seen.
  std::uint32_t max_namespaces = 4096;
};

class BlockIndex {
 public:
  explicit BlockIndex(BlockIndexOptions options = {});
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // The id of `ns`, interning it if new. InvalidArgument for a name that does
  // not validate; ResourceExhausted (naming --max-namespaces) when full.
  StatusOr<NamespaceId> InternNamespace(const Namespace& ns);
  // The id of `ns` if it was interned; never interns.
  std::optional<NamespaceId> FindNamespace(const Namespace& ns) const;
  // REQUIRES: id was returned by InternNamespace and not reclaimed since.
  const NamespaceUsage& Usage(NamespaceId id) const { return usage_[id]; }
  NamespaceUsage& MutableUsage(NamespaceId id) { return usage_[id]; }
  // Ids are below this (some may be free: see live()).
  std::uint32_t namespace_count() const { return static_cast<std::uint32_t>(usage_.size()); }
  // Whether `id` names an interned namespace now.
  bool live(NamespaceId id) const { return id < live_.size() && live_[id]; }
  // Namespaces interned now.
  std::uint32_t live_namespaces() const {
    return static_cast<std::uint32_t>(usage_.size() - free_ids_.size());
  }
  // Forgets `id` if it holds nothing (no block, reservation, lease or quota):
  // its name is no longer interned and the id is reused by a later
  // InternNamespace. Returns whether it was reclaimed. The caller must hold no
  // other reference to `id` that it could use afterwards (the lease table
  // purges its eviction decisions of it).
  bool ReclaimIfEmpty(NamespaceId id);

  // Sets the quota of `ns` (interning it); 0 removes it. A quota below the
  // current usage evicts nothing by itself: new reservations are refused until
  // eviction brings the namespace under it.
  Status SetQuota(const Namespace& ns, std::uint64_t quota_bytes);

  // OK if `ns` may hold `more_bytes` more host bytes; otherwise
  // ResourceExhausted with the formula ("quota of tenant \"a\": resident 6 MiB
  // + reserved 2 MiB + 1 MiB > 8 MiB; raise it or wait for eviction").
  Status CheckQuota(NamespaceId ns, std::uint64_t more_bytes) const;

  // Adds (or with a negative delta, removes) reserved bytes of `ns`.
  void ChargeReserved(NamespaceId ns, std::int64_t delta);
  // Counts one lease entry of `ns` that found (hit) or missed its block.
  void CountAccess(NamespaceId ns, bool hit) { ++(hit ? usage_[ns].hits : usage_[ns].misses); }

  const BlockEntry* Find(NamespaceId ns, const BlockKey& key) const;
  // See the class comment for which fields the caller may change.
  BlockEntry* FindMutable(NamespaceId ns, const BlockKey& key);

  // Inserts `entry` and accounts for it. AlreadyExists if (ns, key) is present.
  Status Publish(BlockEntry entry);
  // Removes (ns, key), returning the entry. NotFound if absent.
  StatusOr<BlockEntry> Remove(NamespaceId ns, const BlockKey& key);
  // Sets tier, host pages, resident bytes and NVMe location of (ns, key).
  // NotFound if absent.
  Status ReplaceLocation(NamespaceId ns, const BlockKey& key, BlockTier tier,
                         const PageRuns& host_pages, std::uint64_t host_resident_bytes,
                         const NvmeLocation& nvme);

  // Marks (ns, key) kept or not (the class comment, "Kept compact copies").
  // NotFound if absent; FailedPrecondition to keep a block without a host copy.
  Status SetCompactKept(NamespaceId ns, const BlockKey& key, bool kept);
  // Resident bytes and blocks of the kept compact copies.
  std::uint64_t compact_kept_bytes() const { return compact_kept_bytes_; }
  std::uint64_t compact_kept_blocks() const { return compact_kept_blocks_; }

  // Calls fn for every entry (of `only`, when set), in no particular order.
  // fn must not modify the index.
  void ForEach(std::optional<NamespaceId> only,
               const std::function<void(const BlockEntry&)>& fn) const;

  std::uint64_t size() const { return entries_.size(); }

 private:
  struct Slot {
    NamespaceId ns;
    BlockKey key;
    friend bool operator==(const Slot&, const Slot&) = default;
  };
  struct SlotHash {
    std::size_t operator()(const Slot& s) const noexcept {
      return BlockKey::Hash()(s.key) ^ (std::size_t{s.ns} * 0x9e3779b97f4a7c15ull);
    }
  };
  void Account(const BlockEntry& e, int sign);

  const BlockIndexOptions options_;
  std::unordered_map<std::string, NamespaceId> ids_;
  std::vector<NamespaceUsage> usage_;  // indexed by NamespaceId
  std::vector<std::uint8_t> live_;     // indexed by NamespaceId
  std::vector<NamespaceId> free_ids_;  // reclaimed ids, reused first
  std::unordered_map<Slot, BlockEntry, SlotHash> entries_;
  std::uint64_t compact_kept_bytes_ = 0;
  std::uint64_t compact_kept_blocks_ = 0;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_BLOCK_INDEX_H_
