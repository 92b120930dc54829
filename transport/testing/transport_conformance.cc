#include "transport/testing/transport_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace kvfabric::transport::conformance {

// A binary may link these tests for a backend it does not instantiate.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformanceTest);

TEST_P(TransportConformanceTest, ReadsAndWritesRandomBlocksInBatchesOf1And16) {
  std::mt19937_64 rng(Seed());
  constexpr std::size_t kBlocks = 16;
  constexpr std::uint64_t kBlock = 64 * 1024 + 24;  // odd size: offsets are not page-aligned
  std::unique_ptr<MemoryRegion> server = Allocate(*pair_.server, kBlocks * kBlock + 100);
  std::vector<std::byte> client_bytes(kBlocks * kBlock);
  StatusOr<std::unique_ptr<MemoryRegion>> client =
      pair_.client->RegisterMemory(client_bytes, MemoryKind::kHost);
  ASSERT_TRUE(server && client.ok());
  // The export starts 100 bytes in: remote offsets are relative to it.
  std::unique_ptr<RemoteRegion> remote = Import(*client_ep_, *server, 100, kBlocks * kBlock);
  ASSERT_NE(remote, nullptr);
  ASSERT_EQ(remote->length(), kBlocks * kBlock);
  std::span<std::byte> server_blocks = server->bytes().subspan(100);

  for (std::size_t batch_size : {std::size_t{1}, kBlocks}) {
    std::vector<std::size_t> perm(kBlocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
      FillRandom(op == TransferOp::kRead ? server_blocks : std::span<std::byte>(client_bytes), rng);
      for (std::size_t first = 0; first < kBlocks; first += batch_size) {
        std::vector<Transfer> transfers;
        for (std::size_t i = first; i < first + batch_size; ++i) {
          transfers.push_back({.op = op,
                               .local = client->get(),
                               .local_offset = i * kBlock,
                               .length = kBlock,
                               .remote = remote.get(),
                               .remote_offset = perm[i] * kBlock,
                               .header = {}});
        }
        std::unique_ptr<TransferBatch> batch = Submit(*client_ep_, transfers);
        ASSERT_NE(batch, nullptr);
        ASSERT_TRUE(batch->Wait(Soon()).ok());
        ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
        EXPECT_EQ(batch->TotalBytes(), batch_size * kBlock);
      }
      for (std::size_t i = 0; i < kBlocks; ++i) {
        std::span<const std::byte> mine(client_bytes.data() + i * kBlock, kBlock);
        EXPECT_EQ(Crc(mine), Crc(server_blocks.subspan(perm[i] * kBlock, kBlock)))
            << "block " << i << " op " << static_cast<int>(op) << " batch " << batch_size;
      }
    }
  }
}

TEST_P(TransportConformanceTest, AcceptedSideWritesIntoConnectingSidesExport) {
  std::mt19937_64 rng(Seed());
  constexpr std::uint64_t kSize = 256 * 1024;
  std::unique_ptr<MemoryRegion> staging = Allocate(*pair_.client, kSize);
  std::unique_ptr<MemoryRegion> pages = Allocate(*pair_.server, kSize);
  ASSERT_TRUE(staging && pages);
  FillRandom(pages->bytes(), rng);
  std::unique_ptr<RemoteRegion> remote = Import(*server_ep_, *staging, 0, kSize);
  ASSERT_NE(remote, nullptr);
  std::unique_ptr<TransferBatch> batch = Submit(*server_ep_, {{.op = TransferOp::kWrite,
                                                               .local = pages.get(),
                                                               .length = kSize,
                                                               .remote = remote.get(),
                                                               .header = {}}});
  ASSERT_NE(batch, nullptr);
  ASSERT_TRUE(batch->Wait(Soon()).ok());
  ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  EXPECT_EQ(Crc(staging->bytes()), Crc(pages->bytes()));
}

