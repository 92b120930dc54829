// Client: the library a serving engine links (libkvfabric). It follows the
// calls engines already make (vLLM's KV connector): how many tokens are
// cached, load asynchronously and wait per layer, save per layer, finish.
//
//   Open(options)                 connects to placement; daemons are reached
//                                 lazily through the hosts placement names.
//   Match(chain, suffix_tokens)   the longest cached prefix and placement's
//                                 plan (fetch / recompute per run of blocks).
//   NewContext(tokens)            a request's history: one page of the
//                                 history pool per block (ceil(tokens /
//                                 tokens_per_block) pages, taken, never
//                                 allocated), and a budget in the device
//                                 arena.
//   Load(match, context)          starts the plan: fetch runs on one loader
//                                 thread, recompute runs (options.recompute,
//                                 the engine's prefill, called once per run
//                                 of adjacent pages) on another, both
//                                 writing into the context's history.
//   WaitLayer(context, layer)     returns when layer `layer` of every block
//                                 is in the history and verified. Fetches
//                                 move layer-major (layer 0 of every block,
//                                 then groups of later layers, each slice
//                                 checked against its layer CRC), so layer 0
//                                 is ready after about 1/layers of the load;
//                                 recomputed blocks bring all their layers
//                                 at once. A block that falls back after
//                                 some of its layers landed keeps them (its
//                                 fallback fetches only the missing layers;
//                                 a recompute or an NVMe staging rewrites
//                                 them with the same bytes).
//   Save(context, layer, blocks)  the engine has written that layer of those
//                                 blocks into the history (BlockPayload);
//                                 once every layer of a block is saved (each
//                                 layer once: a second Save of a layer is
//                                 refused), the block is written back to a
//                                 daemon chosen by placement, asynchronously
//                                 (saver thread), unless the cluster already
//                                 holds it. A write-back is best effort:
//                                 Finish reports every block written,
//                                 skipped or failed, and fails if any failed.
//   Attend(context, layer, q)     after WaitLayer(context, layer): decode
//                                 attention over that layer of the history:
//                                 tiles stream host -> device through the
//                                 arena's staging pages and fold by LSE
//                                 (client/streaming_attention.h); the result
//                                 is bit-identical to fully resident tiled
//                                 attention with the same tile size.
//   Finish(context)               waits for the load and the saves, reports
//                                 the observations to placement, releases
//                                 the arena pages and the history.
//
// Exactness and fallback: a fetched block is used only if its bytes match the
// CRC32C the daemon committed; a fetch that fails (daemon gone: Unavailable,
// NotFound, DataLoss, a CRC mismatch, a deadline) tries the run's fallback
// hosts, then recomputes the blocks still missing. Every fallback is counted
// (ClientMetrics) and reported to placement (fallback runs, stale directory
// entries for NotFound). When placement itself cannot be reached, Match
// returns a local recompute-all plan and counts it. Wrong bytes are never
// returned: what cannot be fetched exactly is recomputed or the load fails.
//
// Ownership: the Client borrows options.device (which must outlive it) and
// owns its data-plane transport (options.data_transport: UCX or kernel TCP
// sockets), its staging region (options.staging_bytes: write-back), its
// history pool (options.history_pool_bytes: registered with the transport
// and exported to every daemon, which writes fetched blocks straight into
// the context's pages), its
// device arena, its loader and saver threads, its sessions with daemons
// (client/cache_host_session.h) and every context. A context's history
// belongs to the Client; the spans BlockPayload returns and the view History
// returns stay valid until Finish.
//
// Threads: Match, NewContext, Load, WaitLayer, Save, Finish and metrics may be
// called from any thread, concurrently, for different contexts. Attend uses
// one set of staging buffers: calls to Attend are serialised internally (one
// decode at a time per Client). options.recompute runs on loader threads.
// The engine must not write into a context's history while its load runs
// (before WaitLayer returned OK), nor after Save for the saved layers.
#ifndef KVFABRIC_CLIENT_KVFABRIC_CLIENT_H_
#define KVFABRIC_CLIENT_KVFABRIC_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/device_arena.h"
#include "client/host_history.h"
#include "core/block_key.h"
#include "core/bus_cost_model.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/device.h"
#include "security/grpc_security.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace kvfabric::client {

