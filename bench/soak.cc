// soak: kvfabric under a fault a minute, on a small datacentre of network
// namespaces (tests/fault/netns_cluster.h).
//
// Placement and three daemons (host pool + NVMe tier, each tier on a tmpfs of
// its own) run in namespaces of their own; --clients engine processes, each
// in its own namespace, serve mixed match/load/save traffic over a shared set
// of chains (so clients hit each other's blocks), checking every byte they
// load. The run is cut into phases of --fault-interval: the first has no
// fault; each later one starts with a fault on one daemon, chosen by the
// printed seed, held for --fault-hold and then healed:
//
//   kill       SIGKILL, restarted on the same NVMe directory after the hold
//   partition  its switch port down, up after the hold
//   slow       its link capped at 20 Mbit/s, uncapped after the hold
//   disk       its NVMe filesystem filled to the last byte, emptied after
//
// Printed per phase: requests served, errors by code, p50/p99 load latency
// (match to last layer ready), blocks fetched from a replica or recomputed
// after a failed fetch (fallbacks). At the end: blocks the faulted daemon
// held on NVMe before each kill or fill, and how many of them it still holds
// after its recovery (on any tier: a block read since is on both, and Lookup
// names the host copy); lost (must be 0) is the difference. Also blocks that
// loaded wrong or failed their CRC (corrupt, must be 0). The exit status is 1
// if either is not 0.
//
// Needs root (namespaces, tmpfs mounts); says so in one line and exits 77
// otherwise. Binaries: $KVF_CACHED, $KVF_PLACEMENT, or beside this one.
//
//   bazel run -c opt //bench:soak -- --duration=600
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "core/status.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "tests/fault/netns_cluster.h"
#include "tests/server_process.h"
#include "tests/test_engine.h"

