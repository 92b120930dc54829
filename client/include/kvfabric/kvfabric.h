/* kvfabric's C API: the client library (client/kvfabric_client.h) for engines
 * that bind through a foreign-function interface (Python ctypes/cffi, Rust,
 * Go). Pure C: it compiles as C99 and as C++, and every symbol has C linkage.
 *
 * The calls follow kvfabric::client::Client one for one:
 *
 *   kvf_options_init(&o); ...            defaults, then the required settings
 *   kvf_client_open(&o, &client)         a CPU or CUDA device + Client::Open
 *   kvf_key_tokens(client, tokens, ...)  the key chain of a prompt
 *   kvf_match(client, keys, n, ...)      cached prefix and placement's plan
 *   kvf_new_context(client, tokens, &c)  a request's history
 *   kvf_load(client, match, c)           starts the plan (fetch / recompute)
 *   kvf_wait_layer(client, c, layer, ms) that layer of every block is loaded
 *   kvf_block_payload(client, c, b, ...) the engine reads / writes a block
 *   kvf_save(client, c, layer, ...)      that layer was written: write back
 *   kvf_attend(client, c, layer, ...)    decode attention over the history
 *   kvf_finish(client, c, &report)       waits, reports, frees the context
 *   kvf_client_close(client)             finishes everything, frees
 *
 * Errors. Every call that can fail returns a kvf_status: KVF_OK or one of the
 * codes below, numbered as kvfabric::StatusCode (and gRPC) and never
 * renumbered. A failing call also records a message on the calling thread:
 * kvf_last_error() returns it, naming what was wrong with its numbers and the
 * setting or argument to change, e.g.
 *   "kvf_attend: InvalidArgument: q_len is 4000, expected num_q_heads *
 *    head_dim = 32 * 128 = 4096".
 * A null pointer or a size that does not fit gives KVF_INVALID_ARGUMENT naming
 * the argument. No C++ exception crosses this API: one that escapes the
 * library becomes KVF_INTERNAL.
 *
 * Ownership. The caller owns every buffer it passes in; the library copies
 * what it keeps (option strings, keys) before the call returns, except:
 *   - kvf_options.recompute_user is borrowed until kvf_client_close returns;
 *   - a kvf_client owns its device, its Client, every context and every
 *     history; kvf_block_payload's pointer stays valid until kvf_finish of
 *     that context (or kvf_client_close);
 *   - a kvf_match_result belongs to the caller (kvf_match_free); the
 *     strings its accessors return live as long as it does;
 *   - kvf_last_error's string belongs to the calling thread and stays valid
 *     until the next failing call on that thread.
 *
 * Device. A kvf_client creates and owns the device attention runs on, with
 * an arena of kvf_options.device_arena_bytes: by default the CPU reference
 * device (gpu/cpu); kvf_options.device_kind = KVF_DEVICE_CUDA selects GPU
 * kvf_options.device_index, in a library built with CUDA. Level Zero, and
 * borrowing the engine's own device context, are later additions.
 *
 * Logging. The library logs through its own logger, never the engine's:
 * lines for operators (refusals with their arithmetic, quarantines, failed
 * write-backs), to stderr at KVF_LOG_WARN and above unless the engine says
 * otherwise with kvf_set_log_level and kvf_set_log_sink. Both are
 * process-wide (every kvf_client shares them) and may be called at any time
 * from any thread, before kvf_client_open too.
 *
 * Threads. Every kvf_client call may be made from any thread, concurrently,
 * for different contexts (as Client's). kvf_attend calls are serialised inside
 * the library (one decode at a time per client). kvf_options.recompute runs on
 * the library's loader threads. kvf_client_close must be the last call on a
 * client: no other call on it may be in flight or follow, and it must not be
 * called from inside the recompute callback. A kvf_match_result is
 * immutable: its accessors and kvf_load may use it from any thread. The
 * engine must not write into a context's history while its load runs (before
 * kvf_wait_layer returned KVF_OK), nor after kvf_save for the saved layers.
 *
 * ABI. kvf_options carries its size (struct_size, set by kvf_options_init):
 * options not initialised by this library's kvf_options_init are refused, and
 * later versions add fields at its end. The output structs (kvf_metrics,
 * kvf_context_report) and the codes change only with the major version.
 */
