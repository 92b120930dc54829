// LeaseTable: the cache host's state machine for blocks in the host pool:
// write reservations, commits, read leases, expiry, deletion, and applying
// eviction and demotion decisions. It owns the BlockIndex and borrows the
// HostPagePool.
//
// Write path.
//   Reserve(ns, key, meta, ttl) takes ceil(bytes / page) pages in state
//     reserved and returns a reservation id with those pages; the payload then
//     arrives through the transport into exactly those pages. First reserver
//     wins: AlreadyExists if the key is committed (in any tier) or reserved by
//     another writer. Reserve never evicts. When the pool cannot hold the block
//     it returns ResourceExhausted with the page counts; the caller (the
//     daemon) then runs MakeRoom with its policy, scoped to the requesting
//     namespace, and retries once; demotions return their pages only when the
//     NVMe tier calls CompleteDemotion, so that retry may still fail and the
//     client sees ResourceExhausted. A namespace over its quota is refused
//     with ResourceExhausted naming the quota.
//   Commit(id, crc) computes the CRC32C of the reserved pages (outside the
//     mutex; the reservation is marked committing so expiry skips it) and
//     publishes the block atomically if it matches. On a mismatch it returns
//     DataLoss, frees the pages and publishes nothing; the answer never names
//     the CRC it computed.
// No foreign bytes. Pool pages are not cleared when they are freed or
//   reserved: a reservation may sit on pages a deleted block of another
//   tenant used. So the table records which byte ranges of a reservation a
//   transfer has written (EndWrite with the range that landed; CopyIn for an
//   in-process writer) and Commit refuses, with FailedPrecondition and the
//   first gap, a block whose payload is not wholly covered by them. A block is
//   published only over bytes its writer put there. (Clearing on reuse was
//   measured and costs more: see docs/cache-host.md, "Reused pages".) A
//   reservation holds at most kMaxWrittenRanges disjoint ranges.
//   A reservation not committed by its expiry is removed by ExpireUntil and
//     its pages return to the pool.
// Read path.
//   Lease(ns, keys, ttl) pins the host pages of every key of `ns` that is in
//     the host pool and reports each key's outcome (leased, missing, or only on
//     NVMe, which needs staging first). Pinned pages are neither evicted,
//     demoted nor freed (the pool itself refuses to free a pinned page) until
//     Release or expiry. Renew moves the expiry.
// Transfers. Expiry must never recycle pages a transfer is still touching (a
//   stalled client's late payload would land in another block; a late push
//   would send another block's bytes). So the daemon brackets every transfer
//   into a reservation's pages with BeginWrite/EndWrite, and every transfer
//   out of leased pages with BeginRead/EndRead. A reservation or lease with a
//   transfer in flight is not expired until the transfer ends (the transport
//   completes every transfer, failing it if the peer dies, so this is bounded);
//   Commit and Abort refuse while a write is in flight; Release while a read
//   is in flight takes effect when the last read ends.
// Expiry is driven by the caller's clock: ExpireUntil(now) drops every
//   reservation and lease whose expiry is <= now, and counts them. The daemon
//   calls it periodically; tests call it with chosen times.
// Eviction. MakeRoom gathers candidates (committed host-resident blocks with
//   no read pin and no demotion in flight, in the given namespace scope),
//   asks PlanEviction (eviction_policy.h) for decisions, applies them and
//   records each in the DecisionLog. A demotion pins the pages and is returned
//   as a DemotionOrder; the NVMe tier writes them and calls CompleteDemotion
//   (host pages freed, tier NVMe) or AbortDemotion.
// Compact copies. With CompactKeepOptions::budget_bytes > 0, every exact
//   block gets its compact copy's key at publish (CompactBlockKey, one
//   SHA-256 over ~100 bytes); MakeRoom pairs each exact block with a host
//   copy with its copy (held) and hands PlanEviction the roles and the kept
//   copies' bytes ("Compact copies" in eviction_policy.h); it marks the
//   copies it keeps (BlockEntry::compact_kept). A kept copy whose exact block
//   comes back into the pool (committed again, or staged from NVMe) is held
//   again, no longer counted against the budget.
//
// Limits (LeaseTableOptions) bound every request: TTLs, keys per lease, live
// reservations and leases, so no request makes the table grow without bound.
//
// Thread safety: every method may be called from any thread. One mutex guards
// the table and the index; the pool has its own (lock order: table, then
// pool). Commit's CRC runs without the mutex. Nothing here blocks on I/O.
#ifndef KVFABRIC_SERVER_CACHE_HOST_LEASE_TABLE_H_
#define KVFABRIC_SERVER_CACHE_HOST_LEASE_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_key.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/block_index.h"
#include "server/cache_host/block_location.h"
#include "server/cache_host/eviction_policy.h"
#include "server/cache_host/host_page_pool.h"

