// Transport conformance tests: the behaviour transport/transport.h promises,
// checked the same way for every backend.
//
// The tests themselves are in transport_conformance.cc, which a backend's test
// binary links (whole: nothing refers to its symbols; Bazel alwayslink). The
// backend's test file includes this header and instantiates the suite with a
// factory that makes two unconnected transports:
//
//   TransportPair MakeLoopbackPair() { ... }
//   INSTANTIATE_TEST_SUITE_P(Loopback, TransportConformanceTest,
//                            ::testing::Values(TransportConformanceParam{
//                                "loopback", &MakeLoopbackPair}),
//                            ConformanceParamName);
//
// The fixture installs message handlers on both transports, listens on the
// server at the pair's listen_address, connects the client and waits for the
// accepted endpoint. Every wait has a deadline of a few seconds, so a backend
// that loses a completion fails a test instead of hanging it. Tests that need
// entries to stay in flight deterministically use the pair's stall_server hook
// and are skipped for backends that cannot provide one; the others race
// cancellation against completion and accept either outcome, checking the data
// of every entry that reports OK.
#ifndef KVFABRIC_TRANSPORT_TESTING_TRANSPORT_CONFORMANCE_H_
#define KVFABRIC_TRANSPORT_TESTING_TRANSPORT_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/mutex.h"
#include "core/testing/test_seed.h"
#include "transport/transport.h"

namespace kvfabric::transport::conformance {

// What a backend's factory returns: two transports not yet listening or
// connected. Members are destroyed in reverse order: keep_alive last.
struct TransportPair {
  // Anything the transports need that must outlive them (e.g. a LoopbackNetwork).
  std::shared_ptr<void> keep_alive;
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  // What the server listens on ("loopback:0", "127.0.0.1:0").
  std::string listen_address;
  // Optional: stall_server(true) holds off the server's handling of work the
  // client aimed at it (reads and writes of its memory, messages to it), so
  // that those entries stay in flight; stall_server(false) lets it go on.
  // Null for a backend that cannot (truly one-sided hardware paths).
  std::function<void(bool)> stall_server;
};

struct TransportConformanceParam {
  std::string name;  // letters, digits and '_' only (it names the tests)
  std::function<TransportPair()> make_pair;
};

inline std::string ConformanceParamName(
    const ::testing::TestParamInfo<TransportConformanceParam>& info) {
  return info.param.name;
}

inline Deadline Soon() { return Clock::now() + std::chrono::seconds(5); }

inline void FillRandom(std::span<std::byte> bytes, std::mt19937_64& rng) {
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
}

inline std::uint32_t Crc(std::span<const std::byte> bytes) { return crc32c::Value(bytes); }

class TransportConformanceTest : public ::testing::TestWithParam<TransportConformanceParam> {
 protected:
  void SetUp() override {
    pair_ = GetParam().make_pair();
    ASSERT_NE(pair_.server, nullptr);
    ASSERT_NE(pair_.client, nullptr);
    pair_.server->SetMessageHandler(
        [this](IncomingMessage& m) { Dispatch(&on_server_message_, m); });
    pair_.client->SetMessageHandler(
        [this](IncomingMessage& m) { Dispatch(&on_client_message_, m); });
    ASSERT_TRUE(pair_.server
                    ->Listen(pair_.listen_address,
                             [this](std::unique_ptr<Endpoint> ep) {
                               MutexLock lock(&mu_);
                               accepted_ = std::move(ep);
                               cv_.NotifyAll();
                             })
                    .ok());
    StatusOr<std::unique_ptr<Endpoint>> ep = pair_.client->Connect(
        pair_.server->listen_address(), PeerFailureMode::kFailInFlight, Soon());
    ASSERT_TRUE(ep.ok()) << ep.status();
    client_ep_ = std::move(ep).value();
    MutexLock lock(&mu_);
    ASSERT_TRUE(cv_.WaitUntil(&mu_, Soon(), [this]() KVF_REQUIRES(mu_) {
      return accepted_ != nullptr;
    })) << "no accepted endpoint within the deadline";
    server_ep_ = std::move(accepted_);
  }

  void TearDown() override {
    if (pair_.stall_server && pair_.server) pair_.stall_server(false);
    client_ep_.reset();
    server_ep_.reset();
    pair_.client.reset();
    pair_.server.reset();
  }

  std::uint64_t Seed() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return TestSeed(std::string(info->test_suite_name()) + "." + info->name());
  }

  void OnServerMessage(std::function<void(IncomingMessage&)> fn) {
    MutexLock lock(&mu_);
    on_server_message_ = std::move(fn);
  }
  void OnClientMessage(std::function<void(IncomingMessage&)> fn) {
    MutexLock lock(&mu_);
    on_client_message_ = std::move(fn);
  }