#ifndef KVFABRIC_KVFABRIC_H_
#define KVFABRIC_KVFABRIC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status ------------------------------------------------------------ */

/* A kvf_status holds one of enum kvf_status_code (a fixed-width int, so that
 * FFI declarations need no enum size). */
typedef int32_t kvf_status;

enum kvf_status_code {
  KVF_OK = 0,
  KVF_CANCELLED = 1,
  KVF_UNKNOWN = 2,
  KVF_INVALID_ARGUMENT = 3,
  KVF_DEADLINE_EXCEEDED = 4,
  KVF_NOT_FOUND = 5,
  KVF_ALREADY_EXISTS = 6,
  KVF_PERMISSION_DENIED = 7,
  KVF_RESOURCE_EXHAUSTED = 8,
  KVF_FAILED_PRECONDITION = 9,
  KVF_ABORTED = 10,
  KVF_OUT_OF_RANGE = 11,
  KVF_UNIMPLEMENTED = 12,
  KVF_INTERNAL = 13,
  KVF_UNAVAILABLE = 14,
  KVF_DATA_LOSS = 15
};

/* The message of the last call on this thread that did not return KVF_OK,
 * "<function>: <Code>: <what was wrong>"; "" if none has failed on this
 * thread. Successful calls leave it unchanged (like errno). Never NULL. The
 * string belongs to this thread and stays valid until its next failing call. */
const char* kvf_last_error(void);

/* "KVF_OK", "KVF_INVALID_ARGUMENT", ...; "KVF_UNRECOGNISED_STATUS" for any
 * other value. A static string. */
const char* kvf_status_name(kvf_status status);

/* ---- Logging ----------------------------------------------------------- */

/* A kvf_log_level holds one of enum kvf_log_level_code (fixed width, as
 * kvf_status). Numbered here, never renumbered; each level includes the more
 * severe ones. */
typedef int32_t kvf_log_level;

enum kvf_log_level_code {
  KVF_LOG_TRACE = 0,
  KVF_LOG_DEBUG = 1,
  KVF_LOG_INFO = 2, /* also the start-up arithmetic: the arena's layout */
  KVF_LOG_WARN = 3, /* the default: refusals, failed write-backs */
  KVF_LOG_ERROR = 4,
  KVF_LOG_OFF = 5 /* nothing is logged */
};

/* Writes lines of `level` and more severe ones from now on (KVF_LOG_OFF:
 * none). Default KVF_LOG_WARN. KVF_INVALID_ARGUMENT for a value not in
 * enum kvf_log_level_code (the level stays as it was). */
kvf_status kvf_set_log_level(kvf_log_level level);

/* Receives one log line: its level (never KVF_LOG_OFF) and the message, a
 * NUL-terminated string without timestamp or trailing newline, valid during
 * the call only. Called on whichever library or engine thread logged, one
 * line at a time (calls never overlap). It must not call into kvfabric (a
 * call that logs would deadlock), and should return quickly: other threads'
 * lines wait for it. */
typedef void (*kvf_log_fn)(void* user, kvf_log_level level, const char* line);

/* Sends every line from now on to fn(user, level, line) instead of stderr;
 * fn NULL restores stderr (user is then ignored). When this returns, the
 * previous fn is not running and is never called again, so its user data may
 * be freed; `user` is borrowed until the next kvf_set_log_sink. Cannot
 * fail. */
void kvf_set_log_sink(kvf_log_fn fn, void* user);

/* ---- Keys and handles -------------------------------------------------- */

/* One block key: 32 bytes (SHA-256, core/block_key.h). An array of n keys is
 * 32 * n contiguous bytes. (A struct rather than uint8_t[32] because C does
 * not convert uint8_t (*)[32] to const uint8_t (*)[32] implicitly.) */
#define KVF_BLOCK_KEY_BYTES 32
typedef struct kvf_block_key {
  uint8_t bytes[KVF_BLOCK_KEY_BYTES];
} kvf_block_key;

/* A connected client (kvf_client_open .. kvf_client_close). Opaque. */
typedef struct kvf_client kvf_client;
/* A plan returned by kvf_match (.. kvf_match_free). Opaque. (Not named
 * kvf_match: a C function and a type cannot share a name.) */
