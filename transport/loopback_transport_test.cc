#include "core/mutex.h"
#include "transport/loopback_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/testing/transport_conformance.h"

namespace kvfabric::transport {
namespace {

using conformance::ConformanceParamName;
using conformance::Soon;
using conformance::TransportConformanceParam;
using conformance::TransportConformanceTest;
using conformance::TransportPair;

TransportPair MakeLoopbackPair() {
  auto network = std::make_shared<LoopbackNetwork>();
  TransportPair pair;
  pair.keep_alive = network;
  auto server = CreateLoopbackTransport({.network = network.get()});
  auto client = CreateLoopbackTransport({.network = network.get()});
  if (!server.ok() || !client.ok()) return pair;
  LoopbackTransport* raw_server = server->get();
  pair.server = std::move(server).value();
  pair.client = std::move(client).value();
  pair.listen_address = "loopback:0";
  pair.stall_server = [raw_server](bool stalled) { raw_server->TEST_StallPeerWork(stalled); };
  return pair;
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportConformanceTest,
                         ::testing::Values(TransportConformanceParam{"loopback",
                                                                     &MakeLoopbackPair}),
                         ConformanceParamName);

class LoopbackTransportTest : public ::testing::Test {
 protected:
  std::unique_ptr<LoopbackTransport> Make() {
    auto t = CreateLoopbackTransport({.network = &network_});
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(t).value();
  }

  // Listens on `server` and returns the client's endpoint; the accepted one
  // lands in accepted_.
  std::unique_ptr<Endpoint> Connect(LoopbackTransport& server, LoopbackTransport& client) {
    EXPECT_TRUE(server
                    .Listen("loopback:0",
                            [this](std::unique_ptr<Endpoint> ep) {
                              MutexLock lock(&mu_);
                              accepted_.push_back(std::move(ep));
                            })
                    .ok());
    auto ep = client.Connect(server.listen_address(), PeerFailureMode::kFailInFlight, Soon());
    EXPECT_TRUE(ep.ok()) << ep.status();
    return std::move(ep).value();
  }

