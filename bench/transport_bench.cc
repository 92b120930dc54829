// transport_bench: throughput and latency of kvfabric's UCX Transport between
// two processes, against baselines measured in the same run.
//
// For each transport list (shared memory "sm,self,tcp", TCP "tcp"), memory
// kind (UCX-allocated "alloc", caller memory "user"), operation (read, write),
// block size and batch depth it reports:
//   kvf GB/s    bytes moved / wall time through Endpoint::Submit + Wait
//   p50/p99     per-batch latency (Submit to Wait returning), milliseconds
//   perftest    the best of ucx_perftest's ucp_get, ucp_put_bw, ucp_am_bw and
//               tag_bw for the same UCX_TLS and size (memory UCX allocates,
//               endpoints with error handling, -e, like kvfabric's)
//   memcpy      single-thread memcpy of the same bytes in the batch's layout
//               (depth blocks at distinct offsets)
//   socket      a plain loopback TCP stream of the same block size, the
//               receiver acknowledging each block
// and the ratios kvf/perftest, kvf/memcpy and kvf/socket.
//
// The peer is this binary re-executed as `transport_bench --role=server`
// (ucx_perftest's UCX_TLS is set in its child's environment only; the
// library never reads the environment). Benchmarks are not tests: it prints
// figures and exits 0 unless something failed outright.
//
// Usage: transport_bench [--tls=sm,tcp] [--mem=alloc,user]
//          [--sizes=64K,256K,1M,2M,16M,64M] [--depths=1,16]
//          [--bytes_per_case=256M] [--max_iters=200] [--perftest=1]
//          [--perftest_bytes=256M] [--ucx='KEY=VALUE;...']
//          [--inline_max=BYTES (client's inline_copy_max_bytes; 0 = off)]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "core/units.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::bench {
namespace {

using transport::Clock;
using transport::Endpoint;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferOp;
using transport::Transport;

constexpr std::uint64_t kMiB = 1 << 20;
// The server's region: blocks of one batch wrap around in it.
constexpr std::uint64_t kRegionBytes = 256 * kMiB;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    const std::size_t eq = a.find('=');
    if (eq == std::string::npos) {
      f[a.substr(2)] = "1";
    } else {
      f[a.substr(2, eq - 2)] = a.substr(eq + 1);
    }
  }
  return f;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::uint64_t Bytes(const std::string& s) {
  StatusOr<std::uint64_t> b = ParseBytes(s);
  if (!b.ok()) {
    std::fprintf(stderr, "bad size %s: %s\n", s.c_str(), b.status().ToString().c_str());
    std::exit(2);
  }
  return *b;
}

// --ucx=KEY=VALUE;KEY=VALUE: extra UCX configuration for both sides
// (UcxTransportOptions::ucx_config), for tuning experiments.
std::vector<std::pair<std::string, std::string>> UcxConfig(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ';')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "bad --ucx entry '%s' (want KEY=VALUE)\n", item.c_str());
      std::exit(2);
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

// "sm" and "tcp" are shorthands for the two transport lists compared.
std::string TlsList(const std::string& name) {
  if (name == "sm") return "sm,self,tcp";
  return name;
}

std::string Hex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

using bench::Percentile;

// Server role: a transport listening on loopback with one exported region;
// prints "READY <address> <hex export>" and serves until stdin closes.
int RunServer(const std::map<std::string, std::string>& flags) {
  ucx::UcxTransportOptions options;
  options.tls = TlsList(flags.at("tls"));
  if (flags.count("ucx")) options.ucx_config = UcxConfig(flags.at("ucx"));
  auto t = ucx::CreateUcxTransport(options);
  if (!t.ok()) {
    std::fprintf(stderr, "server: %s\n", t.status().ToString().c_str());
    return 1;
  }
  std::mutex mu;
  std::vector<std::unique_ptr<Endpoint>> accepted;
  Status listening = (*t)->Listen("127.0.0.1:0", [&](std::unique_ptr<Endpoint> ep) {
    std::lock_guard<std::mutex> lock(mu);
    accepted.push_back(std::move(ep));
  });
  if (!listening.ok()) {
    std::fprintf(stderr, "server: %s\n", listening.ToString().c_str());
    return 1;
  }
  std::vector<std::byte> user;
  StatusOr<std::unique_ptr<MemoryRegion>> region = Status::Unknown("");
  if (flags.at("mem") == "user") {
    user.resize(kRegionBytes);
    region = (*t)->RegisterMemory(user, MemoryKind::kHost);
  } else {
    region = (*t)->AllocateMemory(kRegionBytes, MemoryKind::kHost);
  }
  if (!region.ok()) {
    std::fprintf(stderr, "server: %s\n", region.status().ToString().c_str());
    return 1;
  }
  std::memset((*region)->bytes().data(), 0x5a, kRegionBytes);
  StatusOr<std::string> exported = (*region)->Export(0, kRegionBytes);
  if (!exported.ok()) return 1;
  std::printf("READY %s %s\n", (*t)->listen_address().c_str(), Hex(*exported).c_str());
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    accepted.clear();
  }
  region->reset();
  return 0;
}

