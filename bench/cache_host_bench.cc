// cache_host_bench: PUT and GET of 256 KiB and 2 MiB blocks through a real
// kvfabric-cached on loopback (gRPC control + owner-driven data), with 1 and
// 4 client connections, over UCX shared memory ("shm"), UCX TCP ("tcp") and
// the kernel-socket transport ("ktcp", --data-transport=tcp); and, in the same
// run, Redis (SET/GET) and memcached (-I 8m) on the same value sizes.
// Prints GB/s, p50/p99 per batch and the ratio against memcached's GET, and
// against memcached's GET into a ring as large as a kvfabric connection's
// staging (the "ring" rows: values land in distinct, mostly cold memory as
// kvfabric's blocks do, not in one buffer that stays in cache).
//
//   cache_host_bench --daemon build/ci/server/cache_host/kvfabric-cached
//                    [--total-mib 1024] [--batch-blocks 16] [--batch-mib 0] [--depth 1]
//                    [--copy-threads 1] [--data-workers 2]
//                    [--paths all|shm|tcp|ktcp] [--baselines 1|0] [--block-kib 256|2048]
//                    [--conns 1|4] [--ktcp-send-buffer auto|kernel|256KiB] [--get fetch|lease]
//                    [--put store|reserve]
//                    [--repeat 3]
//
// --paths, --baselines, --block-kib and --conns select cases (default: all);
// without baselines no ratios are printed.
//
// Ratios are paired: before each kvfabric PUT and GET, memcached's same op
// (and, for GET, its GET into a ring) runs again on the same size and
// connections, so both sides of a ratio see the machine in the same state
// (on shared 2-vCPU VMs throughput drifts by a third within minutes). Each
// case runs --repeat times; a row prints the median GB/s (with that run's
// latencies), the median of the per-run ratios, and memcached's median. The
// baseline table printed first is context (Redis included), not the base.
//
// A kvfabric "op" is one batch of blocks: batch-blocks of them (16, the most
// libkvfabric fetches or saves at once), or batch-mib worth when given. PUT
// (--put store, the default, as libkvfabric writes back): one data-plane
// kStore per 8 blocks (reserve, pull, CRC check, commit on the daemon);
// --put reserve: Reserve over gRPC, one data-plane transfer, Commit. GET (--get fetch, the
// default, as libkvfabric fetches): one data-plane kFetch by key, which
// leases, pushes and releases on the daemon; --get lease: Lease over gRPC, one
// data-plane kGet, Release. Each connection keeps `depth` batches in flight.
// Redis and memcached ops are single-key SET/GET (they have no batch-with-
// lease shape); GB/s compares like with like, latency does not. PUT rows are compared with
// memcached's PUT, GET rows with its GET, at the same value size and connection count.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/kv_baselines.h"
#include "client/cache_host_session.h"
#include "client/data_plane_client.h"
#include "core/block_format.h"
#include "core/crc32c.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "transport/data_transport.h"
#include "transport/tcp/tcp_transport.h"

extern char** environ;

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string daemon = "kvfabric-cached";
  std::uint64_t total_mib = 1024;
  // Blocks per batch, unless batch_mib (> 0) sets the batch's bytes.
  std::uint64_t batch_blocks = 16;
  std::uint64_t batch_mib = 0;
  // Batches in flight per connection (each its own thread and staging slot):
  // while one batch's bytes move, the next one's lease RPC runs, as a client
  // library pipelines.
  int depth = 1;
  // The daemon's --copy-threads.
  int copy_threads = 1;
  // The daemon's --data-workers: one per core of this 2-core machine.
  int data_workers = 2;
  // Which kvfabric paths to run ("shm", "tcp", "ktcp" or "all"), and whether to run
  // the Redis and memcached baselines (without them no ratios are printed).
  std::string paths = "all";
  bool baselines = true;
  // Only this block size (KiB) / connection count; 0 runs both of each.
  std::uint64_t only_block_kib = 0;
  int only_conns = 0;
  // The "ktcp" path's send buffers, daemon and clients
  // (TcpTransportOptions::send_buffer_bytes): auto (256 KiB on this host,
  // which loopback is), kernel (autotuning) or a size. On loopback both
  // copies share the caches; autotuned buffers let several MiB per
  // connection go cold between them (docs/benchmarks.md). memcached bounds
  // its in-flight bytes by answering one value per request.
  std::string ktcp_send_buffer = "auto";
  // How a GET batch runs: "fetch" (kFetch) or "lease" (Lease, kGet, Release).
  std::string get = "fetch";
  // How a PUT batch runs: "store" (kStore) or "reserve" (Reserve, kPut, Commit).
  std::string put = "store";
  // Repetitions of each kvfabric case, each right after memcached's same op
  // (paired baselines); rows print medians.
  int repeat = 3;
  // Whether the case (block bytes, connections; 0: any) is selected.
  bool Runs(std::uint64_t block, int conns) const {
    return (only_block_kib == 0 || only_block_kib << 10 == block) &&
           (only_conns == 0 || conns == 0 || only_conns == conns);
  }
};

