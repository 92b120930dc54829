// Cross-process tests of `kvfabric-cached`: a real daemon on loopback, this
// test as its client over gRPC (control) and UCX (data, owner-driven).
//
//   PutsAndGets2GiBThroughUcxWithChecksums  1,024 blocks of 2 MiB put, then
//       leased and read back; every byte compared; SIGTERM then exits 0.
//   SigkillDuringWritesThenRestartRecoversNvmeBlocks  a small pool demotes to
//       NVMe; every block the daemon reported on NVMe before a SIGKILL (taken
//       while writes are in flight) is served intact after a restart.
//
// The daemon binary is $KVF_CACHED (the build sets it), else
// "kvfabric-cached" beside this test binary (tests/server_process.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "client/data_plane_client.h"
#include "core/crc32c.h"
#include "core/testing/test_seed.h"
#include "core/testing/wait_for.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "tests/cache_host_test_client.h"
#include "tests/server_process.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kRegion = 1;  // the region id CacheHostTestClient exports

// GET of an http://127.0.0.1:PORT/path URL; the whole response, or "".
std::string HttpGet(const std::string& url) {
  const std::string rest = url.substr(url.find("//") + 2);
  const std::string hostport = rest.substr(0, rest.find('/'));
  const std::string path = rest.substr(rest.find('/'));
  const int port = std::stoi(hostport.substr(hostport.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + hostport + "\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

class CacheHostDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    char tmpl[] = "/tmp/kvf_daemon_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto c = testing::CacheHostTestClient::Create(seed_, "sm,self,tcp");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }

  void TearDown() override {
    daemon_.reset();
    client_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon(std::vector<std::string> args) {
    std::vector<std::string> all;
    // Defaults, unless `args` names the flag itself.
    for (std::string d : {"--host-id=test-daemon", "--insecure", "--grpc-address=127.0.0.1:0",
                          "--transport-address=127.0.0.1:0", "--metrics-address=127.0.0.1:0",
                          "--admin-address=127.0.0.1:0", "--lock-memory=off", "--log-level=warn"}) {
      const std::string flag = d.find('=') == std::string::npos ? d : d.substr(0, d.find('=') + 1);
      if (std::none_of(args.begin(), args.end(),
                       [&](const std::string& a) { return a.rfind(flag, 0) == 0; })) {
        all.push_back(d);
      }
    }
    all.insert(all.end(), args.begin(), args.end());
    if (std::find(args.begin(), args.end(), "--data-transport=tcp") != args.end()) {
      // The daemon speaks the kernel-socket transport: so must the client.
      auto c = testing::CacheHostTestClient::Create(seed_, testing::kKernelTcp);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      client_ = std::move(*c);
    }
    auto d = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cached", dir_, all);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    admin_stub_ = v1::CacheHost::NewStub(
        grpc::CreateChannel(daemon_->Get("admin"), grpc::InsecureChannelCredentials()));
    Status s = client_->Attach(daemon_->grpc(), daemon_->transport());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  void PutAndGetFromConcurrentClients(const std::string& transport, std::uint64_t seed);
  void ExpectCommitsAndNoCrcFailures(std::uint64_t commits);

  Status PutBatch(int first, int n) { return client_->PutBatch(first, n); }
  Status GetBatch(const std::vector<int>& ids) { return client_->GetBatch(ids); }
  std::string Key(int i) const { return client_->Key(i); }
  static v1::ModelFingerprint Fingerprint() { return testing::CacheHostTestClient::Fingerprint(); }
  v1::CacheHost::Stub* stub() { return client_->stub(); }
  // The daemon's admin listener (Delete, Drain, Stats with namespaces).
  v1::CacheHost::Stub* admin_stub() { return admin_stub_.get(); }

  std::uint64_t seed_ = 0;
  std::string dir_;
  std::unique_ptr<testing::CacheHostTestClient> client_;
  std::unique_ptr<testing::ServerProcess> daemon_;
  std::unique_ptr<v1::CacheHost::Stub> admin_stub_;
};

TEST_F(CacheHostDaemonTest, PutsAndGets2GiBThroughUcxWithChecksums) {
  constexpr int kBlocks = 1024;  // 2 GiB
  StartDaemon({"--host-pool-bytes=2080MiB", "--host-page-bytes=2MiB",
               "--host-high-watermark=1.0", "--host-low-watermark=1.0",
               "--eviction-policy=lru"});
  for (int i = 0; i < kBlocks; i += 16) {
    Status s = PutBatch(i, 16);
    ASSERT_TRUE(s.ok()) << "put " << i << ": " << s.ToString();
  }
  for (int i = 0; i < kBlocks; i += 16) {
    std::vector<int> ids;
    for (int k = 0; k < 16; ++k) ids.push_back(i + k);
    Status s = GetBatch(ids);
    ASSERT_TRUE(s.ok()) << "get " << i << ": " << s.ToString();
  }
  v1::StatsRequest sreq;
  v1::StatsResponse stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub()->Stats(&ctx, sreq, &stats).ok());
  EXPECT_EQ(stats.commits_total(), static_cast<std::uint64_t>(kBlocks));
  EXPECT_EQ(stats.hits_total(), static_cast<std::uint64_t>(kBlocks));
  EXPECT_EQ(stats.crc_failures_total(), 0u);
  // /metrics reports the same work, in Prometheus' text format.
  const std::string metrics = HttpGet(daemon_->metrics());
  EXPECT_NE(metrics.find("kvfabric_cache_host_commits_total 1024"), std::string::npos)
      << metrics.substr(0, 2000);
  EXPECT_NE(metrics.find("kvfabric_cache_host_transfer_bytes_total{direction=\"get\"} 2147483648"),
            std::string::npos);
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
}

// Four clients over `transport` at once, each putting 32 blocks (64 MiB) and
// getting them back in reverse order within each batch of 16: every byte
// each one puts comes back to it exactly while the others run. Deletes the
// blocks afterwards so the pool serves the next call.
void CacheHostDaemonTest::PutAndGetFromConcurrentClients(const std::string& transport,
                                                        std::uint64_t seed) {
  SCOPED_TRACE(transport);
  constexpr int kClients = 4;
  constexpr int kBlocks = 32;
  std::vector<std::unique_ptr<testing::CacheHostTestClient>> clients;
  for (int c = 0; c < kClients; ++c) {
    // Each client its own seed, so its own keys and payloads.
    auto client = testing::CacheHostTestClient::Create(seed + 1000 * (c + 1), transport);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_TRUE((*client)->Attach(daemon_->grpc(), daemon_->transport()).ok());
    clients.push_back(std::move(*client));
  }
  std::vector<Status> results(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Status s;
      for (int i = 0; s.ok() && i < kBlocks; i += 16) s = clients[c]->PutBatch(i, 16);
      for (int i = 0; s.ok() && i < kBlocks; i += 16) {
        std::vector<int> ids;
        for (int k = 15; k >= 0; --k) ids.push_back(i + k);
        s = clients[c]->GetBatch(ids);
      }
      results[c] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) {
    EXPECT_TRUE(results[c].ok()) << "client " << c << ": " << results[c].ToString();
  }
  for (int c = 0; c < kClients; ++c) {
    v1::DeleteRequest req;
    for (int i = 0; i < kBlocks; ++i) req.add_keys(clients[c]->Key(i));
    v1::DeleteResponse resp;
    grpc::ClientContext open_ctx;
    // Delete acts on every tenant: the public listener refuses it.
    EXPECT_EQ(clients[c]->stub()->Delete(&open_ctx, req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_stub()->Delete(&ctx, req, &resp).ok());
  }
}

void CacheHostDaemonTest::ExpectCommitsAndNoCrcFailures(std::uint64_t commits) {
  v1::StatsRequest sreq;
  v1::StatsResponse stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub()->Stats(&ctx, sreq, &stats).ok());
  EXPECT_EQ(stats.commits_total(), commits);
  EXPECT_EQ(stats.crc_failures_total(), 0u);
}

// A daemon with three data-plane workers (--data-workers) and four client
// connections at once, over shared memory and over TCP only: each client's
// connection lands on a worker in turn.
TEST_F(CacheHostDaemonTest, DataWorkersServeConcurrentClientsExactly) {
  StartDaemon({"--host-pool-bytes=544MiB", "--host-page-bytes=2MiB",
               "--host-high-watermark=1.0", "--host-low-watermark=1.0", "--eviction-policy=lru",
               "--data-workers=3"});
  PutAndGetFromConcurrentClients("sm,self,tcp", seed_);
  PutAndGetFromConcurrentClients("tcp", seed_ + 7);
  ExpectCommitsAndNoCrcFailures(2 * 4 * 32);

  // A kernel-TCP client of this UCX daemon is refused, not left hanging.
  auto tcp_client = testing::CacheHostTestClient::Create(seed_ + 99, testing::kKernelTcp);
  ASSERT_TRUE(tcp_client.ok()) << tcp_client.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  const Status refused = (*tcp_client)->Attach(daemon_->grpc(), daemon_->transport());
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.ToString().find("same data transport"), std::string::npos) << refused;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
}

// The same over the kernel-socket transport (--data-transport=tcp) with two
// workers; a UCX client is refused with an error, not left hanging.
TEST_F(CacheHostDaemonTest, KernelTcpDataTransportServesConcurrentClientsExactly) {
  StartDaemon({"--host-pool-bytes=544MiB", "--host-page-bytes=2MiB",
               "--host-high-watermark=1.0", "--host-low-watermark=1.0", "--eviction-policy=lru",
               "--data-transport=tcp", "--data-workers=2"});
  PutAndGetFromConcurrentClients(testing::kKernelTcp, seed_);
  ExpectCommitsAndNoCrcFailures(4 * 32);

  auto ucx_client = testing::CacheHostTestClient::Create(seed_ + 99, "tcp");
  ASSERT_TRUE(ucx_client.ok()) << ucx_client.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE((*ucx_client)->Attach(daemon_->grpc(), daemon_->transport()).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
}

TEST_F(CacheHostDaemonTest, SigkillDuringWritesThenRestartRecoversNvmeBlocks) {
  const std::vector<std::string> args = {
      "--host-pool-bytes=64MiB", "--host-page-bytes=2MiB", "--nvme-dir=" + dir_ + "/nvme",
      "--nvme-capacity-bytes=2GiB", "--nvme-io-engine=threads", "--eviction-policy=lru"};
  StartDaemon(args);
  constexpr int kBlocks = 96;  // 192 MiB through a 64 MiB pool
  for (int i = 0; i < kBlocks; i += 8) {
    Status s = PutBatch(i, 8);
    ASSERT_TRUE(s.ok()) << "put " << i << ": " << s.ToString();
  }
  // What the daemon says is on NVMe now is durable (docs/nvme-tier.md).
  v1::LookupRequest lreq;
  for (int i = 0; i < kBlocks; ++i) lreq.add_keys(Key(i));
  v1::LookupResponse lresp;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub()->Lookup(&lctx, lreq, &lresp).ok());
  std::vector<int> durable;
  for (int i = 0; i < kBlocks; ++i) {
    if (lresp.results(i).status().code() == 0 && lresp.results(i).tier() == v1::TIER_NVME) {
      durable.push_back(i);
    }
  }
  ASSERT_GT(durable.size(), 16u);
  // The daemon explains why a block left its host pool.
  v1::ExplainEvictionRequest ereq;
  ereq.set_key(Key(durable[0]));
  v1::ExplainEvictionResponse eresp;
  grpc::ClientContext ectx;
  ASSERT_TRUE(stub()->ExplainEviction(&ectx, ereq, &eresp).ok());
  ASSERT_GE(eresp.decisions_size(), 1);
  EXPECT_EQ(eresp.decisions(0).action(), "demote");
  EXPECT_FALSE(eresp.decisions(0).explanation().empty());
  // Keep writing, and kill the daemon in the middle of it: once a batch of
  // the writer has gone through, the next one is on its way.
  std::atomic<bool> stop{false};
  std::atomic<int> batches_written{0};
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    for (int i = kBlocks; i < kBlocks + 64 && !stop.load(); i += 8) {
      if (!PutBatch(i, 8).ok()) break;  // fails once the daemon is dead
      batches_written.fetch_add(1);
    }
    writer_done.store(true);
  });
  EXPECT_TRUE(WaitFor([&] { return batches_written.load() >= 1 || writer_done.load(); },
                      std::chrono::seconds(60), "the writer's first batch"));
  daemon_->Kill(SIGKILL);
  stop = true;
  writer.join();

  StartDaemon(args);
  for (std::size_t k = 0; k < durable.size(); k += 8) {
    std::vector<int> ids(durable.begin() + k,
                         durable.begin() + std::min(durable.size(), k + 8));
    Status s = GetBatch(ids);
    ASSERT_TRUE(s.ok()) << "after restart: " << s.ToString();
  }
  v1::StatsRequest sreq;
  v1::StatsResponse stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub()->Stats(&ctx, sreq, &stats).ok());
  EXPECT_GE(stats.recovered_blocks(), durable.size());
}

