// The UCX transport's behaviour over TCP and over shared memory, with one
// worker and with three on each side, and its options' checks. Inline
// copies and copy helpers: ucx_copy_test.cc; several workers serving several
// clients: ucx_workers_test.cc.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "transport/ucx/ucx_export.h"
#include "transport/ucx/ucx_test_fixture.h"

namespace kvfabric::ucx::ucx_test {
namespace {

TEST_P(UcxTransportTest, ReadsAndWritesOneMebibyteRegions) {
  const std::uint64_t seed = TestSeed("ReadsAndWritesOneMebibyteRegions");
  std::vector<std::byte> server_buf(kMiB), client_buf(kMiB);
  Fill(server_buf, seed);
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);
  EXPECT_EQ(remote->length(), kMiB);

  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Read(client_region.get(), 0, remote.get(), 0, kMiB)}).ok());
  EXPECT_TRUE(Same(client_buf, server_buf));

  Fill(client_buf, seed + 1);
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Write(client_region.get(), 0, remote.get(), 0, kMiB)}).ok());
  // OK for a kWrite means placed in the peer's memory.
  EXPECT_TRUE(Same(client_buf, server_buf));
}

TEST_P(UcxTransportTest, RunsBatchesOfSixteenEntries) {
  const std::uint64_t seed = TestSeed("RunsBatchesOfSixteenEntries");
  constexpr std::uint64_t kSlice = 64 * 1024;
  std::vector<std::byte> server_buf(16 * kSlice), client_buf(16 * kSlice);
  Fill(server_buf, seed);
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);

  // Slice i of the server lands in slice 15 - i of the client.
  std::vector<Transfer> reads;
  for (std::uint64_t i = 0; i < 16; ++i) {
    reads.push_back(Read(client_region.get(), (15 - i) * kSlice, remote.get(), i * kSlice, kSlice));
  }
  auto batch = client_ep_->Submit(reads);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE((*batch)->Wait(In(10)).ok());
  ASSERT_TRUE((*batch)->FirstError().ok()) << (*batch)->FirstError();
  EXPECT_EQ((*batch)->TotalBytes(), 16 * kSlice);
  for (std::uint64_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(Same(std::span(client_buf).subspan((15 - i) * kSlice, kSlice),
                     std::span(server_buf).subspan(i * kSlice, kSlice)))
        << "slice " << i;
  }

  Fill(client_buf, seed + 1);
  std::vector<Transfer> writes;
  for (std::uint64_t i = 0; i < 16; ++i) {
    writes.push_back(Write(client_region.get(), i * kSlice, remote.get(), i * kSlice, kSlice));
  }
  ASSERT_TRUE(SubmitAndWait(*client_ep_, writes).ok());
  EXPECT_TRUE(Same(client_buf, server_buf));
}

TEST_P(UcxTransportTest, SendsHeaderOnlyMessage) {
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  bool had_endpoint = false;
  OnMessage([&](IncomingMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    got.assign(reinterpret_cast<const char*>(m.header().data()), m.header().size());
    had_endpoint = m.endpoint() != nullptr;
    EXPECT_EQ(m.payload_length(), 0u);
    cv.notify_all();
  });
  const std::string header = "lease 42 ready";
  Transfer t;
  t.op = TransferOp::kSend;
  t.header = std::as_bytes(std::span(header));
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {t}).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_until(lock, In(10), [&] { return !got.empty(); }));
  EXPECT_EQ(got, header);
  EXPECT_TRUE(had_endpoint);
}

