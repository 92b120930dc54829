#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "transport/ucx/ucx_export.h"

namespace kvfabric::ucx {
namespace {

using transport::Clock;
using transport::CloseMode;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::PeerFailureMode;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;
using transport::Transport;

constexpr std::uint64_t kMiB = 1 << 20;

Clock::time_point In(int seconds) { return Clock::now() + std::chrono::seconds(seconds); }

// Waits for a batch submitted while its endpoint or a region it names may be
// going away, and counts it: completed OK, or failed cleanly (Unavailable,
// Cancelled).
void CountRacingBatch(StatusOr<std::unique_ptr<TransferBatch>> batch, std::atomic<int>* ok,
                      std::atomic<int>* failed) {
  if (!batch.ok()) {
    EXPECT_TRUE(batch.status().IsUnavailable()) << batch.status();
    ++*failed;
    return;
  }
  ASSERT_TRUE((*batch)->Wait(Clock::now() + std::chrono::seconds(30)).ok());
  const Status st = (*batch)->FirstError();
  if (st.ok()) {
    ++*ok;
  } else {
    EXPECT_TRUE(st.IsUnavailable() || st.code() == StatusCode::kCancelled) << st;
    ++*failed;
  }
}

// A test parameter: a UCX transport list, optionally followed by "/N" for N
// workers on both sides ("tcp/3").
UcxTransportOptions OptionsFor(const std::string& param) {
  UcxTransportOptions options;
  const std::size_t slash = param.find('/');
  options.tls = param.substr(0, slash);
  if (slash != std::string::npos) options.workers = std::stoi(param.substr(slash + 1));
  return options;
}

void Fill(std::span<std::byte> bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, std::min<std::size_t>(8, bytes.size() - i));
  }
}

bool Same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

Transfer Read(MemoryRegion* local, std::uint64_t local_offset, const RemoteRegion* remote,
              std::uint64_t remote_offset, std::uint64_t length) {
  Transfer t;
  t.op = TransferOp::kRead;
  t.local = local;
  t.local_offset = local_offset;
  t.remote = remote;
  t.remote_offset = remote_offset;
  t.length = length;
  return t;
}

Transfer Write(MemoryRegion* local, std::uint64_t local_offset, const RemoteRegion* remote,
               std::uint64_t remote_offset, std::uint64_t length) {
  Transfer t = Read(local, local_offset, remote, remote_offset, length);
  t.op = TransferOp::kWrite;
  return t;
}

// Submits and waits; returns the batch's first error.
Status SubmitAndWait(Endpoint& ep, std::vector<Transfer> transfers) {
  StatusOr<std::unique_ptr<TransferBatch>> batch = ep.Submit(transfers);
  if (!batch.ok()) return batch.status();
  KVF_RETURN_IF_ERROR((*batch)->Wait(In(10)));
  return (*batch)->FirstError();
}

// A server transport listening on 127.0.0.1:0 and a client transport
// connected to it, in one process.
class UcxTransportTest : public ::testing::TestWithParam<std::string> {
 public:
  // Routes the server's messages to `fn` (on the server's progress thread).
  void OnMessage(std::function<void(IncomingMessage&)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_message_ = std::move(fn);
  }

 protected:
  virtual UcxTransportOptions MakeOptions() const { return OptionsFor(GetParam()); }

  void SetUp() override {
    const UcxTransportOptions options = MakeOptions();
    auto server = CreateUcxTransport(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->SetMessageHandler([this](IncomingMessage& m) {
      std::function<void(IncomingMessage&)> fn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        fn = on_message_;
      }
      if (fn) fn(m);
    });
    ASSERT_TRUE(server_
                    ->Listen("127.0.0.1:0",
                             [this](std::unique_ptr<Endpoint> ep) {
                               std::lock_guard<std::mutex> lock(mu_);
                               accepted_.push_back(std::move(ep));
                               cv_.notify_all();
                             })
                    .ok());
    ASSERT_NE(server_->listen_address().find("127.0.0.1:"), std::string::npos);
    ASSERT_NE(server_->listen_address(), "127.0.0.1:0");
    auto client = CreateUcxTransport(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    auto ep = client_->Connect(server_->listen_address(), PeerFailureMode::kFailInFlight, In(10));
    ASSERT_TRUE(ep.ok()) << ep.status();
    client_ep_ = std::move(*ep);
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_until(lock, In(10), [this] { return !accepted_.empty(); }));
  }