// An operator watches a drain on the dashboard: /metrics answers (with the
// draining state) for as long as the daemon waits for its clients' leases,
// until it exits.
// A transport list naming what this machine lacks (ugni: Cray's network)
// gets one warning in the daemon's log while it runs, naming the missing
// item and what UCX found; UCX's own message is not printed at exit.
TEST_F(CacheHostDaemonTest, AMissingUcxTransportIsOneWarningInTheLogAtStartUp) {
  const std::string log = dir_ + "/cached.log";
  StartDaemon({"--host-pool-bytes=64MiB", "--host-page-bytes=2MiB", "--ucx-tls=ugni,sm,self,tcp",
               "--log-file=" + log});
  ASSERT_TRUE(PutBatch(0, 2).ok());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string warning =
      "--ucx-tls \"ugni,sm,self,tcp\": ugni is not available on this machine (UCX finds: ";
  const std::size_t at = text.find(warning);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find(warning, at + 1), std::string::npos) << "warned twice:\n" << text;
  EXPECT_NE(text.find("using sm, self, tcp only"), std::string::npos) << text;
  EXPECT_EQ(text.find("UCX  WARN"), std::string::npos) << text;
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
}

TEST_F(CacheHostDaemonTest, MetricsServeThroughoutTheDrain) {
  StartDaemon({"--host-pool-bytes=64MiB", "--host-page-bytes=2MiB", "--shutdown-grace=4s"});
  ASSERT_TRUE(PutBatch(0, 2).ok());
  // A read lease the client holds across the SIGTERM: the drain waits for it.
  v1::LeaseRequest lreq;
  lreq.add_keys(Key(0));
  lreq.set_ttl_ms(20000);
  v1::LeaseResponse lresp;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub()->Lease(&lctx, lreq, &lresp).ok());
  ASSERT_EQ(lresp.results(0).status().code(), 0);
  const auto start = Clock::now();
  daemon_->Kill(SIGTERM);
  int answered = 0;
  bool saw_draining = false;
  while (Clock::now() - start < std::chrono::seconds(3)) {
    const std::string page = HttpGet(daemon_->metrics());
    if (page.find(" 200 ") != std::string::npos) ++answered;
    saw_draining = saw_draining || page.find("kvfabric_cache_host_serving{state=\"draining\"} 1") !=
                                       std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_GE(answered, 10) << "/metrics stopped answering during the drain";
  EXPECT_TRUE(saw_draining);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
}