TEST_P(TransportConformanceTest, SendWithoutPayloadDeliversTheHeader) {
  std::vector<std::byte> got;
  std::uint64_t got_payload = 1;
  bool arrived = false;
  OnServerMessage([&](IncomingMessage& m) {
    MutexLock lock(&mu_);
    got.assign(m.header().begin(), m.header().end());
    got_payload = m.payload_length();
    arrived = true;
    cv_.NotifyAll();
  });
  std::vector<std::byte> header(kMaxMessageHeaderBytes);
  std::mt19937_64 rng(Seed());
  FillRandom(header, rng);
  std::unique_ptr<TransferBatch> batch =
      Submit(*client_ep_, {{.op = TransferOp::kSend, .header = header}});
  ASSERT_NE(batch, nullptr);
  std::vector<std::byte> sent = header;
  std::fill(header.begin(), header.end(), std::byte{0});  // the header was copied at Submit
  ASSERT_TRUE(batch->Wait(Soon()).ok());
  EXPECT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  ASSERT_TRUE(WaitFor([&] { return arrived; }));
  MutexLock lock(&mu_);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(got_payload, 0u);
}

TEST_P(TransportConformanceTest, SendPayloadIsAcceptedAtChosenOffsetAndRepliedTo) {
  std::mt19937_64 rng(Seed());
  constexpr std::uint64_t kPayload = 100 * 1000 + 7;
  constexpr std::uint64_t kOffset = 4096 + 3;
  std::unique_ptr<MemoryRegion> inbox = Allocate(*pair_.server, kOffset + kPayload + 64);
  std::unique_ptr<MemoryRegion> outbox = Allocate(*pair_.client, kPayload);
  ASSERT_TRUE(inbox && outbox);
  FillRandom(outbox->bytes(), rng);
  std::memset(inbox->bytes().data(), 0, inbox->bytes().size());
  Status placed = Status::Unknown("not placed");
  bool replied = false;
  const std::string reply = "placed";
  OnServerMessage([&](IncomingMessage& m) {
    Status accepted = m.Accept(inbox.get(), kOffset, [&, ep = m.endpoint()](Status s) {
      // Replies from the progress thread: Submit only queues work.
      auto header = std::as_bytes(std::span(reply));
      StatusOr<std::unique_ptr<TransferBatch>> b =
          ep->Submit(std::vector<Transfer>{{.op = TransferOp::kSend, .header = header}});
      EXPECT_TRUE(b.ok()) << b.status();
      MutexLock lock(&mu_);
      placed = s;
      if (b.ok()) replies_.push_back(std::move(b).value());
      cv_.NotifyAll();
    });
    EXPECT_TRUE(accepted.ok()) << accepted;
    EXPECT_NE(m.endpoint(), nullptr);
  });
  OnClientMessage([&](IncomingMessage& m) {
    MutexLock lock(&mu_);
    replied =
        std::string(reinterpret_cast<const char*>(m.header().data()), m.header().size()) == reply;
    cv_.NotifyAll();
  });
  std::string header = "lease 7";
  std::unique_ptr<TransferBatch> batch =
      Submit(*client_ep_, {{.op = TransferOp::kSend,
                            .local = outbox.get(),
                            .length = kPayload,
                            .header = std::as_bytes(std::span(header))}});
  ASSERT_NE(batch, nullptr);
  ASSERT_TRUE(batch->Wait(Soon()).ok());
  EXPECT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  EXPECT_EQ(batch->TotalBytes(), kPayload);
  ASSERT_TRUE(WaitFor([&] { return placed.ok() && replied; })) << placed;
  EXPECT_EQ(Crc(inbox->bytes().subspan(kOffset, kPayload)), Crc(outbox->bytes()));
  EXPECT_EQ(inbox->bytes()[kOffset - 1], std::byte{0});
  EXPECT_EQ(inbox->bytes()[kOffset + kPayload], std::byte{0});
  MutexLock lock(&mu_);
  for (auto& b : replies_) EXPECT_TRUE(b->Wait(Soon()).ok());
  replies_.clear();
}

