#include "transport/testing/fault_injection_transport.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/mutex.h"
#include "core/testing/test_seed.h"
#include "transport/loopback_transport.h"
#include "transport/testing/transport_conformance.h"

namespace kvfabric::transport {
namespace {

using conformance::ConformanceParamName;
using conformance::Soon;
using conformance::TransportConformanceParam;
using conformance::TransportConformanceTest;
using conformance::TransportPair;
using std::chrono::milliseconds;

std::unique_ptr<FaultInjectionTransport> WrapLoopback(LoopbackNetwork& network,
                                                      const FaultInjectionOptions& options) {
  auto base = CreateLoopbackTransport({.network = &network});
  EXPECT_TRUE(base.ok()) << base.status();
  return std::make_unique<FaultInjectionTransport>(std::move(base).value(), options);
}

// With every rate 0 the wrapper must pass the whole conformance suite.
TransportPair MakeWrappedLoopbackPair() {
  auto network = std::make_shared<LoopbackNetwork>();
  TransportPair pair;
  pair.keep_alive = network;
  auto server = WrapLoopback(*network, {});
  auto* raw = static_cast<LoopbackTransport*>(server->base());
  pair.server = std::move(server);
  pair.client = WrapLoopback(*network, {});
  pair.listen_address = "loopback:0";
  pair.stall_server = [raw](bool stalled) { raw->TEST_StallPeerWork(stalled); };
  return pair;
}

INSTANTIATE_TEST_SUITE_P(FaultInjectionWithoutFaults, TransportConformanceTest,
                         ::testing::Values(TransportConformanceParam{"loopback_in_fault_injection",
                                                                     &MakeWrappedLoopbackPair}),
                         ConformanceParamName);

int DifferingBits(std::span<const std::byte> a, std::span<const std::byte> b) {
  int bits = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bits += std::popcount(static_cast<unsigned>(a[i] ^ b[i]));
  }
  return bits;
}

class FaultInjectionTransportTest : public ::testing::Test {
 protected:
  // Connects a client (wrapped, `client_options`) to a server (wrapped, `server_options`).
  void Connect(const FaultInjectionOptions& client_options,
               const FaultInjectionOptions& server_options = {}) {
    server_ = WrapLoopback(network_, server_options);
    client_ = WrapLoopback(network_, client_options);
    server_->SetMessageHandler([this](IncomingMessage& m) {
      std::function<void(IncomingMessage&)> fn;
      {
        MutexLock lock(&mu_);
        fn = on_message_;
      }
      if (fn) {
        fn(m);
      } else {
        m.Drop();
      }
    });
    ASSERT_TRUE(server_
                    ->Listen("loopback:0",
                             [this](std::unique_ptr<Endpoint> ep) {
                               MutexLock lock(&mu_);
                               accepted_ = std::move(ep);
                               cv_.NotifyAll();
                             })
                    .ok());
    auto ep = client_->Connect(server_->listen_address(), PeerFailureMode::kFailInFlight, Soon());
    ASSERT_TRUE(ep.ok()) << ep.status();
    client_ep_ = std::move(ep).value();
    MutexLock lock(&mu_);
    ASSERT_TRUE(
        cv_.WaitUntil(&mu_, Soon(), [this]() KVF_REQUIRES(mu_) { return accepted_ != nullptr; }));
    server_mem_ = std::move(server_->AllocateMemory(kSize, MemoryKind::kHost)).value();
    client_mem_ = std::move(client_->AllocateMemory(kSize, MemoryKind::kHost)).value();
    remote_ = std::move(client_ep_->ImportRegion(*server_mem_->Export(0, kSize))).value();
  }

  std::unique_ptr<TransferBatch> Submit(TransferOp op, std::uint64_t length = kSize,
                                        bool checksum = false) {
    std::vector<Transfer> t = {{.op = op,
                                .local = client_mem_.get(),
                                .length = length,
                                .remote = remote_.get(),
                                .header = {},
                                .checksum = checksum}};
    auto b = client_ep_->Submit(t);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(b).value();
  }