namespace kvfabric::cache_host {

// Microseconds on a monotonic clock (Env::NowMicros in the daemon; a fake in
// tests).
using MicrosClock = std::function<std::uint64_t()>;

struct LeaseTableOptions {
  // Longest TTL a reservation or lease may ask for (--max-lease-ttl). Default
  // 60 s: long enough for a 64 MiB block over a slow link, short enough that a
  // vanished client's pages come back within a minute.
  std::uint64_t max_ttl_us = 60'000'000;
  // Most keys in one Lease call (--max-keys-per-lease). Default 4096 (a
  // 65,536-token history at 16 tokens per block).
  std::uint32_t max_keys_per_lease = 4096;
  // Most live reservations and leases (--max-reservations, --max-leases).
  // Default 65,536 each; beyond them requests get ResourceExhausted.
  std::uint32_t max_reservations = 65536;
  std::uint32_t max_leases = 65536;
  // Per namespace, so that one tenant (or one client inventing tenants'
  // traffic) cannot hold every reservation, lease or pinned page:
  // --max-reservations-per-namespace (default 4096 open reservations),
  // --max-reserved-bytes-per-namespace (host bytes reserved at once; 0: no
  // cap, the daemon sets half its pool), --max-leases-per-namespace (default
  // 16384), --max-leased-bytes-per-namespace (host bytes its leases pin; 0:
  // no cap, the daemon sets half its pool). Beyond them ResourceExhausted
  // names the flag.
  std::uint32_t max_reservations_per_namespace = 4096;
  std::uint64_t max_reserved_bytes_per_namespace = 0;
  std::uint32_t max_leases_per_namespace = 16384;
  std::uint64_t max_leased_bytes_per_namespace = 0;
  BlockIndexOptions index;
  // Recent eviction decisions kept for explain (--eviction-log-capacity).
  std::size_t decision_log_capacity = 4096;
  // --compact-keep-bytes and the codec of the copies it keeps
  // (eviction_policy.h, "Compact copies"). Default: no preference.
  CompactKeepOptions compact_keep;
};

// A byte range of the pool (offsets into the pool region).
struct PoolRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// Most disjoint written ranges one reservation records; a write that could
// exceed it is refused at BeginWriteRange (a client writes a block in one
// range per page run, so honest writers stay far below it).
inline constexpr std::size_t kMaxWrittenRanges = 1024;

struct WriteReservation {
  std::uint64_t id = 0;
  PageRuns pages;
  std::uint64_t expires_at_us = 0;
};

enum class LeaseOutcome : std::uint8_t {
  kLeased = 1,    // pages pinned; `pages` is valid
  kMissing = 2,   // not in this namespace
  kNvmeOnly = 3,  // on NVMe only: stage it into the pool first (BeginPromotion)
  kFingerprintMismatch = 4,  // its fingerprint digest is not the expected one; not leased
  kBusy = 5,      // on NVMe only and another lease is staging it now; retry
};

struct LeasedBlock {
  BlockKey key;
  LeaseOutcome outcome = LeaseOutcome::kMissing;
  PageRuns pages;
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
  BlockRepresentation representation = BlockRepresentation::kExact;
  BlockMeta meta;                     // set unless kMissing
  BlockTier tier = BlockTier::kHost;  // set unless kMissing
  std::vector<std::uint32_t> layer_crc32c;  // kLeased and asked for
};

// An NVMe -> host staging read the daemon performs for a lease: read the
// block at `nvme` into `pages` (state staging), then CompletePromotion, or
// AbortPromotion on failure.
struct PromotionOrder {
  NamespaceId ns = 0;
  BlockKey key;
  PageRuns pages;
  NvmeLocation nvme;
  BlockMeta meta;
  std::uint32_t crc32c = 0;
};

struct ReadLease {
  std::uint64_t id = 0;  // 0 when no key was leased (nothing to release)
  std::uint64_t expires_at_us = 0;
  std::vector<LeasedBlock> blocks;  // one per requested key, in order
};

struct ExpiryCounts {
  std::uint64_t reservations = 0;
  std::uint64_t leases = 0;
};

// A host -> NVMe copy the tier must perform. The pages stay pinned until
// CompleteDemotion or AbortDemotion.
struct DemotionOrder {
  NamespaceId ns = 0;
  BlockKey key;
  PageRuns pages;
  BlockMeta meta;
  std::uint32_t crc32c = 0;
};

struct EvictionRequest {
  Watermarks watermarks;
  bool nvme_enabled = false;
  // See EvictionTrigger: room left on NVMe, and why demotion is off.
  std::uint64_t nvme_free_bytes = ~std::uint64_t{0};
  std::uint64_t nvme_record_alignment = 4096;
  std::string nvme_off_reason;
  // Set for a pass on behalf of one namespace's request: only its blocks are
  // candidates. Unset for the background pass over every namespace.
  std::optional<Namespace> scope;
  std::uint64_t pages_needed = 0;
};

struct EvictionPassResult {
  std::vector<EvictionDecision> decisions;
  std::vector<DemotionOrder> demotions;
  std::uint64_t pages_freed = 0;  // by drops and evictions, now
};

// Counters since creation and current gauges, a snapshot for metrics.
struct LeaseTableCounters {
  std::uint64_t reservations = 0;
  std::uint64_t already_exists = 0;
  std::uint64_t quota_refusals = 0;
  std::uint64_t pool_refusals = 0;
  std::uint64_t commits = 0;
  std::uint64_t crc_failures = 0;
  std::uint64_t aborts = 0;
  std::uint64_t reservations_expired = 0;
  std::uint64_t leases = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t nvme_only = 0;
  std::uint64_t releases = 0;
  std::uint64_t renewals = 0;
  std::uint64_t leases_expired = 0;
  std::uint64_t deletes = 0;
  std::uint64_t dropped_host_copies = 0;
  std::uint64_t evictions = 0;
  std::uint64_t demotions_started = 0;
  std::uint64_t demotions_completed = 0;
  std::uint64_t demotions_aborted = 0;
  std::uint64_t active_reservations = 0;
  std::uint64_t active_leases = 0;
  std::uint64_t pages_demoting = 0;
  std::uint64_t promotions_started = 0;
  std::uint64_t promotions_completed = 0;
  std::uint64_t promotions_failed = 0;
  std::uint64_t recovered = 0;
  // Gauges: the compact copies eviction keeps (BlockIndex::compact_kept_bytes).
  std::uint64_t compact_kept_bytes = 0;
  std::uint64_t compact_kept_blocks = 0;
};

class LeaseTable {
 public:
  // REQUIRES: pool outlives the table; clock is callable from any thread.
  LeaseTable(HostPagePool* pool, MicrosClock clock, LeaseTableOptions options = {});
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // ---- Write path ----
  // See the class comment. InvalidArgument for a TTL of 0 or above
  // max_ttl_us, or bytes of 0 or above kMaxBlockPayloadBytes.
  StatusOr<WriteReservation> Reserve(const Namespace& ns, const BlockKey& key,
                                     const BlockMeta& meta, std::uint64_t ttl_us);
  // NotFound for an unknown or expired reservation; FailedPrecondition while
  // another Commit of it runs, or when some payload byte was never written
  // (the reservation stays; write the gap and commit again); DataLoss on a
  // CRC mismatch (pages freed). `landed_slice_crcs`: the CRC32C of each
  // layer slice (or of the whole payload, one value, for a payload that does
  // not split into its layers) as the daemon's own transport computed it over
  // these pages right after writing them (Transfer::checksum, kStore); when
  // given in that count, Commit folds them instead of reading the pages
  // again. Daemon-internal: never from a request.
  Status Commit(std::uint64_t reservation_id, std::uint32_t crc32c,
                std::span<const std::uint32_t> landed_slice_crcs = {});
  // Gives a reservation up; its pages return. NotFound if unknown;
  // FailedPrecondition while a write or Commit is in flight.
  Status Abort(std::uint64_t reservation_id);
  // Brackets one transfer into the reservation's pages (see "Transfers").
  // BeginWrite: NotFound if unknown or expired, FailedPrecondition while
  // committing. EndWrite: NotFound if unknown, FailedPrecondition without a
  // matching BeginWrite. `landed` is the pool range the transfer wrote in
  // full (it is recorded as written; see "No foreign bytes"); nullopt for a
  // transfer that failed or wrote nothing. A landed range must lie inside the
  // reservation's payload (InvalidArgument otherwise; the bracket still ends).
  Status BeginWrite(std::uint64_t reservation_id);
  Status EndWrite(std::uint64_t reservation_id, std::optional<PoolRange> landed = std::nullopt);
  // An in-process writer's path: copies `payload` into the reservation's
  // pages from payload byte 0 and records it as written. InvalidArgument if
  // it is longer than the block; NotFound / FailedPrecondition as BeginWrite.
  Status CopyIn(std::uint64_t reservation_id, std::span<const std::byte> payload);