TEST_P(TransportConformanceTest, DroppedOrUnfittingPayloadCompletesSenderAndPlacesNothing) {
  std::unique_ptr<MemoryRegion> inbox = Allocate(*pair_.server, 1000);
  std::unique_ptr<MemoryRegion> outbox = Allocate(*pair_.client, 4000);
  ASSERT_TRUE(inbox && outbox);
  std::memset(outbox->bytes().data(), 0x77, 4000);
  int seen = 0;
  Status too_big;
  OnServerMessage([&](IncomingMessage& m) {
    MutexLock lock(&mu_);
    if (seen++ == 0) {
      m.Drop();
    } else {
      too_big = m.Accept(inbox.get(), 0, [](Status) { ADD_FAILURE() << "placed anyway"; });
    }
    cv_.NotifyAll();
  });
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<TransferBatch> batch =
        Submit(*client_ep_,
               {{.op = TransferOp::kSend, .local = outbox.get(), .length = 4000, .header = {}}});
    ASSERT_NE(batch, nullptr);
    ASSERT_TRUE(batch->Wait(Soon()).ok());
    EXPECT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  }
  ASSERT_TRUE(WaitFor([&] { return seen == 2; }));
  MutexLock lock(&mu_);
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument) << too_big;
  for (std::byte b : inbox->bytes()) ASSERT_EQ(b, std::byte{0});
}

TEST_P(TransportConformanceTest, RejectsInvalidBatchWithNothingStarted) {
  constexpr std::uint64_t kSize = 8192;
  std::unique_ptr<MemoryRegion> server = Allocate(*pair_.server, kSize);
  std::unique_ptr<MemoryRegion> client = Allocate(*pair_.client, kSize);
  ASSERT_TRUE(server && client);
  std::memset(client->bytes().data(), 0xab, kSize);
  std::unique_ptr<RemoteRegion> remote = Import(*client_ep_, *server, 0, kSize / 2);
  ASSERT_NE(remote, nullptr);
  const Transfer good{.op = TransferOp::kWrite,
                      .local = client.get(),
                      .length = 1024,
                      .remote = remote.get(),
                      .header = {}};
  std::vector<std::byte> big_header(kMaxMessageHeaderBytes + 1);
  std::vector<Transfer> bad = {
      {.op = TransferOp::kWrite,
       .local = client.get(),
       .length = kSize / 2 + 1,
       .remote = remote.get(),
       .header = {}},  // past the export, though inside the region
      {.op = TransferOp::kRead,
       .local = client.get(),
       .local_offset = kSize - 10,
       .length = 11,
       .remote = remote.get(),
       .header = {}},
      {.op = TransferOp::kRead,
       .local = client.get(),
       .length = 16,
       .remote = remote.get(),
       .remote_offset = UINT64_MAX - 8,
       .header = {}},  // overflows
      {.op = TransferOp::kRead,
       .local = client.get(),
       .length = 16,
       .remote = nullptr,
       .header = {}},
      {.op = TransferOp::kWrite,
       .local = nullptr,
       .length = 16,
       .remote = remote.get(),
       .header = {}},
      {.op = TransferOp::kSend, .header = big_header},
      {.op = TransferOp::kSend, .local = nullptr, .length = 1, .header = {}},
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    std::vector<Transfer> batch = {good, bad[i]};
    StatusOr<std::unique_ptr<TransferBatch>> b = client_ep_->Submit(batch);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << "case " << i;
  }
  ASSERT_TRUE(client_ep_->Flush(Soon()).ok());
  for (std::byte b : server->bytes()) ASSERT_EQ(b, std::byte{0}) << "a rejected batch ran";
  // The same good entry alone does run.
  std::unique_ptr<TransferBatch> ok = Submit(*client_ep_, {good});
  ASSERT_TRUE(ok && ok->Wait(Soon()).ok());
  EXPECT_TRUE(ok->FirstError().ok());
  EXPECT_EQ(server->bytes()[0], std::byte{0xab});
}

