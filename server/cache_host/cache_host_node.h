// CacheHostNode: the core of the cache-host daemon `kvfabric-cached`, in
// kvfabric's own types, tested without gRPC. It ties together the host page
// pool (allocated once, through the transport, and pre-faulted), the lease
// table and block index, the eviction policy, the optional NVMe tier with its
// catalog, and the data plane that moves payloads over the transport. The gRPC
// adapter (server/cache_host_service.h) only converts messages and checks wire
// limits; the binary (server/cache_host/cached_main.cc) only reads flags.
//
// Batches. A Reserve batch becomes one *write grant* (one lease id for the
// client) over one lease-table reservation per block; a Lease batch becomes
// one *read grant* over one or two lease-table read leases (blocks already in
// the host pool, then blocks staged from NVMe for this call). A grant carries a
// random 16-byte access token and a random 64-bit id (both from getrandom);
// the data plane moves bytes only for requests that present the grant's id
// and token and name byte ranges inside the grant's blocks
// (LeaseTable::BeginWriteRange / BeginReadRange), so a client can touch
// nothing but its own leased pages. Commit, Renew and Release also need the
// token: the grant is bound to whoever received the Reserve or Lease answer,
// and another client that guesses or observes an id can neither end nor
// extend it (until identities exist, the token is that binding; the
// authentication issue adds the caller's identity). Grants end with Release, with
// Commit(release_uncommitted), or when their TTL runs out (the maintenance
// thread expires the lease table and forgets ended grants).
//
// Writes. Reserve never blocks on I/O but may wait up to
// Options::reserve_wait for demotions it started to free room. Commit checks
// the payload's CRC32C in the pages; a mismatch publishes nothing and returns
// the pages (the client reserves again).
//
// Reads of NVMe blocks. Lease stages NVMe-only blocks into host pages before
// it returns: the block is read (O_DIRECT) into a bounce buffer, verified
// (header, key, CRC32C), copied into staging pages and published as the
// block's host copy (tier both; promotion on every read is the policy: the
// NVMe copy stays, so a later eviction drops the host copy without I/O). A
// block that fails verification is removed everywhere and answers DataLoss.
//
// Eviction and demotion. The maintenance thread runs a background pass when
// occupancy passes the high watermark; Reserve runs a pass scoped to the
// requesting namespace when the pool cannot hold its block. Demotions are
// written to the NVMe catalog (one sync per pass) and then queued on the NVMe
// tier; their pages return when the tier reports them durable. With
// --compact-keep-bytes (options.leases.compact_keep) an exact block's host
// copy leaves before its compact copy, which stays within that budget
// (eviction_policy.h, "Compact copies"); the exact block's leaving is
// reported to placement as it is without a copy (kEvicted, kDemoted), and the
// copy, under its own key, stays listed.
//
// Drain and shutdown. Drain() refuses new reservations and leases
// (Unavailable) and keeps everything else working. Shutdown() drains, waits
// (bounded) for grants in use to end, closes the data plane, flushes the NVMe
// tier (queued demotions are committed: docs/nvme-tier.md's durability rule)
// and stops the maintenance thread.
//
// Thread safety: every public method may be called from any thread (gRPC
// handler threads, the transport's progress thread through the data plane, the
// maintenance thread). Lock order: node, then lease table, then pool.
#ifndef KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_H_
#define KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/block_key.h"
#include "core/env.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/block_index.h"
#include "server/cache_host/compact_conversion_stats.h"
#include "server/cache_host/data_plane.h"
#include "server/cache_host/eviction_policy.h"
#include "server/cache_host/host_page_pool.h"
#include "server/cache_host/lease_table.h"
#include "server/cache_host/nvme_catalog.h"
#include "server/cache_host/nvme_tier.h"
#include "transport/transport.h"

namespace kvfabric::cache_host {


// --eviction-policy.
enum class EvictionPolicyKind : std::uint8_t {
  kLru = 1,
  kCostAware = 2,  // the default
};
// "lru", "cost-aware"; ParseEvictionPolicyKind is its inverse (InvalidArgument
// naming the accepted values).
std::string_view EvictionPolicyKindName(EvictionPolicyKind kind);
StatusOr<EvictionPolicyKind> ParseEvictionPolicyKind(std::string_view name);

struct CacheHostOptions {
  // --host-id. Names this daemon in logs, Health and placement. Non-empty.
  std::string host_id;