TEST_F(CacheHostDaemonTest, StalledClientsLeasesExpireAndTheirPagesReturn) {
  StartDaemon({"--host-pool-bytes=64MiB", "--host-page-bytes=2MiB"});
  ASSERT_TRUE(PutBatch(0, 4).ok());
  // A read lease of 300 ms that the client lets run out before reading.
  v1::LeaseRequest lreq;
  lreq.add_keys(Key(0));
  lreq.set_ttl_ms(300);
  v1::LeaseResponse lresp;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub()->Lease(&lctx, lreq, &lresp).ok());
  ASSERT_EQ(lresp.results(0).status().code(), 0);
  // A reservation of 300 ms that is never put or committed.
  v1::ReserveRequest rreq;
  *rreq.mutable_fingerprint() = Fingerprint();
  v1::BlockDescriptor* b = rreq.add_blocks();
  b->set_key(Key(99));
  b->set_payload_bytes(testing::kTestBlockBytes);
  b->set_representation(v1::REPRESENTATION_EXACT);
  b->set_format_version(1);
  b->set_token_count(16);
  rreq.set_ttl_ms(300);
  v1::ReserveResponse rresp;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub()->Reserve(&rctx, rreq, &rresp).ok());
  ASSERT_EQ(rresp.results(0).status().code(), 0);
  // The stall: the client does nothing until the daemon reports both expired
  // (its maintenance pass runs on the daemon's own clock, in its process).
  ASSERT_TRUE(WaitFor(
      [&] {
        v1::StatsResponse stats;
        grpc::ClientContext ctx;
        return stub()->Stats(&ctx, v1::StatsRequest(), &stats).ok() &&
               stats.read_leases_expired_total() >= 1 && stats.reservations_expired_total() >= 1;
      },
      std::chrono::seconds(30), "the daemon to expire the 300 ms lease and reservation"));

  std::array<std::uint8_t, 16> token{};
  std::memcpy(token.data(), lresp.grant().access_token().data(), 16);
  std::vector<wire::TransferRange> ranges = {
      {lresp.results(0).extents(0).offset_bytes(), testing::kTestBlockBytes, 32 << 20}};
  Status late = client_->data()->Transfer(client_->connection(), client::DataOp::kGet, lresp.lease_id(), token, kRegion,
                                ranges, Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(late.IsNotFound()) << late.ToString();
  std::memcpy(token.data(), rresp.grant().access_token().data(), 16);
  ranges = {{rresp.results(0).extents(0).offset_bytes(), testing::kTestBlockBytes, 0}};
  late = client_->data()->Transfer(client_->connection(), client::DataOp::kPut, rresp.lease_id(), token, kRegion, ranges,
                         Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(late.IsNotFound()) << late.ToString();

  v1::StatsResponse stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub()->Stats(&sctx, v1::StatsRequest(), &stats).ok());
  EXPECT_GE(stats.read_leases_expired_total(), 1u);
  EXPECT_GE(stats.reservations_expired_total(), 1u);
  EXPECT_EQ(stats.tiers(0).reserved_bytes(), 0u);
  EXPECT_EQ(stats.tiers(0).leased_bytes(), 0u);
  // The block itself is still there for a client that is on time.
  EXPECT_TRUE(GetBatch({0}).ok());
}

