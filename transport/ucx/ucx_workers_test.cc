// UcxTransportOptions::workers: connections spread over several UCX
// workers sharing one context, and regions shared and revoked across them.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "transport/ucx/ucx_test_fixture.h"

namespace kvfabric::ucx::ucx_test {
namespace {

// A server with three workers and four clients: connections are spread
// over the workers (messages from different clients are handled on
// different threads), every client's transfers land exactly both ways, on
// the server's own regions and on the clients', and a region the server
// destroys while clients use it is refused to every one of them.
class UcxWorkersTest : public ::testing::TestWithParam<std::string> {
 protected:
  struct Client {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Endpoint> ep;
    std::unique_ptr<MemoryRegion> region;        // UCX-allocated, region_bytes
    std::unique_ptr<RemoteRegion> server_side;  // `exported`, imported on ep
  };

  // Appends `n` clients, each with its own transport (this test's
  // parameter), connected to `address`, with a region of `region_bytes` and
  // the server's `exported` range imported.
  void ConnectClients(int n, const std::string& address, const std::string& exported,
                      std::uint64_t region_bytes, std::vector<Client>* out) {
    for (int i = 0; i < n; ++i) {
      Client c;
      auto t = CreateUcxTransport(OptionsFor(GetParam()));
      ASSERT_TRUE(t.ok()) << t.status();
      c.t = std::move(*t);
      auto ep = c.t->Connect(address, PeerFailureMode::kFailInFlight, In(10));
      ASSERT_TRUE(ep.ok()) << ep.status();
      c.ep = std::move(*ep);
      auto region = c.t->AllocateMemory(region_bytes, MemoryKind::kHost);
      ASSERT_TRUE(region.ok());
      c.region = std::move(*region);
      auto remote = c.ep->ImportRegion(exported);
      ASSERT_TRUE(remote.ok()) << remote.status();
      c.server_side = std::move(*remote);
      out->push_back(std::move(c));
    }
  }

  // Closes the clients' endpoints, then the server's, then the server
  // (whose handlers use `mu` and `accepted`).
  static void CloseAll(std::vector<Client>& clients, std::mutex& mu,
                       std::vector<std::unique_ptr<Endpoint>>& accepted,
                       std::unique_ptr<Transport>& server) {
    for (auto& c : clients) {
      c.server_side.reset();
      c.ep.reset();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      accepted.clear();
    }
    server.reset();
  }
};

TEST_P(UcxWorkersTest, SpreadsConnectionsAndSharesRegionsAcrossWorkers) {
  const std::uint64_t seed = TestSeed("SpreadsConnectionsAndSharesRegionsAcrossWorkers");
  UcxTransportOptions server_options = OptionsFor(GetParam());
  server_options.workers = 3;
  auto server = CreateUcxTransport(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Endpoint>> accepted;
  std::map<Endpoint*, std::thread::id> handled_on;
  std::map<int, Endpoint*> endpoint_of;  // client index (the hello's header) -> server side
  (*server)->SetMessageHandler([&](IncomingMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    handled_on[m.endpoint()] = std::this_thread::get_id();
    endpoint_of[static_cast<int>(m.header()[0])] = m.endpoint();
    cv.notify_all();
  });
  ASSERT_TRUE((*server)
                  ->Listen("127.0.0.1:0",
                           [&](std::unique_ptr<Endpoint> ep) {
                             std::lock_guard<std::mutex> lock(mu);
                             accepted.push_back(std::move(ep));
                             cv.notify_all();
                           })
                  .ok());
  constexpr int kClients = 4;
  std::vector<std::byte> server_buf(kClients * kMiB);
  Fill(server_buf, seed);
  auto server_region = (*server)->RegisterMemory(server_buf, MemoryKind::kHost);
  ASSERT_TRUE(server_region.ok());
  auto exported = (*server_region)->Export(0, server_buf.size());
  ASSERT_TRUE(exported.ok());

  std::vector<Client> clients;
  ConnectClients(kClients, (*server)->listen_address(), *exported, 2 * kMiB, &clients);
  if (HasFatalFailure()) return;
  for (int i = 0; i < kClients; ++i) {
    Fill(clients[i].region->bytes(), seed + 1 + i);
    // A header-only message naming the client, to learn which server
    // endpoint and thread handle it.
    Transfer hello;
    hello.op = TransferOp::kSend;
    const std::byte h[1] = {static_cast<std::byte>(i)};
    hello.header = h;
    ASSERT_TRUE(SubmitAndWait(*clients[i].ep, {hello}).ok());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_until(lock, In(10), [&] {
      return accepted.size() == kClients && handled_on.size() == kClients;
    }));
    std::set<std::thread::id> threads;
    for (const auto& [ep, id] : handled_on) threads.insert(id);
    EXPECT_EQ(threads.size(), 3u) << "four connections over three workers";
  }
  // Concurrently: each client writes its first MiB into its own MiB of the
  // server's region and reads it back into its second MiB.
  std::vector<std::thread> runs;
  std::vector<Status> results(kClients);
  for (int i = 0; i < kClients; ++i) {
    runs.emplace_back([&, i] {
      Client& c = clients[i];
      Status st = SubmitAndWait(
          *c.ep, {Write(c.region.get(), 0, c.server_side.get(), i * kMiB, kMiB)});
      if (st.ok()) {
        st = SubmitAndWait(*c.ep, {Read(c.region.get(), kMiB, c.server_side.get(), i * kMiB,
                                        kMiB)});
      }
      results[i] = st;
    });
  }
  for (auto& r : runs) r.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(results[i].ok()) << "client " << i << ": " << results[i];
    EXPECT_TRUE(Same(std::span(server_buf).subspan(i * kMiB, kMiB),
                     clients[i].region->bytes().subspan(0, kMiB)));
    EXPECT_TRUE(Same(clients[i].region->bytes().subspan(kMiB, kMiB),
                     clients[i].region->bytes().subspan(0, kMiB)));
  }
  // The server pushes into each client's region over that client's
  // endpoint, from its worker.
  std::vector<std::byte> src(kClients * 4096);
  Fill(src, seed + 100);
  auto src_region = (*server)->RegisterMemory(src, MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok());
  for (int i = 0; i < kClients; ++i) {
    Endpoint* ep = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      ep = endpoint_of.at(i);
    }
    auto ex = clients[i].region->Export(0, 2 * kMiB);
    ASSERT_TRUE(ex.ok());
    auto remote = ep->ImportRegion(*ex);
    ASSERT_TRUE(remote.ok()) << remote.status();
    ASSERT_TRUE(
        SubmitAndWait(*ep, {Write(src_region->get(), i * 4096, remote->get(), kMiB + 5, 4096)})
            .ok());
    EXPECT_TRUE(Same(std::span(src).subspan(i * 4096, 4096),
                     clients[i].region->bytes().subspan(kMiB + 5, 4096)))
        << "client " << i;
  }
  src_region->reset();
  // The server destroys its region: every client is refused afterwards.
  server_region->reset();
  for (int i = 0; i < kClients; ++i) {
    const Status st = SubmitAndWait(
        *clients[i].ep, {Read(clients[i].region.get(), 0, clients[i].server_side.get(), 0, 4096)});
    EXPECT_FALSE(st.ok()) << "client " << i;
  }
  CloseAll(clients, mu, accepted, *server);
}

