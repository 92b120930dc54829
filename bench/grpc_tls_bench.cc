// What transport security costs a kvfabric control-plane call: unary gRPC
// round trips and fresh-connection set-up on loopback, plaintext (the
// baseline, measured in the same run) against TLS and mutual TLS with
// certificates issued at run time, through security/grpc_security.h as the
// daemons and libkvfabric use it. The call is CacheHost.Lookup of `keys`
// 32-byte keys answered by an in-process service that echoes nothing back
// (the handler's own work is not what is measured).
//
//   bazel run -c opt //bench:grpc_tls_bench -- [--calls 4000] [--connections 200] [--keys 16]
//
// Prints, per mode: p50/p90/p99 of a call on a warm channel, calls/s on one
// thread, the p50 time to a fresh channel's first answer (the TCP and TLS
// handshakes), and each as a ratio to plaintext; then plaintext once more
// ("pt-again"), whose ratios are the machine's noise floor.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "security/grpc_security.h"
#include "security/testing/test_pki.h"

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;

class Echo final : public v1::CacheHost::Service {
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest*,
                      v1::LookupResponse*) override {
    return grpc::Status::OK;
  }
};

struct Mode {
  const char* name;
  GrpcSecurityOptions server;
  GrpcSecurityOptions client;
};

struct Figures {
  double p50_us = 0, p90_us = 0, p99_us = 0, calls_per_s = 0, connect_p50_us = 0;
};

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

Figures Measure(const Mode& m, int calls, int connections, int keys) {
  Echo service;
  grpc::ServerBuilder b;
  int port = 0;
  auto creds = MakeServerCredentials(m.server, "127.0.0.1:0");
  if (!creds.ok()) {
    std::fprintf(stderr, "%s: %s\n", m.name, creds.status().ToString().c_str());
    std::exit(1);
  }
  b.AddListeningPort("127.0.0.1:0", *creds, &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  v1::LookupRequest req;
  req.set_namespace_("bench");
  for (int i = 0; i < keys; ++i) req.add_keys(std::string(32, static_cast<char>('a' + i % 26)));

  Figures f;
  // Warm channel: per-call latency.
  auto channel = OpenSecureChannel(address, m.client, grpc::ChannelArguments());
  auto stub = v1::CacheHost::NewStub(*channel);
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(calls));
  for (int i = 0; i < calls / 10 + 1; ++i) {  // warm-up
    grpc::ClientContext ctx;
    v1::LookupResponse r;
    stub->Lookup(&ctx, req, &r);
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext ctx;
    v1::LookupResponse r;
    const auto s = Clock::now();
    if (!stub->Lookup(&ctx, req, &r).ok()) std::exit(1);
    lat.push_back(Us(Clock::now() - s));
  }
  f.calls_per_s = calls / std::chrono::duration<double>(Clock::now() - t0).count();
  f.p50_us = bench::Percentile(lat, 0.5);
  f.p90_us = bench::Percentile(lat, 0.9);
  f.p99_us = bench::Percentile(lat, 0.99);
  // Fresh channels: connection set-up to the first answer. A unique channel
  // argument keeps gRPC from reusing a pooled subchannel.
  std::vector<double> connect;
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("kvfabric.bench.unique", i);
    auto fresh = OpenSecureChannel(address, m.client, args);
    auto s2 = v1::CacheHost::NewStub(*fresh);
    grpc::ClientContext ctx;
    v1::LookupResponse r;
    const auto s = Clock::now();
    if (!s2->Lookup(&ctx, req, &r).ok()) std::exit(1);
    connect.push_back(Us(Clock::now() - s));
  }
  f.connect_p50_us = bench::Percentile(connect, 0.5);
  server->Shutdown();
  return f;
}

int Main(int argc, char** argv) {
  CLI::App app{"grpc_tls_bench: what TLS and mutual TLS cost a control-plane call"};
  int calls = 4000, connections = 200, keys = 16;
  app.add_option("--calls", calls, "calls on one warm channel per mode");
  app.add_option("--connections", connections, "fresh channels per mode");
  app.add_option("--keys", keys, "32-byte keys per Lookup");
  CLI11_PARSE(app, argc, argv);

  char tmpl[] = "/tmp/kvf_tls_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  testing::TestPki pki(dir, "bench CA");
  const auto server_pair = pki.Issue("server", {"IP:127.0.0.1"});
  const auto client_pair = pki.Issue("client", {"DNS:client.example"});

  std::vector<Mode> modes(4);
  modes[0].name = "plaintext";
  modes[0].server.insecure = modes[0].client.insecure = true;
  modes[1].name = "tls";
  modes[1].server.cert_file = server_pair.cert;
  modes[1].server.key_file = server_pair.key;
  modes[1].client.ca_file = pki.ca_file();
  modes[2].name = "mutual-tls";
  modes[2].server = modes[1].server;
  modes[2].server.ca_file = pki.ca_file();
  modes[2].client = modes[1].client;
  modes[2].client.cert_file = client_pair.cert;
  modes[2].client.key_file = client_pair.key;
  // Plaintext again, last: how far two identical runs differ on this
  // machine (the noise floor of every ratio above it).
  modes[3] = modes[0];
  modes[3].name = "pt-again";

  std::printf(
      "Lookup of %d keys on loopback: %d calls per mode on a warm channel, %d fresh "
      "channels\n",
      keys, calls, connections);
  std::printf("%-11s %9s %9s %9s %10s %12s | %8s %8s %10s\n", "mode", "p50 us", "p90 us", "p99 us",
              "calls/s", "connect us", "p50/pt", "p99/pt", "connect/pt");
  Figures base;
  for (const Mode& m : modes) {
    const Figures f = Measure(m, calls, connections, keys);
    if (std::string(m.name) == "plaintext") base = f;
    std::printf("%-11s %9.1f %9.1f %9.1f %10.0f %12.1f | %8.2f %8.2f %10.2f\n", m.name, f.p50_us,
                f.p90_us, f.p99_us, f.calls_per_s, f.connect_p50_us, f.p50_us / base.p50_us,
                f.p99_us / base.p99_us, f.connect_p50_us / base.connect_p50_us);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) { return kvfabric::Main(argc, argv); }