  // --host-pool-bytes, --host-page-bytes, --lock-memory (host_page_pool.h).
  HostPagePoolOptions pool;
  // --huge-pages: ask for transparent huge pages on the pool (anonymous
  // memory only; a transport-allocated pool is the transport's).
  bool huge_pages = false;
  // --pool-memory=transport|anonymous. true (default): the transport
  // allocates the pool (UCX over shared memory: truly one-sided copies);
  // false: anonymous memory registered with the transport.
  bool transport_allocates_pool = true;
  // Touch every page at start-up (and print how long it took). Default true;
  // tests with large, mostly unused pools may turn it off.
  bool prefault = true;

  // --host-high-watermark, --host-low-watermark.
  Watermarks watermarks;
  // --eviction-policy.
  EvictionPolicyKind policy = EvictionPolicyKind::kCostAware;
  // Cost model parameters of the cost-aware policy.
  CostAwareOptions cost_aware;
  // Lease-table limits (--max-lease-ttl, --max-reservations, ...), and
  // leases.compact_keep: --compact-keep-bytes and its codec.
  LeaseTableOptions leases;
  // TTL of a request that leaves it at 0 (default_ttl_ms of the Limits).
  std::uint64_t default_ttl_us = 30'000'000;
  // Connection limits of the data plane (server/cache_host/data_plane.h).
  DataPlaneOptions data_plane;
  // --reservation-ttl: the default and the longest life of an uncommitted
  // write reservation (a Reserve asking for more gets this much). Short, so
  // that reservations a client abandons return their pages quickly; a save
  // commits in milliseconds. Default 10 s.
  std::uint64_t reservation_ttl_us = 10'000'000;

  // --nvme-dir and friends. Empty dir: no NVMe tier (evicted blocks are
  // dropped). env is filled in from `env` below if left null.
  NvmeTierOptions nvme;

  // --quota NAMESPACE=BYTES, repeatable. Host bytes (resident + reserved).
  std::vector<std::pair<std::string, std::uint64_t>> quotas;

  // Models whose arithmetic the daemon prints at start-up (--model ...,
  // --history-tokens). May be empty (then only the pool lines are printed).
  std::vector<PoolModel> models;