// Sends `payload_bytes` and has the server accept it at offset 4096 of a
// region; returns whether the placed bytes match.
void SendAndAccept(UcxTransportTest* test, Transport& server, Transport& client,
                   Endpoint& client_ep, std::uint64_t payload_bytes, std::uint64_t seed) {
  std::vector<std::byte> src(payload_bytes), dst(payload_bytes + 8192);
  Fill(src, seed);
  auto src_region = client.RegisterMemory(src, MemoryKind::kHost);
  auto dst_region = server.RegisterMemory(dst, MemoryKind::kHost);
  ASSERT_TRUE(src_region.ok() && dst_region.ok());
  std::mutex mu;
  std::condition_variable cv;
  bool placed = false;
  Status placed_status = Status::Unknown("not placed");
  MemoryRegion* dst_raw = dst_region->get();
  test->OnMessage([&](IncomingMessage& m) {
    EXPECT_EQ(m.payload_length(), payload_bytes);
    Status st = m.Accept(dst_raw, 4096, [&](Status s) {
      std::lock_guard<std::mutex> lock(mu);
      placed = true;
      placed_status = s;
      cv.notify_all();
    });
    EXPECT_TRUE(st.ok()) << st;
  });
  const std::string header = "block";
  Transfer t;
  t.op = TransferOp::kSend;
  t.header = std::as_bytes(std::span(header));
  t.local = src_region->get();
  t.length = payload_bytes;
  ASSERT_TRUE(SubmitAndWait(client_ep, {t}).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_until(lock, In(10), [&] { return placed; }));
  ASSERT_TRUE(placed_status.ok()) << placed_status;
  EXPECT_TRUE(Same(src, std::span(dst).subspan(4096, payload_bytes)));
}

TEST_P(UcxTransportTest, AcceptsLargePayloadIntoChosenRegionByRendezvous) {
  const auto before = TEST_GetCounters(*server_);
  SendAndAccept(this, *server_, *client_, *client_ep_, 2 * kMiB, TestSeed("LargePayload"));
  EXPECT_GT(TEST_GetCounters(*server_).rendezvous_messages, before.rendezvous_messages);
}

TEST_P(UcxTransportTest, AcceptsSmallPayloadEagerly) {
  const auto before = TEST_GetCounters(*server_);
  SendAndAccept(this, *server_, *client_, *client_ep_, 200, TestSeed("SmallPayload"));
  EXPECT_GT(TEST_GetCounters(*server_).eager_messages, before.eager_messages);
}

TEST_P(UcxTransportTest, AcceptRefusesPayloadThatDoesNotFit) {
  std::vector<std::byte> src(4096), dst(1024);
  auto src_region = Register(*client_, src);
  auto dst_region = Register(*server_, dst);
  std::mutex mu;
  std::condition_variable cv;
  bool handled = false;
  Status accept_status;
  OnMessage([&](IncomingMessage& m) {
    Status st = m.Accept(dst_region.get(), 0, [](Status) { ADD_FAILURE() << "placed"; });
    std::lock_guard<std::mutex> lock(mu);
    accept_status = st;
    handled = true;
    cv.notify_all();
  });
  Transfer t;
  t.op = TransferOp::kSend;
  t.local = src_region.get();
  t.length = src.size();
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {t}).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_until(lock, In(10), [&] { return handled; }));
  EXPECT_TRUE(accept_status.IsInvalidArgument()) << accept_status;
}