struct Result {
  double gbps = 0, p50_us = 0, p99_us = 0;
};

// The UCX transport list of a path (unused by "ktcp").
std::string UcxTls(const std::string& path) { return path == "shm" ? "sm,self,tcp" : "tcp"; }

class Daemon {
 public:
  Daemon(const Args& a, const std::string& path, const std::string& dir) {
    const std::string ready = dir + "/ready";
    std::filesystem::remove(ready);
    std::vector<std::string> argv = {
        a.daemon,
        "--host-id=bench",
        "--insecure",
        "--grpc-address=127.0.0.1:0",
        "--transport-address=127.0.0.1:0",
        "--metrics-address=off",
        "--admin-address=127.0.0.1:0",  // Delete between repeats
        "--lock-memory=off",
        "--data-transport=" + std::string(path == "ktcp" ? "tcp" : "ucx"),
        "--ucx-tls=" + UcxTls(path),
        "--tcp-send-buffer=" + a.ktcp_send_buffer,
        "--host-pool-bytes=" + std::to_string(2 * a.total_mib + 64) + "MiB",
        "--host-page-bytes=256KiB",
        "--host-high-watermark=1.0",
        "--host-low-watermark=1.0",
        "--eviction-policy=lru",
        "--copy-threads=" + std::to_string(a.copy_threads),
        "--data-workers=" + std::to_string(a.data_workers),
        "--ready-file=" + ready,
        "--log-level=warn"};
    std::vector<char*> c;
    for (auto& s : argv) c.push_back(s.data());
    c.push_back(nullptr);
    if (posix_spawn(&pid_, c[0], nullptr, nullptr, c.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start %s\n", c[0]);
      std::exit(1);
    }
    for (int i = 0; i < 6000; ++i) {
      std::ifstream in(ready);
      std::string line;
      while (std::getline(in, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) info_[line.substr(0, eq)] = line.substr(eq + 1);
      }
      if (info_.count("pid")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::fprintf(stderr, "daemon did not become ready\n");
    std::exit(1);
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  std::string grpc() { return info_["grpc"]; }
  std::string transport() { return info_["transport"]; }
  std::string admin() { return info_["admin"]; }

 private:
  pid_t pid_ = -1;
  std::map<std::string, std::string> info_;
};

// One client connection: its own UCX transport, staging region and session
// with the daemon (gRPC stub and data-plane connection).
struct Conn {
  std::unique_ptr<transport::Transport> t;
  std::unique_ptr<transport::MemoryRegion> staging;
  std::unique_ptr<client::DataPlaneClient> data;
  std::shared_ptr<client::CacheHostSession> session;
  ~Conn() { session.reset(); }  // before the data plane it borrows
};

std::unique_ptr<Conn> Connect(const Args& a, Daemon& d, const std::string& path,
                              std::uint64_t staging_bytes) {
  auto c = std::make_unique<Conn>();
  transport::DataTransportOptions o;
  o.kind = path == "ktcp" ? "tcp" : "ucx";
  o.ucx_tls = UcxTls(path);
  o.tcp_send_buffer_bytes = *tcp::ParseSendBuffer(a.ktcp_send_buffer, "--ktcp-send-buffer");
  c->t = std::move(*transport::CreateDataTransport(o));
  c->staging = std::move(*c->t->AllocateMemory(staging_bytes, transport::MemoryKind::kHost));
  std::memset(c->staging->bytes().data(), 0x5a, c->staging->bytes().size());
  c->data = std::move(*client::DataPlaneClient::Create(c->t.get()));
  client::CacheHostSessionOptions so;
  so.grpc_address = d.grpc();
  so.security.insecure = true;
  so.admin_address = d.admin();
  so.transport_address = d.transport();
  so.rpc_timeout = std::chrono::seconds(10);
  so.transfer_timeout = std::chrono::seconds(60);
  so.region_id = 1;
  auto session = client::CacheHostSession::Open(c->data.get(), *c->staging, so);
  if (!session.ok()) {
    std::fprintf(stderr, "session: %s\n", session.status().ToString().c_str());
    std::exit(1);
  }
  c->session = std::move(*session);
  return c;
}

v1::ModelFingerprint Fp(std::uint32_t layers) {
  v1::ModelFingerprint f;
  f.set_model_id("bench/model@1");
  f.set_layer_count(layers);
  f.set_dtype(v1::DTYPE_FP16);
  f.set_kv_heads(8);
  f.set_head_dim(128);
  f.set_tokens_per_block(16);
  f.set_tp_size(1);
  f.set_layout_version(1);
  return f;
}

std::string Key(int conn, std::uint64_t i) {
  std::string k(32, '\0');
  std::uint64_t v = (std::uint64_t(conn) << 48) ^ (i * 0x9e3779b97f4a7c15ull) ^ 0x1234;
  for (int b = 0; b < 32; ++b) {
    k[b] = static_cast<char>(v >> (8 * (b % 8)));
    if (b % 8 == 7) v = v * 6364136223846793005ull + 1442695040888963407ull;
  }
  return k;
}

// One batch: PUT (kStore; or reserve, put, commit) or GET (kFetch; or lease,
// get, release) of `n` blocks starting at `first`; `get_mode` is the PUT
// mode for a PUT. Returns false on any error.
bool Batch(Conn& c, bool put, const std::string& get_mode, int conn, std::uint64_t first, int n,
           std::uint64_t block, std::uint32_t layers, std::uint64_t slot,
           std::vector<std::uint32_t>* crcs) {
  const client::SlotLayout slots{slot, block};
  Status first_error;
  if (put) {
    std::vector<client::CacheHostSession::StoreBlock> blocks(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) {
      v1::BlockDescriptor& b = blocks[k].descriptor;
      b.set_key(Key(conn, first + k));
      b.set_payload_bytes(block);
      b.set_representation(v1::REPRESENTATION_EXACT);
      b.set_format_version(kBlockFormatVersion);
      b.set_token_count(16);
      b.set_prefix_tokens(16 * (first + k));
      blocks[k].crc32c = (*crcs)[k];
    }
    StatusOr<std::vector<Status>> got = Status::Internal("unset");
    if (get_mode == "store") {
      // kStore names the model by digest: the bench's fixed stand-in (the
      // daemon keeps it with the block; nothing here reads it back). gRPC
      // Reserve computes it from the fingerprint instead.
      for (auto& b : blocks) b.descriptor.set_fingerprint_digest(std::string(32, 'b'));
      got = c.session->StoreByKey(Fp(layers), blocks, slots);
    } else {
      got = c.session->Store(Fp(layers), blocks, slots);
    }
    first_error = got.status();
    for (std::size_t k = 0; got.ok() && first_error.ok() && k < got->size(); ++k) {
      first_error = (*got)[k];
    }
  } else if (get_mode == "fetch") {
    std::vector<wire::FetchKey> keys(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) std::memcpy(keys[k].data(), Key(conn, first + k).data(), 32);
    auto got = c.session->Fetch(keys, "", slots);
    first_error = got.status();
    for (std::size_t k = 0; got.ok() && first_error.ok() && k < got->size(); ++k) {
      first_error = (*got)[k].status;
      if (first_error.ok() && (*got)[k].payload_bytes != block) {
        first_error = Status::DataLoss(std::to_string((*got)[k].payload_bytes) + " bytes");
      }
    }
  } else {
    std::vector<std::string> keys;
    for (int k = 0; k < n; ++k) keys.push_back(Key(conn, first + k));
    auto got = c.session->LeaseGet(keys, "", 0, slots);
    first_error = got.status();
    for (std::size_t k = 0; got.ok() && first_error.ok() && k < got->size(); ++k) {
      first_error = (*got)[k].status;
    }
  }
  if (!first_error.ok()) {
    std::fprintf(stderr, "%s: %s\n", put ? "put" : get_mode.c_str(),
                 first_error.ToString().c_str());
    return false;
  }
  return true;
}

Result RunKvf(std::vector<std::unique_ptr<Conn>>& conns, const std::string& ns, bool put,
              const std::string& get_mode, std::uint64_t block, std::uint64_t total,
              std::uint64_t batch_bytes, int depth) {
  const std::uint32_t layers = static_cast<std::uint32_t>(block / (64 << 10));
  const int per_batch = static_cast<int>(std::max<std::uint64_t>(1, batch_bytes / block));
  const std::size_t workers = conns.size() * static_cast<std::size_t>(depth);
  const std::uint64_t blocks_per_worker = total / block / workers;
  std::vector<std::vector<double>> lat(workers);
  std::atomic<bool> failed{false};
  for (auto& c : conns) c->session->SetNamespace(ns);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (std::size_t wi = 0; wi < workers; ++wi) {
    threads.emplace_back([&, wi] {
      Conn& c = *conns[wi / static_cast<std::size_t>(depth)];
      const std::uint64_t slot = (wi % static_cast<std::size_t>(depth)) * batch_bytes;
      // The staging bytes are fixed; their CRC is computed once per slot
      // (puts only: a get's bytes are the ones put before).
      std::vector<std::uint32_t> crcs(put ? per_batch : 0);
      for (std::size_t k = 0; k < crcs.size(); ++k) {
        crcs[k] = crc32c::Value(c.staging->bytes().subspan(slot + k * block, block));
      }
      for (std::uint64_t i = 0; i < blocks_per_worker && !failed; i += per_batch) {
        const int n = static_cast<int>(std::min<std::uint64_t>(per_batch, blocks_per_worker - i));
        const auto t0 = Clock::now();
        if (!Batch(c, put, get_mode, static_cast<int>(wi), i, n, block, layers, slot, &crcs)) {
          failed = true;
        }
        lat[wi].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed) {
    std::fprintf(stderr, "kvfabric %s failed\n", put ? "put" : "get");
    std::exit(1);
  }
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.gbps = double(blocks_per_worker * workers * block) / secs / 1e9;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

// The start of a result row: who, how, GB/s and latencies.
void PrintHead(const char* system, const std::string& path, const char* op, std::uint64_t block,
               int conns, const Result& r) {
  std::printf("%-10s %-6s %-4s %5llu KiB %d conn  %6.2f GB/s  p50 %8.0f us  p99 %8.0f us",
              system, path.c_str(), op, static_cast<unsigned long long>(block >> 10), conns,
              r.gbps, r.p50_us, r.p99_us);
}

// A baseline row; `memcached_gbps`: memcached's same op, size and connections
// (0: not run), for the ratio.
void Print(const char* system, const char* path, const char* op, std::uint64_t block, int conns,
           const Result& r, double memcached_gbps) {
  PrintHead(system, path, op, block, conns, r);
  if (memcached_gbps > 0) std::printf("  %.2fx memcached %s", r.gbps / memcached_gbps, op);
  std::printf("\n");
  std::fflush(stdout);
}

// One repetition of a kvfabric case, with memcached's same op measured just
// before it (0: no baselines, or it failed).
struct Paired {
  Result kvf;
  double memcached = 0;
  double ring = 0;  // GET only: memcached's GET into a staging-sized ring
};

// The lower median (an element of `v`: the middle one of an odd count).
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

void PrintPaired(const std::string& path, const char* op, std::uint64_t block, int conns,
                 const std::vector<Paired>& runs) {
  std::vector<double> gbps, ratio, ring_ratio, base;
  for (const Paired& r : runs) {
    gbps.push_back(r.kvf.gbps);
    if (r.memcached > 0) {
      ratio.push_back(r.kvf.gbps / r.memcached);
      base.push_back(r.memcached);
    }
    if (r.ring > 0) ring_ratio.push_back(r.kvf.gbps / r.ring);
  }
  const double g = Median(gbps);
  const Result* at = &runs.front().kvf;  // the median run: its latencies
  for (const Paired& r : runs) {
    if (r.kvf.gbps == g) at = &r.kvf;
  }
  PrintHead("kvfabric", path, op, block, conns, *at);
  if (!ratio.empty()) {
    std::printf("  %.2fx memcached %s (%.2f GB/s)", Median(ratio), op, Median(base));
  }
  if (!ring_ratio.empty()) std::printf("  %.2fx memcached GET into a ring", Median(ring_ratio));
  if (runs.size() > 1) std::printf("  [median of %zu]", runs.size());
  std::printf("\n");
  std::fflush(stdout);
}

// Deletes what one RunKvf put (`workers` x `blocks_per_worker` keys), so the
// next repetition can put the same keys again.
void DeleteBlocks(Conn& c, const std::string& ns, std::size_t workers,
                  std::uint64_t blocks_per_worker) {
  c.session->SetNamespace(ns);
  std::vector<std::string> keys;
  auto flush = [&] {
    if (keys.empty()) return;
    if (auto got = c.session->Delete(keys); !got.ok()) {
      std::fprintf(stderr, "Delete: %s\n", got.status().ToString().c_str());
      std::exit(1);
    }
    keys.clear();
  };
  for (std::size_t wi = 0; wi < workers; ++wi) {
    for (std::uint64_t i = 0; i < blocks_per_worker; ++i) {
      keys.push_back(Key(static_cast<int>(wi), i));
      if (keys.size() == 4096) flush();
    }
  }
  flush();
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--daemon") a.daemon = argv[i + 1];
    else if (k == "--total-mib") a.total_mib = std::stoull(argv[i + 1]);
    else if (k == "--batch-mib") a.batch_mib = std::stoull(argv[i + 1]);
    else if (k == "--batch-blocks") a.batch_blocks = std::max<std::uint64_t>(1, std::stoull(argv[i + 1]));
    else if (k == "--depth") a.depth = std::max(1, std::stoi(argv[i + 1]));
    else if (k == "--copy-threads") a.copy_threads = std::max(0, std::stoi(argv[i + 1]));
    else if (k == "--data-workers") a.data_workers = std::max(1, std::stoi(argv[i + 1]));
    else if (k == "--paths") a.paths = argv[i + 1];
    else if (k == "--baselines") a.baselines = std::string(argv[i + 1]) != "0";
    else if (k == "--block-kib") a.only_block_kib = std::stoull(argv[i + 1]);
    else if (k == "--conns") a.only_conns = std::stoi(argv[i + 1]);
    else if (k == "--ktcp-send-buffer") a.ktcp_send_buffer = argv[i + 1];
    else if (k == "--get") a.get = argv[i + 1];
    else if (k == "--put")
      a.put = argv[i + 1];
    else if (k == "--repeat") a.repeat = std::clamp(std::stoi(argv[i + 1]), 1, 9);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (auto sb = tcp::ParseSendBuffer(a.ktcp_send_buffer, "--ktcp-send-buffer"); !sb.ok()) {
    std::fprintf(stderr, "%s\n", std::string(sb.status().message()).c_str());
    return 2;
  }
  if (a.put != "store" && a.put != "reserve") {
    std::fprintf(stderr, "--put %s: must be store or reserve\n", a.put.c_str());
    return 2;
  }
  if (a.get != "fetch" && a.get != "lease") {
    std::fprintf(stderr, "--get %s: must be fetch or lease\n", a.get.c_str());
    return 2;
  }
  const std::uint64_t total = a.total_mib << 20;
  const std::uint64_t sizes[] = {256 << 10, 2 << 20};
  const int conn_counts[] = {1, 4};
  // memcached's GB/s by (value size, connections, is-get): the baseline
  // table's ratios.
  std::map<std::tuple<std::uint64_t, int, bool>, double> memcached;
  // A batch holds at least one block; a connection stages `depth` batches.
  auto batch_bytes_of = [&](std::uint64_t block) {
    if (a.batch_mib == 0) return a.batch_blocks * block;
    return std::max<std::uint64_t>(a.batch_mib << 20, block);
  };
  auto staging_bytes = [&](std::uint64_t block) {
    return batch_bytes_of(block) * static_cast<std::uint64_t>(a.depth);
  };


  // Baselines first, on the same value sizes and total bytes. memcached
  // stays up for the paired measurements of the kvfabric rows.
  std::unique_ptr<bench::BaselineServer> paired_memcached;
  for (auto kind : {bench::BaselineKind::kMemcached, bench::BaselineKind::kRedis}) {
    if (!a.baselines) break;
    bench::BaselineServerOptions so;
    // Room for the values twice over plus memcached's per-item overhead, so
    // nothing is evicted between the put and the get.
    so.memcached_memory_mib = 2 * a.total_mib + 512;
    auto server = bench::BaselineServer::Start(kind, so);
    if (!server.ok()) {
      std::printf("%s: skipped (%s)\n", std::string(bench::BaselineKindName(kind)).c_str(),
                  server.status().ToString().c_str());
      continue;
    }
    for (std::uint64_t block : sizes) {
      for (int conns : conn_counts) {
        if (!a.Runs(block, conns)) continue;
        // Warm-up put (fresh values fault in pages), then the timed overwrite.
        (void)bench::RunBaseline(kind, bench::BaselineOp::kPut, (*server)->port(), block, total,
                                 conns);
        for (auto op : {bench::BaselineOp::kPut, bench::BaselineOp::kGet}) {
          auto r = bench::RunBaseline(kind, op, (*server)->port(), block, total, conns);
          if (!r.ok()) {
            std::printf("%s failed: %s\n", std::string(bench::BaselineKindName(kind)).c_str(),
                        r.status().ToString().c_str());
            continue;
          }
          const bool get = op == bench::BaselineOp::kGet;
          if (kind == bench::BaselineKind::kMemcached) memcached[{block, conns, get}] = r->gbps;
          Print(std::string(bench::BaselineKindName(kind)).c_str(), "tcp", get ? "GET" : "PUT",
                block, conns, Result{r->gbps, r->p50_us, r->p99_us},
                memcached.count({block, conns, get}) ? memcached[{block, conns, get}] : 0);
        }
        if (kind != bench::BaselineKind::kMemcached) continue;
        auto ring = bench::RunBaseline(kind, bench::BaselineOp::kGet, (*server)->port(), block,
                                       total, conns, staging_bytes(block));
        if (!ring.ok()) {
          std::printf("memcached GET into a ring failed: %s\n", ring.status().ToString().c_str());
          continue;
        }
        // Every value lands in the next slot of a ring as large as a kvfabric
        // connection's staging, not in one buffer that stays in cache: the
        // destinations kvfabric's GETs write.
        Print("memcached", "ring", "GET", block, conns, Result{ring->gbps, ring->p50_us, ring->p99_us},
              memcached[{block, conns, true}]);
      }
    }
    if (kind == bench::BaselineKind::kMemcached) paired_memcached = std::move(*server);
  }
  // memcached's `op` on this case now (0 without baselines or on failure).
  auto memcached_now = [&](bench::BaselineOp op, std::uint64_t block, int conns,
                           std::uint64_t ring_bytes) {
    if (!paired_memcached) return 0.0;
    auto r = bench::RunBaseline(bench::BaselineKind::kMemcached, op, paired_memcached->port(),
                                block, total, conns, ring_bytes);
    if (!r.ok()) {
      std::printf("paired memcached run failed: %s\n", r.status().ToString().c_str());
      return 0.0;
    }
    return r->gbps;
  };

  std::printf("ktcp send buffers: %s (receive buffers: kernel autotuning)\n",
              a.ktcp_send_buffer.c_str());
  std::printf("kvfabric GET = %s\n", a.get == "fetch"
                                         ? "kFetch by key (one data-plane round trip)"
                                         : "gRPC Lease + data-plane kGet + gRPC Release");
  std::printf("kvfabric PUT = %s\n", a.put == "store"
                                         ? "kStore (one data-plane round trip)"
                                         : "gRPC Reserve + data-plane kPut + gRPC Commit");
  char tmpl[] = "/tmp/kvf_bench_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  for (const std::string path : {"shm", "tcp", "ktcp"}) {
    if (a.paths != "all" && a.paths != path) continue;
    for (std::uint64_t block : sizes) {
      if (!a.Runs(block, 0)) continue;
      const std::uint64_t batch_bytes = batch_bytes_of(block);
      Daemon d(a, path, dir);
      for (int conns : conn_counts) {
        if (!a.Runs(block, conns)) continue;
        std::vector<std::unique_ptr<Conn>> cs;
        for (int i = 0; i < conns; ++i) {
          cs.push_back(Connect(a, d, path, staging_bytes(block)));
        }
        const std::string ns = "bench-" + std::to_string(conns);
        const std::size_t workers = static_cast<std::size_t>(conns * a.depth);
        std::vector<Paired> puts, gets;
        for (int rep = 0; rep < a.repeat; ++rep) {
          Paired p, g;
          // memcached's PUT also leaves this size's values for its GET.
          p.memcached = memcached_now(bench::BaselineOp::kPut, block, conns, 0);
          p.kvf = RunKvf(cs, ns, true, a.put, block, total, batch_bytes, a.depth);
          g.memcached = memcached_now(bench::BaselineOp::kGet, block, conns, 0);
          g.ring = memcached_now(bench::BaselineOp::kGet, block, conns, staging_bytes(block));
          g.kvf = RunKvf(cs, ns, false, a.get, block, total, batch_bytes, a.depth);
          DeleteBlocks(*cs.front(), ns, workers, total / block / workers);
          puts.push_back(p);
          gets.push_back(g);
        }
        PrintPaired(path, "PUT", block, conns, puts);
        PrintPaired(path, "GET", block, conns, gets);
      }
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) { return kvfabric::Main(argc, argv); }