// A region of the server (caller memory, so every operation on it is placed
// by its owner: the server's workers) is destroyed while clients on three
// different workers keep writing into it and reading from it: the
// destruction waits for or cuts off what is in flight on every worker, and
// returns; entries complete OK or fail cleanly; nothing touches the freed
// memory (run under ASan); later operations are refused.
TEST_P(UcxWorkersTest, RegionDestroyedUnderLoadOnEveryWorker) {
  UcxTransportOptions server_options = OptionsFor(GetParam());
  server_options.workers = 3;
  auto server = CreateUcxTransport(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::mutex mu;
  std::vector<std::unique_ptr<Endpoint>> accepted;
  ASSERT_TRUE((*server)
                  ->Listen("127.0.0.1:0",
                           [&](std::unique_ptr<Endpoint> ep) {
                             std::lock_guard<std::mutex> lock(mu);
                             accepted.push_back(std::move(ep));
                           })
                  .ok());
  constexpr int kClients = 3;
  auto server_buf = std::make_unique<std::vector<std::byte>>(4 * kMiB);
  auto server_region = (*server)->RegisterMemory(*server_buf, MemoryKind::kHost);
  ASSERT_TRUE(server_region.ok());
  auto exported = (*server_region)->Export(0, server_buf->size());
  ASSERT_TRUE(exported.ok());
  std::vector<Client> clients;
  ConnectClients(kClients, (*server)->listen_address(), *exported, kMiB, &clients);
  if (HasFatalFailure()) return;
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> load;
  for (int i = 0; i < kClients; ++i) {
    load.emplace_back([&, i] {
      Client& c = clients[i];
      for (int n = 0; !stop.load(); ++n) {
        const std::uint64_t at = static_cast<std::uint64_t>(i) * kMiB;
        Transfer t = n % 2 == 0 ? Write(c.region.get(), 0, c.server_side.get(), at, kMiB)
                                : Read(c.region.get(), 0, c.server_side.get(), at, kMiB);
        CountRacingBatch(c.ep->Submit(std::vector<Transfer>{t}), &ok, &refused);
      }
    });
  }
  while (ok.load() < 30) std::this_thread::yield();
  const auto before = Clock::now();
  server_region->reset();  // waits for, or cuts off, every worker's operations
  server_buf.reset();      // freed: ASan reports any later touch
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(20));
  while (refused.load() < 3 * kClients) std::this_thread::yield();
  stop = true;
  for (auto& t : load) t.join();
  EXPECT_GE(ok.load(), 30);
  CloseAll(clients, mu, accepted, *server);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxWorkersTest, ::testing::Values("tcp", "sm,self,tcp"),
                         [](const auto& info) {
                           return info.param == "tcp" ? std::string("Tcp")
                                                      : std::string("SharedMemory");
                         });

}  // namespace
}  // namespace kvfabric::ucx::ucx_test
