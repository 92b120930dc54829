// Test support shared by the UCX transport's tests (ucx_transport_test,
// ucx_copy_test, ucx_workers_test): byte helpers, transfer builders, the
// "tls[/workers]" test parameter, and UcxTransportTest, the fixture with a
// server transport listening on loopback and a client connected to it.
// Test-only; the tests live in namespace kvfabric::ucx::ucx_test.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_TEST_FIXTURE_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_TEST_FIXTURE_H_

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::ucx::ucx_test {

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

inline constexpr std::uint64_t kMiB = 1 << 20;

inline Clock::time_point In(int seconds) { return Clock::now() + std::chrono::seconds(seconds); }

// Waits for a batch submitted while its endpoint or a region it names may be
// going away, and counts it: completed OK, or failed cleanly (Unavailable,
// Cancelled).
inline void CountRacingBatch(StatusOr<std::unique_ptr<TransferBatch>> batch, std::atomic<int>* ok,
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
inline UcxTransportOptions OptionsFor(const std::string& param) {
  UcxTransportOptions options;
  const std::size_t slash = param.find('/');
  options.tls = param.substr(0, slash);
  if (slash != std::string::npos) options.workers = std::stoi(param.substr(slash + 1));
  return options;
}

inline void Fill(std::span<std::byte> bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, std::min<std::size_t>(8, bytes.size() - i));
  }
}

inline bool Same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

inline Transfer Read(MemoryRegion* local, std::uint64_t local_offset, const RemoteRegion* remote,
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

inline Transfer Write(MemoryRegion* local, std::uint64_t local_offset, const RemoteRegion* remote,
               std::uint64_t remote_offset, std::uint64_t length) {
  Transfer t = Read(local, local_offset, remote, remote_offset, length);
  t.op = TransferOp::kWrite;
  return t;
}

// Submits and waits; returns the batch's first error.
inline Status SubmitAndWait(Endpoint& ep, std::vector<Transfer> transfers) {
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
    MutexLock lock(&mu_);
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
        MutexLock lock(&mu_);
        fn = on_message_;
      }
      if (fn) fn(m);
    });
    ASSERT_TRUE(server_
                    ->Listen("127.0.0.1:0",
                             [this](std::unique_ptr<Endpoint> ep) {
                               MutexLock lock(&mu_);
                               accepted_.push_back(std::move(ep));
                               cv_.NotifyAll();
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
    MutexLock lock(&mu_);
    ASSERT_TRUE(
        cv_.WaitUntil(&mu_, In(10), [this]() KVF_REQUIRES(mu_) { return !accepted_.empty(); }));
  }

  void TearDown() override {
    client_ep_.reset();
    {
      MutexLock lock(&mu_);
      on_message_ = nullptr;
    }
    client_.reset();
    std::vector<std::unique_ptr<Endpoint>> accepted;
    {
      MutexLock lock(&mu_);
      accepted.swap(accepted_);
    }
    accepted.clear();  // outside mu_, as before: handlers may still take it
    server_.reset();
  }

  Endpoint& server_ep() {
    MutexLock lock(&mu_);
    return *accepted_.front();
  }

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
  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<Endpoint>> accepted_ KVF_GUARDED_BY(mu_);
  std::function<void(IncomingMessage&)> on_message_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric::ucx::ucx_test

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_TEST_FIXTURE_H_
