// Both services on a real gRPC server on loopback, without their nodes (the
// daemons are starting): Health answers with the documented limits, other RPCs
// check the request and then answer UNAVAILABLE.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include <gtest/gtest.h>

#include "core/env.h"
#include "proto/wire_limits.h"
#include "server/cache_host_service.h"
#include "server/placement_service.h"

namespace kvfabric {
namespace {

class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    health_ = std::make_unique<HealthReporter>(Env::Default(), "test-host", "0.0.0-test");
    cache_host_ = std::make_unique<CacheHostService>(nullptr, health_.get(), CacheHostServiceOptions());
    placement_ =
        std::make_unique<PlacementService>(nullptr, health_.get(), PlacementServiceOptions());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(cache_host_.get());
    builder.RegisterService(placement_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  static void SetDeadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  std::unique_ptr<HealthReporter> health_;
  std::unique_ptr<CacheHostService> cache_host_;
  std::unique_ptr<PlacementService> placement_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServicesTest, CacheHostHealthReportsStateIdentityAndLimits) {
  auto stub = v1::CacheHost::NewStub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::HealthResponse resp;
  grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.status(), v1::SERVING_STATUS_STARTING);
  EXPECT_EQ(resp.detail(), "starting");
  EXPECT_EQ(resp.server_id(), "test-host");
  EXPECT_EQ(resp.version(), "0.0.0-test");
  EXPECT_NE(resp.incarnation(), 0u);
  EXPECT_EQ(resp.limits().max_keys_per_batch(), kMaxKeysPerBatch);
  EXPECT_EQ(resp.limits().max_block_bytes(), 64u << 20);
}

TEST_F(ServicesTest, PlacementHealthFollowsServingState) {
  health_->SetState(v1::SERVING_STATUS_SERVING, "");
  auto stub = v1::Placement::NewStub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::HealthResponse resp;
  ASSERT_TRUE(stub->Health(&ctx, v1::HealthRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(resp.detail(), "");
}

TEST_F(ServicesTest, CacheHostWithoutANodeChecksRequestsAndAnswersUnavailable) {
  auto cache_host = v1::CacheHost::NewStub(channel_);
  grpc::ClientContext ctx1;
  SetDeadline(&ctx1);
  v1::ReserveResponse reserve;
  // An empty batch is refused whole, naming the limit; a lookup of a valid
  // key reaches the missing node: UNAVAILABLE while the daemon starts.
  EXPECT_EQ(cache_host->Reserve(&ctx1, v1::ReserveRequest(), &reserve).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext ctx3;
  SetDeadline(&ctx3);
  v1::LookupRequest lookup;
  lookup.add_keys(std::string(32, 'k'));
  v1::LookupResponse looked;
  EXPECT_EQ(cache_host->Lookup(&ctx3, lookup, &looked).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServicesTest, PlacementWithoutANodeChecksRequestsAndAnswersUnavailable) {
  auto placement = v1::Placement::NewStub(channel_);
  // An empty chain is refused whole, naming what is missing; a valid one
  // reaches the missing node: UNAVAILABLE while placement starts.
  grpc::ClientContext ctx1;
  SetDeadline(&ctx1);
  v1::PlanResponse plan;
  grpc::Status s = placement->Plan(&ctx1, v1::PlanRequest(), &plan);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "keys: 0, a chain needs at least 1 key");
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  v1::LocateRequest locate;
  locate.add_keys(std::string(32, 'k'));
  v1::LocateResponse located;
  EXPECT_EQ(placement->Locate(&ctx2, locate, &located).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace kvfabric