using ContextId = std::uint64_t;

// What the engine must prefill when a run is recomputed.
struct RecomputeRequest {
  ContextId context = 0;
  std::uint32_t first_block = 0;  // chain index of the first block
  std::uint32_t block_count = 0;
  std::uint64_t first_token = 0;    // first_block * tokens_per_block
  std::uint64_t tokens = 0;         // tokens to produce (a partial tail counts its own)
  std::uint64_t prefix_tokens = 0;  // tokens before them (= first_token)
  // The history's blocks [0, first_block): the KV the prefill attends to.
  // Every one has landed (fetched, or recomputed by an earlier call) before
  // the call is made, as a serving engine's prefill after a cached prefix
  // needs; the view is valid during the call. Under a compact_after policy
  // some may hold their compact_int8 copies (prefix.compact(b); decode
  // them with gpu::DecodeCompactInt8): the policy accepts their error.
  HostHistory prefix;
};

// The engine's prefill: writes every layer of the request's blocks into `out`
// (block payloads back to back, laid out as docs/block-format.md says; block
// first_block at out[0]). Called on a loader thread; may block. An error fails
// the load (there is no further fallback).
using RecomputeFn = std::function<Status(const RecomputeRequest&, std::span<std::byte> out)>;

// The flag names are the settings a refusal names.
struct ClientOptions {
  // Placement's gRPC address HOST:PORT (--placement-address), or several
  // replicas' separated by commas (at most 8): a call that gets no answer
  // from one (Unavailable, DeadlineExceeded) goes to the next at once, and
  // the one that does not answer is backed off (1 s doubling to 30 s). Open
  // needs one to answer. Required.
  std::string placement_address;
  // How gRPC to placement and every daemon is secured
  // (security/grpc_security.h, docs/security.md): security.ca_file for TLS
  // (with cert_file/key_file for mutual TLS, or token_file for a bearer
  // token), or security.insecure for plaintext to loopback addresses
  // (allow_insecure_remote for others). Open refuses neither, naming the
  // settings; a daemon's address from placement is checked the same way
  // when the client first reaches it. Required.
  GrpcSecurityOptions security;
  // The daemons run their kernel-TCP data plane with TLS
  // (kvfabric-cached --data-plane-tls): connect with TLS 1.3 and verify them
  // against security.ca_file. Needs data_transport "tcp". Default false.
  bool data_plane_tls = false;
  // Tenant of every key (empty: the default tenant).
  std::string namespace_name;
  // Model and shard: block geometry and recompute fit. Required (validated).
  ModelFingerprint model;
  // This machine's name, compared with the daemons' (default: hostname).
  std::string client_node;
  // The data-plane transport (--data-transport): "ucx" (default) or "tcp",
  // kernel sockets, for daemons started with --data-transport=tcp. Every
  // daemon this client reaches must use the same.
  std::string data_transport = "ucx";
  // UCX transports for the data plane (--ucx-tls). Must include tcp. With
  // shared memory in it (sm, sysv, posix, cma), a daemon on this host that
  // runs as another user (or in another IPC namespace) is refused before its
  // data plane is connected: loads from it and saves to it fail
  // FailedPrecondition naming this setting (logged once per daemon), since
  // UCX would fail every transfer. "tcp" works across users.
  std::string ucx_tls = "sm,self,tcp";
  // How refusals spell ucx_tls (the C API passes its field name); empty:
  // "ucx_tls (--ucx-tls)".
  std::string ucx_tls_setting;
  // The device attention runs on; borrowed. Required.
  gpu::Device* device = nullptr;
  // The bounded device working set (client/device_arena.h). page_bytes 0
  // picks one attention tile of one layer (tile_tokens * kv_heads * head_dim
  // * dtype size * 2); staging_pages 0 picks two tiles' worth;
  // context_floor_pages 0 picks 1 + hot_newest_pages.
  DeviceArenaOptions arena;
  // Query heads (--num-q-heads): a multiple of model.kv_heads. Required.
  std::uint32_t num_q_heads = 0;
  // Tokens per attention tile (--tile-tokens): a multiple of
  // tokens_per_block. Default 256.
  std::uint32_t tile_tokens = 256;
  // Client staging region for write-back (--client-staging-bytes): the
  // blocks of one write-back batch (at most 16) are copied into it before
  // the daemon pulls them. Default 64 MiB; must hold one block. Fetches need
  // no staging: daemons write into the history pool.
  std::uint64_t staging_bytes = std::uint64_t{64} << 20;
  // Fetch requests in flight per daemon per load (--client-fetch-depth), each
  // of up to 16 blocks and about 8 MiB (a 2 MiB block: 4 per request): each
  // is checked (CRC) while the others move. Every daemon of a plan is fetched
  // from at once. 1..64; default 4 (docs/benchmarks.md, "Loading from
  // daemons"). Requests to one daemon from all loads together are admitted by
  // a window that halves when the daemon refuses one for its per-namespace
  // lease bound and grows back as requests succeed
  // (CacheHostSession::FetchWithin); a refused request is asked again after a
  // pause (ClientMetrics::fetch_requests_throttled). Blocks on a daemon's
  // NVMe only are leased (the daemon stages them) one lease at a time per
  // daemon beside these requests.
  std::uint32_t fetch_depth = 4;
  // A stream that runs far past its plan's prediction is cut: once a
  // daemon's stream has run straggler_factor x the end placement predicted
  // for it plus straggler_slack, or has run its whole predicted time (and at
  // least straggler_slack) at a rate that would end it past that
  // (client/straggler_cut.h: judged when a layered load's layer 0 is
  // answered, before its large requests go out), it starts no further
  // request; the requests in flight finish, and its blocks not yet landed
  // fall back like a failed run's (another replica, else recompute)
  // (ClientMetrics::streams_cut_past_cut_off, streams_cut_projected). A
  // stream whose rate projects it past the cut-off before it has run its
  // predicted time keeps one request in flight until the next answer. The stream's bytes and time
  // still teach placement the path (a miss this large is a change point
  // after two, core/calibrated_cost_model.h). Without it a link capped to a
  // twentieth of its rate held every load planned before placement knew,
  // for the whole of its fetch (cluster_planner_bench phase 2). 0 turns it
  // off; otherwise >= 1.5 (a stream must be allowed its noise: identical
  // plans spread 0.45-1.26x on the 2-vCPU VM). Default 4. Streams of a
  // plan without predictions (predicted end 0) are never cut; a client whose
  // `recompute` cannot prefill sets 0 (the Python client opened without
  // recompute= does). The stream's time starts once its daemon session is
  // open. Slack default
  // 50 ms: a short load on a busy host is not worth a fallback.
  double straggler_factor = 4.0;
  std::chrono::milliseconds straggler_slack{50};
  // Who reads a fetched block's bytes again for its CRC32C. true (default):
  // the daemon is asked to (kFetch flag bit 3); where it copies into the
  // history pool through a shared-memory mapping (UCX on one host) it reads
  // each 64 KiB back from its cache right after writing it and says which
  // blocks matched, and the client skips its own pass over those
  // (ClientMetrics::bytes_checked_by_daemon). Elsewhere (TCP, RDMA, an
  // older daemon) the client checks every byte as before. false: the client
  // always checks itself, one more pass over memory: 1.2-1.4x the load time
  // of a 32K-token history on the development VM (docs/benchmarks.md). The
  // daemon checks the bytes where they landed, in the client's pages, so
  // either way the bytes checked are the bytes the engine reads; what
  // changes is whose CPU reads them, and that the client then trusts the
  // daemon's answer, as it already trusts it to serve the right block.
  bool daemon_checks_landing = true;
  // Write-back protocol (--client-store-by-key). true: one data-plane kStore
  // per batch of up to 8 blocks, several in flight, the daemon pulling each
  // block from its page of the history and checking its CRC before it
  // commits (one round trip, no client-side copy). false: gRPC Reserve, a
  // kPut from staging, gRPC Commit (three round trips and a copy into
  // staging): for daemons older than kStore, and for comparison.
  bool store_by_key = true;
  // Write-back threads with store_by_key, each taking the next batch (about
  // 32 MiB, one Place call, then its kStores), so that one batch's Place
  // call and daemon round trips overlap another's. 1..8; default 2
  // (docs/benchmarks.md, write-back). The Reserve/kPut/Commit path uses one
  // (it copies through the one staging region).
  std::uint32_t save_threads = 2;
  // Open starts, on a thread of its own, a data session with every daemon
  // placement lists as serving (at most 64): gRPC OpenDataSession, the
  // transport's connection, and the daemon's import of the history pool,
  // 30-80 ms each on the development VM, which a first save or load
  // otherwise pays (docs/benchmarks.md, write-back). Open does not wait for
  // it; a daemon that does not answer is connected when a request needs it,
  // as with false (connect on first use).
  bool connect_at_open = true;
  // The pinned host memory every context's history lives in
  // (--client-history-pool-bytes; client/history_pool.h): allocated,
  // pinned and pre-faulted at Open, handed out in pages of one block, so no
  // request allocates or faults in memory. Required: 0 is refused. A context
  // of T tokens holds ceil(T / tokens_per_block) pages until Finish; Open
  // logs how many histories of max_context_tokens fit.
  std::uint64_t history_pool_bytes = 0;
  // The longest history the engine will ask for (--client-max-context-tokens):
  // Open refuses a history pool that cannot hold one. 0: not stated (the
  // pool must hold one block).
  std::uint64_t max_context_tokens = 0;
  // How refusals spell history_pool_bytes (the C API passes its field name);
  // empty: "history_pool_bytes (--client-history-pool-bytes)".
  std::string history_pool_setting;
  // The engine's prefill. Required.
  RecomputeFn recompute;
  // What the engine's prefill costs, if it knows: t = c0 + c1 n + c2 n (p + n/2) in µs
  // (core/bus_cost_model.h). Sent with every plan request: placement plans with it until a
  // calibration file or its online fit of this model (refitted from the recompute times this
  // client measures and reports) says otherwise. Unset: placement's figures.
  std::optional<RecomputeParameters> prefill;
  // Deadline of each gRPC call (placement and daemons). Default 5 s.
  std::chrono::milliseconds rpc_timeout{5000};
  // Deadline of each data-plane transfer. Default 30 s.
  std::chrono::milliseconds transfer_timeout{30000};
  // Read-lease TTL asked of daemons. Default 30 s.
  std::uint32_t lease_ttl_ms = 30000;
  // The extra decode time of a compact token over an exact one, per decode
  // step, all layers, in µs (--client-compact-extra-decode-us): what a
  // compact_after request tells placement a compact block costs after its
  // load. Unset: measured at Open on this CPU's attention kernels for the
  // model's shape (logged); set it for a GPU device, where the CPU's figure
  // does not apply. Finite, >= 0.
  std::optional<double> compact_extra_decode_us_per_token;
  // Where the client serves its own Prometheus /metrics (HOST:PORT, port 0
  // picks; --client-metrics-address). Empty (default): no listener; the
  // engine serves metrics_collectable() from its own endpoint instead.
  std::string metrics_address;
};