TEST_P(TransportConformanceTest, ExportAndImportRejectWhatIsOutOfRangeOrMalformed) {
  std::unique_ptr<MemoryRegion> server = Allocate(*pair_.server, 4096);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->Export(4000, 97).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server->Export(UINT64_MAX, 2).status().code(), StatusCode::kInvalidArgument);
  StatusOr<std::string> good = server->Export(0, 4096);
  ASSERT_TRUE(good.ok());
  std::vector<std::string> malformed = {"", "x", good->substr(0, good->size() - 1), *good + "x",
                                        std::string(good->size(), '\xff')};
  for (const std::string& m : malformed) {
    EXPECT_EQ(client_ep_->ImportRegion(m).status().code(), StatusCode::kInvalidArgument)
        << m.size() << " bytes";
  }
}

TEST_P(TransportConformanceTest, CancelCompletesEveryEntryOkOrCancelled) {
  constexpr std::uint64_t kBlock = 1 << 20;
  InFlight f = SubmitReads(16, kBlock);
  ASSERT_NE(f.batch, nullptr);
  f.batch->Cancel();
  ASSERT_TRUE(f.batch->Wait(Soon()).ok());
  ExpectEachOkOr(*f.batch, StatusCode::kCancelled);
  for (std::size_t i = 0; i < 16; ++i) {
    if (!f.batch->results()[i].status.ok()) {
      continue;
    }
    EXPECT_EQ(f.batch->results()[i].bytes, kBlock);
    EXPECT_EQ(f.client_region->bytes()[i * kBlock + kBlock - 1], std::byte{0x5a});
  }
}

TEST_P(TransportConformanceTest, CancelWhileStalledCancelsEveryEntryAndTouchesNothing) {
  if (!pair_.stall_server) GTEST_SKIP() << "backend cannot stall the server";
  pair_.stall_server(true);
  InFlight f = SubmitReads(4, 4096);
  ASSERT_NE(f.batch, nullptr);
  EXPECT_FALSE(f.batch->Done());
  f.batch->Cancel();
  ASSERT_TRUE(f.batch->Wait(Soon()).ok());
  ExpectEach(*f.batch, StatusCode::kCancelled);
  pair_.stall_server(false);
  ASSERT_TRUE(client_ep_->Flush(Soon()).ok());
  // Cancelled reads must not land later: the range is the caller's again.
  std::unique_ptr<TransferBatch> probe = Submit(*client_ep_, {});
  ASSERT_TRUE(probe && probe->Wait(Soon()).ok());
  for (std::byte b : f.client_region->bytes()) ASSERT_EQ(b, std::byte{0});
}

TEST_P(TransportConformanceTest, DestroyingTheBatchHandleCancelsAndWaits) {
  if (!pair_.stall_server) GTEST_SKIP() << "backend cannot stall the server";
  pair_.stall_server(true);
  InFlight f = SubmitReads(4, 4096);
  ASSERT_NE(f.batch, nullptr);
  // ~TransferBatch returns only once every entry completed (Cancelled). Run it
  // on a helper thread so that a backend that never completes fails the test.
  bool destroyed = false;
  std::thread destroyer([&] {
    f.batch.reset();
    MutexLock lock(&mu_);
    destroyed = true;
    cv_.NotifyAll();
  });
  const bool in_time = WaitFor([&] { return destroyed; });
  pair_.stall_server(false);
  destroyer.join();
  ASSERT_TRUE(in_time) << "~TransferBatch did not return while the server was stalled";
  EXPECT_TRUE(client_ep_->Flush(Soon()).ok());
  EXPECT_TRUE(client_ep_->health().ok());
}