  // ---- Read path ----
  // InvalidArgument for a bad TTL or more than max_keys_per_lease keys. With
  // `expected`, a block of another fingerprint digest is kFingerprintMismatch
  // and not leased.
  // With `with_layer_crcs`, each leased block's layer CRCs are copied out
  // (LeasedBlock::layer_crc32c; for a layer-range fetch). Without
  // `count_access`, a lease is no access: hit counts, last access and the
  // hit/miss counters stay as they were (the daemon's own readers, which
  // must not make a block look hot to eviction).
  StatusOr<ReadLease> Lease(const Namespace& ns, std::span<const BlockKey> keys,
                            std::uint64_t ttl_us, const FingerprintDigest* expected = nullptr,
                            bool with_layer_crcs = false, bool count_access = true);

  // Staging (NVMe -> host, "promotion"). BeginPromotion takes staging pages
  // for an NVMe-only block and marks it promoting (Delete refuses meanwhile,
  // a second BeginPromotion gets Aborted). NotFound if absent; nullopt (nothing
  // to stage) if it has a host copy already; ResourceExhausted (with the page counts) if
  // the pool cannot hold it. CompletePromotion publishes the staged pages as the
  // block's host copy (tier both; the NVMe copy stays, so eviction later drops
  // the host copy without I/O). AbortPromotion frees the pages; with
  // `remove_block` (the NVMe copy failed its CRC) it also removes the block
  // from the index and returns it.
  StatusOr<std::optional<PromotionOrder>> BeginPromotion(NamespaceId ns, const BlockKey& key);
  // Waits until no staging read of `key` is in flight (another lease's
  // BeginPromotion ended in CompletePromotion or AbortPromotion) or `deadline`
  // passes. true: none is in flight now (the block may have a host copy, or
  // may be NVMe-only again after a failed read, or gone).
  bool AwaitPromotion(NamespaceId ns, const BlockKey& key,
                      std::chrono::steady_clock::time_point deadline);
  // `layer_crcs`: the staged copy's verified layer CRCs (NvmeTier::Read).
  Status CompletePromotion(const PromotionOrder& order, std::vector<std::uint32_t> layer_crcs);
  StatusOr<std::optional<BlockEntry>> AbortPromotion(const PromotionOrder& order,
                                                     bool remove_block);