typedef struct kvf_match_result kvf_match_result;
/* A request's history, valid from kvf_new_context until kvf_finish. */
typedef uint64_t kvf_context_id;

/* ---- Options ----------------------------------------------------------- */

/* Element type of the cached keys and values: the numbers of kvfabric::KvDtype
 * (hashed into every block key; never renumbered). The attention kernels take
 * these three. Stored in kvf_options.dtype as a uint32_t. */
enum kvf_dtype_code { KVF_DTYPE_FP16 = 1, KVF_DTYPE_BF16 = 2, KVF_DTYPE_FP32 = 3 };

/* The device a kvf_client creates (stored in kvf_options.device_kind as a
 * uint32_t; never renumbered). */
enum kvf_device_kind {
  KVF_DEVICE_CPU = 0, /* the reference CPU backend; attention on the host */
  KVF_DEVICE_CUDA = 1 /* an NVIDIA GPU: kvf_options.device_index */
};

/* What the engine must prefill when a run of blocks is recomputed
 * (kvfabric::client::RecomputeRequest). */
typedef struct kvf_recompute_request {
  kvf_context_id context;
  uint32_t first_block; /* chain index of the first block */
  uint32_t block_count;
  uint64_t first_token;   /* first_block * tokens_per_block */
  uint64_t tokens;        /* tokens to produce (a partial tail counts its own) */
  uint64_t prefix_tokens; /* tokens before them (= first_token) */
} kvf_recompute_request;

/* The engine's prefill: writes every layer of the request's blocks into `out`
 * (out_bytes bytes: block payloads back to back, laid out as
 * docs/block-format.md says; block first_block at out[0]). It is called only
 * once every block before first_block is in the context's history (fetched,
 * or recomputed by an earlier call), as a prefill after a cached prefix
 * needs; kvf_block_payload reads them from inside the call. `out` belongs to
 * the library and is valid during the call only. Called on a loader thread,
 * possibly several at once for different contexts; may block. Return KVF_OK,
 * or a code that fails the load (there is no further fallback). */
typedef kvf_status (*kvf_recompute_fn)(void* user, const kvf_recompute_request* request,
                                       uint8_t* out, uint64_t out_bytes);

/* Settings of kvf_client_open. Fill with kvf_options_init, then set the
 * required fields. Strings are copied by kvf_client_open; they need not
 * outlive it. The names in brackets are the matching server-side flags. */