TEST_P(UcxTransportTest, RejectsOutOfBoundsEntriesBeforePostingAnything) {
  std::vector<std::byte> server_buf(8192), client_buf(8192, std::byte{7});
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  // Only the first half is exported: the second half must stay unreachable.
  auto exported = server_region->Export(0, 4096);
  ASSERT_TRUE(exported.ok());
  auto remote = client_ep_->ImportRegion(*exported);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ((*remote)->length(), 4096u);
  const RemoteRegion* r = remote->get();
  MemoryRegion* l = client_region.get();

  const std::vector<std::vector<Transfer>> bad = {
      {Write(l, 0, r, 0, 4096), Write(l, 0, r, 1, 4096)},        // remote end past range
      {Write(l, 0, r, 0, 1024), Write(l, 0, r, 4097, 0)},        // remote offset past range
      {Write(l, 0, r, 0, 1024), Read(l, 8000, r, 0, 1024)},      // local end past region
      {Write(l, 0, r, 0, 1024), Read(l, 0, r, ~0ull - 10, 20)},  // overflowing offset
      {Write(l, 0, r, 0, 1024), Read(nullptr, 0, r, 0, 16)},     // no local region
      {Write(l, 0, r, 0, 1024), Read(l, 0, nullptr, 0, 16)},     // no remote region
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    auto batch = client_ep_->Submit(bad[i]);
    ASSERT_FALSE(batch.ok()) << "case " << i;
    EXPECT_TRUE(batch.status().IsInvalidArgument()) << batch.status();
  }
  std::vector<std::byte> big_header(transport::kMaxMessageHeaderBytes + 1);
  Transfer send;
  send.op = TransferOp::kSend;
  send.header = big_header;
  EXPECT_TRUE(client_ep_->Submit(std::vector<Transfer>{send}).status().IsInvalidArgument());

  // Nothing of the rejected batches was started: the peer's memory is intact.
  ASSERT_TRUE(client_ep_->Flush(In(10)).ok());
  EXPECT_EQ(server_buf, std::vector<std::byte>(8192));
  EXPECT_TRUE(server_region->Export(4096, 4097).status().IsInvalidArgument());
}

TEST_P(UcxTransportTest, RejectsMalformedImports) {
  std::vector<std::byte> buf(4096);
  auto region = Register(*server_, buf);
  auto good = region->Export(0, 4096);
  ASSERT_TRUE(good.ok());
  std::vector<std::string> bad = {"", "KVFU", good->substr(0, good->size() - 1), *good + "x"};
  std::string flipped = *good;
  flipped[40] ^= 0x40;  // inside the packed key: the checksum catches it
  bad.push_back(flipped);
  std::string version = *good;
  version[4] = 9;
  bad.push_back(version);
  std::mt19937_64 rng(TestSeed("RejectsMalformedImports"));
  for (int i = 0; i < 20; ++i) {
    std::string junk(good->size(), '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    bad.push_back(junk);
  }
  for (std::size_t i = 0; i < bad.size(); ++i) {
    auto imported = client_ep_->ImportRegion(bad[i]);
    EXPECT_TRUE(imported.status().IsInvalidArgument()) << "case " << i << ": " << imported.status();
  }
  EXPECT_TRUE(client_ep_->ImportRegion(*good).ok());
}

TEST_P(UcxTransportTest, ForceCloseCompletesEveryEntry) {
  std::vector<std::byte> server_buf(4 * kMiB), client_buf(4 * kMiB);
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);
  std::vector<Transfer> transfers;
  for (int round = 0; round < 8; ++round) {
    for (std::uint64_t i = 0; i < 4; ++i) {
      transfers.push_back(Read(client_region.get(), i * kMiB, remote.get(), i * kMiB, kMiB));
    }
  }
  auto batch = client_ep_->Submit(transfers);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(client_ep_->Close(CloseMode::kForce, In(10)).ok());
  ASSERT_TRUE((*batch)->Done());
  for (const auto& r : (*batch)->results()) {
    EXPECT_TRUE(r.status.ok() || r.status.code() == StatusCode::kCancelled) << r.status;
  }
  EXPECT_TRUE(client_ep_->health().IsUnavailable());
  auto later = client_ep_->Submit(transfers);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE((*later)->Wait(In(10)).ok());
  EXPECT_TRUE((*later)->results()[0].status.IsUnavailable());
}

TEST_P(UcxTransportTest, GracefulCloseWaitsForInFlightEntries) {
  std::vector<std::byte> server_buf(kMiB), client_buf(kMiB);
  Fill(server_buf, TestSeed("GracefulClose"));
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);
  auto batch = client_ep_->Submit(
      std::vector<Transfer>{Read(client_region.get(), 0, remote.get(), 0, kMiB)});
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(client_ep_->Close(CloseMode::kGraceful, In(10)).ok());
  ASSERT_TRUE((*batch)->Done());
  EXPECT_TRUE((*batch)->FirstError().ok());
  EXPECT_TRUE(Same(client_buf, server_buf));
}