  void TearDown() override {
    client_ep_.reset();
    {
      std::lock_guard<std::mutex> lock(mu_);
      on_message_ = nullptr;
    }
    client_.reset();
    accepted_.clear();
    server_.reset();
  }

  Endpoint& server_ep() { return *accepted_.front(); }

  std::unique_ptr<MemoryRegion> Register(Transport& t, std::vector<std::byte>& buf) {
    auto r = t.RegisterMemory(buf, MemoryKind::kHost);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Exports all of `region` and imports it on `ep`.
  std::unique_ptr<RemoteRegion> Share(const MemoryRegion& region, Endpoint& ep) {
    auto bytes = region.Export(0, region.bytes().size());
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    if (!bytes.ok()) return nullptr;
    auto remote = ep.ImportRegion(*bytes);
    EXPECT_TRUE(remote.ok()) << remote.status();
    return remote.ok() ? std::move(*remote) : nullptr;
  }

  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
  std::unique_ptr<Endpoint> client_ep_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Endpoint>> accepted_;   // guarded by mu_
  std::function<void(IncomingMessage&)> on_message_;  // guarded by mu_
};

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
    std::lock_guard<std::mutex> lock(mu_);
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

// Shared memory with a small inline limit, and a region UCX allocated on
// the server side, so that both sides of the limit can be exercised.
class UcxInlineCopyTest : public UcxTransportTest {
 protected:
  static constexpr std::uint64_t kLimit = kMiB;

  UcxTransportOptions MakeOptions() const override {
    UcxTransportOptions options = UcxTransportTest::MakeOptions();
    options.inline_copy_max_bytes = kLimit;
    return options;
  }

  void SetUp() override {
    UcxTransportTest::SetUp();
    if (HasFatalFailure()) return;
    auto owned = server_->AllocateMemory(4 * kMiB, MemoryKind::kHost);
    ASSERT_TRUE(owned.ok()) << owned.status();
    owned_ = std::move(*owned);
    Fill(owned_->bytes(), 7);
    auto local = client_->AllocateMemory(4 * kMiB, MemoryKind::kHost);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    remote_ = Share(*owned_, *client_ep_);
    ASSERT_NE(remote_, nullptr);
  }

  void TearDown() override {
    remote_.reset();
    local_.reset();
    owned_.reset();
    UcxTransportTest::TearDown();
  }

  std::unique_ptr<MemoryRegion> owned_, local_;
  std::unique_ptr<RemoteRegion> remote_;
};

TEST_P(UcxInlineCopyTest, SmallBatchIsCopiedBeforeSubmitReturns) {
  const auto before = TEST_GetCounters(*client_);
  std::vector<Transfer> ts = {Read(local_.get(), 0, remote_.get(), kMiB / 2, kMiB / 2),
                              Write(local_.get(), 0, remote_.get(), 3 * kMiB, kMiB / 2)};
  auto batch = client_ep_->Submit(ts);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE((*batch)->Done());  // no hand-off to the progress thread
  ASSERT_TRUE((*batch)->FirstError().ok()) << (*batch)->FirstError();
  EXPECT_EQ((*batch)->TotalBytes(), kMiB);
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers - before.inline_transfers, 2u);
  EXPECT_EQ(after.one_sided_transfers - before.one_sided_transfers, 2u);
  EXPECT_TRUE(Same(local_->bytes().subspan(0, kMiB / 2), owned_->bytes().subspan(kMiB / 2, kMiB / 2)));
  EXPECT_TRUE(Same(owned_->bytes().subspan(3 * kMiB, kMiB / 2),
                   owned_->bytes().subspan(kMiB / 2, kMiB / 2)));
}