  static constexpr std::uint64_t kSize = 4096;
  LoopbackNetwork network_;
  Mutex mu_;
  CondVar cv_;
  std::function<void(IncomingMessage&)> on_message_ KVF_GUARDED_BY(mu_);
  std::unique_ptr<FaultInjectionTransport> server_, client_;
  std::unique_ptr<Endpoint> accepted_ KVF_GUARDED_BY(mu_);
  std::unique_ptr<Endpoint> client_ep_;
  std::unique_ptr<MemoryRegion> server_mem_, client_mem_;
  std::unique_ptr<RemoteRegion> remote_;
};

TEST_F(FaultInjectionTransportTest, FailCompletesWithChosenCodeAndDoesNothing) {
  Connect({.rates = {.fail_one_in = 1, .fail_code = StatusCode::kDataLoss}});
  std::memset(client_mem_->bytes().data(), 0x11, kSize);
  auto b = Submit(TransferOp::kWrite);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  EXPECT_EQ(b->results()[0].status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(b->results()[0].bytes, 0u);
  ASSERT_TRUE(client_ep_->Flush(Soon()).ok());
  EXPECT_EQ(server_mem_->bytes()[0], std::byte{0});
  EXPECT_EQ(client_->counters().failed, 1u);
  EXPECT_EQ(client_->counters().entries, 1u);
}

TEST_F(FaultInjectionTransportTest, FailAfterPerformsTheTransferThenReportsFailure) {
  Connect({.rates = {.fail_after_one_in = 1}});
  std::memset(client_mem_->bytes().data(), 0x22, kSize);
  auto b = Submit(TransferOp::kWrite);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  EXPECT_EQ(b->results()[0].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(server_mem_->bytes()[kSize - 1], std::byte{0x22});
  EXPECT_EQ(client_->counters().failed_after, 1u);
}

TEST_F(FaultInjectionTransportTest, DelayedEntryIsHeldUntilCancelCutsTheDelayShort) {
  Connect({.rates = {.delay_one_in = 1, .delay = std::chrono::minutes(10)}});
  std::memset(server_mem_->bytes().data(), 0x33, kSize);
  auto b = Submit(TransferOp::kRead);
  EXPECT_EQ(b->Wait(Clock::now() + milliseconds(30)).code(), StatusCode::kDeadlineExceeded);
  b->Cancel();
  ASSERT_TRUE(b->Wait(Soon()).ok());
  // The read had happened: the real outcome is reported.
  EXPECT_TRUE(b->results()[0].status.ok()) << b->results()[0].status;
  EXPECT_EQ(client_mem_->bytes()[0], std::byte{0x33});
  EXPECT_EQ(client_->counters().delayed, 1u);
}

TEST_F(FaultInjectionTransportTest, DelayedEntryCompletesOnItsOwn) {
  Connect({.rates = {.delay_one_in = 1, .delay = milliseconds(5)}});
  auto b = Submit(TransferOp::kRead);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  EXPECT_TRUE(b->results()[0].status.ok());
}

TEST_F(FaultInjectionTransportTest, DroppedEntryNeverCompletesUntilCancelled) {
  Connect({.rates = {.drop_one_in = 1}});
  std::memset(server_mem_->bytes().data(), 0x44, kSize);
  auto b = Submit(TransferOp::kRead);
  EXPECT_EQ(b->Wait(Clock::now() + milliseconds(20)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client_ep_->Flush(Clock::now() + milliseconds(20)).code(),
            StatusCode::kDeadlineExceeded);
  b->Cancel();
  ASSERT_TRUE(b->Wait(Soon()).ok());
  EXPECT_EQ(b->results()[0].status.code(), StatusCode::kCancelled);
  EXPECT_EQ(client_mem_->bytes()[0], std::byte{0});  // never performed
  EXPECT_EQ(client_->counters().dropped, 1u);
}

TEST_F(FaultInjectionTransportTest, CloseAndDestructionCompleteDroppedEntries) {
  Connect({.rates = {.drop_one_in = 1}}, {.rates = {.drop_one_in = 1}});
  auto closed = Submit(TransferOp::kRead);
  auto destroyed = Submit(TransferOp::kWrite);
  auto handle_dropped = Submit(TransferOp::kRead);
  handle_dropped.reset();  // the destructor cancels and waits
  std::vector<Transfer> send = {{.op = TransferOp::kSend, .header = {}}};
  auto accepted_ep = [&] {
    MutexLock lock(&mu_);
    return std::move(accepted_);
  }();
  auto on_server = accepted_ep->Submit(send);
  ASSERT_TRUE(on_server.ok());
  EXPECT_EQ(client_ep_->Close(CloseMode::kGraceful, Clock::now() + milliseconds(20)).code(),
            StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(closed->Done() && destroyed->Done());
  EXPECT_EQ(closed->results()[0].status.code(), StatusCode::kCancelled);
  server_.reset();  // the server's own dropped send completes too
  ASSERT_TRUE((*on_server)->Done());
  EXPECT_EQ((*on_server)->results()[0].status.code(), StatusCode::kCancelled);
}

TEST_F(FaultInjectionTransportTest, CorruptFlipsExactlyOneBitOfAReadDestination) {
  std::mt19937_64 rng(TestSeed("FaultInjectionTransportTest.CorruptRead"));
  Connect({.seed = rng(), .rates = {.corrupt_one_in = 1}});
  for (std::byte& b : server_mem_->bytes()) b = static_cast<std::byte>(rng());
  auto b = Submit(TransferOp::kRead);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  EXPECT_TRUE(b->results()[0].status.ok());
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 1);
  EXPECT_EQ(client_->counters().corrupted, 1u);
  // Writes are not corrupted by the writer's wrapper (the destination is remote).
  auto w = Submit(TransferOp::kWrite);
  ASSERT_TRUE(w->Wait(Soon()).ok());
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 0);
}

TEST_F(FaultInjectionTransportTest, CorruptWriteFlipsOneBitOfWhatThePeerGetsAndNoneOfTheSource) {
  std::mt19937_64 rng(TestSeed("FaultInjectionTransportTest.CorruptWrite"));
  Connect({.seed = rng(), .rates = {.corrupt_write_one_in = 1}});
  for (std::byte& b : client_mem_->bytes()) b = static_cast<std::byte>(rng());
  const std::vector<std::byte> source(client_mem_->bytes().begin(), client_mem_->bytes().end());
  auto w = Submit(TransferOp::kWrite);
  ASSERT_TRUE(w->Wait(Soon()).ok());
  EXPECT_TRUE(w->results()[0].status.ok());
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 1);
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), source), 0) << "the source was changed";
  EXPECT_EQ(client_->counters().corrupted_writes, 1u);
  // Reads are not touched by this rate.
  auto r = Submit(TransferOp::kRead);
  ASSERT_TRUE(r->Wait(Soon()).ok());
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 0);
  EXPECT_EQ(client_->counters().corrupted, 0u);
}