namespace kvfabric::soak {
namespace {

using Clock = std::chrono::steady_clock;
using client::Client;

constexpr std::uint32_t kQHeads = 4;
constexpr std::uint32_t kTileTokens = 256;
constexpr std::uint32_t kChainTokens = 1024;  // 64 blocks of 16 tokens, 32 KiB each
constexpr int kChains = 12;                   // 24 MiB of KV in all
constexpr std::uint64_t kSlowBitsPerSecond = 20'000'000;
// The engines' prefill cost: the recompute callback generates the synthetic
// KV (far faster) and then waits out this much per token, standing in for a
// GPU's prefill, as the fault tests do. Without it recomputing is nearly free,
// placement learns so, plans stop fetching, and no fault touches a transfer.
constexpr double kPrefillUsPerToken = 200.0;
constexpr const char* kDaemons[] = {"cache-a", "cache-b", "cache-c"};
constexpr const char* kFaults[] = {"kill", "partition", "slow", "disk"};

// Wall-clock milliseconds: driver and workers are different processes, so
// phases and requests meet on the realtime clock.
std::int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ModelFingerprint SoakModel() { return testing::SyntheticTestModel("soak/synthetic@1"); }

// ---- The worker: one engine process ----

struct WorkerOptions {
  std::string placement;
  std::uint64_t seed = 0;
  std::int64_t end_ms = 0;
  std::uint32_t concurrency = 2;
  std::string stats;
};

int RunWorker(const WorkerOptions& w) {
  const ModelFingerprint model = SoakModel();
  auto device = testing::CreateTestDevice(model, kQHeads, kTileTokens, 2 * w.concurrency);
  if (!device.ok()) {
    std::fprintf(stderr, "worker: device: %s\n", device.status().ToString().c_str());
    return 2;
  }
  std::mutex chains_mu;
  std::map<client::ContextId, const std::vector<BlockKey>*> chain_of_context;
  client::ClientOptions o;
  o.placement_address = w.placement;
  o.security.insecure = true;  // the namespaces' addresses are not loopback
  o.security.allow_insecure_remote = true;
  o.data_transport = "tcp";
  o.model = model;
  o.device = device->device.get();
  o.num_q_heads = kQHeads;
  o.tile_tokens = kTileTokens;
  o.arena.page_bytes = device->page_bytes;
  o.arena.staging_pages = 2;
  o.staging_bytes = 4 << 20;
  o.history_pool_bytes = std::uint64_t{w.concurrency} * (3 << 20);
  o.max_context_tokens = kChainTokens;
  o.rpc_timeout = std::chrono::milliseconds(1500);
  o.transfer_timeout = std::chrono::milliseconds(3000);
  o.recompute = [&](const client::RecomputeRequest& r, std::span<std::byte> out) {
    const auto start = Clock::now();
    const std::vector<BlockKey>* chain = nullptr;
    {
      std::lock_guard<std::mutex> l(chains_mu);
      auto it = chain_of_context.find(r.context);
      if (it == chain_of_context.end()) return Status::Internal("prefill of an unknown context");
      chain = it->second;
    }
    const std::uint64_t bytes = *model.BlockBytes();
    for (std::uint32_t i = 0; i < r.block_count; ++i) {
      KVF_RETURN_IF_ERROR(
          client::SyntheticKv(model, client::SeedFromKey((*chain)[r.first_block + i], w.seed), 16,
                              out.subspan(i * bytes, bytes)));
    }
    std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<std::int64_t>(
                                              kPrefillUsPerToken * r.tokens)));
    return Status::OK();
  };
  o.prefill = RecomputeParameters{0.0, kPrefillUsPerToken, 0.0};
  auto opened = Client::Open(std::move(o));
  if (!opened.ok()) {
    std::fprintf(stderr, "worker: open: %s\n", opened.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<Client> c = std::move(*opened);
  // The same chains in every worker: they share blocks through the daemons.
  std::vector<std::vector<BlockKey>> chains;
  for (int i = 0; i < kChains; ++i) {
    std::vector<std::uint32_t> ids(kChainTokens);
    std::mt19937_64 rng(w.seed ^ (std::uint64_t(i + 1) * 0x9e3779b97f4a7c15ull));
    for (std::uint32_t& t : ids) t = static_cast<std::uint32_t>(rng() % 128000);
    chains.push_back(*c->KeyTokens(ids));
  }
  {
    std::ofstream keys(w.stats + ".keys.tmp");
    for (const auto& chain : chains) {
      for (const BlockKey& k : chain) {
        for (unsigned char b : k.bytes()) {
          char h[3];
          std::snprintf(h, sizeof(h), "%02x", static_cast<unsigned>(b));
          keys << h;
        }
        keys << "\n";
      }
    }
  }
  std::filesystem::rename(w.stats + ".keys.tmp", w.stats + ".keys");
  FILE* out = std::fopen(w.stats.c_str(), "w");
  if (out == nullptr) return 2;
  std::mutex out_mu;
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < w.concurrency; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(w.seed + 7919 * (t + 1) + static_cast<std::uint64_t>(::getpid()));
      const std::uint64_t bytes = *model.BlockBytes();
      std::vector<std::byte> want(bytes);
      while (NowMs() < w.end_ms) {
        const std::vector<BlockKey>& chain = chains[rng() % kChains];
        const std::int64_t start_ms = NowMs();
        const auto start = Clock::now();
        int wrong = 0;
        double load_s = -1;
        client::ContextReport report;
        Status s;
        auto match = c->Match(chain, 0);
        s = match.status();
        StatusOr<client::ContextId> ctx = Status::Unavailable("not opened");
        if (s.ok()) {
          ctx = c->NewContext(kChainTokens);
          s = ctx.status();
        }
        if (s.ok()) {
          {
            std::lock_guard<std::mutex> l(chains_mu);
            chain_of_context[*ctx] = &chain;
          }
          s = c->Load(*match, *ctx);
          for (std::uint32_t l = 0; s.ok() && l < model.layer_count; ++l) s = c->WaitLayer(*ctx, l);
          if (s.ok()) load_s = std::chrono::duration<double>(Clock::now() - start).count();
          if (s.ok()) {
            auto history = c->History(*ctx);
            s = history.status();
            for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
              s = client::SyntheticKv(model, client::SeedFromKey(chain[b], w.seed), 16, want);
              if (s.ok() && std::memcmp(want.data(), history->block(b).data(), bytes) != 0) ++wrong;
            }
          }
          for (std::uint32_t l = 0; s.ok() && l < model.layer_count; ++l) {
            s = c->Save(*ctx, l, 0, chain);
          }
          const Status finished = c->Finish(*ctx, &report);
          if (s.ok()) s = finished;
          std::lock_guard<std::mutex> l(chains_mu);
          chain_of_context.erase(*ctx);
        }
        std::uint32_t from_replica = 0, after_failure = 0;
        for (const client::RunOutcome& r : report.runs) {
          from_replica += r.blocks_from_fallback_host;
          after_failure += r.blocks_recomputed_after_failure;
        }
        std::lock_guard<std::mutex> l(out_mu);
        std::fprintf(out, "req %" PRId64 " %s %.6f %d %u %u %u %u\n", start_ms,
                     std::string(StatusCodeName(s.code())).c_str(), load_s, wrong,
                     report.blocks_fetched, report.blocks_recomputed, from_replica, after_failure);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::fprintf(out, "crc_failures %" PRIu64 "\n", c->metrics().crc_failures);
  std::fclose(out);
  return 0;
}

// ---- The driver ----

struct Options {
  int duration_s = 600;
  int interval_s = 60;
  int hold_s = 20;
  int clients = 3;
  std::uint32_t concurrency = 2;
  std::uint64_t seed = 0;
};

struct Request {
  std::int64_t start_ms = 0;
  std::string code;
  double load_s = -1;
  int wrong = 0;
  std::uint32_t fetched = 0, recomputed = 0, from_replica = 0, after_failure = 0;
};

struct Phase {
  std::int64_t start_ms = 0;
  std::string fault = "none";
  std::string daemon;
  std::string note;
};

using bench::Percentile;

class Driver {
 public:
  explicit Driver(const Options& o) : o_(o) {}
  ~Driver() { Teardown(); }

  int Run() {
    char tmpl[] = "/tmp/kvf_soak_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return Fail("mkdtemp failed");
    dir_ = tmpl;
    std::vector<std::string> hosts = {"placement", "cache-a", "cache-b", "cache-c"};
    for (int i = 1; i <= o_.clients; ++i) hosts.push_back("client-" + std::to_string(i));
    auto net = testing::NetnsCluster::Create(hosts);
    if (!net.ok()) return Fail("namespaces: " + net.status().ToString());
    net_ = std::move(*net);
    placement_address_ = net_->Address("placement") + ":7450";
    auto p = net_->StartIn(
        "placement", testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement",
        dir_,
        {"--insecure", "--allow-insecure-remote", "--grpc-address=" + placement_address_,
         "--metrics-address=off", "--log-level=warn"});
    if (!p.ok()) return Fail("placement: " + p.status().ToString());
    placement_ = std::move(*p);
    for (const char* host : kDaemons) {
      const std::string nvme = NvmeDir(host);
      std::filesystem::create_directories(nvme);
      if (::mount("tmpfs", nvme.c_str(), "tmpfs", 0, "size=128m") != 0) {
        return Fail("mount tmpfs on " + nvme + ": " + std::strerror(errno));
      }
      mounts_.push_back(nvme);
      if (Status s = StartDaemon(host); !s.ok())
        return Fail(host + std::string(": ") + s.ToString());
    }
    std::printf(
        "soak: seed %" PRIu64
        ", %d s in phases of %d s (faults held %d s), %d client "
        "processes x %u contexts, %d chains of %u tokens shared by all, daemons with a 4 MiB "
        "host pool over a 128 MiB tmpfs NVMe tier\n",
        o_.seed, o_.duration_s, o_.interval_s, o_.hold_s, o_.clients, o_.concurrency, kChains,
        kChainTokens);
    std::fflush(stdout);
    // The keys every worker uses, for the NVMe checks.
    const std::int64_t start_ms = NowMs();
    const std::int64_t end_ms = start_ms + std::int64_t{o_.duration_s} * 1000;
    for (int i = 1; i <= o_.clients; ++i) {
      if (Status s = StartWorker(i, end_ms); !s.ok()) return Fail(s.ToString());
    }
    std::mt19937_64 rng(o_.seed);
    for (std::int64_t phase_ms = start_ms; phase_ms < end_ms;
         phase_ms += std::int64_t{o_.interval_s} * 1000) {
      Phase ph;
      ph.start_ms = phase_ms;
      SleepUntil(phase_ms);
      if (phase_ms != start_ms) {
        ph.fault = kFaults[rng() % 4];
        ph.daemon = kDaemons[rng() % 3];
        std::printf("t=%5.0f s  %s on %s\n", (NowMs() - start_ms) / 1000.0, ph.fault.c_str(),
                    ph.daemon.c_str());
        std::fflush(stdout);
        ph.note = Inject(ph, std::min(end_ms, phase_ms + std::int64_t{o_.hold_s} * 1000));
      }
      phases_.push_back(ph);
    }
    SleepUntil(end_ms);
    const int exited = WaitWorkers(end_ms + 30'000);
    return Report(start_ms, exited);
  }

 private:
  static int Fail(const std::string& why) {
    std::fprintf(stderr, "soak: %s\n", why.c_str());
    return 2;
  }
  static void SleepUntil(std::int64_t ms) {
    const std::int64_t now = NowMs();
    if (ms > now) std::this_thread::sleep_for(std::chrono::milliseconds(ms - now));
  }
  std::string NvmeDir(const std::string& host) const { return dir_ + "/" + host + "-nvme"; }

  std::vector<std::string> DaemonFlags(const std::string& host) const {
    return {"--insecure",
            "--allow-insecure-remote",
            "--host-id=" + host,
            "--grpc-address=" + net_->Address(host) + ":7440",
            "--transport-address=" + net_->Address(host) + ":0",
            "--data-transport=tcp",
            "--metrics-address=off",
            "--lock-memory=off",
            "--log-level=warn",
            "--host-page-bytes=32KiB",
            "--host-pool-bytes=4MiB",
            "--nvme-dir=" + NvmeDir(host),
            "--nvme-capacity-bytes=256MiB",
            "--nvme-segment-bytes=32MiB",
            "--nvme-io-engine=threads",
            "--placement-address=" + placement_address_,
            "--membership-ttl=2s"};
  }

  Status StartDaemon(const std::string& host) {
    KVF_ASSIGN_OR_RETURN(daemons_[host],
                         net_->StartIn(host, testing::ServerBinary("KVF_CACHED", "kvfabric-cached"),
                                       host, dir_, DaemonFlags(host)));
    return Status::OK();
  }

  Status StartWorker(int i, std::int64_t end_ms) {
    const std::string host = "client-" + std::to_string(i);
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string stats = dir_ + "/" + host + ".stats";
    const std::string log = dir_ + "/" + host + ".log";
    std::vector<std::string> args = {"/usr/sbin/ip",
                                     "netns",
                                     "exec",
                                     net_->Namespace(host),
                                     self,
                                     "--worker",
                                     "--placement-address=" + placement_address_,
                                     "--seed=" + std::to_string(o_.seed),
                                     "--end-ms=" + std::to_string(end_ms),
                                     "--concurrency=" + std::to_string(o_.concurrency),
                                     "--stats=" + stats};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int err = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) return Status::Internal("spawn worker: " + std::string(std::strerror(err)));
    workers_.push_back({pid, stats, log});
    return Status::OK();
  }

  // The keys of `keys` that `host` holds on NVMe (what it acknowledged
  // durable), by one Lookup; with `any_tier`, those it holds at all (a block
  // read since is on both tiers, and Lookup names the host one).
  std::vector<std::string> Held(const std::string& host, const std::vector<std::string>& keys,
                                bool any_tier) {
    auto stub = v1::CacheHost::NewStub(
        grpc::CreateChannel(net_->Address(host) + ":7440", grpc::InsecureChannelCredentials()));
    v1::LookupRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::vector<std::string> out;
    if (!stub->Lookup(&ctx, req, &resp).ok()) return out;
    for (int i = 0; i < resp.results_size() && i < static_cast<int>(keys.size()); ++i) {
      if (resp.results(i).status().code() == 0 &&
          (any_tier || resp.results(i).tier() == v1::TIER_NVME)) {
        out.push_back(keys[static_cast<std::size_t>(i)]);
      }
    }
    return out;
  }

  // Every key of every chain, as the workers keyed them (each writes them,
  // one per line in hex, to <stats>.keys before its first request).
  const std::vector<std::string>& AllKeys() {
    if (!all_keys_.empty() || workers_.empty()) return all_keys_;
    std::ifstream in(workers_[0].stats + ".keys");
    std::string hex;
    while (in >> hex) {
      std::string key;
      for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
        key += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
      }
      all_keys_.push_back(std::move(key));
    }
    return all_keys_;
  }

  // Applies `ph`'s fault, waits until `heal_ms`, heals it; returns what the
  // phase checked.
  std::string Inject(const Phase& ph, std::int64_t heal_ms) {
    const std::string& host = ph.daemon;
    if (ph.fault == "kill" || ph.fault == "disk") {
      const std::vector<std::string> before = Held(host, AllKeys(), /*any_tier=*/false);
      if (ph.fault == "kill") {
        daemons_[host]->Kill(SIGKILL);
        SleepUntil(heal_ms);
        if (Status s = StartDaemon(host); !s.ok()) return "restart failed: " + s.ToString();
      } else {
        const std::string filler = NvmeDir(host) + "/filler";
        {
          std::ofstream f(filler, std::ios::binary);
          const std::string mib(1 << 20, 'f');
          while (f.write(mib.data(), static_cast<std::streamsize>(mib.size()))) {
          }
        }
        SleepUntil(heal_ms);
        std::filesystem::remove(filler);
      }
      const std::vector<std::string> after = Held(host, before, /*any_tier=*/true);
      acknowledged_ += before.size();
      recovered_ += after.size();
      lost_ += before.size() - after.size();
      return std::to_string(before.size()) + " on NVMe before, " + std::to_string(after.size()) +
             " held after";
    }
    if (ph.fault == "partition") {
      (void)net_->Partition(host);
      SleepUntil(heal_ms);
      (void)net_->Heal(host);
    } else {
      (void)net_->RateLimit(host, kSlowBitsPerSecond);
      SleepUntil(heal_ms);
      (void)net_->RateLimit(host, 0);
    }
    return "";
  }

  int WaitWorkers(std::int64_t deadline_ms) {
    int exited = 0;
    for (Worker& w : workers_) {
      int status = 0;
      while (NowMs() < deadline_ms && ::waitpid(w.pid, &status, WNOHANG) == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (::waitpid(w.pid, &status, WNOHANG) == 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &status, 0);
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        ++exited;
      }
      w.pid = -1;
    }
    return exited;
  }

  int Report(std::int64_t start_ms, int exited) {
    std::vector<Request> requests;
    std::uint64_t crc_failures = 0;
    for (const Worker& w : workers_) {
      std::ifstream in(w.stats);
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream s(line);
        std::string tag;
        s >> tag;
        if (tag == "crc_failures") {
          std::uint64_t n = 0;
          s >> n;
          crc_failures += n;
          continue;
        }
        Request r;
        s >> r.start_ms >> r.code >> r.load_s >> r.wrong >> r.fetched >> r.recomputed >>
            r.from_replica >> r.after_failure;
        if (s) requests.push_back(r);
      }
    }
    // Phase 0 has no fault: the baseline each phase's p99 is divided by.
    double base_p99 = 0;
    std::printf("\n%-6s %-10s %-8s %8s %9s %9s %8s %9s %9s  %s\n", "phase", "fault", "daemon",
                "served", "p50 load", "p99 load", "p99/base", "fetched", "fallback",
                "errors by code; checks");
    std::uint64_t served = 0, wrong = 0;
    std::map<std::string, std::uint64_t> all_errors;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const std::int64_t from = phases_[i].start_ms;
      const std::int64_t to = i + 1 < phases_.size() ? phases_[i + 1].start_ms : INT64_MAX;
      std::vector<double> loads;
      std::uint64_t n = 0, fetched = 0, fallback = 0;
      std::map<std::string, std::uint64_t> errors;
      for (const Request& r : requests) {
        if (r.start_ms < from || r.start_ms >= to) continue;
        ++n;
        wrong += static_cast<std::uint64_t>(r.wrong);
        fetched += r.fetched;
        fallback += r.from_replica + r.after_failure;
        if (r.load_s >= 0) loads.push_back(r.load_s);
        if (r.code != "OK") {
          ++errors[r.code];
          ++all_errors[r.code];
        }
      }
      served += n;
      const double p99 = Percentile(loads, 0.99);
      if (i == 0) base_p99 = p99;
      std::string e;
      for (const auto& [code, k] : errors) e += code + ":" + std::to_string(k) + " ";
      if (e.empty()) e = "none ";
      std::printf(
          "%-6zu %-10s %-8s %8" PRIu64 " %7.1fms %7.1fms %7.2fx %9" PRIu64 " %9" PRIu64 "  %s%s\n",
          i, phases_[i].fault.c_str(), phases_[i].daemon.empty() ? "-" : phases_[i].daemon.c_str(),
          n, 1e3 * Percentile(loads, 0.5), 1e3 * p99, base_p99 > 0 ? p99 / base_p99 : 0.0, fetched,
          fallback, e.c_str(), phases_[i].note.empty() ? "" : ("; " + phases_[i].note).c_str());
    }
    std::string e;
    for (const auto& [code, k] : all_errors) e += " " + code + ":" + std::to_string(k);
    const std::uint64_t corrupt = wrong + crc_failures;
    std::printf("\nsoak: %.0f s, %d of %d client processes exited cleanly; %" PRIu64
                " requests served, errors by code {%s }; blocks on NVMe before kills/fills %" PRIu64
                ", after recovery %" PRIu64 ", lost %" PRIu64 "; corrupt %" PRIu64
                " (wrong bytes %" PRIu64 ", CRC failures %" PRIu64 ")\n",
                (NowMs() - start_ms) / 1000.0, exited, o_.clients, served, e.c_str(), acknowledged_,
                recovered_, lost_, corrupt, wrong, crc_failures);
    return lost_ == 0 && corrupt == 0 && exited == o_.clients ? 0 : 1;
  }

  void Teardown() {
    for (Worker& w : workers_) {
      if (w.pid > 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, nullptr, 0);
      }
    }
    daemons_.clear();
    placement_.reset();
    net_.reset();
    for (const std::string& m : mounts_) ::umount2(m.c_str(), MNT_DETACH);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  struct Worker {
    pid_t pid = -1;
    std::string stats;
    std::string log;
  };

  const Options o_;
  std::string dir_;
  std::unique_ptr<testing::NetnsCluster> net_;
  std::string placement_address_;
  std::unique_ptr<testing::ServerProcess> placement_;
  std::map<std::string, std::unique_ptr<testing::ServerProcess>> daemons_;
  std::vector<std::string> mounts_;
  std::vector<Worker> workers_;
  std::vector<Phase> phases_;
  std::vector<std::string> all_keys_;
  std::uint64_t acknowledged_ = 0, recovered_ = 0, lost_ = 0;
};

}  // namespace
}  // namespace kvfabric::soak