TEST_F(CacheHostDaemonTest, CorruptedSegmentByteIsDetectedAndNeverServed) {
  const std::vector<std::string> args = {
      "--host-pool-bytes=64MiB", "--host-page-bytes=2MiB", "--nvme-dir=" + dir_ + "/nvme",
      "--nvme-capacity-bytes=1GiB", "--nvme-io-engine=threads", "--eviction-policy=lru"};
  StartDaemon(args);
  constexpr int kBlocks = 64;
  for (int i = 0; i < kBlocks; i += 8) ASSERT_TRUE(PutBatch(i, 8).ok());
  daemon_->Kill(SIGTERM);
  ASSERT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0);
  // One flipped byte inside the first record's payload of every segment.
  int flipped = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_ + "/nvme")) {
    if (f.path().filename().string().rfind("catalog", 0) == 0) continue;
    if (std::filesystem::file_size(f.path()) < (1 << 20)) continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(64 << 10);
    char c = 0;
    io.read(&c, 1);
    c ^= 0x01;
    io.seekp(64 << 10);
    io.write(&c, 1);
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  StartDaemon(args);
  int served = 0, refused = 0;
  for (int i = 0; i < kBlocks; ++i) {
    Status s = GetBatch({i});
    if (s.ok()) {
      ++served;  // GetBatch compared every byte with what was put
    } else {
      EXPECT_TRUE(s.IsNotFound() || s.IsDataLoss()) << i << ": " << s.ToString();
      ++refused;
    }
  }
  EXPECT_GE(refused, flipped);
  EXPECT_GT(served, 0);
  v1::StatsResponse stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub()->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_GE(stats.recovery_dropped_blocks() + stats.crc_failures_total(),
            static_cast<std::uint64_t>(flipped));
}