typedef struct kvf_options {
  /* sizeof(kvf_options), set by kvf_options_init. Do not change. */
  uint32_t struct_size;

  /* Placement's gRPC address HOST:PORT [--placement-address], or up to 8
   * replicas' separated by commas (the next is used when one does not
   * answer). Required. */
  const char* placement_address;
  /* Tenant of every key. NULL or "": the default tenant. */
  const char* namespace_name;
  /* This machine's name, compared with the daemons'. NULL: the hostname. */
  const char* client_node;

  /* The model and shard: they decide the block geometry and every key.
   * model_id is required (non-empty, at most 256 bytes). */
  const char* model_id;
  uint32_t first_layer;      /* layers [first_layer, first_layer + layer_count). Default 0 */
  uint32_t layer_count;      /* > 0. Required */
  uint32_t dtype;            /* a kvf_dtype_code. Default KVF_DTYPE_BF16 */
  uint32_t kv_heads;         /* KV heads of this TP rank, > 0. Required */
  uint32_t head_dim;         /* > 0. Required */
  uint32_t tokens_per_block; /* a power of two in [1, 256]. Default 16 */
  uint32_t tp_rank;          /* < tp_size. Default 0 */
  uint32_t tp_size;          /* Default 1 */

  /* Query heads [--num-q-heads]: a multiple of kv_heads. Required. */
  uint32_t num_q_heads;
  /* Tokens per attention tile [--tile-tokens]: a multiple of
   * tokens_per_block. Default 256. */
  uint32_t tile_tokens;

  /* Bytes of the device arena, allocated (and pre-faulted) once at open, in
   * the device's memory [--device-arena-bytes]. Required: 0 is refused. It
   * must hold the kernels' scratch, device_staging_pages and one
   * device_context_floor_pages (client/device_arena.h); a refusal names the
   * minimum. For KVF_DEVICE_CUDA it must fit the GPU's free memory
   * (KVF_RESOURCE_EXHAUSTED otherwise). */
  uint64_t device_arena_bytes;
  /* Bytes per arena page [--device-page-bytes]. 0 (default): one attention
   * tile of one layer, tile_tokens * kv_heads * head_dim * dtype size * 2. */
  uint64_t device_page_bytes;
  /* Client staging region for write-back [--client-staging-bytes]: one
   * write-back batch (up to 16 blocks) is copied into it for the daemon to
   * pull. Default 64 MiB; must hold one block. Fetches need none: daemons
   * write blocks straight into the history pool. */
  uint64_t staging_bytes;
  /* UCX transports for the data plane [--ucx-tls]. Must include tcp.
   * Default "sm,self,tcp" (NULL means the same). */
  const char* ucx_tls;

  /* Deadline of each gRPC call, to placement and daemons. Default 5000. */
  uint32_t rpc_timeout_ms;
  /* Deadline of each data-plane transfer. Default 30000. */
  uint32_t transfer_timeout_ms;

  /* The engine's prefill. Required. recompute_user is passed back to it
   * unchanged and is borrowed until kvf_client_close returns. */
  kvf_recompute_fn recompute;
  void* recompute_user;

  /* The pinned host memory every context's history lives in
   * [--client-history-pool-bytes]: allocated, pinned and pre-faulted at
   * kvf_client_open (its arithmetic is logged at info), handed out in pages
   * of one block, so no request allocates or faults in memory. Required: 0
   * is refused. A context of T tokens holds ceil(T / tokens_per_block) pages
   * until kvf_finish; kvf_new_context answers KVF_RESOURCE_EXHAUSTED when
   * too few are free. */
  uint64_t history_pool_bytes;

  /* The data-plane transport [--data-transport]: "ucx" (default; NULL means
   * the same) or "tcp", kernel sockets, for daemons started with
   * --data-transport=tcp. Every daemon reached must use the same. */
  const char* data_transport;

  /* The device attention runs on, a kvf_device_kind. Default KVF_DEVICE_CPU.
   * KVF_DEVICE_CUDA needs a library built with CUDA: otherwise
   * kvf_client_open refuses it (KVF_UNIMPLEMENTED, saying so), and without a
   * usable GPU it fails with KVF_FAILED_PRECONDITION and CUDA's reason. */
  uint32_t device_kind;
  /* Which GPU for KVF_DEVICE_CUDA: the CUDA ordinal (CUDA_VISIBLE_DEVICES
   * applies). Default 0. Must be 0 for KVF_DEVICE_CPU. */
  uint32_t device_index;

  /* Arena pages reserved for staging streamed tiles
   * [--device-staging-pages]. 0 (default): two tiles' worth, so the next
   * tile's copy overlaps the current tile's attention. Every staging page is
   * a page no context can hold. */
  uint32_t device_staging_pages;
  /* Pages every context holds to run, committed when kvf_new_context admits
   * it [--device-context-floor-pages]. 0 (default): 2, its attention-sink
   * page and its newest page (the least that is accepted). A larger floor
   * keeps more of each history on the device; fewer contexts fit. */
  uint32_t device_context_floor_pages;
  /* The longest history the engine will ask for
   * [--client-max-context-tokens]: kvf_client_open refuses a history pool
   * that cannot hold one. 0 (default): not stated (one block must fit). */
  uint64_t max_context_tokens;

  /* What the engine's prefill costs, if it knows (ClientOptions::prefill):
   * prefill_c0_us + prefill_c1_us * n + prefill_c2_us * n * (p + n / 2)
   * + prefill_c3_us * p microseconds for n tokens after p (prefill_c3_us,
   * at the end of this struct, is the per-call cost of reading the prefix's
   * K and V). Sent with every plan request;
   * placement plans with it until a calibration file or its online fit of
   * the model (from the recompute times this client measures) says
   * otherwise. All four 0 (default): not stated. Each finite and >= 0. */
  double prefill_c0_us;
  double prefill_c1_us;
  double prefill_c2_us;

  /* Where the client serves Prometheus /metrics, HOST:PORT (port 0 picks
   * one; kvf_client_metrics_url says which) [--client-metrics-address].
   * NULL or "" (default): no listener; kvf_client_metrics_text gives the
   * same page for the engine's own endpoint. The families are catalogued in
   * docs/metrics.md (kvfabric_client_*). */
  const char* metrics_address;

  /* With the prefill constants above: how much of a split plan's shorter
   * side (prefilling the front while fetching the rest) fails to overlap the
   * longer one, in [0, 1]. 0 (default): they overlap fully, e.g. a GPU
   * prefill beside a NIC/DMA fetch; 1: serial, e.g. a CPU prefill on the
   * cores the data plane uses. Placement learns it from finished split plans
   * unless a calibration file says otherwise (docs/placement.md). */
  double prefill_split_serial_fraction;

  /* How gRPC to placement and the daemons is secured (docs/security.md).
   * TLS: tls_ca_file, the PEM CA bundle that signs the servers' certificates
   * [--tls-ca]; mutual TLS adds tls_cert_file and tls_key_file, this
   * engine's certificate and key [--tls-cert, --tls-key]; or, without a
   * client certificate, tls_token_file, a file holding a bearer token sent
   * with every call [--tls-token-file]. tls_server_name: the name the
   * servers' certificates carry when it is not the host dialled.
   * insecure = 1: plaintext, only to loopback addresses unless
   * allow_insecure_remote = 1 too [--insecure, --allow-insecure-remote].
   * With none of these kvf_client_open fails, naming the settings. */
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_token_file;
  const char* tls_server_name;
  int insecure;
  int allow_insecure_remote;

  /* 1: the daemons encrypt their kernel-TCP data plane
   * (kvfabric-cached --data-plane-tls); connect with TLS 1.3, verified
   * against tls_ca_file. Needs data_transport "tcp". Default 0. */
  int data_plane_tls;

  /* Fetch requests (up to 16 blocks each) in flight per daemon per load
   * [--client-fetch-depth]; every daemon of a plan is fetched from at once.
   * 1..64, default 4 (0 means 4). */
  uint32_t fetch_depth;

  /* Write-back protocol [--client-store-by-key]: 0 (default) one data-plane
   * kStore round trip per batch of up to 8 blocks, pulled by the daemon
   * straight from the history; 1 gRPC Reserve, a put from staging, gRPC
   * Commit (daemons older than kStore). */
  uint32_t write_back_protocol;

  /* Block-key encoding v2 (docs/block-key.md, section 6): the rest of what
   * decides every key, so that engines whose blocks differ in bytes never
   * share one. key_version: 2 (default) or 1, to keep computing the keys of
   * blocks written before v2; with 1 every field below must hold its
   * default, else KVF_INVALID_ARGUMENT naming it. For the strings NULL and ""
   * both mean not stated. */
  uint32_t key_version;
  /* A commit hash or checksum of the exact weights, at most 256 bytes. */
  const char* weights_revision;
  /* The weights' quantisation, e.g. "awq-int4", at most 64 bytes. Not
   * stated: unquantised weights. */
  const char* quantization;
  /* How the cached values are scaled, e.g. "fp8-per-tensor", at most 64
   * bytes, and kv_scales_digest, the SHA-256 of the scale values in the
   * encoding of docs/block-key.md section 6.3: set both or neither (an
   * all-zero digest). Neither: unscaled (every scale 1.0). */
  const char* kv_scale_scheme;
  uint8_t kv_scales_digest[32];
  /* The rotary position embedding in the canonical form of docs/block-key.md
   * section 6.4, e.g. "scaling=llama3;factor=8;..." with keys sorted, at most
   * 256 bytes; a string not in that form is refused, naming its canonical
   * spelling where it can. */
  const char* rope;
  /* Elements per value head where it differs from head_dim (MLA-style
   * models). 0 (default): head_dim. Keys could be computed for another
   * value, but the block format and attention hold equal K and V halves, so
   * kvf_client_open refuses it with KVF_UNIMPLEMENTED naming v_head_dim. */
  uint32_t v_head_dim;
  /* Tokens in the vocabulary. 0 (default): not stated. When set,
   * kvf_key_tokens refuses a token id >= vocab_size (KVF_INVALID_ARGUMENT
   * naming the block, the position and both values). */
  uint32_t vocab_size;

  /* With prefill_c0_us..prefill_c2_us: what one prefill call pays per token
   * of its prefix however few tokens it prefills (reading the prefix's K
   * and V), in microseconds. Finite and >= 0; 0 (default): not modelled. */
  double prefill_c3_us;

  /* A daemon's stream that runs straggler_factor x its predicted end plus
   * straggler_slack_ms starts no further request and its blocks fall back
   * (another replica, else recompute) (ClientOptions::straggler_factor,
   * docs/client.md). Defaults 4.0 and 50; straggler_factor 0 turns it off,
   * otherwise >= 1.5. */
  double straggler_factor;
  uint32_t straggler_slack_ms;
  /* 1 (default): open starts a data session with every serving daemon on a
   * thread of its own (ClientOptions::connect_at_open); 0: connect on first
   * use. */
  int connect_at_open;
  /* 1 (default): daemons copying through shared memory check the CRC of the
   * bytes they land and the client skips its own pass
   * (ClientOptions::daemon_checks_landing); 0: the client checks every
   * byte. */
  int daemon_checks_landing;
} kvf_options;