  // Range-checked transfer brackets for the data plane: like BeginWrite /
  // BeginRead, and additionally InvalidArgument unless the pool byte range
  // [offset, offset + length) lies inside one page run of the reservation (of
  // one block of the lease), and within the block's payload bytes.
  // BeginWriteRange is ResourceExhausted when the reservation's written
  // ranges and writes in flight reach kMaxWrittenRanges.
  Status BeginWriteRange(std::uint64_t reservation_id, std::uint64_t offset,
                         std::uint64_t length);
  Status BeginReadRange(std::uint64_t lease_id, std::uint64_t offset, std::uint64_t length);
  // NotFound for an unknown or expired lease.
  Status Release(std::uint64_t lease_id);
  // Returns the new expiry. NotFound for an unknown or expired lease.
  StatusOr<std::uint64_t> Renew(std::uint64_t lease_id, std::uint64_t ttl_us);
  // Brackets one transfer out of the lease's pages (see "Transfers").
  // BeginRead: NotFound if unknown, expired or released. EndRead: NotFound if
  // unknown, FailedPrecondition without a matching BeginRead.
  Status BeginRead(std::uint64_t lease_id);
  Status EndRead(std::uint64_t lease_id);

  // Moves a reservation's expiry; returns the new one. NotFound if unknown or
  // expired; InvalidArgument for a bad TTL.
  StatusOr<std::uint64_t> RenewReservation(std::uint64_t reservation_id, std::uint64_t ttl_us);