TEST_F(CacheHostDaemonTest, FullPoolRefusesWithResourceExhaustedAndKeepsServingReads) {
  // One tenant fills the whole pool here: lift its per-namespace caps (half
  // the pool by default).
  StartDaemon({"--host-pool-bytes=32MiB", "--host-page-bytes=2MiB", "--host-high-watermark=1.0",
               "--host-low-watermark=1.0", "--max-reserved-bytes-per-namespace=32MiB",
               "--max-leased-bytes-per-namespace=96MiB"});
  ASSERT_TRUE(PutBatch(0, 16).ok());  // every page
  // Hold every block so that nothing can be evicted to make room.
  v1::LeaseRequest lreq;
  for (int i = 0; i < 16; ++i) lreq.add_keys(Key(i));
  v1::LeaseResponse held;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub()->Lease(&lctx, lreq, &held).ok());
  Status s = PutBatch(100, 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("pages"), std::string::npos) << s.ToString();
  EXPECT_TRUE(GetBatch({3, 7, 11}).ok());
}

// A write-back bigger than the daemon lets one namespace hold reserved
// (--max-reserved-bytes-per-namespace, half the pool by default) is still
// stored whole: kStore reserves before it pulls, so StoreByKey keeps a window
// of kStores in flight that halves when the daemon refuses blocks for room,
// and sends the refused ones again. Before the window, every block past the
// bound came back ResourceExhausted (the small demo lost 6 of 144 blocks).
TEST_F(CacheHostDaemonTest, StoreByKeyBeyondTheReservationBoundNarrowsItsWindowAndStoresAll) {
  StartDaemon({"--host-pool-bytes=128MiB", "--host-page-bytes=2MiB",
               "--max-reserved-bytes-per-namespace=8MiB"});
  // 16 blocks of 2 MiB: two kStores of 8 (16 MiB each) against a bound of 4
  // blocks.
  std::uint64_t throttled = 0;
  Status s = client_->StoreBatch(0, 16, &throttled);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(throttled, 0u) << "the daemon never refused: the test no longer crosses the bound";
  EXPECT_LT(client_->session().store_window(), 4u);
  std::vector<int> all(16);
  std::iota(all.begin(), all.end(), 0);
  for (int i = 0; i < 16; i += 4) {
    Status g = GetBatch({all[i], all[i + 1], all[i + 2], all[i + 3]});
    EXPECT_TRUE(g.ok()) << g.ToString();
  }
  ExpectCommitsAndNoCrcFailures(16);
}