/* Fills *options with the defaults above (required fields zero or NULL) and
 * sets struct_size. NULL: does nothing. */
void kvf_options_init(kvf_options* options);

/* ---- Client ------------------------------------------------------------ */

/* Validates *options (KVF_INVALID_ARGUMENT naming the field), creates the
 * client's device (device_kind, device_index; their failures are described
 * there) with its arena of device_arena_bytes, lays the arena out
 * (KVF_INVALID_ARGUMENT naming the kvf_options fields to change when the
 * staging pages and one context floor do not fit), then connects to
 * placement (KVF_UNAVAILABLE if it does not answer within rpc_timeout_ms) and
 * creates the data-plane transport and the staging region. On success *out
 * is the new client; on failure *out is NULL. */
kvf_status kvf_client_open(const kvf_options* options, kvf_client** out);

/* Finishes every open context (waiting for their loads and saves), stops the
 * client's threads, and frees the client and its device, whatever the
 * outcome. Returns the first error seen while finishing. NULL: KVF_OK.
 * REQUIRES: no other call on `client` is in flight or follows. */
kvf_status kvf_client_close(kvf_client* client);

/* The keys of the floor(n / tokens_per_block) full blocks of tokens[0..n)
 * (a partial tail has no key), under the client's namespace and model.
 * *keys_len is set to that count. keys_out may be NULL when keys_cap is 0:
 * a size query (KVF_OK). Otherwise keys_cap smaller than the count gives
 * KVF_INVALID_ARGUMENT (with *keys_len set). tokens may be NULL if n is 0. */