TEST_P(TransportConformanceTest, ForceCloseWithWorkInFlightCompletesEveryEntry) {
  if (pair_.stall_server) pair_.stall_server(true);
  InFlight f = SubmitReads(16, 256 * 1024);
  ASSERT_NE(f.batch, nullptr);
  EXPECT_TRUE(client_ep_->Close(CloseMode::kForce, Soon()).ok());
  ASSERT_TRUE(f.batch->Done()) << "Close returned with entries in flight";
  if (pair_.stall_server) {
    ExpectEach(*f.batch, StatusCode::kCancelled);
  } else {
    ExpectEachOkOr(*f.batch, StatusCode::kCancelled);
  }
  EXPECT_EQ(client_ep_->health().code(), StatusCode::kUnavailable);
  // The peer learns of it.
  for (int i = 0; i < 500 && server_ep_->health().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_ep_->health().code(), StatusCode::kUnavailable);
  // Work submitted after the close fails instead of hanging.
  StatusOr<std::unique_ptr<TransferBatch>> late =
      client_ep_->Submit(std::vector<Transfer>{{.op = TransferOp::kSend, .header = {}}});
  if (late.ok()) {
    ASSERT_TRUE((*late)->Wait(Soon()).ok());
    EXPECT_FALSE((*late)->FirstError().ok());
  }
}

TEST_P(TransportConformanceTest, GracefulCloseWaitsForInFlightEntries) {
  InFlight f = SubmitReads(16, 256 * 1024);
  ASSERT_NE(f.batch, nullptr);
  EXPECT_TRUE(client_ep_->Close(CloseMode::kGraceful, Soon()).ok());
  ASSERT_TRUE(f.batch->Done());
  EXPECT_TRUE(f.batch->FirstError().ok()) << f.batch->FirstError();
  EXPECT_EQ(f.client_region->bytes()[16 * 256 * 1024 - 1], std::byte{0x5a});
}

TEST_P(TransportConformanceTest, GracefulCloseFallsBackToForceAtTheDeadline) {
  if (!pair_.stall_server) GTEST_SKIP() << "backend cannot stall the server";
  pair_.stall_server(true);
  InFlight f = SubmitReads(4, 4096);
  ASSERT_NE(f.batch, nullptr);
  Status s = client_ep_->Close(CloseMode::kGraceful, Clock::now() + std::chrono::milliseconds(20));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  ASSERT_TRUE(f.batch->Done());
  ExpectEach(*f.batch, StatusCode::kCancelled);
}

TEST_P(TransportConformanceTest, FlushWaitsForEarlierEntries) {
  InFlight f = SubmitReads(16, 64 * 1024);
  ASSERT_NE(f.batch, nullptr);
  ASSERT_TRUE(client_ep_->Flush(Soon()).ok());
  EXPECT_TRUE(f.batch->Done());
  EXPECT_TRUE(f.batch->FirstError().ok());
}

TEST_P(TransportConformanceTest, FlushReportsDeadlineExceededWhileStalledAndCancelsNothing) {
  if (!pair_.stall_server) GTEST_SKIP() << "backend cannot stall the server";
  pair_.stall_server(true);
  InFlight f = SubmitReads(2, 4096);
  ASSERT_NE(f.batch, nullptr);
  EXPECT_EQ(client_ep_->Flush(Clock::now() + std::chrono::milliseconds(20)).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.batch->Wait(Clock::now()).code(), StatusCode::kDeadlineExceeded);
  pair_.stall_server(false);
  ASSERT_TRUE(client_ep_->Flush(Soon()).ok());
  EXPECT_TRUE(f.batch->FirstError().ok()) << f.batch->FirstError();
  EXPECT_EQ(f.client_region->bytes()[0], std::byte{0x5a});
}