// Counters since Open (a snapshot).
struct ClientMetrics {
  std::uint64_t matches = 0;
  std::uint64_t plans_recompute_all = 0;
  std::uint64_t plans_fetch_all = 0;
  std::uint64_t plans_split = 0;
  std::uint64_t plans_mixed = 0;
  std::uint64_t placement_unavailable = 0;  // Match planned locally
  // Plan and Place calls not made because placement was backing off after
  // it did not answer (see ClientOptions::rpc_timeout).
  std::uint64_t placement_calls_skipped = 0;
  std::uint64_t blocks_fetched = 0;
  std::uint64_t bytes_fetched = 0;
  // Of those, blocks that landed as their compact_int8 copies (compact_after
  // requests; docs/compact.md) and their bytes; and the plans with a compact run.
  std::uint64_t compact_blocks_fetched = 0;
  std::uint64_t compact_bytes_fetched = 0;
  std::uint64_t plans_with_compact = 0;
  std::uint64_t fetch_us = 0;  // wall time of fetch batches
  std::uint64_t blocks_recomputed = 0;
  std::uint64_t tokens_recomputed = 0;
  std::uint64_t recompute_us = 0;
  std::uint64_t fallbacks_to_replica = 0;    // runs (or parts) fetched from a fallback host
  std::uint64_t fallbacks_to_recompute = 0;  // runs (or parts) recomputed after a failed fetch
  std::uint64_t blocks_fallen_back = 0;      // blocks recomputed after a failed fetch
  std::uint64_t crc_failures = 0;
  // Fetched bytes the daemon checked where they landed
  // (ClientOptions::daemon_checks_landing); the rest of bytes_fetched the
  // client checked itself.
  std::uint64_t bytes_checked_by_daemon = 0;
  std::uint64_t stale_entries_reported = 0;
  std::uint64_t blocks_saved = 0;  // written back by this client
  std::uint64_t bytes_saved = 0;
  std::uint64_t blocks_already_cached = 0;  // saved, but the cluster already held them
  std::uint64_t save_us = 0;
  std::uint64_t save_failures = 0;  // blocks not written back (counted, logged)
  std::uint32_t history_pool_pages = 0;        // pages of one block
  std::uint32_t history_pages_in_use = 0;      // held by open contexts
  // Pages set aside after a fetch into them failed as a whole (the daemon
  // may still write them until transfer_timeout): total so far.
  std::uint64_t history_pages_quarantined = 0;
  // Fetch requests and NVMe leases a daemon refused for its per-namespace
  // lease bound and this client asked again after a pause.
  std::uint64_t fetch_requests_throttled = 0;
  // Daemon streams cut as stragglers (straggler_factor,
  // client/straggler_cut.h): past their cut-off, and projected past it from
  // the rate they moved (before their large requests went out).
  std::uint64_t streams_cut_past_cut_off = 0;
  std::uint64_t streams_cut_projected = 0;
  // Blocks a daemon refused at write-back for room (its namespace's
  // reservation bound, or a full pool) that this client sent again after
  // narrowing its window of kStores (CacheHostSession::StoreByKey).
  std::uint64_t store_blocks_throttled = 0;
  std::uint32_t peak_history_pages_in_use = 0;
  std::uint64_t attends = 0;
  std::uint64_t attend_us = 0;
  std::uint32_t peak_arena_pages = 0;  // held pool + staging pages at peak
  std::uint32_t arena_pages = 0;       // pool + staging pages
};