  // How long Reserve waits for demotions it started to free room before it
  // answers ResourceExhausted. Default 2 s.
  std::chrono::milliseconds reserve_wait{2000};
  // Maintenance period: lease expiry, background eviction, grant cleanup.
  // Default 20 ms.
  std::chrono::milliseconds maintenance_interval{20};
  // Transport listener address (--transport-address), e.g. "127.0.0.1:0".
  std::string transport_address = "127.0.0.1:0";
  // Bounce buffers for NVMe staging reads, each of nvme.max_group_bytes
  // (the largest record the tier accepts), allocated at start-up. Default 2:
  // two staging reads at once.
  int staging_buffers = 2;
};

// A byte range of the pool region (what a grant's extents name).
struct ByteExtent {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

using AccessToken = std::array<std::uint8_t, 16>;

struct ReserveEntry {
  BlockKey key;
  BlockMeta meta;
};

struct ReserveEntryResult {
  Status status;                    // OK, AlreadyExists, ResourceExhausted, InvalidArgument
  std::vector<ByteExtent> extents;  // OK only, in payload order
};

struct GrantInfo {
  std::uint64_t lease_id = 0;  // 0 when no entry is OK
  std::uint64_t ttl_us = 0;
  AccessToken token{};
};

struct ReserveBatch {
  GrantInfo grant;
  std::vector<ReserveEntryResult> results;  // one per entry, in order
};

struct CommitEntry {
  BlockKey key;
  std::uint32_t crc32c = 0;
  // Daemon-internal (kStore, from its own transport's landed CRCs; never set
  // from a request): the payload's per-layer-slice CRCs over the reserved
  // pages, so that the commit need not read them again
  // (LeaseTable::Commit). Empty: the commit computes them.
  std::vector<std::uint32_t> landed_slice_crcs = {};
};

struct LeaseRequestOptions {
  std::uint64_t ttl_us = 0;  // 0: default_ttl_us
  bool prefix_only = false;
  std::optional<FingerprintDigest> expected_fingerprint;
  // Lease only blocks already in the host pool: one resting on NVMe answers
  // Unavailable instead of being staged, so the call does no I/O (the data
  // plane's kFetch, which runs on the transport's progress thread).
  bool host_only = false;
  // Also return each leased block's layer CRCs (LeaseEntryResult::
  // layer_crc32c), for a data-plane fetch of a layer range.
  bool layer_crcs = false;
  // A client's read (default): the block's hit count and last access are
  // updated and the lease counts as a hit or a miss. The daemon's own readers
  // (the compact converter) set false, so that reading a block to convert it
  // does not make it look hot to eviction nor count in the hit ratio.
  bool count_access = true;
};

struct LeaseEntryResult {
  // OK, NotFound, DataLoss, ResourceExhausted, FailedPrecondition (digest),
  // Aborted (prefix_only), Unavailable (evicted while staging; retry).
  Status status;
  BlockMeta meta;  // set unless NotFound/Aborted
  std::uint32_t crc32c = 0;
  bool staged_from_nvme = false;    // the block rested on NVMe when leased
  std::vector<ByteExtent> extents;  // OK only
  std::vector<std::uint32_t> layer_crc32c;  // OK and LeaseRequestOptions::layer_crcs
};

struct LeaseBatch {
  GrantInfo grant;
  std::vector<LeaseEntryResult> results;
};

struct ReleaseEntry {
  std::uint64_t lease_id = 0;
  AccessToken token{};         // the grant's (GrantInfo::token)
  std::vector<BlockKey> keys;  // empty: the whole grant
};

// A grant as its holder names it: id and access token.
struct GrantRef {
  std::uint64_t lease_id = 0;
  AccessToken token{};
};

struct LookupEntryResult {
  Status status;  // OK or NotFound
  BlockMeta meta;
  std::uint32_t crc32c = 0;
  BlockTier tier = BlockTier::kHost;
  std::uint32_t active_leases = 0;
  std::uint64_t hit_count = 0;
};

enum class ServingState : std::uint8_t {
  kStarting = 1,
  kServing = 2,
  kDraining = 3,
  kStopped = 4,
};
std::string_view ServingStateName(ServingState state);

// Everything Stats and /metrics report, one consistent-enough snapshot.
struct CacheHostSnapshot {
  ServingState state = ServingState::kStarting;
  std::uint64_t uptime_us = 0;
  std::string policy;  // "lru" / "cost-aware"
  bool memory_locked = false;
  std::uint64_t page_bytes = 0;
  PagePoolCounts pages;          // host pool pages by state
  LeaseTableCounters table;      // lease table counters and gauges
  std::vector<NamespaceUsage> namespaces;
  bool nvme_enabled = false;
  std::uint64_t nvme_capacity_bytes = 0;
  NvmeTierStats nvme;
  NvmeRecoveryReport recovery;
  std::uint64_t recovery_orphans = 0;  // NVMe blocks without a catalog record (dropped)
  std::uint64_t evictions_by_action[4] = {};  // indexed by EvictionAction
  // Eviction's compact copies (eviction_policy.h, "Compact copies"; zero
  // with --compact-keep-bytes 0; the kept bytes and blocks are in `table`):
  // the budget; exact blocks whose host copy left while their copy stayed,
  // by the exact block's action; copies that left, by CompactOutcome
  // (kCopyOverBudget, kCopyLastResort).
  std::uint64_t compact_keep_budget_bytes = 0;
  std::uint64_t compact_kept_by_action[4] = {};  // indexed by EvictionAction
  std::uint64_t compact_copies_evicted[4] = {};  // indexed by CompactOutcome
  std::uint64_t grants_active = 0;
  std::uint64_t grants_expired = 0;
  std::uint64_t staging_reads = 0;
  // Leases that found another lease staging the same block and waited for its
  // read instead of reading it again (or refusing it).
  std::uint64_t staging_waits = 0;
  std::uint64_t staging_crc_failures = 0;
  std::uint64_t data_plane_endpoints = 0;
  DataPlaneStats data_plane;  // connection refusals and closes
  std::uint64_t transfers_refused = 0;  // data-plane requests refused (token, range, lease)
  std::uint64_t demotion_failures = 0;  // demotions the NVMe tier failed (full, I/O error)
  bool demotion_backing_off = false;    // eviction drops instead of demoting for now
  CatalogStats catalog;                 // the NVMe catalog's (zero without a tier)
  // The background compact converter's (compact_converter.h). Snapshot()
  // leaves it zero: the daemon's snapshot source fills it in.
  CompactConversionStats compact;
};

// A data-plane transfer the node allowed (see BeginTransfer).
struct TransferTicket {
  bool write = false;
  // Lease-table ids to end (EndWrite / EndRead), one per range, in order.
  std::vector<std::uint64_t> sub_ids;
  // For writes, the pool range of each sub id: recorded as written when the
  // transfer lands in full.
  std::vector<ByteExtent> ranges;
};

// What happened to a block, for the placement service's directory (numbered
// as kvfabric.v1.BlockEventKind).
enum class BlockEventKind : std::uint8_t {
  kCommitted = 1,  // committed in the host pool
  kDemoted = 2,    // now on NVMe only (demoted, or its host copy dropped)
  kPromoted = 3,   // staged back into the host pool (also still on NVMe)
  kEvicted = 4,    // dropped to make room
  kDeleted = 5,    // removed by Delete
  kCorrupted = 6,  // removed: its bytes failed their CRC32C
  kPresent = 7,    // full-snapshot entry
};

struct BlockEventRecord {
  BlockEventKind kind = BlockEventKind::kCommitted;
  std::string tenant;
  BlockKey key;
  BlockMeta meta;  // zero for kEvicted / kDeleted / kCorrupted (the key is enough)
  std::uint32_t crc32c = 0;
  BlockTier tier = BlockTier::kHost;  // where it rests after the event
  std::uint64_t hit_count = 0;
};

// Receives block events, in the order they happened, on the thread that
// caused them (gRPC handlers, the maintenance thread, the NVMe committer).
// Must not block and must not call back into the node.
using BlockEventSink = std::function<void(std::vector<BlockEventRecord>)>;

// Observes data-plane transfers for metrics (bytes, latency). Called on the
// transport's progress thread; must not block.
using TransferObserver =
    std::function<void(bool write, std::uint64_t bytes, std::uint64_t micros, const Status&)>;

class CacheHostNode {
 public:
  // Allocates and pre-faults the pool, opens and recovers the NVMe tier,
  // rebuilds the index, listens on the transport and starts maintenance.
  // Prints the start-up arithmetic (pool, pages, models, write reserve) and the
  // recovery counts as log lines. Refuses (InvalidArgument / FailedPrecondition
  // naming the setting) what cannot work. `transport` and `env` are borrowed
  // and must outlive the node.
  // The checks Create makes before it allocates or opens anything, and the
  // start-up arithmetic lines it would print (kvfabric-cached
  // --check-config). InvalidArgument naming the setting otherwise.
  static StatusOr<std::string> CheckOptions(const CacheHostOptions& options);