// A server child and the pipes to it.
struct ServerProcess {
  pid_t pid = -1;
  int to_child = -1;
  std::string address;
  std::string exported;

  ~ServerProcess() {
    if (to_child >= 0) close(to_child);
    if (pid > 0) {
      int status = 0;
      for (int i = 0; i < 100; ++i) {
        if (waitpid(pid, &status, WNOHANG) == pid) return;
        usleep(50 * 1000);
      }
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
};

bool StartServer(const std::string& tls, const std::string& mem, const std::string& ucx,
                 ServerProcess* s) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[1]);
    close(out[0]);
    const std::string a1 = "--tls=" + tls, a2 = "--mem=" + mem, a3 = "--ucx=" + ucx;
    execl("/proc/self/exe", "transport_bench", "--role=server", a1.c_str(), a2.c_str(),
          ucx.empty() ? nullptr : a3.c_str(), nullptr);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  s->pid = pid;
  s->to_child = in[1];
  // UCX logs warnings to stdout too: skip lines until READY.
  std::string line, ready, hex;
  char c;
  while (ready != "READY") {
    line.clear();
    bool eof = true;
    while (read(out[0], &c, 1) == 1) {
      eof = false;
      if (c == '\n') break;
      line.push_back(c);
    }
    if (eof) break;
    std::istringstream is(line);
    is >> ready >> s->address >> hex;
  }
  close(out[0]);
  if (ready != "READY") return false;
  s->exported = Unhex(hex);
  return true;
}

struct KvfResult {
  double gbps = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  int iters = 0;
  std::string error;
};

KvfResult RunKvf(Endpoint& ep, MemoryRegion& local, const RemoteRegion& remote, TransferOp op,
                 std::uint64_t size, int depth, std::uint64_t bytes_per_case, int max_iters) {
  std::vector<Transfer> ts(depth);
  const std::uint64_t slots = kRegionBytes / size;
  for (int i = 0; i < depth; ++i) {
    ts[i].op = op;
    ts[i].local = &local;
    ts[i].local_offset = (i % slots) * size;
    ts[i].remote = &remote;
    ts[i].remote_offset = (i % slots) * size;
    ts[i].length = size;
  }
  KvfResult r;
  auto one = [&]() -> Status {
    auto batch = ep.Submit(ts);
    if (!batch.ok()) return batch.status();
    KVF_RETURN_IF_ERROR((*batch)->Wait(Clock::now() + std::chrono::seconds(60)));
    return (*batch)->FirstError();
  };
  if (Status st = one(); !st.ok()) {  // warm-up
    r.error = st.ToString();
    return r;
  }
  const std::uint64_t per_batch = size * depth;
  const int iters = static_cast<int>(std::clamp<std::uint64_t>(
      bytes_per_case / per_batch, 3, static_cast<std::uint64_t>(max_iters)));
  std::vector<double> lat;
  lat.reserve(iters);
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    if (Status st = one(); !st.ok()) {
      r.error = st.ToString();
      return r;
    }
    lat.push_back(Seconds(Clock::now() - t0) * 1e3);
  }
  const double secs = Seconds(Clock::now() - start);
  r.iters = iters;
  r.gbps = static_cast<double>(per_batch) * iters / secs / 1e9;
  r.p50_ms = Percentile(lat, 0.50);
  r.p99_ms = Percentile(lat, 0.99);
  return r;
}

// --- Baselines -------------------------------------------------------------

// Single-thread memcpy of the bytes one batch moves, laid out as RunKvf
// lays them out: `depth` blocks of `size` at distinct offsets of a source
// and a destination buffer, batch after batch. At depth 1 it is one
// cache-resident block, as ucx_perftest's single buffer is; at depth 16
// the working set is 2 x 16 blocks, which is what the batch touches.
double MemcpyGbps(std::uint64_t size, int depth, std::uint64_t bytes_per_case) {
  const std::uint64_t blocks = std::min<std::uint64_t>(depth, kRegionBytes / size);
  std::vector<char> a(size * blocks, 1), b(size * blocks, 2);
  const std::uint64_t per_batch = size * depth;
  const int iters =
      static_cast<int>(std::clamp<std::uint64_t>(bytes_per_case / per_batch, 3, 2000));
  auto batch = [&] {
    for (int i = 0; i < depth; ++i) {
      const std::uint64_t off = (i % blocks) * size;
      std::memcpy(b.data() + off, a.data() + off, size);
    }
  };
  batch();  // fault in and warm up, as RunKvf's first batch does
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) batch();
  const double secs = Seconds(Clock::now() - start);
  volatile char sink = a[size / 2] + b[size / 3];
  (void)sink;
  return static_cast<double>(per_batch) * iters / secs / 1e9;
}

