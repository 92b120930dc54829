// Client::Impl: the state behind client/kvfabric_client.h. Internal to the
// client library (kvfabric_client.cc: API, contexts, attention;
// client_io.cc: fetch, recompute, write-back).
//
// Locks, in the order they may nest: Impl::mu_ (contexts), Context::mu,
// Impl::metrics_mu_. No lock is held across a fetch: daemons write blocks
// straight into each context's own pages, so loads of different contexts,
// and the batches of one load from every daemon, run at once. daemons_mu_
// is held only briefly (a DaemonSlot's connect_mu, held while connecting to
// that daemon, is taken before it, never inside it). attend_mu_ serialises
// Attend (one set of staging buffers). Checked by clang's -Wthread-safety
// (tools/thread_safety_check.sh).
#ifndef KVFABRIC_CLIENT_CLIENT_IMPL_H_
#define KVFABRIC_CLIENT_CLIENT_IMPL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/cache_host_session.h"
#include "client/client_prometheus.h"
#include "client/data_plane_client.h"
#include "client/device_arena.h"
#include "client/history_pool.h"
#include "client/host_history.h"
#include "client/kvfabric_client.h"
#include "client/layer0_gate.h"
#include "client/streaming_attention.h"
#include "core/mutex.h"
#include "core/thread_cache.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "metrics/metrics_server.h"
#include "transport/transport.h"

namespace kvfabric::client {

using Clock = std::chrono::steady_clock;

// The ids of the staging region (write-back) and of the history pool
// (fetches land in context pages) on every daemon they are exported to.
inline constexpr std::uint32_t kStagingRegionId = 1;
inline constexpr std::uint32_t kHistoryRegionId = 2;

// One request's history and the state of its load and saves.
struct Context {
  ContextId id = 0;
  std::uint64_t tokens = 0;
  std::uint32_t blocks = 0;       // ceil(tokens / tokens_per_block)
  std::uint32_t full_blocks = 0;  // tokens / tokens_per_block
  // History pool page of each block. A fetch worker may swap a block's page
  // for a fresh one before the block landed (ReplacePages); nobody else
  // reads an unlanded block's entry.
  std::vector<std::uint32_t> pages;

  std::uint32_t layer_words = 0;  // 64-bit words per block in layer_bits