TEST_P(UcxInlineCopyTest, BatchOverTheLimitGoesThroughTheProgressThread) {
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Read(local_.get(), 0, remote_.get(), 0, kLimit),
                                  Read(local_.get(), kLimit, remote_.get(), kLimit, 4096)})
          .ok());
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers, before.inline_transfers);
  EXPECT_EQ(after.one_sided_transfers - before.one_sided_transfers, 2u);
  EXPECT_TRUE(Same(local_->bytes().subspan(0, kLimit + 4096),
                   owned_->bytes().subspan(0, kLimit + 4096)));
}

TEST_P(UcxInlineCopyTest, BatchWithAnOwnerPlacedEntryIsNotCopiedInline) {
  std::vector<std::byte> user(4096);
  auto user_region = server_->RegisterMemory(user, MemoryKind::kHost);
  ASSERT_TRUE(user_region.ok()) << user_region.status();
  auto exported = (*user_region)->Export(0, user.size());
  ASSERT_TRUE(exported.ok());
  auto to_user = client_ep_->ImportRegion(*exported);
  ASSERT_TRUE(to_user.ok()) << to_user.status();
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Read(local_.get(), 0, remote_.get(), 0, 4096),
                                          Write(local_.get(), 0, to_user->get(), 0, 4096)})
                  .ok());
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers, before.inline_transfers);
  EXPECT_EQ(after.owner_placed_transfers - before.owner_placed_transfers, 1u);
  EXPECT_TRUE(Same(std::span(user), owned_->bytes().subspan(0, 4096)));
}

// The mapping an inline copy uses is released by the progress thread when
// the endpoint closes; copies racing the close either finish or fail
// cleanly, never touch an unmapped page (run under ASan).
TEST_P(UcxInlineCopyTest, CopiesRacingACloseFinishOrFailCleanly) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::thread reader([&] {
    while (!stop.load()) {
      CountRacingBatch(client_ep_->Submit(std::vector<Transfer>{
                           Read(local_.get(), 0, remote_.get(), 0, kLimit)}),
                       &ok, &failed);
    }
  });
  while (ok.load() < 20) std::this_thread::yield();
  EXPECT_TRUE(client_ep_->Close(CloseMode::kForce, In(10)).ok());
  while (failed.load() < 5) std::this_thread::yield();
  stop = true;
  reader.join();
  EXPECT_GE(ok.load(), 20);
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, UcxInlineCopyTest, ::testing::Values("sm,self,tcp"));

// The same transports with two copy helpers (copy_threads): batches split
// across the helpers land byte for byte, on the progress thread (above the
// inline limit) and inline, at odd offsets and lengths.
class UcxCopyHelpersTest : public UcxInlineCopyTest {
 protected:
  UcxTransportOptions MakeOptions() const override {
    UcxTransportOptions options = UcxInlineCopyTest::MakeOptions();
    options.copy_threads = 2;
    options.streaming_copy_min_bytes = kMiB;  // streamed too
    return options;
  }
};

TEST_P(UcxCopyHelpersTest, SplitBatchesLandExactly) {
  const std::uint64_t a = kMiB + 12345, b = 2 * kMiB - 777;
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Read(local_.get(), 3, remote_.get(), 5, a),
                                          Read(local_.get(), a + 3, remote_.get(), a + 9, b)})
                  .ok());
  EXPECT_TRUE(Same(local_->bytes().subspan(3, a), owned_->bytes().subspan(5, a)));
  EXPECT_TRUE(Same(local_->bytes().subspan(a + 3, b), owned_->bytes().subspan(a + 9, b)));
  // Inline (at most kLimit), written back to the far end of the region.
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Write(local_.get(), 3, remote_.get(), 3 * kMiB + 1,
                                                kLimit - 1)})
                  .ok());
  EXPECT_EQ(TEST_GetCounters(*client_).inline_transfers - before.inline_transfers, 1u);
  EXPECT_TRUE(Same(owned_->bytes().subspan(3 * kMiB + 1, kLimit - 1),
                   local_->bytes().subspan(3, kLimit - 1)));
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, UcxCopyHelpersTest, ::testing::Values("sm,self,tcp"));

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
}  // namespace kvfabric::ucx