  static StatusOr<std::unique_ptr<CacheHostNode>> Create(CacheHostOptions options,
                                                         transport::Transport* transport,
                                                         Env* env);
  // Shutdown() if not yet done.
  ~CacheHostNode();
  CacheHostNode(const CacheHostNode&) = delete;
  CacheHostNode& operator=(const CacheHostNode&) = delete;

  // The start-up arithmetic lines (also logged).
  const std::string& arithmetic() const { return arithmetic_; }
  std::string transport_address() const;
  std::uint64_t pool_bytes() const { return pool_->pool_bytes(); }
  std::uint64_t page_bytes() const { return pool_->page_bytes(); }
  const CacheHostOptions& options() const { return options_; }
  ServingState state() const { return state_.load(); }
  // New cost-aware eviction figures (the calibration file read again on
  // SIGHUP); later eviction passes score with them. FailedPrecondition under
  // --eviction-policy=lru; InvalidArgument (nothing changes) for bad figures.
  Status ReloadCostModel(const CostAwareOptions& figures);

  // ---- The CacheHost RPCs, in core types (see cache_host.proto) ----
  // Unavailable while not serving. Per-entry outcomes in the result.
  StatusOr<ReserveBatch> Reserve(const Namespace& ns, std::span<const ReserveEntry> entries,
                                 std::uint64_t ttl_us);
  // NotFound for an unknown or ended grant, one of another namespace, or a
  // token that is not the grant's (one answer for all three: no oracle).
  StatusOr<std::vector<Status>> Commit(const Namespace& ns, const GrantRef& grant,
                                       std::span<const CommitEntry> entries,
                                       bool release_uncommitted);
  StatusOr<LeaseBatch> Lease(const Namespace& ns, std::span<const BlockKey> keys,
                             const LeaseRequestOptions& options);
  // Per grant: the granted TTL, or NotFound (as Commit).
  std::vector<StatusOr<std::uint64_t>> Renew(const Namespace& ns,
                                             std::span<const GrantRef> grants,
                                             std::uint64_t ttl_us);
  std::vector<Status> Release(const Namespace& ns, std::span<const ReleaseEntry> entries);
  std::vector<LookupEntryResult> Lookup(const Namespace& ns, std::span<const BlockKey> keys);
  // Per key: OK, NotFound, FailedPrecondition (leased, demoting, staging).
  std::vector<Status> Delete(const Namespace& ns, std::span<const BlockKey> keys);
  CacheHostSnapshot Snapshot() const;
  // Why (ns, key) left the host pool, newest first.
  std::vector<EvictionDecision> ExplainEviction(const Namespace& ns, const BlockKey& key) const;
  // The newest `n` eviction and demotion decisions in the log, newest first:
  // `tenant`'s only, or every tenant's when it is null.
  std::vector<EvictionDecision> RecentEvictions(std::size_t n, const std::string* tenant) const;
  // How many decisions the log keeps (--eviction-log-capacity).
  std::size_t eviction_log_capacity() const;
  // false: start draining; true: serve again. Returns the state after.
  ServingState Drain(bool resume);
  // See the class comment. `grace` bounds the wait for grants in use.
  void Shutdown(std::chrono::milliseconds grace);