// Transfer::checksum through the wrapper: a corrupted read reports no landed
// CRC (the base's was of the bytes before the flip), a corrupted write
// reports the CRC of the flipped bytes the peer got, an untouched entry the
// base's.
TEST_F(FaultInjectionTransportTest, LandedCrcsNeverVouchForBytesTheWrapperFlipped) {
  std::mt19937_64 rng(TestSeed("FaultInjectionTransportTest.LandedCrcs"));
  Connect({.seed = rng(),
           .rates = {
               .corrupt_one_in = 1, .corrupt_write_one_in = 1, .corrupt_write_min_bytes = kSize}});
  for (std::byte& b : server_mem_->bytes()) b = static_cast<std::byte>(rng());
  auto r = Submit(TransferOp::kRead, kSize, /*checksum=*/true);
  ASSERT_TRUE(r->Wait(Soon()).ok());
  ASSERT_TRUE(r->results()[0].status.ok());
  EXPECT_FALSE(r->results()[0].landed_crc32c.has_value());
  for (std::byte& b : client_mem_->bytes()) b = static_cast<std::byte>(rng());
  auto w = Submit(TransferOp::kWrite, kSize, /*checksum=*/true);
  ASSERT_TRUE(w->Wait(Soon()).ok());
  ASSERT_TRUE(w->results()[0].landed_crc32c.has_value());
  EXPECT_EQ(*w->results()[0].landed_crc32c, crc32c::Value(server_mem_->bytes().first(kSize)));
  EXPECT_NE(*w->results()[0].landed_crc32c, crc32c::Value(client_mem_->bytes().first(kSize)));
  // Shorter than corrupt_write_min_bytes: spared, and the base's CRC stands.
  for (std::byte& b : client_mem_->bytes()) b = static_cast<std::byte>(rng());
  auto plain = Submit(TransferOp::kWrite, kSize / 2, /*checksum=*/true);
  ASSERT_TRUE(plain->Wait(Soon()).ok());
  ASSERT_TRUE(plain->results()[0].landed_crc32c.has_value());
  EXPECT_EQ(*plain->results()[0].landed_crc32c,
            crc32c::Value(client_mem_->bytes().first(kSize / 2)));
}

TEST_F(FaultInjectionTransportTest, CorruptWriteSparesEntriesShorterThanItsMinimum) {
  std::mt19937_64 rng(TestSeed("FaultInjectionTransportTest.CorruptWriteMin"));
  Connect({.seed = rng(), .rates = {.corrupt_write_one_in = 1, .corrupt_write_min_bytes = kSize}});
  for (std::byte& b : client_mem_->bytes()) b = static_cast<std::byte>(rng());
  // Shorter than the minimum: written intact.
  auto short_write = Submit(TransferOp::kWrite, kSize / 2);
  ASSERT_TRUE(short_write->Wait(Soon()).ok());
  EXPECT_EQ(
      DifferingBits(client_mem_->bytes().first(kSize / 2), server_mem_->bytes().first(kSize / 2)),
      0);
  EXPECT_EQ(client_->counters().corrupted_writes, 0u);
  // At the minimum: corrupted.
  auto w = Submit(TransferOp::kWrite, kSize);
  ASSERT_TRUE(w->Wait(Soon()).ok());
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 1);
  EXPECT_EQ(client_->counters().corrupted_writes, 1u);
}