// One run of a plan, as executed.
struct RunOutcome {
  std::uint32_t first_block = 0;
  std::uint32_t block_count = 0;
  bool fetch = false;       // planned action
  std::string host_id;      // fetch: planned source
  std::string tier;         // fetch: "host" | "nvme" | "both"
  // When the run's last block is in the history, in µs after Load: as
  // predicted by placement, and as measured (fallbacks included). Fetches of
  // all runs from one host are batched together, so a run's blocks may land
  // before or after the run's predicted start.
  double predicted_end_us = 0;
  double measured_end_us = 0;
  std::uint32_t blocks_from_fallback_host = 0;
  std::uint32_t blocks_recomputed_after_failure = 0;
  std::string failure;  // the first fetch error, if any
};

// A request's accuracy policy (docs/compact.md, issue 24).
struct AccuracyPolicy {
  // nullopt (the default): `exact`. Every block that reaches the history is
  // bit-identical to what was saved or recomputes; no compact copy is ever
  // fetched. N: `compact_after=N`: a block that ends at least N tokens
  // before the request's last token (chain plus suffix) may be fetched as
  // its compact_int8 copy when the plan finds that cheaper (its bytes on the
  // bus against its extra decode time).
  std::optional<std::uint64_t> compact_after_tokens;
  // Decode steps the request expects to run over this history: each pays
  // the extra decode time of every compact token. 0 counts as 1.
  std::uint64_t decode_steps = 0;