  // ---- Data plane (server/cache_host/data_plane.h) ----
  // Checks a transfer request: the grant exists, is of the right kind
  // (write for puts), `token` matches, and every range lies inside one of the
  // grant's blocks; brackets each range in the lease table. On error nothing
  // is bracketed. EndTransfer closes the brackets when the bytes have moved
  // (`landed`: every range of a write arrived in full, so its bytes count as
  // written; false for a failed or abandoned transfer, whose ranges must be
  // written again before Commit accepts the block).
  // With `tenant` (a data-plane connection bound to a session,
  // data_sessions.h), a grant of a namespace the tenant does not hold is
  // refused exactly as an unknown one.
  StatusOr<TransferTicket> BeginTransfer(std::uint64_t lease_id, const AccessToken& token,
                                         bool write, std::span<const ByteExtent> ranges,
                                         const DataSessionTenant* tenant = nullptr);
  void EndTransfer(const TransferTicket& ticket, bool landed);
  // The registered pool region (for the data plane's transfers).
  transport::MemoryRegion* pool_region() const { return pool_region_.get(); }
  void set_transfer_observer(TransferObserver observer);
  void ObserveTransfer(bool write, std::uint64_t bytes, std::uint64_t micros,
                       const Status& status);

  // Block events for the placement reporter (server/cache_host/
  // placement_reporter.h). Set once, before traffic.
  void set_block_event_sink(BlockEventSink sink);
  // A second receiver of the same events, for in-process consumers (the
  // compact converter, compact_converter.h): the same contract as the sink.
  // Set once, before traffic; nullptr removes it.
  void set_block_event_tap(BlockEventSink tap);
  // Every block held now, as kPresent events (a full report for placement).
  std::vector<BlockEventRecord> SnapshotBlocks() const;
  // Usage of each tier, for membership capacity reports.
  std::uint64_t host_free_bytes() const;
  // Read leases held now (clients' and in-process readers').
  std::uint64_t active_leases() const;
  std::uint64_t nvme_capacity_bytes() const { return nvme_ ? options_.nvme.capacity_bytes : 0; }
  std::uint64_t nvme_free_bytes() const;