int main(int argc, char** argv) {
  using namespace kvfabric::soak;
  CLI::App app("soak: kvfabric under a fault a minute on a namespace cluster");
  Options o;
  WorkerOptions w;
  bool worker = false;
  app.add_option("--duration", o.duration_s, "seconds to run (default 600)")
      ->check(CLI::Range(10, 7 * 24 * 3600));
  app.add_option("--fault-interval", o.interval_s, "seconds per phase; one fault each (default 60)")
      ->check(CLI::Range(5, 3600));
  app.add_option("--fault-hold", o.hold_s, "seconds a fault lasts before it is healed (default 20)")
      ->check(CLI::Range(1, 3600));
  app.add_option("--clients", o.clients, "engine processes (default 3)")->check(CLI::Range(1, 16));
  app.add_option("--concurrency", o.concurrency, "contexts in flight per engine (default 2)")
      ->check(CLI::Range(1, 16));
  app.add_option("--seed", o.seed, "fault and traffic seed (default: random, printed)");
  app.add_flag("--worker", worker, "internal: run as one engine process");
  app.add_option("--placement-address", w.placement, "internal (worker)");
  app.add_option("--end-ms", w.end_ms, "internal (worker)");
  app.add_option("--stats", w.stats, "internal (worker)");
  CLI11_PARSE(app, argc, argv);
  if (worker) {
    w.seed = o.seed;
    w.concurrency = o.concurrency;
    return RunWorker(w);
  }
  if (o.hold_s >= o.interval_s) {
    std::fprintf(stderr, "soak: --fault-hold %d must be below --fault-interval %d\n", o.hold_s,
                 o.interval_s);
    return 2;
  }
  const std::string skip = kvfabric::testing::NetnsCluster::SkipReason();
  if (!skip.empty()) {
    std::printf("soak: skipped: %s\n", skip.c_str());
    return 77;
  }
  if (o.seed == 0) o.seed = std::random_device()() | 1;
  // Under `bazel run` the servers are in this binary's runfiles.
  const std::string runfiles =
      std::filesystem::read_symlink("/proc/self/exe").string() + ".runfiles/kvfabric/server/";
  for (const auto& [var, path] : {std::pair{"KVF_CACHED", "cache_host/kvfabric-cached"},
                                  std::pair{"KVF_PLACEMENT", "placement/kvfabric-placement"}}) {
    const char* set = std::getenv(var);
    if ((set == nullptr || *set == '\0') && std::filesystem::exists(runfiles + path)) {
      ::setenv(var, (runfiles + path).c_str(), 1);
    }
  }
  Driver driver(o);
  return driver.Run();
}
