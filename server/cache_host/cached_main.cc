// `kvfabric-cached`: the cache-host daemon. Reads flags (or a YAML file with
// the same keys) once, builds CacheHostNode over a UCX transport, serves the
// CacheHost gRPC service and /metrics, and drains on SIGTERM or SIGINT:
// stop admitting, finish or cancel transfers (bounded by --shutdown-grace),
// commit queued NVMe demotions, exit 0.
//
// Sizes are explicit: --host-pool-bytes and --host-page-bytes have no
// default. Start-up prints the pool arithmetic, the pre-fault time and the
// NVMe recovery counts, and refuses (exit 1, naming the setting) what cannot
// work. Exit status: 0 after a clean shutdown, 1 when start-up failed, 2 on a
// usage error.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/bus_calibration.h"
#include "core/config/logging_flags.h"
#include "core/config/unit_flags.h"
#include "core/config/yaml_config.h"
#include "core/env.h"
#include "core/logging.h"
#include "core/units.h"
#include "metrics/exposition.h"
#include "metrics/rpc_metrics.h"
#include "security/grpc_authorizer.h"
#include "security/grpc_security.h"
#include "security/security_flags.h"
#include "security/tenant_policy.h"
#include "server/cache_host/cache_host_metrics.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/cached_flags.h"
#include "server/cache_host/placement_reporter.h"
#include "server/cache_host_service.h"
#include "server/grpc_server_limits.h"
#include "server/health_reporter.h"
#include "spdlog/spdlog.h"
#include "transport/data_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric {
namespace {

using cached::AdminSecurity;
using cached::BuildOptions;
using cached::CheckConfig;
using cached::Flags;
using cached::PlacementSecurity;
using cached::ValidateSecurity;

// SIGHUP: the calibration file read again; a bad file changes nothing.
void ReloadCalibration(const Flags& f, cache_host::CacheHostNode* node) {
  if (f.calibration_path.empty()) {
    spdlog::warn("kvfabric-cached: SIGHUP: no --calibration to reload");
    return;
  }
  auto c = LoadBusCalibration(Env::Default(), f.calibration_path);
  if (!c.ok()) {
    spdlog::warn("kvfabric-cached: reloading --calibration {}: {}; eviction figures unchanged",
                 f.calibration_path, c.status().ToString());
    return;
  }
  std::string sources;
  const cache_host::CostAwareOptions figures =
      cache_host::CostAwareFromCalibration(*c, f.host_id, f.model_id, &sources);
  if (Status s = node->ReloadCostModel(figures); !s.ok()) {
    spdlog::warn("kvfabric-cached: reloading --calibration {}: {}", f.calibration_path,
                 s.ToString());
    return;
  }
  spdlog::info("kvfabric-cached: calibration {} reloaded: {}", f.calibration_path, sources);
}

int Run(int argc, char** argv) {
  CLI::App app{"kvfabric-cached: the kvfabric cache-host daemon", "kvfabric-cached"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "validate the flags (and --config YAML), print the start-up arithmetic and exit "
               "without starting: 0 when the daemon would start, 2 naming the setting otherwise");
  AddYamlConfigOption(&app);
  LogOptions log_options;
  AddLoggingFlags(app, &log_options);
  Flags f;
  cache_host::CacheHostOptions o;
  app.add_option("--host-id", o.host_id, "name of this daemon (default: the hostname)");
  app.add_option("--grpc-address", f.grpc_address, "gRPC listen address (HOST:PORT; :0 picks)");
  AddServerSecurityFlags(app, &f.security);
  app.add_option("--tenants-file", f.tenants_file,
                 "YAML mapping authenticated identities to namespaces, quotas, admin and daemon "
                 "roles (docs/security.md); default: one open tenant");
  app.add_option("--placement-token-file", f.placement_token_file,
                 "bearer token this daemon presents to placement (when placement does not "
                 "require client certificates)");
  app.add_option("--placement-server-name", f.placement_server_name,
                 "name placement's certificate must carry (default: the host dialled)");
  app.add_option("--data-plane-auth", f.data_plane_auth,
                 "session: a data-plane connection proves a gRPC session (CacheHost."
                 "OpenDataSession, HMAC over a challenge) before anything it sends is read, and "
                 "acts for that tenant only; none: any peer that connects may present grants; "
                 "auto: session with TLS, none with --insecure");
  app.add_flag("--data-plane-tls", f.data_plane_tls,
               "encrypt the kernel-TCP data plane with TLS 1.3 (--data-transport=tcp; this "
               "daemon's --tls-cert/--tls-key; engines set data_plane_tls and verify it with "
               "their CA). For data planes that cross networks nobody vouches for");
  app.add_option("--max-data-handshakes", f.max_data_handshakes,
                 "kernel-TCP data plane: accepted connections not yet past their hello; more "
                 "are closed at accept (1..1048576)")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--max-data-sessions", f.max_data_sessions,
                 "data-plane sessions open at once (1..16777216)")
      ->check(CLI::Range(1u, 1u << 24));
  AddDurationOption(app, "--data-session-ttl", &f.data_session_ttl,
                    "a data-plane session opens connections for this long after it was made");
  app.add_option("--admin-address", f.admin_address,
                 "gRPC listener for the administrative RPCs (Drain, Delete, Stats with "
                 "namespaces), which act on every tenant: unix:/PATH (recommended: the socket "
                 "file's permissions decide who is an operator) or HOST:PORT (:0 picks). "
                 "Default: none, and those RPCs answer PERMISSION_DENIED");
  // A daemon's largest legitimate request is a Reserve of 4096 blocks, ~0.4
  // MiB; parsing is where an oversized one costs (docs/benchmarks.md, the
  // gRPC flood), so daemons accept 1 MiB by default (placement: 4 MiB).
  f.grpc_limits.max_request_bytes = std::uint64_t{1} << 20;
  AddGrpcServerLimitFlags(app, &f.grpc_limits);
  app.add_option("--transport-address", o.transport_address,
                 "data-plane listen address (HOST:PORT; :0 picks)");
  app.add_option("--data-transport", f.data_transport,
                 "ucx (RDMA, shared memory, TCP; the default) | tcp (kernel sockets: for "
                 "TCP-only clients, one copy per side; clients must use the same)")
      ->check(CLI::IsMember({"ucx", "tcp"}));
  app.add_option("--ucx-tls", f.ucx_tls,
                 "UCX transports: sm,self,tcp here; rc,ud,sm,self,tcp on RDMA; must include tcp");
  app.add_option("--shared-memory-peers", f.shared_memory_peers,
                 "with UCX shared memory in --ucx-tls: same-user (the default) accepts data-plane "
                 "connections from processes of this host only when they run as this daemon's "
                 "user (a peer could crash the daemon by truncating memory UCX maps from it; "
                 "docs/security.md) | any (every user of this host is trusted). Clients on "
                 "other hosts are not affected; other users here use --data-transport=tcp or a "
                 "--ucx-tls without sm")
      ->check(CLI::IsMember({"same-user", "any"}));
  app.add_option("--tcp-send-buffer", f.tcp_send_buffer,
                 "SO_SNDBUF per connection with --data-transport=tcp: auto (the default: "
                 "256KiB for clients on this host, kernel autotuning for others), kernel, or "
                 "a size of 4KiB..64MiB");
  AddBytesOption(app, "--tcp-max-pacing-rate", &f.tcp_max_pacing_rate,
                 "--data-transport=tcp: cap each data connection's sends at this many bytes "
                 "per second (SO_MAX_PACING_RATE; emulates a slower link for benchmarks and "
                 "fault tests; 0: no cap)");
  AddBytesOption(app, "--tcp-receive-buffer-bytes", &f.tcp_receive_buffer_bytes,
                 "SO_RCVBUF per connection with --data-transport=tcp (0: kernel autotuning, "
                 "the default; else 4KiB..64MiB)");
  AddBytesOption(app, "--streaming-copy-min-bytes", &f.streaming_copy_min_bytes,
                 "shared-memory batches of at least this many bytes are copied with streaming "
                 "(non-temporal) stores, which skip the caches: a daemon's copies are not read "
                 "again by it soon (0: every batch; default 8MiB)");
  AddDurationOption(app, "--max-rank-deferral", &f.max_rank_deferral,
                    "UCX: how long a copy of a load's later layers waits at most while copies "
                    "of whole blocks or layer 0 are queued (0..10s; default 20ms)");
  app.add_option("--copy-threads", f.copy_threads,
                 "threads that help the UCX progress thread copy large shared-memory "
                 "batches (0: it copies alone; default 1; more on nodes with many cores)")
      ->check(CLI::Range(0, 64));
  app.add_flag("--no-populate-imports", f.no_populate_imports,
               "do not fill in, in the background, the page tables of a client's shared-memory "
               "region when it is imported (by default every page the client already has is "
               "populated, so first copies into it take no page faults; costs page tables only)");
  app.add_option("--data-workers", f.data_workers,
                 "data-plane workers (each a progress thread) serving the data plane; client "
                 "connections are spread over them (default 1; one per core the data path may "
                 "use on nodes serving several clients, above all over TCP)")
      ->check(CLI::Range(1, ucx::kMaxUcxWorkers));
  app.add_option("--metrics-address", f.metrics_address,
                 "Prometheus /metrics listen address HOST:PORT, or \"off\"");
  app.add_option("--ready-file", f.ready_file,
                 "write the listen addresses here once serving (for scripts and tests)");
  AddBytesOption(app, "--host-pool-bytes", &o.pool.pool_bytes, "host pool size (required)")
      ->required();
  AddBytesOption(app, "--host-page-bytes", &o.pool.page_bytes,
                 "host page size, a power of two >= 4 KiB (required)")
      ->required();
  app.add_option("--lock-memory", f.lock_memory, "required | best-effort | off");
  app.add_option("--pool-memory", f.pool_memory,
                 "transport (UCX allocates: one-sided over shared memory) | anonymous");
  app.add_flag("--huge-pages", o.huge_pages, "transparent huge pages for anonymous pool memory");
  app.add_flag("--no-prefault", f.no_prefault, "do not touch every pool page at start-up");
  app.add_option("--host-high-watermark", o.watermarks.high, "eviction starts above (0, 1]");
  app.add_option("--host-low-watermark", o.watermarks.low, "eviction stops at or below");
  app.add_option("--eviction-policy", f.eviction_policy, "cost-aware | lru");
  app.add_option("--nvme-dir", o.nvme.dir, "NVMe tier directory (empty: no NVMe tier)");
  AddBytesOption(app, "--nvme-capacity-bytes", &o.nvme.capacity_bytes,
                 "most bytes the NVMe segment files may occupy (required with --nvme-dir)");
  AddBytesOption(app, "--nvme-segment-bytes", &o.nvme.segment_bytes, "segment file size");
  app.add_option("--nvme-io-engine", f.nvme_io_engine, "auto | uring | threads");
  app.add_option("--quota", f.quotas, "NAMESPACE=BYTES host quota, repeatable");
  app.add_option("--model-id", f.model_id, "model whose arithmetic start-up prints");
  app.add_option("--calibration", f.calibration_path,
                 "bus calibration file written by `kvfabric calibrate` (the one placement "
                 "reads): cost-aware eviction scores with its figures; read again on SIGHUP");
  app.add_option("--model-layers", f.model_layers, "layers per block");
  app.add_option("--model-kv-heads", f.model_kv_heads, "KV heads per block");
  app.add_option("--model-head-dim", f.model_head_dim, "elements per head");
  app.add_option("--model-dtype", f.model_dtype, "fp16 | bf16 | fp32 | fp8_e4m3 | int8");
  app.add_option("--tokens-per-block", f.tokens_per_block, "tokens per block");
  app.add_option("--history-tokens", f.history_tokens, "N of 'histories of N tokens fit'");
  AddDurationOption(app, "--max-lease-ttl", &f.max_lease_ttl, "longest lease TTL");
  AddDurationOption(app, "--default-lease-ttl", &f.default_lease_ttl, "TTL when a request gives 0");
  AddDurationOption(app, "--reservation-ttl", &f.reservation_ttl,
                    "default and longest life of an uncommitted write reservation");
  // Counts, each in [1, max], with its default shown.
  auto add_count = [&app](const char* name, std::uint32_t* value, const char* help,
                          std::uint32_t max) {
    app.add_option(name, *value, help)->capture_default_str()->check(CLI::Range(1u, max));
  };
  add_count("--max-namespaces", &f.max_namespaces,
            "most namespaces holding blocks, reservations, leases or quotas at once", 1u << 20);
  add_count("--max-reservations", &f.max_reservations, "most open write reservations, in all",
            1u << 24);
  add_count("--max-leases", &f.max_leases, "most read leases held, in all", 1u << 24);
  add_count("--max-keys-per-lease", &f.max_keys_per_lease, "most keys in one Lease", 1u << 20);
  add_count("--max-reservations-per-namespace", &f.max_reservations_per_namespace,
            "most open write reservations of one namespace", 1u << 24);
  AddBytesOption(app, "--max-reserved-bytes-per-namespace", &f.max_reserved_bytes_per_namespace,
                 "most host bytes one namespace may hold reserved; 0: half the host pool");
  add_count("--max-leases-per-namespace", &f.max_leases_per_namespace,
            "most read leases of one namespace", 1u << 24);
  AddBytesOption(app, "--max-leased-bytes-per-namespace", &f.max_leased_bytes_per_namespace,
                 "most host bytes one namespace's leases may pin; 0: half the host pool");
  add_count("--eviction-log-capacity", &f.eviction_log_capacity,
            "recent eviction decisions kept for kvfabric explain", 1u << 20);
  app.add_option("--metrics-namespace-series", f.metrics_namespace_series,
                 "how many of the largest namespaces get /metrics series of their own (their "
                 "tenant names become label values); 0: none, only the summed totals")
      ->capture_default_str()
      ->check(CLI::Range(0u, static_cast<std::uint32_t>(cache_host::kMaxNamespaceSeries)));
  add_count("--max-data-connections", &f.max_data_connections,
            "most data-plane connections, in all", 1u << 20);
  add_count("--max-data-connections-per-host", &f.max_data_connections_per_host,
            "most data-plane connections from one host", 1u << 20);
  add_count("--max-requests-per-connection", &f.max_requests_per_connection,
            "most requests in flight plus undelivered replies on one data-plane connection (a "
            "peer past it is disconnected)",
            1u << 16);
  add_count("--store-threads", &f.store_threads,
            "threads that reserve and commit data-plane stores (kStore; the CRC check of what "
            "a client wrote runs there)",
            64u);
  AddDurationOption(app, "--data-idle-timeout", &f.data_idle_timeout,
                    "a data-plane connection with nothing in flight this long is closed");
  AddDurationOption(app, "--transfer-timeout", &f.transfer_timeout,
                    "a data-plane transfer running this long closes its connection (and so "
                    "releases its leases)");
  app.add_option("--placement-address", f.placement_address,
                 "placement service gRPC address, or several replicas' separated by commas "
                 "(the next is tried when one does not answer); empty: run without placement");
  app.add_option("--node-name", f.node_name,
                 "machine name clients compare with theirs to pick local paths (default hostname)");
  AddDurationOption(app, "--membership-ttl", &f.membership_ttl,
                    "membership lease with placement; a dead daemon leaves plans after it");
  app.add_option("--compact-threads", f.compact_threads,
                 "threads converting committed exact blocks to compact_int8 copies in the "
                 "background (docs/compact.md); 0: off (only compact_after requests read them)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--compact-queue-blocks", f.compact_queue_blocks,
                 "committed blocks waiting for conversion; a full queue drops the oldest")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
  app.add_option("--compact-pause-leases", f.compact_pause_leases,
                 "conversion pauses while more read leases than this are held (clients' loads "
                 "come first); 0: never for load")
      ->capture_default_str();
  AddBytesOption(app, "--compact-min-free-bytes", &f.compact_min_free_bytes,
                 "conversion pauses while the host pool's free bytes (less the copy) are under "
                 "this")
      ->default_str("10% of --host-pool-bytes");
  AddBytesOption(app, "--compact-keep-bytes", &f.compact_keep_bytes,
                 "host bytes that compact copies may hold while eviction has dropped their exact "
                 "blocks from the pool (exact copies leave first, their copies stay within this); "
                 "0: no preference, copies are evicted like any block")
      ->default_str("25% of --host-pool-bytes with --compact-threads > 0, else 0");
  AddDurationOption(app, "--shutdown-grace", &f.shutdown_grace,
                    "how long SIGTERM waits for leases in use before cancelling");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (Status s = InitLogging(log_options); !s.ok()) {
    std::fprintf(stderr, "kvfabric-cached: %s\n", s.ToString().c_str());
    return 2;
  }
  if (Status s = f.grpc_limits.Validate(); !s.ok()) {
    spdlog::error("kvfabric-cached: {}", s.message());
    return 2;
  }
  if (Status s = ValidateSecurity(f); !s.ok()) {
    spdlog::error("kvfabric-cached: {}", s.ToString());
    return 2;
  }
  auto options = BuildOptions(f, std::move(o));
  if (!options.ok()) {
    spdlog::error("kvfabric-cached: {}", options.status().ToString());
    return 2;
  }