bool WriteAll(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// A forked receiver reads `iters` blocks of `size` bytes and acknowledges
// each with one byte; the sender times blocks until the last ack.
double SocketGbps(std::uint64_t size, std::uint64_t bytes_per_case) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    close(listener);
    return 0;
  }
  const int iters = static_cast<int>(std::clamp<std::uint64_t>(bytes_per_case / size, 3, 2000));
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) _exit(1);
    std::vector<char> buf(size);
    for (int i = 0; i < iters + 1; ++i) {
      if (!ReadAll(fd, buf.data(), size) || !WriteAll(fd, "k", 1)) _exit(1);
    }
    _exit(0);
  }
  const int fd = accept(listener, nullptr, nullptr);
  close(listener);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> buf(size, 7);
  char ack;
  double gbps = 0;
  bool ok = WriteAll(fd, buf.data(), size) && ReadAll(fd, &ack, 1);  // warm-up
  const auto start = Clock::now();
  for (int i = 0; ok && i < iters; ++i) {
    ok = WriteAll(fd, buf.data(), size) && ReadAll(fd, &ack, 1);
  }
  if (ok) gbps = static_cast<double>(size) * iters / Seconds(Clock::now() - start) / 1e9;
  close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  return gbps;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  close(fd);
  return port;
}

// Runs `cmd` with a shell (the UCX_TLS assignment is the child's
// environment) and returns its output, or "" on failure.
std::string Capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// One ucx_perftest server + client; MB/s (overall) from the "Final:" line.
double PerftestGbps(const std::string& tls, const std::string& test, std::uint64_t size,
                    std::uint64_t bytes_per_case) {
  const int port = FreePort();
  const int iters = static_cast<int>(std::clamp<std::uint64_t>(bytes_per_case / size, 8, 4000));
  // The same UCX settings kvfabric's transport makes (transport/ucx/
  // ucx_transport.h): with -e (peer error handling) shared memory needs
  // MM_ERROR_HANDLING, and protocol v2 stays off.
  const std::string env = "UCX_TLS=" + tls +
                          " UCX_MM_ERROR_HANDLING=y UCX_CMA_MEMORY_INVALIDATE=y"
                          " UCX_PROTO_ENABLE=n UCX_WARN_UNUSED_ENV_VARS=n ";
  const std::string server =
      env + "timeout 60 ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 & ";
  // The client retries until the server listens (it starts in ~0.1 s).
  const std::string client = "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.2; " + env +
                             "timeout 60 ucx_perftest 127.0.0.1 -p " + std::to_string(port) +
                             " -e -f -t " + test + " -s " + std::to_string(size) + " -n " +
                             std::to_string(iters) + " -w 3 2>/dev/null && break; done; wait";
  const std::string out = Capture("(" + server + client + ")");
  // With -f the last line is: iterations, latency 50%/average/overall (us),
  // bandwidth average/overall (MB/s), message rate average/overall.
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  }
  std::istringstream is(last);
  std::vector<std::string> fields;
  std::string word;
  while (is >> word) {
    if (word != "Final:") fields.push_back(word);
  }
  if (fields.size() < 7) return 0;
  return std::atof(fields[5].c_str()) / 1e3;  // MB/s -> GB/s
}