  // "exact" or "compact_after=N" (N a token count); InvalidArgument naming
  // the text otherwise.
  static StatusOr<AccuracyPolicy> Parse(std::string_view text);
  std::string ToString() const;
};

// Options of one Match call.
struct MatchOptions {
  // Fill MatchResult::explanation with the plan's formula.
  bool explain = false;
  AccuracyPolicy accuracy;
  // Only plans whose fetch runs are a leading prefix of the chain (no split):
  // for an engine that can take only a loaded prefix and computes everything
  // after it itself (vLLM's connector).
  bool prefix_plans_only = false;
};

// What Match returns: the plan, and the chain it was made for.
struct MatchResult {
  std::vector<BlockKey> chain;
  std::uint64_t suffix_tokens = 0;
  std::uint32_t cached_prefix_blocks = 0;  // per placement's directory
  std::uint64_t plan_id = 0;               // 0: planned locally (placement unreachable)
  std::string kind;  // "recompute_all" | "fetch_all" | "split" | "mixed"
  double predicted_us = 0;
  std::string explanation;  // when Match was called with explain = true
  struct Run {
    std::uint32_t first_block = 0;
    std::uint32_t block_count = 0;
    bool fetch = false;
    std::uint32_t host = 0;  // index into hosts
    std::string tier;
    std::vector<std::uint32_t> fallback_hosts;
    double predicted_start_us = 0;
    double predicted_end_us = 0;
    // A fetch of the blocks' compact_int8 copies (only under a compact_after
    // policy): they land compact (Client::BlockIsCompact).
    bool compact = false;
  };
  std::vector<Run> runs;
  // The plan's representation choice: "exact", "compact-where-gone" (compact
  // copies only where no exact copy is cached) or "compact"; and the decode
  // time its compact runs add after the load, µs (not in predicted_us).
  std::string representation = "exact";
  double compact_penalty_us = 0;
  struct Host {
    std::string host_id;
    std::string grpc_address;
    std::string transport_address;
  };
  std::vector<Host> hosts;
};

