// What TLS costs the kernel-TCP data plane (kvfabric-cached --data-plane-tls):
// bytes moved by kWrite (client region -> daemon region) and kRead (back) on
// loopback between two kernel-TCP transports in this process, plaintext (the
// baseline, measured in the same run) against TLS 1.3 with certificates
// issued at run time, then plaintext again (the noise floor), beside a
// single-thread memcpy of the same bytes.
//
//   bazel run -c opt //bench:tcp_tls_bench -- [--total-mib 1024] [--entry-mib 4] [--depth 4]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "security/testing/test_pki.h"
#include "transport/tcp/tcp_tls.h"
#include "transport/tcp/tcp_transport.h"

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Transfer;
using transport::TransferOp;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Result {
  double write_gbs = 0, read_gbs = 0;
};

// GB/s of `op` moving `total` bytes in entries of `entry` bytes, `depth`
// entries per batch.
double Move(transport::Endpoint* ep, TransferOp op, transport::MemoryRegion* local,
            const transport::RemoteRegion* remote, std::uint64_t total, std::uint64_t entry,
            int depth) {
  const std::uint64_t region = local->bytes().size();
  const auto t0 = Clock::now();
  std::uint64_t moved = 0, offset = 0;
  while (moved < total) {
    std::vector<Transfer> batch;
    for (int i = 0; i < depth && moved < total; ++i) {
      if (offset + entry > region) offset = 0;
      batch.push_back({.op = op,
                       .local = local,
                       .local_offset = offset,
                       .length = entry,
                       .remote = remote,
                       .remote_offset = offset,
                       .header = {}});
      offset += entry;
      moved += entry;
    }
    auto b = ep->Submit(batch);
    if (!b.ok() || !(*b)->Wait(Clock::now() + std::chrono::seconds(60)).ok() ||
        !(*b)->FirstError().ok()) {
      std::fprintf(stderr, "transfer failed\n");
      std::exit(1);
    }
  }
  return moved / Seconds(Clock::now() - t0) / 1e9;
}

Result Measure(std::shared_ptr<const tcp::TcpTls> tls, std::uint64_t total, std::uint64_t entry,
               int depth) {
  tcp::TcpTransportOptions o;
  o.tls = tls;
  auto server = tcp::CreateTcpTransport(o);
  auto client = tcp::CreateTcpTransport(o);
  if (!server.ok() || !client.ok()) std::exit(1);
  std::unique_ptr<transport::Endpoint> accepted;
  if (!(*server)
           ->Listen("127.0.0.1:0",
                    [&](std::unique_ptr<transport::Endpoint> ep) { accepted = std::move(ep); })
           .ok()) {
    std::exit(1);
  }
  const std::uint64_t region_bytes = std::uint64_t{entry} * depth * 4;
  auto target = (*server)->AllocateMemory(region_bytes, transport::MemoryKind::kHost);
  auto source = (*client)->AllocateMemory(region_bytes, transport::MemoryKind::kHost);
  std::memset((*source)->bytes().data(), 0x5a, region_bytes);
  auto ep =
      (*client)->Connect((*server)->listen_address(), transport::PeerFailureMode::kFailInFlight,
                         Clock::now() + std::chrono::seconds(10));
  if (!ep.ok()) {
    std::fprintf(stderr, "connect: %s\n", ep.status().ToString().c_str());
    std::exit(1);
  }
  auto remote = (*ep)->ImportRegion(*(*target)->Export(0, region_bytes));
  Move(ep->get(), TransferOp::kWrite, source->get(), remote->get(), region_bytes, entry,
       depth);  // warm-up
  Result r;
  r.write_gbs =
      Move(ep->get(), TransferOp::kWrite, source->get(), remote->get(), total, entry, depth);
  r.read_gbs =
      Move(ep->get(), TransferOp::kRead, source->get(), remote->get(), total, entry, depth);
  remote->reset();
  ep->reset();
  return r;
}

double MemcpyGbs(std::uint64_t total, std::uint64_t entry) {
  std::vector<char> a(entry, 1), b(entry);
  const auto t0 = Clock::now();
  for (std::uint64_t moved = 0; moved < total; moved += entry) {
    std::memcpy(b.data(), a.data(), entry);
    a[moved % entry] = b[(moved + 1) % entry];  // keep the copies observable
  }
  return total / Seconds(Clock::now() - t0) / 1e9;
}

int Main(int argc, char** argv) {
  CLI::App app{"tcp_tls_bench: what TLS costs the kernel-TCP data plane"};
  std::uint64_t total_mib = 1024, entry_mib = 4;
  int depth = 4;
  app.add_option("--total-mib", total_mib, "MiB moved per direction and mode");
  app.add_option("--entry-mib", entry_mib, "MiB per transfer entry");
  app.add_option("--depth", depth, "entries per batch");
  CLI11_PARSE(app, argc, argv);
  const std::uint64_t total = total_mib << 20, entry = entry_mib << 20;

  char tmpl[] = "/tmp/kvf_tcp_tls_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  testing::TestPki pki(dir, "bench CA");
  const auto cert = pki.Issue("daemon", {"IP:127.0.0.1"});
  tcp::TcpTlsOptions to;
  to.cert_file = cert.cert;
  to.key_file = cert.key;
  to.ca_file = pki.ca_file();
  auto tls = tcp::TcpTls::Create(to);
  if (!tls.ok()) return 1;

  const double memcpy_gbs = MemcpyGbs(total, entry);
  std::printf(
      "loopback, %llu MiB per direction in %llu MiB entries, %d per batch; memcpy %.2f "
      "GB/s\n",
      static_cast<unsigned long long>(total_mib), static_cast<unsigned long long>(entry_mib), depth,
      memcpy_gbs);
  std::printf("%-10s %10s %10s | %8s %8s | %9s %9s\n", "mode", "write GB/s", "read GB/s",
              "write/pt", "read/pt", "w/memcpy", "r/memcpy");
  const Result pt = Measure(nullptr, total, entry, depth);
  const Result t = Measure(*tls, total, entry, depth);
  const Result again = Measure(nullptr, total, entry, depth);
  for (const auto& [name, r] :
       {std::pair{"plaintext", pt}, std::pair{"tls1.3", t}, std::pair{"pt-again", again}}) {
    std::printf("%-10s %10.2f %10.2f | %8.2f %8.2f | %9.2f %9.2f\n", name, r.write_gbs, r.read_gbs,
                r.write_gbs / pt.write_gbs, r.read_gbs / pt.read_gbs, r.write_gbs / memcpy_gbs,
                r.read_gbs / memcpy_gbs);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) { return kvfabric::Main(argc, argv); }