kvf_status kvf_key_tokens(kvf_client* client, const uint32_t* tokens, size_t n,
                          kvf_block_key* keys_out, size_t keys_cap, size_t* keys_len);

/* Asks placement for a plan over the chain keys[0..n) (n >= 1) plus
 * suffix_tokens the engine prefills anyway. Placement being down is not an
 * error: a local recompute-all plan comes back (plan id 0) and is counted.
 * On success *out is a new match owned by the caller (kvf_match_free). */
kvf_status kvf_match(kvf_client* client, const kvf_block_key* keys, size_t n,
                     uint64_t suffix_tokens, kvf_match_result** out);

/* kvf_match under the request's accuracy policy (docs/compact.md):
 * accuracy "exact" (or NULL: what kvf_match does; nothing compact is ever
 * fetched) or "compact_after=N": blocks ending N or more tokens before the
 * last may be fetched as their compact_int8 copies where the plan finds that
 * cheaper over decode_steps decode steps (0 counts as 1). Such blocks land
 * compact (kvf_block_is_compact): kvf_block_payload and kvf_save refuse
 * them with KVF_FAILED_PRECONDITION; kvf_attend decodes them. */
kvf_status kvf_match_accuracy(kvf_client* client, const kvf_block_key* keys, size_t n,
                              uint64_t suffix_tokens, const char* accuracy, uint64_t decode_steps,
                              kvf_match_result** out);