TEST_P(UcxTransportTest, DestroyedPeerFailsTransfersWithUnavailable) {
  std::vector<std::byte> server_buf(4 * kMiB), client_buf(4 * kMiB);
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);
  std::vector<Transfer> transfers;
  for (std::uint64_t i = 0; i < 4; ++i) {
    transfers.push_back(Read(client_region.get(), i * kMiB, remote.get(), i * kMiB, kMiB));
  }
  auto in_flight = client_ep_->Submit(transfers);
  ASSERT_TRUE(in_flight.ok());
  {
    MutexLock lock(&mu_);
    accepted_.clear();
  }
  server_.reset();
  server_region.reset();
  ASSERT_TRUE((*in_flight)->Wait(In(20)).ok()) << "in-flight reads hung after the peer died";
  for (const auto& r : (*in_flight)->results()) {
    EXPECT_TRUE(r.status.ok() || r.status.IsUnavailable()) << r.status;
  }
  const auto deadline = In(20);
  while (client_ep_->health().ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(client_ep_->health().IsUnavailable()) << client_ep_->health();
  auto later = client_ep_->Submit(transfers);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE((*later)->Wait(In(10)).ok());
  for (const auto& r : (*later)->results()) EXPECT_TRUE(r.status.IsUnavailable()) << r.status;
}

TEST_P(UcxTransportTest, AllocatedRegionsWorkBothWays) {
  const std::uint64_t seed = TestSeed("AllocatedRegionsWorkBothWays");
  auto server_region = server_->AllocateMemory(kMiB, MemoryKind::kHost);
  auto client_region = client_->AllocateMemory(kMiB, MemoryKind::kHost);
  ASSERT_TRUE(server_region.ok()) << server_region.status();
  ASSERT_TRUE(client_region.ok()) << client_region.status();
  ASSERT_EQ((*server_region)->bytes().size(), kMiB);
  Fill((*server_region)->bytes(), seed);
  Fill((*client_region)->bytes(), seed + 1);
  auto to_server = Share(**server_region, *client_ep_);
  auto to_client = Share(**client_region, server_ep());
  ASSERT_NE(to_server, nullptr);
  ASSERT_NE(to_client, nullptr);

  // Client writes its bytes into the server; server then reads them back
  // from the client into the second half of its own region.
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Write(client_region->get(), 0, to_server.get(), 0, kMiB / 2)})
          .ok());
  EXPECT_TRUE(Same((*server_region)->bytes().subspan(0, kMiB / 2),
                   (*client_region)->bytes().subspan(0, kMiB / 2)));
  ASSERT_TRUE(SubmitAndWait(server_ep(), {Read(server_region->get(), kMiB / 2, to_client.get(),
                                               kMiB / 2, kMiB / 2)})
                  .ok());
  EXPECT_TRUE(Same((*server_region)->bytes(), (*client_region)->bytes()));
}

// The owner bounds-checks owner-placed kRead/kWrite itself: a peer that
// forges a larger range into an export (the importer's own check then
// passes) is refused by the owner, and nothing outside the grant moves.
TEST_P(UcxTransportTest, OwnerRefusesAccessOutsideTheExportedRange) {
  std::vector<std::byte> server_buf(8192), client_buf(8192, std::byte{7});
  Fill(std::span(server_buf).subspan(4096), TestSeed("OwnerRefusesAccessOutsideTheExportedRange"));
  const std::vector<std::byte> server_before = server_buf;
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto exported = server_region->Export(0, 4096);
  ASSERT_TRUE(exported.ok());
  auto range = DecodeExportedRange(*exported);
  ASSERT_TRUE(range.ok());
  range->length = 8192;  // forged: twice what was granted
  auto remote = client_ep_->ImportRegion(EncodeExportedRange(*range));
  ASSERT_TRUE(remote.ok()) << remote.status();

  const Status wrote =
      SubmitAndWait(*client_ep_, {Write(client_region.get(), 0, remote->get(), 0, 8192)});
  EXPECT_TRUE(wrote.IsInvalidArgument()) << wrote;
  EXPECT_EQ(server_buf, server_before);
  const std::vector<std::byte> client_before = client_buf;
  const Status read =
      SubmitAndWait(*client_ep_, {Read(client_region.get(), 0, remote->get(), 4096, 4096)});
  EXPECT_TRUE(read.IsInvalidArgument()) << read;
  EXPECT_EQ(client_buf, client_before);
  // Inside the grant the same import works.
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Write(client_region.get(), 0, remote->get(), 0, 4096)}).ok());
  EXPECT_TRUE(Same(std::span(server_buf).subspan(0, 4096), std::span(client_buf).subspan(0, 4096)));
}