  Mutex mu;
  CondVar cv;
  // Load.
  bool load_started KVF_GUARDED_BY(mu) = false;
  bool load_done KVF_GUARDED_BY(mu) = false;
  int load_workers KVF_GUARDED_BY(mu) = 0;  // loader threads still running
  // The fetch loader's streams are still moving the plan's blocks: a
  // prefill that overlaps them is observed as beside_fetch.
  bool fetching KVF_GUARDED_BY(mu) = false;
  // The mirror: the plan prefills blocks before some it fetches (a split's
  // front), so that prefill runs while the streams move and slows them;
  // their transfers are observed as beside_prefill. (A recompute run after
  // every fetched block waits for them to land, so it never is.)
  bool fetch_beside_prefill KVF_GUARDED_BY(mu) = false;
  // This load's prefills so far: the µs of those that ended, and when the
  // one running began (if one is). What a prefill beside the streams can
  // have cost them is at most this (RecordTransfers).
  double prefill_us KVF_GUARDED_BY(mu) = 0;
  bool prefill_running KVF_GUARDED_BY(mu) = false;
  Clock::time_point prefill_since KVF_GUARDED_BY(mu);
  Status load_status KVF_GUARDED_BY(mu);
  Clock::time_point load_start KVF_GUARDED_BY(mu);
  // Written by Load (under mu) before the loader threads start; read-only
  // afterwards, so the loaders read it without the lock.
  MatchResult match;
  ContextReport report KVF_GUARDED_BY(mu);
  std::vector<v1::TransferObservation> transfers KVF_GUARDED_BY(mu);
  std::vector<v1::RecomputeObservation> recomputes KVF_GUARDED_BY(mu);
  std::vector<v1::StaleEntry> stale KVF_GUARDED_BY(mu);
  std::vector<std::uint32_t> fallback_runs KVF_GUARDED_BY(mu);
  // Per block: µs after load_start it was in the history (every layer);
  // negative until it landed.
  std::vector<double> landed_us KVF_GUARDED_BY(mu);
  // Per block, layer_words words: the layers of it that landed and verified
  // (a layer-range fetch lands some; recompute and whole-block fetches all).
  std::vector<std::uint64_t> landed_layer_bits KVF_GUARDED_BY(mu);
  // Per layer: blocks of the context whose slice of that layer landed.
  // WaitLayer(l) returns once layer_ready[l] == blocks.
  std::vector<std::uint32_t> layer_ready KVF_GUARDED_BY(mu);
  // Per block: 1 when its page holds its compact_int8 copy (a compact run
  // landed it; docs/compact.md), 0 for exact bytes. Set before the block is
  // marked landed; a block recomputed after a failed compact fetch is exact.
  std::vector<std::uint8_t> compact KVF_GUARDED_BY(mu);
  std::uint32_t landed_blocks KVF_GUARDED_BY(mu) = 0;  // with every layer
  // Blocks [0, landed_prefix) have all landed: a recompute starting at block
  // b waits until landed_prefix >= b (its prefill attends to them).
  std::uint32_t landed_prefix KVF_GUARDED_BY(mu) = 0;
  TaskGroup workers;  // the load's two (FetchRuns, RecomputeRuns); waited for by Finish
  // Saves.
  std::vector<std::uint64_t> layer_bits KVF_GUARDED_BY(mu);    // per full block: layers saved
  std::vector<std::uint32_t> layers_saved KVF_GUARDED_BY(mu);  // per full block: distinct layers
  std::vector<bool> save_queued KVF_GUARDED_BY(mu);            // per full block
  std::uint32_t pending_saves KVF_GUARDED_BY(mu) = 0;
  Status save_status KVF_GUARDED_BY(mu);  // the first write-back failure
  // Not OK when a failed fetch left pages a daemon may still write and no
  // fresh page could replace them: nothing more is written for this load.
  Status pages_safe KVF_GUARDED_BY(mu);
  // A failed request over shared memory left blocks with some layers landed
  // (their pages cannot be swapped: the engine may be reading those layers),
  // which that daemon may still write until this time: fallbacks into them
  // wait for it.
  Clock::time_point writes_quiet_after KVF_GUARDED_BY(mu);

  // Back to a fresh context's state, keeping every vector's capacity (and
  // `match`, which the next Load overwrites in place): a recycled context
  // (Impl::Recycle) makes the next request of no more blocks allocate none
  // of its bookkeeping. REQUIRES: no other thread holds the context.
  void Reset();
};

// One daemon's session, and the lock that makes connecting to it happen once
// (held while connecting, so threads wanting other daemons never wait).
struct DaemonSlot {
  Mutex connect_mu;
  std::shared_ptr<CacheHostSession> session;  // under Impl::daemons_mu_
  // The shared-memory refusal (CacheHostSessionOptions::check_shared_memory)
  // was logged: it is logged once per daemon, then only returned.
  bool refusal_logged = false;  // under connect_mu
};
using Daemon = CacheHostSession;

// Layers [first, first + count) of a block; count 0: the whole block.
struct LayerGroup {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

// What one fetch request landed in the history.
struct FetchTally {
  std::uint64_t bytes = 0, host_tier = 0, nvme_tier = 0;
  std::uint64_t checked_by_daemon = 0;  // of `bytes`
  std::uint32_t crc_failures = 0;
  struct Landed {
    std::uint32_t block = 0;
    std::uint32_t first_layer = 0;
    std::uint32_t layer_count = 0;
  };
  std::vector<Landed> landed;
};

struct SaveJob {
  std::shared_ptr<Context> context;
  std::uint32_t block = 0;
  BlockKey key;
};

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : o_(std::move(options)) {}
  ~Impl();

  Status Init();
  // The data plane: one transport, one staging region exported to each
  // daemon on first use (client_io.cc). Part of Init.
  Status OpenDataPlane(const HistoryPoolOptions& history);
  Status Close();