/* Flags of kvf_match_with_flags. */
enum kvf_match_flag {
  /* The engine loads a prefix of the chain and computes every token after it
   * (vLLM's connector does): placement plans recompute-all, fetch-all, or a
   * fetched prefix then recompute, never a split (whose recomputed front an
   * engine like that cannot take). MatchOptions::prefix_plans_only. */
  KVF_MATCH_PREFIX_PLANS_ONLY = 1u
};

/* kvf_match_accuracy with flags, a bitwise OR of kvf_match_flag values (0:
 * what kvf_match_accuracy does). A bit not named above gives
 * KVF_INVALID_ARGUMENT. */
kvf_status kvf_match_with_flags(kvf_client* client, const kvf_block_key* keys, size_t n,
                                uint64_t suffix_tokens, const char* accuracy, uint64_t decode_steps,
                                uint32_t flags, kvf_match_result** out);

/* Accessors of a match; they cannot fail (NULL match: 0, or ""). */
/* Blocks of the chain cached per placement's directory. */
uint32_t kvf_match_cached_blocks(const kvf_match_result* match);
/* Blocks in the chain the match was made for. */
uint32_t kvf_match_chain_blocks(const kvf_match_result* match);
/* Placement's plan id; 0 when planned locally (placement unreachable). */
uint64_t kvf_match_plan_id(const kvf_match_result* match);
/* "recompute_all", "fetch_all", "split" or "mixed"; valid while `match` is. */
const char* kvf_match_kind(const kvf_match_result* match);
/* Predicted load time of the plan, microseconds. */
double kvf_match_predicted_us(const kvf_match_result* match);
/* "exact", "compact-where-gone" or "compact": the plan's representation
 * choice; valid while `match` is. */
const char* kvf_match_representation(const kvf_match_result* match);
/* Frees a match. NULL: does nothing. */
void kvf_match_free(kvf_match_result* match);

/* A context for a history of `tokens` tokens: host memory for
 * ceil(tokens / tokens_per_block) blocks and an arena budget.
 * KVF_RESOURCE_EXHAUSTED when the arena cannot admit it (formula in the
 * message). */
kvf_status kvf_new_context(kvf_client* client, uint64_t tokens, kvf_context_id* out);

/* Starts `match`'s plan into `context` (blocks of the chain from the plan,
 * then the partial tail by recompute). The match may be freed once this
 * returns. KVF_INVALID_ARGUMENT if the chain does not fit the context;
 * KVF_FAILED_PRECONDITION if a load already ran. */
kvf_status kvf_load(kvf_client* client, const kvf_match_result* match, kvf_context_id context);

/* Returns when layer `layer` of every block is in the history (today: when
 * the whole load has landed). The load's error if it failed;
 * KVF_DEADLINE_EXCEEDED after timeout_ms (0: do not wait). */
kvf_status kvf_wait_layer(kvf_client* client, kvf_context_id context, uint32_t layer,
                          uint32_t timeout_ms);

/* *out: 1 when block `block` landed as its compact_int8 copy (a
 * kvf_match_accuracy plan), else 0. */
kvf_status kvf_block_is_compact(kvf_client* client, kvf_context_id context, uint32_t block,
                                int* out);

/* Block `block`'s payload in the history: all layers, layer l's K at
 * l * 2 * layer_half and its V after it (docs/block-format.md). *data stays
 * owned by the client, valid until kvf_finish of the context; the engine may
 * write into it only as the Threads paragraph above allows. */
kvf_status kvf_block_payload(kvf_client* client, kvf_context_id context, uint32_t block,
                             uint8_t** data, uint64_t* bytes);

/* The engine has written layer `layer` of full blocks [first_block,
 * first_block + n) into the history; keys[0..n) are their keys. A block is
 * written back (asynchronously) once all its layers are saved.
 * KVF_INVALID_ARGUMENT for a range past the context or a partial block. */
kvf_status kvf_save(kvf_client* client, kvf_context_id context, uint32_t layer,
                    uint32_t first_block, const kvf_block_key* keys, size_t n);