  // Drops what expired at or before `now_us`.
  ExpiryCounts ExpireUntil(std::uint64_t now_us);

  // ---- Other ----
  // The entry of (ns, key), without leasing it. NotFound if absent.
  StatusOr<BlockEntry> Lookup(const Namespace& ns, const BlockKey& key) const;
  // Removes (ns, key) and frees its host pages; returns the removed entry (its
  // NVMe location, if any, is the tier's to drop). NotFound if absent;
  // FailedPrecondition while it is leased or being demoted.
  StatusOr<BlockEntry> Delete(const Namespace& ns, const BlockKey& key);
  Status SetQuota(const Namespace& ns, std::uint64_t quota_bytes);
  // NotFound for a namespace never seen.
  StatusOr<NamespaceUsage> Usage(const Namespace& ns) const;
  // The id of `ns` if any block or quota named it.
  std::optional<NamespaceId> FindNamespace(const Namespace& ns) const;
  // The tenant name of `id` ("" if unknown).
  std::string TenantName(NamespaceId id) const;
  // Every indexed block (a full report for placement). O(blocks).
  std::vector<BlockEntry> Entries() const;
  // Every namespace's usage (for Stats and metrics).
  std::vector<NamespaceUsage> Usages() const;

  // Re-indexes a block the NVMe tier recovered at start-up (tier NVMe).
  // AlreadyExists if present; InvalidArgument / ResourceExhausted from
  // interning the namespace.
  Status AdoptRecovered(const Namespace& ns, const BlockKey& key, const BlockMeta& meta,
                        std::uint32_t crc32c, const NvmeLocation& location);

  // ---- Eviction ----
  StatusOr<EvictionPassResult> MakeRoom(const EvictionPolicy& policy, const EvictionRequest& req);
  // The tier wrote the block: frees its host pages, tier becomes NVMe.
  Status CompleteDemotion(NamespaceId ns, const BlockKey& key, const NvmeLocation& location);
  // The tier gave up: the pages are unpinned and stay in the host pool.
  Status AbortDemotion(NamespaceId ns, const BlockKey& key);
  // Why (ns, key) left the pool, newest first (`kvfabric explain`).
  std::vector<EvictionDecision> Explain(const Namespace& ns, const BlockKey& key) const;
  const DecisionLog& decisions() const { return decisions_; }

  LeaseTableCounters Counters() const;