// Issue 17: a full NVMe filesystem froze the cache (every Reserve failed,
// hundreds of thousands of log lines). Here the tier lives on a 24 MiB tmpfs
// while it believes it has 1 GiB: demotions fail with ENOSPC, demotion backs
// off, eviction drops blocks instead, and the daemon keeps taking writes and
// serving reads from its host pool. Needs root (mount); CI runs as root.
// The value of the sample `series` (name and labels, exactly as exported) on
// a /metrics page; -1 if absent.
double MetricValue(const std::string& page, const std::string& series) {
  const std::size_t at = page.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(page.c_str() + at + series.size() + 2, nullptr);
}

// Issue 20: a real full filesystem under the NVMe tier. The daemon keeps
// serving from host memory (eviction drops instead of demoting), says so in
// one log line per 10 s and in a metric, loses none of the blocks it reported
// on NVMe before the disk filled, and demotes again once there is room (the
// tmpfs is remounted larger).
TEST_F(CacheHostDaemonTest, FullNvmeFilesystemDegradesToHostOnlyLosesNothingAndRecovers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string nvme = dir_ + "/nvme";
  std::filesystem::create_directories(nvme);
  const std::string mount = "mount -t tmpfs -o size=24m kvf-full-nvme " + nvme;
  if (std::system(mount.c_str()) != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << mount;
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)!std::system(("umount -l " + dir).c_str()); }
  } unmount{nvme};
  const std::string log = dir_ + "/cached.log";
  StartDaemon({"--host-pool-bytes=64MiB", "--host-page-bytes=2MiB", "--nvme-dir=" + nvme,
               "--nvme-capacity-bytes=1GiB", "--nvme-segment-bytes=64MiB",
               "--nvme-io-engine=threads", "--eviction-policy=lru", "--log-file=" + log});
  constexpr int kBlocks = 96;  // 192 MiB through a 64 MiB pool and a 24 MiB disk
  for (int i = 0; i < kBlocks; i += 8) {
    Status s = PutBatch(i, 8);
    ASSERT_TRUE(s.ok()) << "put " << i << ": " << s.ToString();
  }
  // Every block the daemon reports on NVMe (acknowledged durable) reads back
  // intact; the newest are served from host memory.
  v1::LookupRequest lreq;
  for (int i = 0; i < kBlocks; ++i) lreq.add_keys(Key(i));
  v1::LookupResponse lresp;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub()->Lookup(&lctx, lreq, &lresp).ok());
  std::vector<int> on_nvme;
  for (int i = 0; i < kBlocks; ++i) {
    if (lresp.results(i).status().code() == 0 && lresp.results(i).tier() == v1::TIER_NVME) {
      on_nvme.push_back(i);
    }
  }
  ASSERT_FALSE(on_nvme.empty()) << "nothing reached NVMe before the disk filled";
  for (std::size_t k = 0; k < on_nvme.size(); k += 8) {
    std::vector<int> batch(on_nvme.begin() + k, on_nvme.begin() + std::min(on_nvme.size(), k + 8));
    Status s = GetBatch(batch);
    EXPECT_TRUE(s.ok()) << "a block acknowledged on NVMe: " << s.ToString();
  }
  EXPECT_TRUE(GetBatch({88, 89, 90, 91, 92, 93, 94, 95}).ok());
  std::string page = HttpGet(daemon_->metrics());
  const double failed = MetricValue(page, "kvfabric_cache_host_nvme_demotions_failed_total");
  const double completed =
      MetricValue(page, "kvfabric_cache_host_demotions_total{result=\"completed\"}");
  EXPECT_GT(failed, 0) << "the disk never filled";
  EXPECT_EQ(MetricValue(page, "kvfabric_cache_host_nvme_demotion_backing_off"), 1.0);
  {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t lines = 0;
    for (std::size_t at = 0;
         (at = text.find("demotions failed since the last report", at)) != std::string::npos;
         ++at) {
      ++lines;
    }
    EXPECT_EQ(lines, 1u) << "one warning, not one per failed demotion:\n" << text;
  }
  std::printf(
      "disk full: %zu blocks on NVMe read back intact, %.0f demotions failed, "
      "%.0f completed\n",
      on_nvme.size(), failed, completed);

  // Room again: demotion resumes after its backoff (at most 30 s).
  ASSERT_EQ(std::system(("mount -o remount,size=256m " + nvme).c_str()), 0);
  const auto room = std::chrono::steady_clock::now();
  int next = kBlocks;
  bool resumed = false;
  while (!resumed && std::chrono::steady_clock::now() - room < std::chrono::seconds(60)) {
    ASSERT_TRUE(PutBatch(next, 8).ok());
    next += 8;
    page = HttpGet(daemon_->metrics());
    resumed = MetricValue(page, "kvfabric_cache_host_demotions_total{result=\"completed\"}") >
                  completed &&
              MetricValue(page, "kvfabric_cache_host_nvme_demotion_backing_off") == 0.0;
    if (!resumed) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_TRUE(resumed) << "demotion did not resume once the disk had room";
  std::printf("room again: demotions completed again %.1f s after the remount\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - room).count());
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0) << "SIGTERM did not drain";
  daemon_.reset();
}