/* Decode attention of q ([num_q_heads, head_dim] fp32, q_len floats) over
 * every token of the history in layer `layer`, into out ([num_q_heads,
 * head_dim], out_len floats) and lse ([num_q_heads], lse_len floats; natural
 * log). `step` is the decode step. Lengths must be exactly those;
 * KVF_FAILED_PRECONDITION before the load finished. */
kvf_status kvf_attend(kvf_client* client, kvf_context_id context, uint32_t layer, uint64_t step,
                      const float* q, size_t q_len, float* out, size_t out_len, float* lse,
                      size_t lse_len);

/* What kvf_finish reports about one context. */
typedef struct kvf_context_report {
  uint64_t plan_id;
  uint32_t blocks_fetched;
  uint32_t blocks_recomputed; /* planned or after a failed fetch, tail included */
  uint64_t bytes_fetched;
  /* Every full block whose layers were all saved is counted in exactly one
   * of blocks_saved, blocks_already_cached and save_failures. */
  uint32_t blocks_saved;  /* written back to a daemon by this context */
  uint32_t save_failures; /* not written back (kvf_finish fails, naming the first error) */
  double predicted_us;    /* the plan's prediction */
  double load_us;         /* kvf_load to the end of the last run */
  uint32_t blocks_already_cached; /* skipped: placement or the daemon already held them */
} kvf_context_report;

/* Waits for the context's load and saves, reports the observations to
 * placement (best effort), and frees the context and its history (the
 * pointers kvf_block_payload returned), whatever happened. report may be
 * NULL; when given it is filled in whatever the status. Returns the failure
 * the engine must not miss: the load's error if the load failed, else, if
 * any block was not written back, the first write-back failure's code with a
 * message saying how many of how many blocks failed (kvf_last_error). */
kvf_status kvf_finish(kvf_client* client, kvf_context_id context, kvf_context_report* report);

/* Counters since open (kvfabric::client::ClientMetrics), a snapshot. */
typedef struct kvf_metrics {
  uint64_t matches;
  uint64_t plans_recompute_all;
  uint64_t plans_fetch_all;
  uint64_t plans_split;
  uint64_t plans_mixed;
  uint64_t placement_unavailable; /* matches planned locally */
  uint64_t blocks_fetched;
  uint64_t bytes_fetched;
  uint64_t fetch_us;
  uint64_t blocks_recomputed;
  uint64_t tokens_recomputed;
  uint64_t recompute_us;
  uint64_t fallbacks_to_replica;   /* runs (or parts) fetched from a fallback host */
  uint64_t fallbacks_to_recompute; /* runs (or parts) recomputed after a failed fetch */
  uint64_t blocks_fallen_back;     /* blocks recomputed after a failed fetch */
  uint64_t crc_failures;
  uint64_t stale_entries_reported;
  uint64_t blocks_saved;
  uint64_t bytes_saved;
  uint64_t save_us;
  uint64_t save_failures;
  uint64_t attends;
  uint64_t attend_us;
  uint32_t peak_arena_pages; /* held pool + staging pages at peak */
  uint32_t arena_pages;      /* pool + staging pages */
  uint64_t history_pool_pages;   /* pages of one block (history_pool_bytes) */
  uint64_t history_pages_in_use; /* held by open contexts */
  uint64_t blocks_already_cached; /* saved blocks the cluster already held */
} kvf_metrics;

kvf_status kvf_client_metrics(kvf_client* client, kvf_metrics* out);

/* The client's metrics in the Prometheus text exposition format (0.0.4),
 * as its /metrics would serve them, for an engine that serves its own
 * endpoint. Writes at most `capacity` bytes, NUL-terminated, into `buffer`
 * and sets *length to the page's length without the NUL. When the page does
 * not fit (or buffer is NULL with capacity 0, to ask the size) it answers
 * KVF_RESOURCE_EXHAUSTED with *length set and writes nothing. */
kvf_status kvf_client_metrics_text(kvf_client* client, char* buffer, size_t capacity,
                                   size_t* length);

/* The URL of the client's own /metrics ("http://HOST:PORT/metrics") when
 * kvf_options.metrics_address was set, else "". Same buffer contract as
 * kvf_client_metrics_text. */
kvf_status kvf_client_metrics_url(kvf_client* client, char* buffer, size_t capacity,
                                  size_t* length);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVFABRIC_KVFABRIC_H_ */