TEST_P(UcxTransportTest, DestroyedRegionRefusesLaterTransfers) {
  std::vector<std::byte> server_buf(4096), client_buf(4096);
  auto server_region = Register(*server_, server_buf);
  auto client_region = Register(*client_, client_buf);
  auto remote = Share(*server_region, *client_ep_);
  ASSERT_NE(remote, nullptr);
  server_region.reset();  // the owner revokes its grant
  const Status read =
      SubmitAndWait(*client_ep_, {Read(client_region.get(), 0, remote.get(), 0, 4096)});
  EXPECT_TRUE(read.IsUnavailable()) << read;
  EXPECT_NE(read.message().find("refused by the owner"), std::string_view::npos) << read;
  EXPECT_TRUE(client_ep_->health().ok()) << client_ep_->health();
}

// UCX's get/put only where they are truly one-sided: memory UCX allocated,
// over shared memory. Everything else is placed by its owner.
TEST_P(UcxTransportTest, UsesOneSidedRmaOnlyForUcxAllocatedSharedMemory) {
  std::vector<std::byte> user_buf(kMiB), client_buf(kMiB);
  auto user_region = Register(*server_, user_buf);
  auto allocated = server_->AllocateMemory(kMiB, MemoryKind::kHost);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  auto client_region = Register(*client_, client_buf);
  auto to_user = Share(*user_region, *client_ep_);
  auto to_allocated = Share(**allocated, *client_ep_);
  ASSERT_NE(to_user, nullptr);
  ASSERT_NE(to_allocated, nullptr);

  auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Read(client_region.get(), 0, to_user.get(), 0, kMiB),
                                          Write(client_region.get(), 0, to_user.get(), 0, kMiB)})
                  .ok());
  auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.owner_placed_transfers - before.owner_placed_transfers, 2u);
  EXPECT_EQ(after.one_sided_transfers, before.one_sided_transfers);

  before = after;
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Read(client_region.get(), 0, to_allocated.get(), 0, kMiB),
                                  Write(client_region.get(), 0, to_allocated.get(), 0, kMiB)})
          .ok());
  after = TEST_GetCounters(*client_);
  const bool shared_memory = OptionsFor(GetParam()).tls != "tcp";
  EXPECT_EQ(after.one_sided_transfers - before.one_sided_transfers, shared_memory ? 2u : 0u);
  EXPECT_EQ(after.owner_placed_transfers - before.owner_placed_transfers, shared_memory ? 0u : 2u);
  EXPECT_TRUE(Same((*allocated)->bytes(), client_buf));
}