 private:
  struct Reservation {
    NamespaceId ns;
    BlockKey key;
    BlockMeta meta;
    PageRuns pages;
    std::uint64_t resident_bytes;
    std::uint64_t expires_at_us;
    bool committing = false;
    std::uint32_t writes_in_flight = 0;
    // Pool ranges written so far: sorted, disjoint, non-adjacent [begin, end).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> written;
  };
  struct PinnedBlock {
    BlockKey key;
    PageRuns pages;
    std::uint64_t bytes = 0;
  };
  struct LeaseState {
    NamespaceId ns;
    std::uint64_t expires_at_us;
    std::vector<PinnedBlock> blocks;
    std::uint32_t reads_in_flight = 0;
    bool released = false;  // Release came while reads were in flight
    std::uint64_t page_bytes = 0;
  };
  struct SlotKey {
    NamespaceId ns;
    BlockKey key;
    friend bool operator==(const SlotKey&, const SlotKey&) = default;
  };
  struct SlotKeyHash {
    std::size_t operator()(const SlotKey& s) const noexcept {
      return BlockKey::Hash()(s.key) ^ (std::size_t{s.ns} * 0x9e3779b97f4a7c15ull);
    }
  };

  Status CheckTtl(std::uint64_t ttl_us) const;
  // OK if [offset, offset + length) lies inside one run of `pages` and inside
  // the first `bytes` bytes of the block.
  Status CheckRange(const PageRuns& pages, std::uint64_t bytes, std::uint64_t offset,
                    std::uint64_t length) const;
  // CheckRange's test without the message: whether [offset, offset + length)
  // lies inside the first `bytes` of `pages`.
  bool RangeInside(const PageRuns& pages, std::uint64_t bytes, std::uint64_t offset,
                   std::uint64_t length) const;
  void DropReservationLocked(std::uint64_t id, bool free_pages) KVF_REQUIRES(mu_);
  // The reservation a write may go into: NotFound if unknown or expired,
  // FailedPrecondition while it is being committed.
  StatusOr<Reservation*> WritableLocked(std::uint64_t reservation_id) KVF_REQUIRES(mu_);
  // Adds [offset, offset + length) to r's written ranges, merging neighbours.
  static void RecordWritten(Reservation& r, std::uint64_t offset, std::uint64_t length);
  // OK if r's written ranges cover every payload byte; otherwise
  // FailedPrecondition naming how many bytes are missing and the first gap.
  Status CheckWritten(std::uint64_t id, const Reservation& r) const;
  void ReleaseLocked(std::uint64_t id) KVF_REQUIRES(mu_);
  // The key of the compact copy of an exact block `key` while copies are
  // kept (budget > 0); nullopt otherwise. Computed without the mutex.
  std::optional<BlockKey> CompactKeyOf(const BlockKey& key,
                                       BlockRepresentation representation) const;
  // The exact block (ns, *compact_key's owner) has a host copy again: its
  // copy, if kept, is held again (no longer counted against the budget).
  void HoldCopyLocked(NamespaceId ns, const std::optional<BlockKey>& compact_key) KVF_REQUIRES(mu_);

  HostPagePool* const pool_;
  const MicrosClock clock_;
  const LeaseTableOptions options_;
  DecisionLog decisions_;

  mutable Mutex mu_;
  BlockIndex index_ KVF_GUARDED_BY(mu_);
  std::uint64_t next_id_ KVF_GUARDED_BY(mu_) = 1;
  std::unordered_map<std::uint64_t, Reservation> reservations_ KVF_GUARDED_BY(mu_);
  std::unordered_map<SlotKey, std::uint64_t, SlotKeyHash> reserved_keys_ KVF_GUARDED_BY(mu_);
  std::unordered_map<std::uint64_t, LeaseState> leases_ KVF_GUARDED_BY(mu_);
  // (expiry, id) of reservations and of leases, for ExpireUntil.
  std::set<std::pair<std::uint64_t, std::uint64_t>> reservation_expiry_ KVF_GUARDED_BY(mu_);
  std::set<std::pair<std::uint64_t, std::uint64_t>> lease_expiry_ KVF_GUARDED_BY(mu_);
  LeaseTableCounters c_ KVF_GUARDED_BY(mu_);
  // Signalled when a staging read ends (CompletePromotion, AbortPromotion).
  CondVar promotion_cv_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_LEASE_TABLE_H_