  LoopbackNetwork network_;
  Mutex mu_;
  std::vector<std::unique_ptr<Endpoint>> accepted_ KVF_GUARDED_BY(mu_);
};

TEST_F(LoopbackTransportTest, CreateRequiresANetwork) {
  EXPECT_EQ(CreateLoopbackTransport({}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopbackTransportTest, ListenBindsNamesOnceAndPicksUniqueOnes) {
  auto a = Make();
  auto b = Make();
  auto c = Make();
  EXPECT_EQ(a->Listen("tcp:1", nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Listen("loopback:", nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->Listen("loopback:cache-0", nullptr).ok());
  EXPECT_EQ(a->listen_address(), "loopback:cache-0");
  EXPECT_EQ(a->Listen("loopback:other", nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Listen("loopback:cache-0", nullptr).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(b->Listen("loopback:0", nullptr).ok());
  ASSERT_TRUE(c->Listen("loopback:0", nullptr).ok());
  EXPECT_NE(b->listen_address(), c->listen_address());
  // A destroyed listener frees its name.
  a.reset();
  auto d = Make();
  EXPECT_TRUE(d->Listen("loopback:cache-0", nullptr).ok());
}

TEST_F(LoopbackTransportTest, ConnectFailsWithoutListenerAndNetworksAreSeparate) {
  auto server = Make();
  ASSERT_TRUE(server->Listen("loopback:s", nullptr).ok());
  LoopbackNetwork other;
  auto stranger = CreateLoopbackTransport({.network = &other});
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(
      (*stranger)->Connect("loopback:s", PeerFailureMode::kFailInFlight, Soon()).status().code(),
      StatusCode::kUnavailable);
  EXPECT_EQ(
      server->Connect("loopback:nobody", PeerFailureMode::kFailInFlight, Soon()).status().code(),
      StatusCode::kUnavailable);
}

TEST_F(LoopbackTransportTest, OnlyHostMemoryIsSupported) {
  auto t = Make();
  std::vector<std::byte> bytes(64);
  EXPECT_EQ(t->RegisterMemory(bytes, MemoryKind::kDevice).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(t->AllocateMemory(64, MemoryKind::kDevice).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(t->AllocateMemory(0, MemoryKind::kHost).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopbackTransportTest, ImportRejectsAnExportFromAnotherTransport) {
  auto server = Make();
  auto client = Make();
  auto third = Make();
  std::unique_ptr<Endpoint> ep = Connect(*server, *client);
  auto region = third->AllocateMemory(4096, MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  auto exported = (*region)->Export(0, 4096);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(ep->ImportRegion(*exported).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopbackTransportTest, RegionOfAnotherTransportIsRejectedAsLocal) {
  auto server = Make();
  auto client = Make();
  std::unique_ptr<Endpoint> ep = Connect(*server, *client);
  auto foreign = server->AllocateMemory(4096, MemoryKind::kHost);
  ASSERT_TRUE(foreign.ok());
  std::vector<Transfer> send = {
      {.op = TransferOp::kSend, .local = foreign->get(), .length = 1, .header = {}}};
  EXPECT_EQ(ep->Submit(send).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopbackTransportTest, TransfersToARegionItsOwnerDestroyedFailUnavailable) {
  auto server = Make();
  auto client = Make();
  std::unique_ptr<Endpoint> ep = Connect(*server, *client);
  auto remote_mem = server->AllocateMemory(4096, MemoryKind::kHost);
  auto local = client->AllocateMemory(4096, MemoryKind::kHost);
  ASSERT_TRUE(remote_mem.ok() && local.ok());
  auto remote = ep->ImportRegion(*(*remote_mem)->Export(0, 4096));
  ASSERT_TRUE(remote.ok());
  remote_mem->reset();
  std::vector<Transfer> read = {{.op = TransferOp::kRead,
                                 .local = local->get(),
                                 .length = 4096,
                                 .remote = remote->get(),
                                 .header = {}}};
  auto batch = ep->Submit(read);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE((*batch)->Wait(Soon()).ok());
  EXPECT_EQ((*batch)->results()[0].status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(ep->health().ok());  // the connection itself is fine
}

TEST_F(LoopbackTransportTest, AcceptOrDropTwiceIsRefused) {
  auto server = Make();
  auto client = Make();
  auto inbox = server->AllocateMemory(4096, MemoryKind::kHost);
  auto outbox = client->AllocateMemory(16, MemoryKind::kHost);
  ASSERT_TRUE(inbox.ok() && outbox.ok());
  Status second;
  std::atomic<bool> seen{false};
  server->SetMessageHandler([&](IncomingMessage& m) {
    EXPECT_TRUE(m.Accept(inbox->get(), 0, [](Status) {}).ok());
    second = m.Accept(inbox->get(), 100, [](Status) {});
    seen = true;
  });
  std::unique_ptr<Endpoint> ep = Connect(*server, *client);
  std::vector<Transfer> send = {
      {.op = TransferOp::kSend, .local = outbox->get(), .length = 16, .header = {}}};
  auto batch = ep->Submit(send);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE((*batch)->Wait(Soon()).ok());
  // The sender's entry completes after the handler returned.
  ASSERT_TRUE(seen.load());
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
}

TEST_F(LoopbackTransportTest, ClientTransportDestroyedWithWorkInFlightCancelsIt) {
  auto server = Make();
  auto client = Make();
  std::unique_ptr<Endpoint> ep = Connect(*server, *client);
  auto remote_mem = server->AllocateMemory(4096, MemoryKind::kHost);
  auto local = client->AllocateMemory(4096, MemoryKind::kHost);
  ASSERT_TRUE(remote_mem.ok() && local.ok());
  auto remote = ep->ImportRegion(*(*remote_mem)->Export(0, 4096));
  ASSERT_TRUE(remote.ok());
  server->TEST_StallPeerWork(true);
  std::vector<Transfer> read = {{.op = TransferOp::kRead,
                                 .local = local->get(),
                                 .length = 4096,
                                 .remote = remote->get(),
                                 .header = {}}};
  auto batch = ep->Submit(read);
  ASSERT_TRUE(batch.ok());
  client.reset();  // completes every entry before returning
  ASSERT_TRUE((*batch)->Done());
  EXPECT_EQ((*batch)->results()[0].status.code(), StatusCode::kCancelled);
  EXPECT_EQ(ep->health().code(), StatusCode::kUnavailable);
  server->TEST_StallPeerWork(false);
  // The endpoint outlives its transport; its methods still answer.
  EXPECT_TRUE(ep->Flush(Soon()).ok());
  EXPECT_TRUE(ep->Close(CloseMode::kGraceful, Soon()).ok());
}

TEST_F(LoopbackTransportTest, DroppingTheAcceptedEndpointDisconnectsThePeer) {
  auto server = Make();
  auto client = Make();
  ASSERT_TRUE(server->Listen("loopback:0", [](std::unique_ptr<Endpoint>) {}).ok());
  auto ep = client->Connect(server->listen_address(), PeerFailureMode::kFailInFlight, Soon());
  ASSERT_TRUE(ep.ok());
  for (int i = 0; i < 500 && (*ep)->health().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*ep)->health().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvfabric::transport