int RunClient(const std::map<std::string, std::string>& flags) {
  auto get = [&](const char* k, const char* def) {
    auto it = flags.find(k);
    return it == flags.end() ? std::string(def) : it->second;
  };
  const std::vector<std::string> tls_names = Split(get("tls", "sm,tcp"));
  const std::vector<std::string> mems = Split(get("mem", "alloc,user"));
  std::vector<std::uint64_t> sizes;
  for (const auto& s : Split(get("sizes", "64K,256K,1M,2M,16M,64M"))) sizes.push_back(Bytes(s));
  std::vector<int> depths;
  for (const auto& d : Split(get("depths", "1,16"))) depths.push_back(std::atoi(d.c_str()));
  const std::uint64_t bytes_per_case = Bytes(get("bytes_per_case", "256M"));
  const int max_iters = std::atoi(get("max_iters", "200").c_str());
  const bool perftest = get("perftest", "1") == "1";
  const std::uint64_t perftest_bytes = Bytes(get("perftest_bytes", "256M"));
  const auto run_start = Clock::now();

  // Baselines that fork run first, before any UCX thread exists.
  std::map<std::pair<std::uint64_t, int>, double> memcpy_gbps;
  std::map<std::uint64_t, double> socket_gbps;
  for (std::uint64_t size : sizes) {
    for (int depth : depths) memcpy_gbps[{size, depth}] = MemcpyGbps(size, depth, bytes_per_case);
    socket_gbps[size] = SocketGbps(size, bytes_per_case);
  }
  // ucx_perftest: best operation per transport list and size.
  std::map<std::pair<std::string, std::uint64_t>, std::pair<double, std::string>> best;
  if (perftest) {
    for (const auto& name : tls_names) {
      for (std::uint64_t size : sizes) {
        auto& b = best[{name, size}];
        for (const char* test : {"ucp_get", "ucp_put_bw", "ucp_am_bw", "tag_bw"}) {
          const double g = PerftestGbps(TlsList(name), test, size, perftest_bytes);
          std::fprintf(stderr, "perftest %-3s %-10s %8s %7.2f GB/s\n", name.c_str(), test,
                       FormatBytes(size).c_str(), g);
          if (g > b.first) b = {g, test};
        }
      }
    }
  }

  std::printf("%-3s %-5s %-5s %7s %5s | %7s %8s %8s | %7s %-10s %7s %7s | %6s %6s %6s\n", "tls",
              "mem", "op", "size", "depth", "kvfGB/s", "p50ms", "p99ms", "ptGB/s", "pt-op",
              "memcpy", "socket", "/pt", "/memcpy", "/socket");
  int failures = 0;
  for (const auto& name : tls_names) {
    for (const auto& mem : mems) {
      ServerProcess server;
      if (!StartServer(name, mem, get("ucx", ""), &server)) {
        std::fprintf(stderr, "cannot start the server for tls=%s mem=%s\n", name.c_str(),
                     mem.c_str());
        return 1;
      }
      ucx::UcxTransportOptions options;
      options.tls = TlsList(name);
      options.ucx_config = UcxConfig(get("ucx", ""));
      if (flags.count("inline_max")) options.inline_copy_max_bytes = Bytes(flags.at("inline_max"));
      auto t = ucx::CreateUcxTransport(options);
      if (!t.ok()) {
        std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
        return 1;
      }
      auto ep = (*t)->Connect(server.address, transport::PeerFailureMode::kFailInFlight,
                              Clock::now() + std::chrono::seconds(10));
      if (!ep.ok()) {
        std::fprintf(stderr, "%s\n", ep.status().ToString().c_str());
        return 1;
      }
      auto remote = (*ep)->ImportRegion(server.exported);
      std::vector<std::byte> user;
      StatusOr<std::unique_ptr<MemoryRegion>> local = Status::Unknown("");
      if (mem == "user") {
        user.resize(kRegionBytes);
        local = (*t)->RegisterMemory(user, MemoryKind::kHost);
      } else {
        local = (*t)->AllocateMemory(kRegionBytes, MemoryKind::kHost);
      }
      if (!remote.ok() || !local.ok()) {
        std::fprintf(stderr, "import/register failed\n");
        return 1;
      }
      std::memset((*local)->bytes().data(), 0x33, kRegionBytes);
      for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
        for (std::uint64_t size : sizes) {
          for (int depth : depths) {
            KvfResult r =
                RunKvf(**ep, **local, **remote, op, size, depth, bytes_per_case, max_iters);
            if (!r.error.empty()) {
              ++failures;
              std::printf("%-3s %-5s %-5s %7s %5d | FAILED: %s\n", name.c_str(), mem.c_str(),
                          op == TransferOp::kRead ? "read" : "write", FormatBytes(size).c_str(),
                          depth, r.error.c_str());
              continue;
            }
            const auto& [pt, pt_op] = best[{name, size}];
            auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
            std::printf(
                "%-3s %-5s %-5s %7s %5d | %7.2f %8.3f %8.3f | %7.2f %-10s %7.2f %7.2f | %6.2f "
                "%6.2f %6.2f\n",
                name.c_str(), mem.c_str(), op == TransferOp::kRead ? "read" : "write",
                FormatBytes(size).c_str(), depth, r.gbps, r.p50_ms, r.p99_ms, pt,
                pt_op.empty() ? "-" : pt_op.c_str(), memcpy_gbps[{size, depth}], socket_gbps[size],
                ratio(r.gbps, pt), ratio(r.gbps, memcpy_gbps[{size, depth}]),
                ratio(r.gbps, socket_gbps[size]));
            std::fflush(stdout);
          }
        }
      }
      remote->reset();
      local->reset();
      ep->reset();
    }
  }
  std::printf("total run time %.1f s\n", Seconds(Clock::now() - run_start));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvfabric::bench

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  const auto flags = kvfabric::bench::ParseFlags(argc, argv);
  auto it = flags.find("role");
  if (it != flags.end() && it->second == "server") return kvfabric::bench::RunServer(flags);
  return kvfabric::bench::RunClient(flags);
}
