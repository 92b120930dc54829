#include "server/grpc_server_limits.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kvfabric/v1/cache_host.grpc.pb.h"

namespace kvfabric {
namespace {

using namespace std::chrono_literals;

// Health blocks until released and records how many run at once.
class BlockingService final : public v1::CacheHost::Service {
 public:
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse*) override {
    std::unique_lock<std::mutex> l(mu_);
    ++running_;
    peak_ = std::max(peak_, running_);
    cv_.notify_all();
    cv_.wait(l, [this] { return released_; });
    --running_;
    return grpc::Status::OK;
  }
  grpc::Status Lease(grpc::ServerContext*, const v1::LeaseRequest*, v1::LeaseResponse*) override {
    return grpc::Status::OK;
  }
  // Waits up to `timeout` for `n` handlers to run at once.
  bool WaitRunning(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return running_ >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int peak() {
    std::lock_guard<std::mutex> l(mu_);
    return peak_;
  }
  int running() {
    std::lock_guard<std::mutex> l(mu_);
    return running_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0, peak_ = 0;
  bool released_ = false;
};

struct Server {
  BlockingService service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

std::unique_ptr<Server> Start(const GrpcServerLimits& limits) {
  auto s = std::make_unique<Server>();
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyGrpcServerLimits(limits, "test", &b);
  b.RegisterService(&s->service);
  s->server = b.BuildAndStart();
  s->address = "127.0.0.1:" + std::to_string(port);
  return s;
}

TEST(GrpcServerLimitsTest, CallsOnOneConnectionBeyondTheStreamLimitWait) {
  GrpcServerLimits limits;
  limits.max_concurrent_streams = 2;
  auto s = Start(limits);
  ASSERT_TRUE(s->server);
  auto stub =
      v1::CacheHost::NewStub(grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials()));
  std::atomic<int> ok{0};
  std::vector<std::thread> calls;
  for (int i = 0; i < 5; ++i) {
    calls.emplace_back([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 30s);
      v1::HealthResponse r;
      ok += stub->Health(&ctx, v1::HealthRequest(), &r).ok();
    });
  }
  ASSERT_TRUE(s->service.WaitRunning(2, 10s));
  // The other three are sent and wait for a stream; none may start.
  EXPECT_FALSE(s->service.WaitRunning(3, 500ms)) << s->service.running() << " running";
  s->service.Release();
  for (std::thread& t : calls) t.join();
  EXPECT_EQ(ok.load(), 5);
  EXPECT_EQ(s->service.peak(), 2);
}

TEST(GrpcServerLimitsTest, OversizedRequestIsRefused) {
  GrpcServerLimits limits;
  limits.max_request_bytes = 64 << 10;
  auto s = Start(limits);
  ASSERT_TRUE(s->server);
  auto stub =
      v1::CacheHost::NewStub(grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials()));
  v1::LeaseRequest req;
  for (int i = 0; i < 3000; ++i) req.add_keys(std::string(32, 'k'));  // ~100 KiB
  grpc::ClientContext ctx;
  v1::LeaseResponse r;
  EXPECT_EQ(stub->Lease(&ctx, req, &r).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  req.mutable_keys()->DeleteSubrange(0, 2900);
  grpc::ClientContext ctx2;
  EXPECT_TRUE(stub->Lease(&ctx2, req, &r).ok());
  s->service.Release();
}

TEST(GrpcServerLimitsTest, IdleConnectionsAreClosedByTheServer) {
  GrpcServerLimits limits;
  limits.idle_timeout = 1s;
  auto s = Start(limits);
  ASSERT_TRUE(s->server);
  auto channel = grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials());
  auto stub = v1::CacheHost::NewStub(channel);
  grpc::ClientContext ctx;
  v1::LeaseResponse r;
  ASSERT_TRUE(stub->Lease(&ctx, v1::LeaseRequest(), &r).ok());
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // The server's GOAWAY after 1 s without calls takes the channel to IDLE.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  grpc_connectivity_state state = GRPC_CHANNEL_READY;
  while (state == GRPC_CHANNEL_READY && std::chrono::steady_clock::now() < deadline) {
    channel->WaitForStateChange(state, std::chrono::system_clock::now() + 1s);
    state = channel->GetState(false);
  }
  EXPECT_NE(state, GRPC_CHANNEL_READY) << "the idle connection stayed open";
  s->service.Release();
}

TEST(GrpcServerLimitsTest, OutOfRangeValuesNameTheirFlag) {
  GrpcServerLimits l;
  EXPECT_TRUE(l.Validate().ok());
  EXPECT_FALSE(l.ToString().empty());
  l.max_concurrent_streams = 0;
  EXPECT_NE(l.Validate().message().find("--grpc-max-concurrent-streams"), std::string::npos);
  l = GrpcServerLimits();
  l.max_threads = 1;
  EXPECT_NE(l.Validate().message().find("--grpc-max-threads"), std::string::npos);
  l = GrpcServerLimits();
  l.memory_bytes = 1 << 20;
  EXPECT_NE(l.Validate().message().find("--grpc-memory-bytes"), std::string::npos);
  l = GrpcServerLimits();
  l.max_request_bytes = std::uint64_t{32} << 20;
  EXPECT_NE(l.Validate().message().find("--grpc-max-request-bytes"), std::string::npos);
  l = GrpcServerLimits();
  l.idle_timeout = 10ms;
  EXPECT_NE(l.Validate().message().find("--grpc-idle-timeout"), std::string::npos);
}

}  // namespace
}  // namespace kvfabric