// What Finish returns about one context.
struct ContextReport {
  std::uint64_t plan_id = 0;
  std::string kind;
  double predicted_us = 0;
  double load_us = 0;  // Load to the end of the last run
  // µs after Load that layer 0, and every layer, of every block was in the
  // history (what WaitLayer(0) and WaitLayer(last) waited for); -1 if never.
  double layer0_ready_us = -1;
  double all_layers_ready_us = -1;
  std::vector<RunOutcome> runs;
  std::uint32_t blocks_fetched = 0;
  std::uint32_t blocks_recomputed = 0;  // planned or after failure, tail included
  std::uint64_t bytes_fetched = 0;
  std::uint64_t fetch_from_host_tier_bytes = 0;
  std::uint64_t fetch_from_nvme_tier_bytes = 0;
  // Every full block whose layers were all saved is exactly one of:
  std::uint32_t blocks_written = 0;         // written back to a daemon by this context
  std::uint32_t blocks_already_cached = 0;  // skipped: placement or the daemon already held it
  std::uint32_t save_failures = 0;          // not written back (Finish returns the first error)
};

class Client {
 public:
  // Validates `options` (InvalidArgument naming the setting), connects to
  // placement (Unavailable if it does not answer Health by rpc_timeout),
  // creates the data-plane transport (UCX or kernel TCP, per
  // options.data_transport), the staging region, the history pool
  // (allocated and pre-faulted: its arithmetic is logged at info) and the
  // device arena, and
  // starts the saver thread.
  static StatusOr<std::unique_ptr<Client>> Open(ClientOptions options);
  // Close(), then frees everything.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Finishes every open context (waiting for their loads and saves) and stops
  // the saver. Idempotent. Returns the first error seen.
  Status Close();

  // The key chain of `tokens` (full blocks; a partial tail is ignored), under
  // options.namespace_name and options.model.
  StatusOr<std::vector<BlockKey>> KeyTokens(std::span<const std::uint32_t> tokens) const;