// An imported region that maps here (memory UCX allocated, reached over
// shared memory) has its mapping's page tables filled in the background for
// the pages its owner already has (ucx_populate.h); one that does not map
// (TCP) is left alone. Transfers through it work as before.
TEST_P(UcxTransportTest, ImportedMappingsArePopulatedWhereTheOwnerHasPages) {
  const bool shared_memory = OptionsFor(GetParam()).tls != "tcp";
  constexpr std::uint64_t kBytes = 8 * kMiB;
  auto allocated = server_->AllocateMemory(kBytes, MemoryKind::kHost);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  // The owner touches the first half only.
  std::memset((*allocated)->bytes().data(), 1, kBytes / 2);
  const UcxTestCounters before = TEST_GetCounters(*client_);
  auto remote = Share(**allocated, *client_ep_);
  ASSERT_NE(remote, nullptr);
  UcxTestCounters after = TEST_GetCounters(*client_);
  auto seen = [&] {
    return after.populated_bytes + after.populate_skipped_bytes - before.populated_bytes -
           before.populate_skipped_bytes;
  };
  // Whole pages of the range: all of it, unless UCX's allocation does not
  // start on a page boundary (then a page at each end is left out).
  const std::uint64_t want = kBytes - 2 * 4096;
  for (const auto deadline = In(10); shared_memory && seen() < want && Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    after = TEST_GetCounters(*client_);
  }
  std::printf("populated %llu bytes, skipped %llu not resident\n",
              static_cast<unsigned long long>(after.populated_bytes - before.populated_bytes),
              static_cast<unsigned long long>(after.populate_skipped_bytes -
                                              before.populate_skipped_bytes));
  if (shared_memory) {
    EXPECT_GE(seen(), want);
    EXPECT_LE(seen(), kBytes);
    EXPECT_GE(after.populated_bytes - before.populated_bytes, kBytes / 2 - 4096);
    // The half the owner never touched has no pages (UCX's allocation does
    // not touch them either): populating it would have allocated them.
    EXPECT_LE(after.populated_bytes - before.populated_bytes, kBytes / 2 + 4096);
  } else {
    EXPECT_EQ(seen(), 0u);
  }
  std::vector<std::byte> client_buf(kBytes);
  Fill(client_buf, TestSeed("ImportedMappingsArePopulatedWhereTheOwnerHasPages"));
  auto client_region = Register(*client_, client_buf);
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Write(client_region.get(), 0, remote.get(), 0, kBytes)}).ok());
  EXPECT_TRUE(Same((*allocated)->bytes(), client_buf));
}

// Every test again with three workers on each side: the test's one
// connection lands on the server's first worker in turn, the client's too,
// and memory and grants are shared across workers.
INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest,
                         ::testing::Values("tcp", "sm,self,tcp", "tcp/3", "sm,self,tcp/3"),
                         [](const auto& info) {
                           const UcxTransportOptions o = OptionsFor(info.param);
                           return std::string(o.tls == "tcp" ? "Tcp" : "SharedMemory") +
                                  (o.workers > 1 ? std::to_string(o.workers) + "Workers" : "");
                         });

TEST(UcxTransportOptionsTest, RefusesWorkerCountsOutOfRange) {
  for (int workers : {0, -1, kMaxUcxWorkers + 1}) {
    UcxTransportOptions options;
    options.workers = workers;
    auto t = CreateUcxTransport(options);
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(t.status().IsInvalidArgument()) << t.status();
    EXPECT_NE(t.status().message().find("workers"), std::string::npos) << t.status();
  }
}

TEST(UcxTransportOptionsTest, RejectsTransportListWithoutTcp) {
  UcxTransportOptions options;
  options.tls = "sm,self";
  auto t = CreateUcxTransport(options);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(t.status().IsInvalidArgument());
  EXPECT_NE(t.status().message().find("tcp"), std::string::npos);
}

TEST(UcxTransportOptionsTest, RefusesDeviceMemory) {
  auto t = CreateUcxTransport({});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->AllocateMemory(4096, MemoryKind::kDevice).status().code(),
            StatusCode::kUnimplemented);
}

TEST(UcxTransportOptionsTest, ConnectToNothingFailsWithoutHanging) {
  UcxTransportOptions options;
  options.tls = "tcp";
  auto t = CreateUcxTransport(options);
  ASSERT_TRUE(t.ok()) << t.status();
  // Port 1 on loopback: nobody listens there.
  auto ep = (*t)->Connect("127.0.0.1:1", PeerFailureMode::kFailInFlight, In(10));
  ASSERT_FALSE(ep.ok());
  EXPECT_TRUE(ep.status().IsUnavailable()) << ep.status();
}

}  // namespace
}  // namespace kvfabric::ucx::ucx_test