  // kvfabric_client.cc
  StatusOr<MatchResult> Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
                              bool explain);
  Status Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
               const MatchOptions& options, MatchResult* out);
  StatusOr<ContextId> NewContext(std::uint64_t tokens);
  Status Load(const MatchResult& match, ContextId id);
  Status WaitLayer(ContextId id, std::uint32_t layer, std::chrono::milliseconds timeout);
  StatusOr<std::span<std::byte>> BlockPayload(ContextId id, std::uint32_t block);
  StatusOr<bool> BlockIsCompact(ContextId id, std::uint32_t block);
  Status DecodeBlock(ContextId id, std::uint32_t block, std::span<float> out);
  StatusOr<HostHistory> History(ContextId id);
  Status Save(ContextId id, std::uint32_t layer, std::uint32_t first_block,
              std::span<const BlockKey> keys);
  Status Attend(ContextId id, std::uint32_t layer, std::uint64_t step, std::span<const float> q,
                std::span<float> out, std::span<float> lse);
  Status Finish(ContextId id, ContextReport* report);
  ClientMetrics metrics() const;
  std::shared_ptr<prometheus::Collectable> metrics_collectable() const { return prom_; }
  std::string metrics_url() const { return metrics_server_ ? metrics_server_->url() : ""; }
  const ClientOptions& options() const { return o_; }
  std::string DescribeArena() const { return arena_->DescribeLayout(); }
  std::string DescribeHistoryPool() const { return history_pool_->DescribeLayout(); }
  double compact_extra_decode_us_per_token() const { return compact_extra_decode_us_; }
  StatusOr<std::vector<BlockKey>> KeyTokens(std::span<const std::uint32_t> tokens) const;

 private:
  friend class Client;
  StatusOr<std::shared_ptr<Context>> Find(ContextId id) const;
  std::chrono::system_clock::time_point RpcDeadline() const {
    return std::chrono::system_clock::now() + o_.rpc_timeout;
  }
  // Placement's reachability. After a Plan or Place call fails with
  // Unavailable or DeadlineExceeded, further calls are skipped for a backoff
  // (1 s, doubling to 30 s, jittered +-25%; the next success resets it):
  // Match plans locally at once and the write-back fails its batch at once,
  // instead of each waiting rpc_timeout (a cut link made one 256-block
  // write-back take 16 x rpc_timeout), and many clients do not retry in step.
  // OK when a call may be made now; else Unavailable naming the last error.
  // With several replicas (placement_address "a,b"): the calls start at the
  // replica that answered last and go on to the next that is not backing off.
  //
  // The index of the `attempt`-th replica to try from the current one, or
  // none if it is backing off.
  std::optional<std::size_t> PlacementToTry(std::size_t attempt);
  // Unavailable naming every replica and its last error (all backing off);
  // counts the skipped call.
  Status PlacementBackoff();
  void PlacementCallDone(std::size_t replica, const grpc::Status& g);
  // Runs `call(stub, &ctx)` with rpc_timeout on the replicas in turn until
  // one answers (anything but UNAVAILABLE or DEADLINE_EXCEEDED), skipping
  // those backing off; UNAVAILABLE without a call if all are.
  template <typename Call>
  grpc::Status CallPlacement(Call&& call) {
    grpc::Status last;
    bool called = false;
    for (std::size_t attempt = 0; attempt < placement_stubs_.size(); ++attempt) {
      const std::optional<std::size_t> replica = PlacementToTry(attempt);
      if (!replica) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(RpcDeadline());
      grpc::Status g = call(placement_stubs_[*replica].get(), &ctx);
      PlacementCallDone(*replica, g);
      called = true;
      if (g.error_code() != grpc::StatusCode::UNAVAILABLE &&
          g.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return g;
      }
      last = std::move(g);
    }
    if (called) return last;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(PlacementBackoff().message()));
  }
  void ReportObservations(Context& c) KVF_REQUIRES(c.mu);
  // Block `b` of `c`'s history: its page of the history pool.
  std::span<std::byte> BlockBytes(const Context& c, std::uint32_t b) const {
    return history_pool_->page(c.pages[b]);
  }

  // client_io.cc (FetchFrom: client_stream.cc)
  // Loader thread bodies: the plan's fetch runs (with their fallbacks), and
  // its recompute runs plus the partial tail.
  void FetchRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs);
  void RecomputeRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs);
  void WorkerDone(Context& c, const Status& status);
  // What one daemon's stream moved, split as placement prices it: two
  // sources per daemon (server/placement/planner.h, FETCH MODEL), its host
  // pool (kFetch on the data plane) and its NVMe tier (staged by a control-
  // plane Lease). Each part's time runs from the fetch's start to the last
  // byte of that part landing.
  struct StreamTally {
    std::uint64_t host_bytes = 0;
    std::uint64_t nvme_bytes = 0;
    double host_us = 0;
    double nvme_us = 0;
    // Bytes other loads moved through this daemon's session while the
    // host-pool part ran (TransferObservation.shared_bytes).
    std::uint64_t host_shared_bytes = 0;
    // The stream was cut as a straggler (ClientOptions::straggler_factor):
    // its miss is the path's even beside a prefill (not beside_prefill).
    bool cut = false;
    // The latest end placement predicted for this daemon's runs, µs after
    // the load began; 0: none (a fallback, a plan without predictions).
    double predicted_us = 0;
  };
  // Fetches `blocks` of `c` from `host` into its history: blocks
  // [0, nvme_from) by kFetch, in batches of fetch_batch_ with
  // options.fetch_depth of them in flight; blocks [nvme_from, end), which
  // the plan says rest on the daemon's NVMe only, and any the daemon
  // answers are not in its host pool, by Lease (the daemon stages them),
  // one lease at a time beside the kFetch requests. The blocks that arrived intact are removed from
  // *blocks (the rest stay, sorted); *tally: the bytes that moved and when. The first error, if
  // any.
  // cut_after_us > 0: the stream starts no request after that many µs from
  // its start (ClientOptions::straggler_factor); its unlanded blocks stay in
  // *blocks and the result is DeadlineExceeded naming the cut.
  // gate (may be null): this load's Layer0Gate (client/layer0_gate.h),
  // which FetchFrom signals once (when its layer-0 units are answered, or on
  // return) and waits on before its later groups, at most as long again as
  // its own layer 0 took.
  Status FetchFrom(Context& c, const MatchResult::Host& host, std::vector<std::uint32_t>* blocks,
                   std::size_t nvme_from, StreamTally* tally, double cut_after_us = 0,
                   Layer0Gate* gate = nullptr);
  // The same for blocks a compact run fetches (client_compact.cc): their
  // compact_int8 copies, under CompactInt8BlockKey, whole blocks of
  // compact_bytes_ into the start of their pages, fetch_batch_ per request
  // (the data plane; blocks only on NVMe through the control plane's Lease).
  Status FetchCompactFrom(Context& c, const MatchResult::Host& host,
                          std::vector<std::uint32_t>* blocks, std::uint64_t* moved_bytes);
  // Measures compact_extra_decode_us_ at Init when the option is unset.
  void ProbeCompactDecode();
  // Transfer observations of one fetch (tallies[h] for hosts[h]): per
  // daemon, its host-pool part as remote_host_to_local_host and its NVMe
  // part as nvme_to_host (the whole staged path: Lease, NVMe read, the
  // transfer), each with its own bytes and time; and one of the client's
  // ingest (every byte over the longest part) when two or more daemons
  // moved bytes.
  void RecordTransfers(Context& c, const std::vector<MatchResult::Host>& hosts,
                       std::span<const StreamTally> tallies);
  // (*arrived)[k]: batch[k] landed intact; *moved += bytes moved.
  // The blocks of `batch` whose read `results` are OK are checked in place
  // against their committed CRC and marked landed; the first per-block
  // error, NotFound ones reported as stale.
  Status LandResults(Context& c, const Daemon& d, std::span<const std::uint32_t> batch,
                     LayerGroup group, std::span<const Daemon::ReadResult> results, bool from_lease,
                     std::vector<bool>* arrived, std::vector<std::size_t>* on_nvme,
                     std::uint64_t* moved);
  // One data-plane kFetch (lease, push into the blocks' pages, release on
  // the daemon). Positions in `batch` the daemon answered Unavailable (not
  // in its host pool) go to *on_nvme.
  // With `group` of nonzero count, only those layers of each block move.
  // Positions the daemon has no layer CRCs for (Unavailable) go to *on_nvme
  // too: the control plane leases them whole.
  Status FetchByKey(Context& c, Daemon& d, std::span<const std::uint32_t> batch, LayerGroup group,
                    std::vector<bool>* arrived, std::vector<std::size_t>* on_nvme,
                    std::uint64_t* moved);
  // gRPC Lease (which stages NVMe blocks), data-plane kGet into the blocks'
  // pages, gRPC Release.
  Status LeaseAndGet(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                     std::vector<bool>* arrived, std::uint64_t* moved);
  // The history-region offsets of the pages of `batch`'s blocks.
  std::vector<std::uint64_t> PageOffsets(const Context& c, std::span<const std::uint32_t> batch,
                                         std::uint64_t within = 0) const;
  // After a request into `batch`'s pages got no answer (deadline, lost
  // connection) over shared memory, where the daemon may still write them:
  // the pages go to quarantine for transfer_timeout and the blocks get fresh
  // ones (or, if the pool has none free, c.pages_safe is set and the load
  // fails rather than write into them). Over sockets closing the connection
  // is enough (see client_io.cc).
  void ReplacePages(Context& c, std::span<const std::uint32_t> batch);
  // Checks layers `group` of block `block`'s page against the CRC the daemon
  // answered (committed with); false, counted in *tally and set as *first (if
  // still OK) on a mismatch.
  // `checked`: the daemon checked the bytes where they landed
  // (ReadResult::landing_checked); no second read.
  bool Land(Context& c, std::uint32_t block, LayerGroup group, std::uint32_t crc, bool checked,
            bool from_nvme, FetchTally* tally, Status* first);
  // Adds one fetch request's landed blocks to the context's report and the
  // client's metrics.
  void RecordFetch(Context& c, const FetchTally& tally);
  // Recomputes chain blocks [first, first + count) of `c` (clipped to its
  // tokens) through options.recompute.
  Status Recompute(Context& c, std::uint32_t first, std::uint32_t count);
  // Moves c.landed_prefix past the blocks that landed; wakes waiters if it moved.
  void AdvanceLandedPrefix(Context& c) KVF_REQUIRES(c.mu);
  // Layers [first, first + count) of block `b` landed and verified at
  // `now_us`: counts them in layer_ready (once each), and marks the block
  // landed when all its layers are. Wakes waiters.
  void MarkLayersLanded(Context& c, std::uint32_t b, std::uint32_t first, std::uint32_t count,
                        double now_us) KVF_REQUIRES(c.mu);
  // One engine call: blocks [first, first + count), whose pages are adjacent.
  // With `partial` (count 1, a block some of whose layers landed and may be
  // read by the engine already), the engine writes into recompute_scratch_
  // and only the layers still missing are copied into the block's page.
  Status RecomputeRun(Context& c, std::uint32_t first, std::uint32_t count, bool partial = false);
  // Whether some, not all, layers of block `b` landed.
  static bool PartlyLanded(const Context& c, std::uint32_t b) KVF_REQUIRES(c.mu);
  // The session with `host`, made on first use (connecting outside
  // daemons_mu_), remade when the daemon moved or its connection failed.
  StatusOr<std::shared_ptr<Daemon>> GetDaemon(const MatchResult::Host& host);
  // Forgets `d` (if it is still the session kept for its address) and closes
  // it: threads still using it see Unavailable.
  void DropDaemon(const std::shared_ptr<Daemon>& d);
  void SaverLoop();
  void SaveBatch(std::vector<SaveJob>& jobs);
  // Stores `jobs` on `host`: per job OK (written), AlreadyExists (cached) or
  // why not in *outcome; a request-wide error is returned instead.
  Status SaveTo(const v1::HostRef& host, std::vector<SaveJob*>& jobs, std::vector<Status>* outcome);
  // kWritten: committed by this client; kCached: the cluster already held
  // it; kFailed: not written back (`why`).
  enum class SaveOutcome { kWritten, kCached, kFailed };
  void FinishSaves(std::vector<SaveJob*>& jobs, SaveOutcome outcome, const Status& why = {});

  const ClientOptions o_;
  std::unique_ptr<BlockKeyer> keyer_;
  v1::ModelFingerprint fingerprint_;
  std::string fingerprint_digest_;
  std::uint64_t block_bytes_ = 0;
  // Blocks per write-back batch: at most 16, and what the staging region
  // holds.
  std::size_t save_batch_ = 1;
  // Blocks per fetch request: at most 16 (wire::kMaxFetchKeys) and about
  // kFetchRequestBytes, so fetch_depth requests in flight pin a bounded
  // number of the daemon's bytes (its --max-leased-bytes-per-namespace).
  static constexpr std::uint64_t kFetchRequestBytes = std::uint64_t{8} << 20;
  std::size_t fetch_batch_ = 16;
  // Layer by layer: a load fetches layer groups in order, [0, 1) first, then
  // groups of about kFetchRequestBytes per request, each across every block
  // of the daemon before the next group starts, so WaitLayer(0) returns after
  // about 1/layers of the load. A group with count 0 is whole blocks (a
  // one-layer model). Keys per layered request: at most 16, and at most
  // kFetchPinBytes of the daemon's pages pinned by one request (a request
  // leases whole blocks whatever layers it moves).
  static constexpr std::uint64_t kFetchPinBytes = std::uint64_t{32} << 20;
  // Bytes of one write-back batch with kStore (save_batch_).
  static constexpr std::uint64_t kStoreBatchBytes = std::uint64_t{32} << 20;
  std::vector<LayerGroup> fetch_groups_;
  std::size_t layered_batch_ = 16;
  // Bytes of one layer slice of a block.
  std::uint64_t layer_bytes_ = 0;
  // Bytes of a block's compact_int8 copy (gpu::CompactPayloadBytes; 0 when
  // the model's dtype has no compact codec), and what one compact token adds
  // to a decode step, µs (options or ProbeCompactDecode).
  std::uint64_t compact_bytes_ = 0;
  double compact_extra_decode_us_ = 0;
  std::string client_node_;

  // One stub per placement replica (placement_address split at commas);
  // fixed after Open.
  std::vector<std::string> placement_addresses_;
  std::vector<std::unique_ptr<v1::Placement::Stub>> placement_stubs_;
  std::unique_ptr<transport::Transport> transport_;
  // The data plane may use shared memory (transport::UsesSharedMemory):
  // each daemon's identity is checked before its data plane is connected.
  bool shared_memory_ = false;
  bool ucx_data_plane_ = false;  // CacheHostSessionOptions::check_ucx_listener
  std::unique_ptr<transport::MemoryRegion> staging_;
  // The history pool, registered with the transport and exported to every
  // daemon as kHistoryRegionId (fetches land in place).
  std::unique_ptr<transport::MemoryRegion> history_region_;
  // The history pool's pages are history_region_'s memory (UCX shared
  // memory, pinned for the device), not the device's.
  bool history_in_transport_ = false;
  std::unique_ptr<DataPlaneClient> data_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<StreamingAttention> attention_;
  HistoryLayout layout_;
  DeviceArenaOptions arena_options_;  // o_.arena with its defaults filled in

  Mutex attend_mu_;
  Mutex daemons_mu_;
  std::map<std::string, std::shared_ptr<DaemonSlot>> daemons_ KVF_GUARDED_BY(daemons_mu_);

  mutable Mutex mu_;
  std::map<ContextId, std::shared_ptr<Context>> contexts_ KVF_GUARDED_BY(mu_);
  // Finished contexts kept for reuse (at most kMaxFreeContexts), so that
  // after warm-up NewContext and Load allocate no bookkeeping.
  static constexpr std::size_t kMaxFreeContexts = 64;
  std::vector<std::shared_ptr<Context>> free_contexts_ KVF_GUARDED_BY(mu_);
  // Puts a finished context (held by the caller alone) back for reuse.
  void Recycle(std::shared_ptr<Context> c);
  ContextId next_context_ KVF_GUARDED_BY(mu_) = 1;
  bool closed_ KVF_GUARDED_BY(mu_) = false;

  std::unique_ptr<HistoryPool> history_pool_;

  Mutex save_mu_;
  CondVar save_cv_;
  std::deque<SaveJob> save_queue_ KVF_GUARDED_BY(save_mu_);
  bool save_stop_ KVF_GUARDED_BY(save_mu_) = false;
  std::vector<std::thread> savers_;  // save_threads of them (1 through staging)
  // ClientOptions::connect_at_open: opens the daemons' sessions (ConnectAll),
  // stopping between daemons once closing_ is set; joined by Close.
  std::thread connector_;
  std::atomic<bool> closing_{false};
  void ConnectAll();
  // Daemons ConnectAll connects to at most.
  static constexpr int kMaxDaemonsConnectedAtOpen = 64;

  // Prometheus view (metrics_collectable) and, with o_.metrics_address,
  // its listener. Both made by Init.
  std::shared_ptr<ClientPrometheus> prom_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  struct ReplicaState {
    std::chrono::steady_clock::time_point retry_at;
    std::chrono::milliseconds backoff{0};  // 0: answering
    std::string last_error;
  };
  Mutex placement_mu_;
  std::vector<ReplicaState> placement_state_ KVF_GUARDED_BY(placement_mu_);
  std::size_t placement_current_ KVF_GUARDED_BY(placement_mu_) = 0;
  std::uint64_t placement_jitter_ KVF_GUARDED_BY(placement_mu_) = 1;  // seeded in Open

  mutable Mutex metrics_mu_;
  ClientMetrics m_ KVF_GUARDED_BY(metrics_mu_);

  // One block of host memory, allocated and touched at Open: a fallback
  // recompute of a block some of whose layers already landed is written
  // here, never over layers the engine may be reading (RecomputeRun). One
  // such recompute at a time, client-wide: it is a fault path.
  Mutex scratch_mu_;
  std::unique_ptr<std::byte[]> recompute_scratch_;  // its bytes: under scratch_mu_

  // Threads for a load's workers (FetchRuns, RecomputeRuns), its streams and
  // their fetch workers, and a save's further daemons: parked between loads,
  // so a load's first request leaves without waiting for thread creations
  // (core/thread_cache.h). At most kIdleLoaderThreads stay parked: a two-
  // daemon load runs 11 at the default fetch_depth, so about six concurrent
  // loads start none. Last, so that it is destroyed first: its destructor
  // waits for tasks still running, while what they use is alive.
  static constexpr std::size_t kIdleLoaderThreads = 64;
  ThreadCache loaders_{kIdleLoaderThreads};
};

// Helpers of client_io.cc and client_save.cc.
namespace internal {

inline double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

inline std::string KeyBytes(const BlockKey& key) {
  return std::string(reinterpret_cast<const char*>(key.bytes().data()), BlockKey::kSize);
}

// OutOfRange unless `block` is one of context `id`'s blocks.
inline Status BlockInRange(const Context& c, ContextId id, std::uint32_t block) {
  if (block < c.blocks) return Status::OK();
  return Status::OutOfRange("client: block " + std::to_string(block) + " of context " +
                            std::to_string(id) + " with " + std::to_string(c.blocks) + " blocks");
}

// A daemon that failed this way is gone or stuck for this load.
inline bool HostDown(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

inline v1::TransferObservation Observation(v1::BusPath path, const std::string& host_id,
                                           std::uint64_t bytes, double us) {
  v1::TransferObservation o;
  o.set_path(path);
  o.set_host_id(host_id);
  o.set_bytes(bytes);
  o.set_observed_us(us);
  return o;
}

}  // namespace internal
}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_CLIENT_IMPL_H_