TEST_F(FaultInjectionTransportTest, CorruptFlipsOneBitOfAnAcceptedPayload) {
  std::mt19937_64 rng(TestSeed("FaultInjectionTransportTest.CorruptPayload"));
  Connect({}, {.seed = rng(), .rates = {.corrupt_one_in = 1}});
  for (std::byte& b : client_mem_->bytes()) b = static_cast<std::byte>(rng());
  bool placed = false;
  {
    MutexLock lock(&mu_);
    on_message_ = [&](IncomingMessage& m) {
      EXPECT_TRUE(m.Accept(server_mem_.get(), 0, [&](Status s) {
                     EXPECT_TRUE(s.ok());
                     MutexLock lock(&mu_);
                     placed = true;
                     cv_.NotifyAll();
                   }).ok());
    };
  }
  std::vector<Transfer> send = {
      {.op = TransferOp::kSend, .local = client_mem_.get(), .length = kSize, .header = {}}};
  auto b = client_ep_->Submit(send);
  ASSERT_TRUE(b.ok() && (*b)->Wait(Soon()).ok());
  MutexLock lock(&mu_);
  ASSERT_TRUE(cv_.WaitUntil(&mu_, Soon(), [&] { return placed; }));
  EXPECT_EQ(DifferingBits(client_mem_->bytes(), server_mem_->bytes()), 1);
  EXPECT_EQ(server_->counters().corrupted, 1u);
}

// Runs 40 single-entry batches under mixed faults and returns each outcome.
std::vector<StatusCode> RunMixed(std::uint64_t seed) {
  LoopbackNetwork network;
  FaultInjectionOptions options{.seed = seed,
                                .rates = {.fail_one_in = 4,
                                          .fail_after_one_in = 5,
                                          .delay_one_in = 6,
                                          .drop_one_in = 7,
                                          .corrupt_one_in = 3,
                                          .delay = milliseconds(1)}};
  auto server = WrapLoopback(network, {});
  auto client = WrapLoopback(network, options);
  std::unique_ptr<Endpoint> accepted;
  EXPECT_TRUE(server
                  ->Listen("loopback:0",
                           [&](std::unique_ptr<Endpoint> ep) {
                             accepted =
                                 std::move(ep);  // only on the server's worker, before any use here
                           })
                  .ok());
  auto ep = client->Connect(server->listen_address(), PeerFailureMode::kFailInFlight, Soon());
  EXPECT_TRUE(ep.ok());
  auto mem = std::move(server->AllocateMemory(4096, MemoryKind::kHost)).value();
  auto local = std::move(client->AllocateMemory(4096, MemoryKind::kHost)).value();
  auto remote = std::move((*ep)->ImportRegion(*mem->Export(0, 4096))).value();
  std::vector<StatusCode> outcomes;
  for (int i = 0; i < 40; ++i) {
    std::vector<Transfer> t = {{.op = i % 2 ? TransferOp::kRead : TransferOp::kWrite,
                                .local = local.get(),
                                .length = 4096,
                                .remote = remote.get(),
                                .header = {}}};
    const std::uint64_t dropped_before = client->counters().dropped;
    auto b = (*ep)->Submit(t);
    EXPECT_TRUE(b.ok());
    // A dropped entry never completes on its own: cancel exactly those.
    if (client->counters().dropped != dropped_before) (*b)->Cancel();
    EXPECT_TRUE((*b)->Wait(Soon()).ok());
    outcomes.push_back((*b)->results()[0].status.code());
  }
  FaultInjectionCounters c = client->counters();
  EXPECT_EQ(c.entries, 40u);
  EXPECT_GT(c.failed + c.failed_after + c.delayed + c.dropped + c.corrupted, 0u);
  return outcomes;
}

TEST(FaultInjectionDeterminismTest, SameSeedInjectsTheSameFaults) {
  const std::uint64_t seed = TestSeed("FaultInjectionDeterminismTest.SameSeed");
  std::vector<StatusCode> first = RunMixed(seed);
  std::vector<StatusCode> second = RunMixed(seed);
  EXPECT_EQ(first, second);
  int cancelled = 0;
  for (StatusCode c : first) cancelled += c == StatusCode::kCancelled;
  EXPECT_LT(cancelled, 40);
}

}  // namespace
}  // namespace kvfabric::transport