// Issue 17: a crashed daemon restarts on its own addresses at once. The
// SIGKILL leaves the daemon's side of every connection it had (gRPC, data
// plane, a /metrics scrape) in FIN-WAIT or TIME-WAIT on the listening ports
// for about a minute; every listener binds with address reuse, so the
// restart does not fail with "Address already in use" (a daemon that cannot
// bind exits, and the start fails).
TEST_F(CacheHostDaemonTest, SigkilledDaemonRestartsOnItsOwnAddressesAtOnce) {
  for (const std::string transport : {"ucx", "tcp"}) {
    SCOPED_TRACE("data transport " + transport);
    std::vector<std::string> args = {"--host-pool-bytes=32MiB", "--host-page-bytes=2MiB"};
    if (transport == "tcp") args.push_back("--data-transport=tcp");
    StartDaemon(args);
    ASSERT_TRUE(PutBatch(0, 4).ok());
    ASSERT_TRUE(GetBatch({0, 1, 2, 3}).ok());
    ASSERT_FALSE(HttpGet(daemon_->metrics()).empty());
    const std::string grpc = daemon_->grpc();
    const std::string data = daemon_->transport();
    const std::string metrics = daemon_->metrics();  // http://127.0.0.1:PORT/metrics
    const std::string admin = daemon_->Get("admin");
    const std::string metrics_hostport =
        metrics.substr(7, metrics.find('/', 7) - 7);
    daemon_->Kill(SIGKILL);

    std::vector<std::string> again = args;
    again.push_back("--grpc-address=" + grpc);
    again.push_back("--transport-address=" + data);
    again.push_back("--metrics-address=" + metrics_hostport);
    again.push_back("--admin-address=" + admin);
    StartDaemon(again);
    EXPECT_EQ(daemon_->grpc(), grpc);
    EXPECT_EQ(daemon_->transport(), data);
    EXPECT_EQ(daemon_->metrics(), metrics);
    EXPECT_EQ(daemon_->Get("admin"), admin);
    ASSERT_TRUE(PutBatch(10, 2).ok());
    EXPECT_TRUE(GetBatch({10, 11}).ok());
    daemon_.reset();
  }
}

}  // namespace
}  // namespace kvfabric