  std::unique_ptr<MemoryRegion> Allocate(Transport& t, std::uint64_t size) {
    StatusOr<std::unique_ptr<MemoryRegion>> r = t.AllocateMemory(size, MemoryKind::kHost);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // Exports [offset, +length) of `region` and imports it on `ep`.
  std::unique_ptr<RemoteRegion> Import(Endpoint& ep, const MemoryRegion& region,
                                       std::uint64_t offset, std::uint64_t length) {
    StatusOr<std::string> exported = region.Export(offset, length);
    EXPECT_TRUE(exported.ok()) << exported.status();
    if (!exported.ok()) return nullptr;
    StatusOr<std::unique_ptr<RemoteRegion>> remote = ep.ImportRegion(*exported);
    EXPECT_TRUE(remote.ok()) << remote.status();
    return remote.ok() ? std::move(remote).value() : nullptr;
  }

  std::unique_ptr<TransferBatch> Submit(Endpoint& ep, const std::vector<Transfer>& transfers) {
    StatusOr<std::unique_ptr<TransferBatch>> b = ep.Submit(transfers);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  // Waits (bounded) until `pred` holds; returns whether it did.
  bool WaitFor(const std::function<bool()>& pred) {
    MutexLock lock(&mu_);
    return cv_.WaitUntil(&mu_, Soon(), [&] { return pred(); });
  }
  void Notify() {
    MutexLock lock(&mu_);
    cv_.NotifyAll();
  }

  // `count` reads of `block` bytes each from the server's memory into the
  // client's, behind a stalled server when the backend can stall.
  struct InFlight {
    InFlight() = default;
    InFlight(InFlight&&) = default;
    // Lifts a stall first, so that a backend whose Cancel is broken fails the
    // test instead of hanging it in ~TransferBatch.
    ~InFlight() {
      if (release) release();
    }
    std::function<void()> release;
    std::unique_ptr<MemoryRegion> server_region, client_region;
    std::unique_ptr<RemoteRegion> remote;
    std::unique_ptr<TransferBatch> batch;
  };
  InFlight SubmitReads(std::size_t count, std::uint64_t block) {
    InFlight f;
    f.release = [this] {
      if (pair_.stall_server && pair_.server) pair_.stall_server(false);
    };
    f.server_region = Allocate(*pair_.server, count * block);
    f.client_region = Allocate(*pair_.client, count * block);
    if (!f.server_region || !f.client_region) return f;
    std::memset(f.server_region->bytes().data(), 0x5a, count * block);
    f.remote = Import(*client_ep_, *f.server_region, 0, count * block);
    if (!f.remote) return f;
    std::vector<Transfer> reads;
    for (std::size_t i = 0; i < count; ++i) {
      reads.push_back({.op = TransferOp::kRead,
                       .local = f.client_region.get(),
                       .local_offset = i * block,
                       .length = block,
                       .remote = f.remote.get(),
                       .remote_offset = i * block,
                       .header = {}});
    }
    f.batch = Submit(*client_ep_, reads);
    return f;
  }

  TransportPair pair_;
  std::unique_ptr<Endpoint> client_ep_;
  std::unique_ptr<Endpoint> server_ep_;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<TransferBatch>> replies_ KVF_GUARDED_BY(mu_);

 private:
  void Dispatch(std::function<void(IncomingMessage&)>* slot, IncomingMessage& m) {
    std::function<void(IncomingMessage&)> fn;
    {
      MutexLock lock(&mu_);
      fn = *slot;
    }
    if (fn) {
      fn(m);
    } else {
      m.Drop();
    }
  }

  std::unique_ptr<Endpoint> accepted_ KVF_GUARDED_BY(mu_);
  std::function<void(IncomingMessage&)> on_server_message_ KVF_GUARDED_BY(mu_);
  std::function<void(IncomingMessage&)> on_client_message_ KVF_GUARDED_BY(mu_);
};

// Every entry of a finished batch is OK (with the read bytes verified by the
// caller) or has `code`.
inline void ExpectEachOkOr(const TransferBatch& batch, StatusCode code) {
  for (const TransferResult& r : batch.results()) {
    if (!r.status.ok()) {
      EXPECT_EQ(r.status.code(), code) << r.status;
    }
  }
}

inline void ExpectEach(const TransferBatch& batch, StatusCode code) {
  for (const TransferResult& r : batch.results()) {
    EXPECT_EQ(r.status.code(), code) << r.status;
    EXPECT_EQ(r.bytes, 0u);
  }
}

}  // namespace kvfabric::transport::conformance

#endif  // KVFABRIC_TRANSPORT_TESTING_TRANSPORT_CONFORMANCE_H_
