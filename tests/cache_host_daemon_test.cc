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
// "kvfabric-cached" beside this test binary.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "client/data_plane_client.h"
#include "core/crc32c.h"
#include "core/testing/test_seed.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "transport/ucx/ucx_transport.h"

extern char** environ;

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;

// 32 layers x 2 x 16 tokens x 8 heads x 128 dims x 2 bytes = 2 MiB.
constexpr std::uint64_t kBlockBytes = 2 << 20;
constexpr std::uint32_t kRegion = 1;

std::string DaemonPath() {
  if (const char* p = std::getenv("KVF_CACHED"); p != nullptr && *p != '\0') return p;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(".");
  return dir.substr(0, dir.rfind('/')) + "/kvfabric-cached";
}

// A kvfabric-cached child; SIGKILLed and reaped on destruction.
class Daemon {
 public:
  static std::unique_ptr<Daemon> Start(const std::string& dir, std::vector<std::string> args) {
    auto d = std::unique_ptr<Daemon>(new Daemon);
    const std::string ready = dir + "/ready";
    std::filesystem::remove(ready);
    std::vector<std::string> argv = {DaemonPath(),
                                     "--host-id=test-daemon",
                                     "--grpc-address=127.0.0.1:0",
                                     "--transport-address=127.0.0.1:0",
                                     "--metrics-address=127.0.0.1:0",
                                     "--lock-memory=off",
                                     "--ready-file=" + ready,
                                     "--log-level=warn"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (posix_spawn(&d->pid_, cargv[0], nullptr, nullptr, cargv.data(), environ) != 0) {
      ADD_FAILURE() << "cannot spawn " << cargv[0];
      return nullptr;
    }
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
        d->pid_ = -1;
        ADD_FAILURE() << "kvfabric-cached exited during start-up, status " << status;
        return nullptr;
      }
      std::ifstream in(ready);
      std::string line;
      while (std::getline(in, line)) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) d->info_[line.substr(0, eq)] = line.substr(eq + 1);
      }
      if (d->info_.count("pid") != 0) return d;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "kvfabric-cached did not become ready";
    return nullptr;
  }

  ~Daemon() { Kill(SIGKILL); }

  const std::string& grpc() { return info_["grpc"]; }
  const std::string& metrics() { return info_["metrics"]; }
  const std::string& transport() { return info_["transport"]; }

  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    if (sig == SIGKILL) {
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  // The exit status, waiting up to `timeout`; -1 if it did not exit.
  int WaitExit(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (pid_ > 0 && Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  std::map<std::string, std::string> info_;
};

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
    ucx::UcxTransportOptions o;
    o.tls = "sm,self,tcp";
    auto t = ucx::CreateUcxTransport(o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    transport_ = std::move(*t);
    auto staging = transport_->AllocateMemory(64 << 20, transport::MemoryKind::kHost);
    ASSERT_TRUE(staging.ok()) << staging.status().ToString();
    staging_ = std::move(*staging);
    data_ = *client::DataPlaneClient::Create(transport_.get());
  }

  void TearDown() override {
    daemon_.reset();
    data_.reset();
    staging_.reset();
    transport_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon(std::vector<std::string> args) {
    daemon_ = Daemon::Start(dir_, std::move(args));
    ASSERT_NE(daemon_, nullptr);
    grpc::ChannelArguments ch;
    ch.SetMaxReceiveMessageSize(16 << 20);
    ch.SetMaxSendMessageSize(16 << 20);
    stub_ = v1::CacheHost::NewStub(
        grpc::CreateCustomChannel(daemon_->grpc(), grpc::InsecureChannelCredentials(), ch));
    data_->Disconnect(daemon_->transport());
    auto conn = data_->Connect(daemon_->transport(), Clock::now() + std::chrono::seconds(10));
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    conn_ = *conn;
    ASSERT_TRUE(
        data_->ExportRegion(conn_, kRegion, *staging_, Clock::now() + std::chrono::seconds(10))
            .ok());
  }

  static v1::ModelFingerprint Fingerprint() {
    v1::ModelFingerprint f;
    f.set_model_id("test/model@1");
    f.set_first_layer(0);
    f.set_layer_count(32);
    f.set_dtype(v1::DTYPE_FP16);
    f.set_kv_heads(8);
    f.set_head_dim(128);
    f.set_tokens_per_block(16);
    f.set_tp_rank(0);
    f.set_tp_size(1);
    f.set_layout_version(1);
    return f;
  }

  std::string Key(int i) const {
    std::string k(32, '\0');
    std::uint64_t v = seed_ * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i);
    for (int b = 0; b < 32; ++b) {
      k[b] = static_cast<char>(v >> (8 * (b % 8)));
      if (b % 8 == 7) v = v * 6364136223846793005ull + 1442695040888963407ull;
    }
    return k;
  }

  // Block i's payload: a cheap deterministic stream of the seed and i.
  void Fill(int i, std::span<std::byte> dst) const {
    std::uint64_t x = seed_ ^ (0x2545F4914F6CDD1Dull * static_cast<std::uint64_t>(i + 1));
    auto* words = reinterpret_cast<std::uint64_t*>(dst.data());
    for (std::size_t w = 0; w < dst.size() / 8; ++w) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words[w] = x;
    }
  }

  std::span<std::byte> Staging(std::uint64_t offset, std::uint64_t bytes) {
    return staging_->bytes().subspan(offset, bytes);
  }

  // Puts blocks [first, first + n) (n * 2 MiB <= 32 MiB). Returns the first error.
  Status PutBatch(int first, int n) {
    v1::ReserveRequest req;
    *req.mutable_fingerprint() = Fingerprint();
    for (int i = first; i < first + n; ++i) {
      v1::BlockDescriptor* b = req.add_blocks();
      b->set_key(Key(i));
      b->set_payload_bytes(kBlockBytes);
      b->set_representation(v1::REPRESENTATION_EXACT);
      b->set_format_version(1);
      b->set_token_count(16);
      b->set_prefix_tokens(16 * static_cast<std::uint64_t>(i));
    }
    v1::ReserveResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status g = stub_->Reserve(&ctx, req, &resp);
    if (!g.ok()) return Status::Unavailable("Reserve: " + g.error_message());
    std::vector<wire::TransferRange> ranges;
    v1::CommitRequest commit;
    commit.set_lease_id(resp.lease_id());
    commit.set_release_uncommitted(true);
    for (int k = 0; k < n; ++k) {
      const v1::ReserveResult& r = resp.results(k);
      if (r.status().code() != 0) {
        return Status(static_cast<StatusCode>(r.status().code()), r.status().message());
      }
      const std::uint64_t off = static_cast<std::uint64_t>(k) * kBlockBytes;
      Fill(first + k, Staging(off, kBlockBytes));
      std::uint64_t pos = off;
      for (const v1::Extent& x : r.extents()) {
        ranges.push_back({x.offset_bytes(), x.length_bytes(), pos});
        pos += x.length_bytes();
      }
      v1::CommitEntry* c = commit.add_entries();
      c->set_key(Key(first + k));
      c->set_crc32c(crc32c::Value(Staging(off, kBlockBytes)));
    }
    std::array<std::uint8_t, 16> token{};
    std::memcpy(token.data(), resp.grant().access_token().data(), 16);
    KVF_RETURN_IF_ERROR(data_->Transfer(conn_, client::DataOp::kPut, resp.lease_id(), token,
                                        kRegion, ranges, Clock::now() + std::chrono::seconds(60)));
    v1::CommitResponse cresp;
    grpc::ClientContext cctx;
    g = stub_->Commit(&cctx, commit, &cresp);
    if (!g.ok()) return Status::Unavailable("Commit: " + g.error_message());
    for (const v1::CommitResult& r : cresp.results()) {
      if (r.status().code() != 0) {
        return Status(static_cast<StatusCode>(r.status().code()), r.status().message());
      }
    }
    return Status::OK();
  }

  // Leases blocks `ids`, reads them into the upper half of staging, compares
  // every byte with what was put, releases. Returns the first error.
  Status GetBatch(const std::vector<int>& ids) {
    v1::LeaseRequest req;
    for (int i : ids) req.add_keys(Key(i));
    v1::LeaseResponse resp;
    grpc::ClientContext ctx;
    grpc::Status g = stub_->Lease(&ctx, req, &resp);
    if (!g.ok()) return Status::Unavailable("Lease: " + g.error_message());
    std::vector<wire::TransferRange> ranges;
    const std::uint64_t base = 32 << 20;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const v1::LeaseResult& r = resp.results(static_cast<int>(k));
      if (r.status().code() != 0) {
        return Status(static_cast<StatusCode>(r.status().code()),
                      "block " + std::to_string(ids[k]) + ": " + r.status().message());
      }
      std::uint64_t pos = base + k * kBlockBytes;
      for (const v1::Extent& x : r.extents()) {
        ranges.push_back({x.offset_bytes(), x.length_bytes(), pos});
        pos += x.length_bytes();
      }
    }
    std::array<std::uint8_t, 16> token{};
    std::memcpy(token.data(), resp.grant().access_token().data(), 16);
    KVF_RETURN_IF_ERROR(data_->Transfer(conn_, client::DataOp::kGet, resp.lease_id(), token,
                                        kRegion, ranges, Clock::now() + std::chrono::seconds(60)));
    std::vector<std::byte> want(kBlockBytes);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      auto got = Staging(base + k * kBlockBytes, kBlockBytes);
      if (crc32c::Value(got) != resp.results(static_cast<int>(k)).block().crc32c()) {
        return Status::DataLoss("block " + std::to_string(ids[k]) + ": CRC mismatch");
      }
      Fill(ids[k], want);
      if (std::memcmp(want.data(), got.data(), kBlockBytes) != 0) {
        return Status::DataLoss("block " + std::to_string(ids[k]) + ": bytes differ");
      }
    }
    v1::ReleaseRequest rel;
    rel.add_entries()->set_lease_id(resp.lease_id());
    v1::ReleaseResponse rresp;
    grpc::ClientContext rctx;
    stub_->Release(&rctx, rel, &rresp);
    return Status::OK();
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<transport::MemoryRegion> staging_;
  std::unique_ptr<client::DataPlaneClient> data_;
  client::DaemonConnection* conn_ = nullptr;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::CacheHost::Stub> stub_;
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
  ASSERT_TRUE(stub_->Stats(&ctx, sreq, &stats).ok());
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
  ASSERT_TRUE(stub_->Lookup(&lctx, lreq, &lresp).ok());
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
  ASSERT_TRUE(stub_->ExplainEviction(&ectx, ereq, &eresp).ok());
  ASSERT_GE(eresp.decisions_size(), 1);
  EXPECT_EQ(eresp.decisions(0).action(), "demote");
  EXPECT_FALSE(eresp.decisions(0).explanation().empty());
  // Keep writing, and kill the daemon in the middle of it.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = kBlocks; i < kBlocks + 64 && !stop.load(); i += 8) {
      if (!PutBatch(i, 8).ok()) break;  // fails once the daemon is dead
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
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
  ASSERT_TRUE(stub_->Stats(&ctx, sreq, &stats).ok());
  EXPECT_GE(stats.recovered_blocks(), durable.size());
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
  ASSERT_TRUE(stub_->Lease(&lctx, lreq, &lresp).ok());
  ASSERT_EQ(lresp.results(0).status().code(), 0);
  // A reservation of 300 ms that is never put or committed.
  v1::ReserveRequest rreq;
  *rreq.mutable_fingerprint() = Fingerprint();
  v1::BlockDescriptor* b = rreq.add_blocks();
  b->set_key(Key(99));
  b->set_payload_bytes(kBlockBytes);
  b->set_representation(v1::REPRESENTATION_EXACT);
  b->set_format_version(1);
  b->set_token_count(16);
  rreq.set_ttl_ms(300);
  v1::ReserveResponse rresp;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub_->Reserve(&rctx, rreq, &rresp).ok());
  ASSERT_EQ(rresp.results(0).status().code(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the stall

  std::array<std::uint8_t, 16> token{};
  std::memcpy(token.data(), lresp.grant().access_token().data(), 16);
  std::vector<wire::TransferRange> ranges = {
      {lresp.results(0).extents(0).offset_bytes(), kBlockBytes, 32 << 20}};
  Status late = data_->Transfer(conn_, client::DataOp::kGet, lresp.lease_id(), token, kRegion,
                                ranges, Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(late.IsNotFound()) << late.ToString();
  std::memcpy(token.data(), rresp.grant().access_token().data(), 16);
  ranges = {{rresp.results(0).extents(0).offset_bytes(), kBlockBytes, 0}};
  late = data_->Transfer(conn_, client::DataOp::kPut, rresp.lease_id(), token, kRegion, ranges,
                         Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(late.IsNotFound()) << late.ToString();

  v1::StatsResponse stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub_->Stats(&sctx, v1::StatsRequest(), &stats).ok());
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
  ASSERT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_GE(stats.recovery_dropped_blocks() + stats.crc_failures_total(),
            static_cast<std::uint64_t>(flipped));
}

TEST_F(CacheHostDaemonTest, FullPoolRefusesWithResourceExhaustedAndKeepsServingReads) {
  StartDaemon({"--host-pool-bytes=32MiB", "--host-page-bytes=2MiB", "--host-high-watermark=1.0",
               "--host-low-watermark=1.0"});
  ASSERT_TRUE(PutBatch(0, 16).ok());  // every page
  // Hold every block so that nothing can be evicted to make room.
  v1::LeaseRequest lreq;
  for (int i = 0; i < 16; ++i) lreq.add_keys(Key(i));
  v1::LeaseResponse held;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub_->Lease(&lctx, lreq, &held).ok());
  Status s = PutBatch(100, 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("pages"), std::string::npos) << s.ToString();
  EXPECT_TRUE(GetBatch({3, 7, 11}).ok());
}

}  // namespace
}  // namespace kvfabric