  // ---- In-process blocks (the compact converter, compact_converter.h) ----
  // These let code in this process read and write blocks through the same
  // grants, lease-table brackets, quotas and events as a client, without a
  // transport. cache_host_node_local.cc.
  //
  // Reserve that never makes room: an entry the pool or the namespace's
  // quota cannot hold now answers ResourceExhausted at once, and nothing is
  // evicted, demoted or waited for. Otherwise as Reserve (grant, token, TTL).
  StatusOr<ReserveBatch> ReserveWithoutEviction(const Namespace& ns,
                                                std::span<const ReserveEntry> entries,
                                                std::uint64_t ttl_us);
  // Copies `payload` (the whole block) into the pages of `key`, reserved
  // under `grant` and not yet committed, recorded as written so that Commit
  // accepts it. NotFound (as Commit) for a grant that is not `ns`'s, not a
  // write grant, or does not hold `key`; InvalidArgument for a payload that
  // is not the reserved size.
  Status WriteReservedBlock(const Namespace& ns, const GrantRef& grant, const BlockKey& key,
                            std::span<const std::byte> payload);
  // Copies the payload of `key`, leased under the read grant `grant` (from
  // Lease), into `out` (exactly the block's bytes). The grant's lease keeps
  // the pages from eviction and the copy is bracketed like a data-plane
  // read. NotFound as above; InvalidArgument for a wrong-sized `out`.
  Status ReadLeasedBlock(const Namespace& ns, const GrantRef& grant, const BlockKey& key,
                         std::span<std::byte> out);

  // Runs one maintenance step now (tests): expiry, background eviction.
  void TEST_RunMaintenance();

 private:
  struct GrantBlock {
    BlockKey key;
    std::uint64_t sub_id = 0;  // reservation id (write) or table lease id (read)
    PageRuns pages;
    std::uint64_t bytes = 0;
    bool committed = false;  // write grants
    bool released = false;
  };
  struct Grant {
    bool write = false;
    std::string tenant;
    AccessToken token{};
    std::uint64_t expires_at_us = 0;
    std::vector<GrantBlock> blocks;
    std::vector<std::uint64_t> read_leases;  // table lease ids (read grants)
  };

  CacheHostNode(CacheHostOptions options, transport::Transport* transport, Env* env);
  // Reserve and ReserveWithoutEviction: `make_room` runs eviction passes and
  // waits up to reserve_wait for a block that does not fit.
  StatusOr<ReserveBatch> ReserveImpl(const Namespace& ns, std::span<const ReserveEntry> entries,
                                     std::uint64_t ttl_us, bool make_room);
  // The pages and reservation (write) of `key` under the grant `ref`, if
  // `ref` is `ns`'s grant of kind `write` and holds it open.
  std::optional<GrantBlock> FindGrantBlock(const Namespace& ns, const GrantRef& ref,
                                           const BlockKey& key, bool write);
  Status Start();
  Status RecoverNvme();
  // Unavailable (naming the state) unless serving.
  Status CheckAdmitting() const;
  static std::vector<std::string> Split(const std::string& text);

  std::uint64_t NowUs() const;