  // Signals are taken by sigwait below; every thread started from here on
  // inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (f.max_rank_deferral.count() < 0 || f.max_rank_deferral > std::chrono::seconds(10)) {
    spdlog::error("kvfabric-cached: --max-rank-deferral: must be 0..10s, got {} us",
                  f.max_rank_deferral.count());
    return 2;
  }
  StatusOr<int> send_buffer = tcp::ParseSendBuffer(f.tcp_send_buffer, "--tcp-send-buffer");
  if (!send_buffer.ok()) {
    spdlog::error("kvfabric-cached: {}", send_buffer.status().message());
    return 2;
  }
  if (f.tcp_receive_buffer_bytes != 0 &&
      (f.tcp_receive_buffer_bytes < (4u << 10) || f.tcp_receive_buffer_bytes > (64u << 20))) {
    spdlog::error(
        "kvfabric-cached: --tcp-receive-buffer-bytes={}: must be 0 (kernel "
        "autotuning) or 4KiB..64MiB",
        f.tcp_receive_buffer_bytes);
    return 2;
  }
  auto compact_options = cached::BuildCompactOptions(f, *options);
  if (!compact_options.ok()) {
    spdlog::error("kvfabric-cached: {}", compact_options.status().ToString());
    return 2;
  }
  if (check_config) return CheckConfig(f, *options);
  transport::DataTransportOptions topts;
  topts.kind = f.data_transport;
  topts.ucx_tls = f.ucx_tls;
  topts.shared_memory_peers = f.shared_memory_peers;
  // One line per 10 s at most, with the count: a peer retrying in a loop
  // must not flood the log.
  struct Rejections {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::int64_t> next_log_s{0};
  };
  topts.on_rejected_peer = [r = std::make_shared<Rejections>()](const std::string& peer,
                                                                const Status& why) {
    const std::uint64_t n = r->count.fetch_add(1) + 1;
    const std::int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    std::int64_t next = r->next_log_s.load();
    if (now < next || !r->next_log_s.compare_exchange_strong(next, now + 10)) return;
    spdlog::warn(
        "data plane: refused a connection from {}: {} (--shared-memory-peers "
        "same-user; that user's engines use --data-transport=tcp or a ucx_tls without "
        "sm; {} refused so far)",
        peer, why.message(), n);
  };
  topts.copy_threads = f.copy_threads;
  topts.streaming_copy_min_bytes = f.streaming_copy_min_bytes;
  topts.max_rank_deferral =
      std::chrono::duration_cast<std::chrono::milliseconds>(f.max_rank_deferral);
  topts.populate_imported_mappings = !f.no_populate_imports;
  topts.workers = f.data_workers;
  topts.tcp_send_buffer_bytes = *send_buffer;
  topts.tcp_receive_buffer_bytes = static_cast<int>(f.tcp_receive_buffer_bytes);
  topts.tcp_max_pacing_rate_bytes_per_s = f.tcp_max_pacing_rate;
  topts.tcp_max_handshakes = f.max_data_handshakes;
  topts.tcp_tls_enabled = f.data_plane_tls;
  topts.tcp_tls.cert_file = f.security.cert_file;
  topts.tcp_tls.key_file = f.security.key_file;
  StatusOr<std::unique_ptr<transport::Transport>> transport = transport::CreateDataTransport(topts);
  if (!transport.ok()) {
    spdlog::error("kvfabric-cached: {}", transport.status().ToString());
    return 1;
  }
  auto node =
      cache_host::CacheHostNode::Create(std::move(*options), transport->get(), Env::Default());
  if (!node.ok()) {
    spdlog::error("kvfabric-cached: cannot start: {}", node.status().ToString());
    return 1;
  }
  // Before any traffic, so that it sees every commit (its event tap).
  std::shared_ptr<cache_host::CompactConverter> converter;
  {
    auto created = cache_host::CompactConverter::Create(*compact_options, node->get());
    if (!created.ok()) {
      spdlog::error("kvfabric-cached: cannot start: {}", created.status().ToString());
      return 1;
    }
    converter = std::move(*created);
  }
  auto metrics = std::make_shared<cache_host::CacheHostMetrics>(
      [n = node->get(), c = std::weak_ptr<cache_host::CompactConverter>(converter)] {
        cache_host::CacheHostSnapshot s = n->Snapshot();
        if (auto live = c.lock()) s.compact = live->Stats();
        return s;
      },
      f.metrics_namespace_series);
  (*node)->set_transfer_observer(cache_host::CacheHostMetrics::ObserverFor(metrics));
  auto rpc_metrics = metrics::RpcServerMetrics::Create("cached");
  auto build_info = metrics::NewBuildInfo("cached");
  auto authorizer = std::make_shared<GrpcAuthorizer>(f.tenants, "cached");
  std::unique_ptr<cache_host::MetricsServer> metrics_server;
  if (!f.metrics_address.empty() && f.metrics_address != "off") {
    auto started = cache_host::MetricsServer::Start(f.metrics_address,
                                                    {metrics, rpc_metrics, build_info, authorizer});
    if (!started.ok()) {
      spdlog::error("kvfabric-cached: {}", started.status().ToString());
      return 1;
    }
    metrics_server = std::move(*started);
  }

  HealthReporter health(Env::Default(), (*node)->options().host_id, "kvfabric-cached");
  health.SetMaxRequestBytes(f.grpc_limits.max_request_bytes);
  health.SetUcxSameUserOnly(transport::UsesSharedMemory(topts) &&
                            topts.shared_memory_peers == "same-user");
  CacheHostServiceOptions sopts;
  sopts.transport_address = (*node)->transport_address();
  sopts.authorizer = authorizer;
  sopts.data_sessions = (*node)->options().data_plane.sessions;
  sopts.data_sessions_required = (*node)->options().data_plane.require_session;
  // Report (and enforce at the door) what the node accepts, so a request
  // within the advertised limits is never refused further down.
  const cache_host::CacheHostOptions& no = (*node)->options();
  sopts.limits.set_max_ttl_ms(static_cast<std::uint32_t>(
      std::min<std::uint64_t>(sopts.limits.max_ttl_ms(), no.leases.max_ttl_us / 1000)));
  sopts.limits.set_default_ttl_ms(static_cast<std::uint32_t>(no.default_ttl_us / 1000));
  sopts.limits.set_max_keys_per_batch(
      std::min(sopts.limits.max_keys_per_batch(), no.leases.max_keys_per_lease));
  // The administrative RPCs live on a listener of their own (see
  // CacheHostServiceOptions::admin).
  std::unique_ptr<CacheHostService> admin_service;
  std::unique_ptr<grpc::Server> admin_server;
  std::string admin_bound = "off";
  if (!f.admin_address.empty()) {
    CacheHostServiceOptions aopts = sopts;
    aopts.admin = true;
    admin_service = std::make_unique<CacheHostService>(node->get(), &health, aopts);
    grpc::ServerBuilder admin_builder;
    int admin_port = 0;
    StatusOr<std::shared_ptr<grpc::ServerCredentials>> admin_creds =
        MakeServerCredentials(AdminSecurity(f), f.admin_address);
    if (!admin_creds.ok()) {
      spdlog::error("kvfabric-cached: --admin-address: {}", admin_creds.status().ToString());
      return 2;
    }
    admin_builder.AddListeningPort(f.admin_address, *admin_creds, &admin_port);
    ApplyGrpcServerLimits(f.grpc_limits, "kvfabric-cached-admin", &admin_builder);
    rpc_metrics->Instrument(&admin_builder);
    admin_builder.RegisterService(admin_service.get());
    admin_server = admin_builder.BuildAndStart();
    const bool unix_socket = f.admin_address.rfind("unix:", 0) == 0;
    if (!admin_server || (admin_port == 0 && !unix_socket)) {
      spdlog::error("kvfabric-cached: cannot listen for admin gRPC on {} (--admin-address)",
                    f.admin_address);
      return 1;
    }
    admin_bound = unix_socket ? f.admin_address
                              : f.admin_address.substr(0, f.admin_address.rfind(':')) + ":" +
                                    std::to_string(admin_port);
  }
  sopts.admin_address = f.admin_address.empty() ? "" : admin_bound;
  CacheHostService public_service(node->get(), &health, sopts);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(f.security, f.grpc_address);
  if (!creds.ok()) {
    spdlog::error("kvfabric-cached: {}", creds.status().ToString());
    return 2;
  }
  builder.AddListeningPort(f.grpc_address, *creds, &grpc_port);
  ApplyGrpcServerLimits(f.grpc_limits, "kvfabric-cached", &builder);
  rpc_metrics->Instrument(&builder);
  builder.RegisterService(&public_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    spdlog::error("kvfabric-cached: cannot listen for gRPC on {} (--grpc-address)", f.grpc_address);
    return 1;
  }
  const std::string grpc_host = f.grpc_address.substr(0, f.grpc_address.rfind(':'));
  const std::string grpc_bound = grpc_host + ":" + std::to_string(grpc_port);
  if (f.security.insecure) {
    spdlog::warn("kvfabric-cached: gRPC security: {}", DescribeSecurity(f.security, grpc_bound,
                                                                        /*server=*/true));
  } else {
    spdlog::info("kvfabric-cached: gRPC security: {}", DescribeSecurity(f.security, grpc_bound,
                                                                        /*server=*/true));
  }
  spdlog::info("kvfabric-cached: tenants: {}; data plane: {}", f.tenants->Summary(),
               f.data_plane_auth == "session"
                   ? "a connection proves a gRPC session (HMAC over a challenge) before anything "
                     "it sends is read"
                   : "any peer that connects may present grants (--data-plane-auth=none)");
  health.SetState(v1::SERVING_STATUS_SERVING, "");
  const std::string metrics_url = metrics_server ? metrics_server->url() : std::string("off");
  spdlog::info("kvfabric-cached {}: gRPC on {} ({}), data plane on {}, metrics {}, admin {}",
               (*node)->options().host_id, grpc_bound, f.grpc_limits.ToString(),
               (*node)->transport_address(), metrics_url, admin_bound);
  if (!f.ready_file.empty()) {
    const std::string tmp = f.ready_file + ".tmp";
    std::ofstream out(tmp);
    out << "grpc=" << grpc_bound << "\ntransport=" << (*node)->transport_address()
        << "\nmetrics=" << metrics_url << "\nadmin=" << admin_bound << "\npid=" << getpid() << "\n";
    out.close();
    std::rename(tmp.c_str(), f.ready_file.c_str());
  }

  std::unique_ptr<cache_host::PlacementReporter> reporter;
  if (!f.placement_address.empty()) {
    cache_host::PlacementReporterOptions ro;
    ro.placement_address = f.placement_address;
    ro.host_id = (*node)->options().host_id;
    ro.grpc_address = grpc_bound;
    ro.transport_address = (*node)->transport_address();
    ro.security = PlacementSecurity(f);
    ro.node_name = f.node_name;
    if (ro.node_name.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      ro.node_name = name;
    }
    ro.version = "kvfabric-cached";
    ro.ttl = std::chrono::duration_cast<std::chrono::milliseconds>(f.membership_ttl);
    auto started = cache_host::PlacementReporter::Start(node->get(), std::move(ro));
    if (!started.ok()) {
      spdlog::error("kvfabric-cached: {}", started.status().ToString());
      return 1;
    }
    reporter = std::move(*started);
  }

  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    ReloadCalibration(f, node->get());
  }
  spdlog::info("kvfabric-cached: signal {}: draining", sig);
  health.SetState(v1::SERVING_STATUS_DRAINING, "shutting down");
  (*node)->Drain(false);
  converter.reset();               // stops converting before the node shuts down
  if (reporter) reporter->Stop();  // deregisters: placement stops planning here
  (*node)->Shutdown(std::chrono::duration_cast<std::chrono::milliseconds>(f.shutdown_grace));
  // The listeners stop together, so SIGTERM ends within --shutdown-grace
  // plus about 2 s (gRPC calls still running get that long), not the sum.
  {
    const auto calls_deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
    std::vector<std::thread> stopping;
    stopping.emplace_back([&] { server->Shutdown(calls_deadline); });
    if (admin_server) stopping.emplace_back([&] { admin_server->Shutdown(calls_deadline); });
    stopping.emplace_back([&] { metrics_server.reset(); });
    for (std::thread& t : stopping) t.join();
  }
  node->reset();
  spdlog::info("kvfabric-cached: exit 0");
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) { return kvfabric::Run(argc, argv); }