  // Asks placement for a plan over `chain` (1..max chain blocks) plus
  // `suffix_tokens` the engine prefills anyway. With explain, the plan's
  // formula comes back too. Never fails for placement being down (a local
  // recompute-all plan is returned and counted); InvalidArgument for a bad
  // chain.
  StatusOr<MatchResult> Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
                              bool explain = false);
  // The same into `*out`, reusing its vectors' and strings' memory: an engine
  // that keeps one MatchResult per slot makes Match allocate no plan storage
  // once warm (a split plan over 1,024 blocks is ~90 KiB of runs). On error
  // *out holds no usable plan.
  Status Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens, bool explain,
               MatchResult* out);
  // The same with the request's accuracy policy (Match above is `exact`).
  Status Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
               const MatchOptions& options, MatchResult* out);

  // A context for a history of `tokens` tokens: ceil(tokens /
  // tokens_per_block) pages of the history pool and an arena budget.
  // ResourceExhausted, with the arithmetic, when the history pool or the
  // arena cannot admit it; nothing is allocated either way.
  StatusOr<ContextId> NewContext(std::uint64_t tokens);

  // Starts `match`'s plan into `context`: blocks [0, chain) from the plan,
  // then the partial tail (tokens beyond the chain) by recompute.
  // InvalidArgument if the chain does not fit the context;
  // FailedPrecondition if a load already ran.
  Status Load(const MatchResult& match, ContextId context);

  // See the class comment. The load's error if it failed; DeadlineExceeded.
  Status WaitLayer(ContextId context, std::uint32_t layer,
                   std::chrono::milliseconds timeout = std::chrono::minutes(5));

  // Block `block`'s payload in the context's history (all layers; layer l's
  // K at l * 2 * layer_half, V after it; core/block_format.h).
  // FailedPrecondition for a block that landed as its compact copy (read it
  // with DecodeBlock).
  StatusOr<std::span<std::byte>> BlockPayload(ContextId context, std::uint32_t block);
  // Whether block `block` landed as its compact_int8 copy (a compact_after
  // plan's compact run; docs/compact.md). Meaningful once its layers landed.
  StatusOr<bool> BlockIsCompact(ContextId context, std::uint32_t block);
  // Block `block`'s KV as fp32 values, laid out as the payload
  // ([layers][K, V][tokens][kv_heads][head_dim]), into `out` (that many
  // floats): the exact values converted, or a compact copy decoded
  // (gpu::DecodeCompactInt8). For engines that keep their own KV cache.
  Status DecodeBlock(ContextId context, std::uint32_t block, std::span<float> out);
  // The whole history as its blocks (for a reference check), with its
  // compact blocks flagged (HostHistory::compact).
  StatusOr<HostHistory> History(ContextId context) const;

  // The engine has written layer `layer` of full blocks [first_block,
  // first_block + block_count) into the history, whose keys are
  // keys[0..block_count). Each block is written back once all its layers are
  // saved. InvalidArgument for a range past the context, a partial block, or
  // a key count that differs.
  Status Save(ContextId context, std::uint32_t layer, std::uint32_t first_block,
              std::span<const BlockKey> keys);

  // Attention of `q` ([num_q_heads, head_dim] fp32) over every token of the
  // context's history in layer `layer`, into `out` ([num_q_heads, head_dim])
  // and `lse` ([num_q_heads]). `step` is the decode step (for staging leases).
  // FailedPrecondition before the load finished.
  Status Attend(ContextId context, std::uint32_t layer, std::uint64_t step,
                std::span<const float> q, std::span<float> out, std::span<float> lse);

  // Waits for the load and this context's saves, reports observations to
  // placement (best effort), releases the arena budget and the history,
  // whatever happened. Returns the report, or the failure the engine must
  // not miss: the load's error if the load failed (its blocks are not in the
  // history), else, if any block was not written back, an error with the
  // first write-back failure's code saying how many of how many failed.
  StatusOr<ContextReport> Finish(ContextId context);
  // The same, with the report filled in whatever the status.
  Status Finish(ContextId context, ContextReport* report);

  ClientMetrics metrics() const;
  // The client's Prometheus families (kvfabric_client_*, docs/metrics.md),
  // for the engine to register with its own prometheus-cpp Exposer or
  // Registry collection. Valid for as long as the engine holds it; after
  // the Client is destroyed it serves only the families observed until
  // then (no snapshot of a gone client).
  std::shared_ptr<prometheus::Collectable> metrics_collectable() const;
  // "http://HOST:PORT/metrics" when options.metrics_address is set, else "".
  std::string metrics_url() const;
  const ClientOptions& options() const;
  // The arena's layout, one line (DeviceArena::DescribeLayout).
  std::string DescribeArena() const;
  // The history pool's arithmetic, one line (HistoryPool::DescribeLayout).
  std::string DescribeHistoryPool() const;
  // What a compact token adds to a decode step, µs, as compact_after
  // requests tell placement: options.compact_extra_decode_us_per_token, or
  // the probe's measurement at Open (0 when the model has no compact codec).
  double compact_extra_decode_us_per_token() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_KVFABRIC_CLIENT_H_