  std::uint64_t EffectiveTtl(std::uint64_t ttl_us) const;
  AccessToken NewToken() KVF_REQUIRES(mu_);
  // A random grant id, nonzero and not in use.
  std::uint64_t NewGrantId() KVF_REQUIRES(mu_);
  // The grant `ref` names if it exists, is of `ns` and `ref.token` is its
  // token; grants_.end() otherwise.
  std::unordered_map<std::uint64_t, Grant>::iterator FindOwnedGrant(const Namespace& ns,
                                                                    const GrantRef& ref)
      KVF_REQUIRES(mu_);
  std::vector<ByteExtent> ExtentsOf(const PageRuns& pages, std::uint64_t bytes) const;
  // Runs an eviction pass; starts the demotions it ordered. Returns the pages
  // it freed at once.
  std::uint64_t RunEviction(std::optional<Namespace> scope, std::uint64_t pages_needed);
  void StartDemotions(std::vector<DemotionOrder> orders);
  // RunEviction, then waits (until `deadline`) for a demotion to finish, for
  // none to be in flight, or for `pages` pages to be free. Returns whether
  // anything was freed or is being freed (false: retrying cannot help).
  bool MakeRoomAndWait(std::optional<Namespace> scope, std::uint64_t pages,
                       std::chrono::steady_clock::time_point deadline);
  // Stages one NVMe-only block into host pages (see the class comment).
  Status Stage(NamespaceId ns, const BlockKey& key);
  void MaintenanceLoop();
  void MaintenanceStep();
  void ForgetEndedGrantsLocked(std::uint64_t now_us) KVF_REQUIRES(mu_);
  void DropNvmeCopy(const std::string& tenant, const BlockEntry& removed);
  // Counts a demotion's outcome: a failure backs demotion off (eviction drops
  // instead) and is logged at most every 10 s with the count since the last
  // line; a success ends the backoff.
  void NoteDemotion(const Status& status, std::uint64_t count = 1);
  // Compacts the NVMe catalog when superseded records outnumber live ones.
  void MaybeCompactCatalog();

  CacheHostOptions options_;
  transport::Transport* const transport_;
  Env* const env_;
  const std::uint64_t start_us_;
  std::string arithmetic_;

  // Keeps anonymous pool memory mapped until after the region is deregistered.
  std::shared_ptr<void> pool_owner_;
  std::unique_ptr<transport::MemoryRegion> pool_region_;
  std::unique_ptr<HostPagePool> pool_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unique_ptr<LeaseTable> table_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<NvmeCatalog> catalog_;
  NvmeRecoveryReport recovery_;
  std::uint64_t recovery_orphans_ = 0;
  std::unique_ptr<DataPlane> data_plane_;

  std::atomic<ServingState> state_{ServingState::kStarting};

  mutable Mutex mu_;
  std::unordered_map<std::uint64_t, Grant> grants_ KVF_GUARDED_BY(mu_);
  std::uint64_t grants_expired_ KVF_GUARDED_BY(mu_) = 0;
  std::atomic<std::uint64_t> transfers_refused_{0};
  std::atomic<std::uint64_t> staging_reads_{0};
  std::atomic<std::uint64_t> staging_waits_{0};
  std::atomic<std::uint64_t> staging_crc_failures_{0};

  // Demotions in flight; Reserve waits on demotion_cv_ for them.
  mutable Mutex demotion_mu_;
  CondVar demotion_cv_;
  std::uint64_t demotions_in_flight_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::uint64_t demotions_done_ KVF_GUARDED_BY(demotion_mu_) = 0;
  // Failed demotions (NoteDemotion): the backoff they impose, and the
  // rate-limited log line's state.
  std::uint64_t demotion_failures_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::uint64_t demotion_failures_unlogged_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::uint64_t demotion_backoff_us_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::uint64_t demotion_backoff_until_us_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::uint64_t next_demotion_log_us_ KVF_GUARDED_BY(demotion_mu_) = 0;
  std::string last_demotion_error_ KVF_GUARDED_BY(demotion_mu_);

  // Bounce buffers for staging reads.
  Mutex staging_mu_;
  CondVar staging_cv_;
  std::vector<AlignedBuffer> staging_free_ KVF_GUARDED_BY(staging_mu_);

  Mutex observer_mu_;
  TransferObserver observer_ KVF_GUARDED_BY(observer_mu_);
  BlockEventSink event_sink_ KVF_GUARDED_BY(observer_mu_);
  BlockEventSink event_tap_ KVF_GUARDED_BY(observer_mu_);
  std::atomic<bool> has_sink_{false};
  void Emit(std::vector<BlockEventRecord> events);

  Mutex maintenance_mu_;
  CondVar maintenance_cv_;
  bool stopping_ KVF_GUARDED_BY(maintenance_mu_) = false;
  std::thread maintenance_;
  std::once_flag shutdown_once_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_H_