TEST_P(TransportConformanceTest, PeerTransportDestructionFailsInFlightAndLaterEntries) {
  const bool stalled = static_cast<bool>(pair_.stall_server);
  if (stalled) pair_.stall_server(true);
  InFlight f = SubmitReads(16, 256 * 1024);
  ASSERT_NE(f.batch, nullptr);
  f.server_region.reset();       // the server's memory goes with it, as in a crash
  pair_.stall_server = nullptr;  // it may name the server
  pair_.server.reset();
  ASSERT_TRUE(f.batch->Wait(Soon()).ok()) << "a dead peer must fail in-flight work";
  if (stalled) {
    ExpectEach(*f.batch, StatusCode::kUnavailable);
  } else {
    ExpectEachOkOr(*f.batch, StatusCode::kUnavailable);
  }
  for (int i = 0; i < 500 && client_ep_->health().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(client_ep_->health().code(), StatusCode::kUnavailable);
  std::vector<Transfer> later = {{.op = TransferOp::kRead,
                                  .local = f.client_region.get(),
                                  .length = 4096,
                                  .remote = f.remote.get(),
                                  .header = {}},
                                 {.op = TransferOp::kSend, .header = {}}};
  std::unique_ptr<TransferBatch> batch = Submit(*client_ep_, later);
  ASSERT_NE(batch, nullptr);
  ASSERT_TRUE(batch->Wait(Soon()).ok());
  ExpectEach(*batch, StatusCode::kUnavailable);
}

TEST_P(TransportConformanceTest, PeerEndpointCloseFailsLaterEntriesAndHealth) {
  std::unique_ptr<MemoryRegion> server = Allocate(*pair_.server, 4096);
  std::unique_ptr<MemoryRegion> client = Allocate(*pair_.client, 4096);
  ASSERT_TRUE(server && client);
  std::unique_ptr<RemoteRegion> remote = Import(*client_ep_, *server, 0, 4096);
  ASSERT_NE(remote, nullptr);
  ASSERT_TRUE(server_ep_->Close(CloseMode::kGraceful, Soon()).ok());
  for (int i = 0; i < 500 && client_ep_->health().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(client_ep_->health().code(), StatusCode::kUnavailable);
  std::unique_ptr<TransferBatch> batch = Submit(*client_ep_, {{.op = TransferOp::kWrite,
                                                               .local = client.get(),
                                                               .length = 4096,
                                                               .remote = remote.get(),
                                                               .header = {}}});
  ASSERT_NE(batch, nullptr);
  ASSERT_TRUE(batch->Wait(Soon()).ok());
  ExpectEach(*batch, StatusCode::kUnavailable);
}

TEST_P(TransportConformanceTest, ConcurrentSubmittersEachSeeTheirOwnData) {
  std::mt19937_64 rng(Seed());
  constexpr int kThreads = 3;
  constexpr std::uint64_t kBlock = 32 * 1024;
  constexpr int kRounds = 20;
  std::unique_ptr<MemoryRegion> server = Allocate(*pair_.server, kThreads * kBlock);
  ASSERT_NE(server, nullptr);
  FillRandom(server->bytes(), rng);
  std::unique_ptr<RemoteRegion> remote = Import(*client_ep_, *server, 0, kThreads * kBlock);
  ASSERT_NE(remote, nullptr);
  std::vector<std::unique_ptr<MemoryRegion>> locals;
  for (int t = 0; t < kThreads; ++t) locals.push_back(Allocate(*pair_.client, kBlock));
  std::vector<int> good(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        StatusOr<std::unique_ptr<TransferBatch>> b =
            client_ep_->Submit(std::vector<Transfer>{{.op = TransferOp::kRead,
                                                      .local = locals[t].get(),
                                                      .length = kBlock,
                                                      .remote = remote.get(),
                                                      .remote_offset = t * kBlock,
                                                      .header = {}}});
        if (!b.ok() || !(*b)->Wait(Soon()).ok() || !(*b)->FirstError().ok()) return;
        if (Crc(locals[t]->bytes()) == Crc(server->bytes().subspan(t * kBlock, kBlock))) {
          ++good[t];
        }
        std::memset(locals[t]->bytes().data(), 0, kBlock);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(good[t], kRounds) << "thread " << t;
}

}  // namespace kvfabric::transport::conformance
