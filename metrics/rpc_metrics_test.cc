#include "metrics/rpc_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "metrics/exposition.h"

namespace kvfabric::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RpcServerMetricsTest, MethodLabelDropsThePackage) {
  EXPECT_EQ(RpcServerMetrics::MethodLabel("/kvfabric.v1.CacheHost/Lease"), "CacheHost/Lease");
  EXPECT_EQ(RpcServerMetrics::MethodLabel("/grpc.health.v1.Health/Check"), "Health/Check");
  EXPECT_EQ(RpcServerMetrics::MethodLabel("/Plain/Call"), "Plain/Call");
  EXPECT_EQ(RpcServerMetrics::MethodLabel("no-slash"), "other");
  EXPECT_EQ(RpcServerMetrics::MethodLabel("/Service/"), "other");
  EXPECT_EQ(RpcServerMetrics::MethodLabel(""), "other");
}

TEST(RpcServerMetricsTest, CodeNamesAreGrpcs) {
  EXPECT_EQ(RpcServerMetrics::CodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(RpcServerMetrics::CodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(RpcServerMetrics::CodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_EQ(RpcServerMetrics::CodeName(static_cast<grpc::StatusCode>(99)), "UNKNOWN");
}

TEST(RpcServerMetricsTest, CountsCallsByMethodAndCode) {
  auto m = RpcServerMetrics::Create("cached");
  m->Observe("/kvfabric.v1.CacheHost/Lease", grpc::StatusCode::OK, 0.001);
  m->Observe("/kvfabric.v1.CacheHost/Lease", grpc::StatusCode::OK, 0.002);
  m->Observe("/kvfabric.v1.CacheHost/Lease", grpc::StatusCode::NOT_FOUND, 0.003);
  const std::string text = RenderText(m->Collect());
  EXPECT_THAT(text, HasSubstr("kvfabric_rpc_server_handled_total{code=\"OK\",method="
                              "\"CacheHost/Lease\",process=\"cached\"} 2"));
  EXPECT_THAT(text, HasSubstr("kvfabric_rpc_server_handled_total{code=\"NOT_FOUND\",method="
                              "\"CacheHost/Lease\",process=\"cached\"} 1"));
  EXPECT_THAT(text, HasSubstr("kvfabric_rpc_server_handling_seconds_count{method=\"CacheHost/"
                              "Lease\",process=\"cached\"} 3"));
}

// A peer cannot grow the label set: past kMaxMethods distinct names, calls
// are counted as method="other".
TEST(RpcServerMetricsTest, MethodsAreBounded) {
  auto m = RpcServerMetrics::Create("placement");
  for (std::size_t i = 0; i < RpcServerMetrics::kMaxMethods + 50; ++i) {
    m->Observe("/x.S/M" + std::to_string(i), grpc::StatusCode::OK, 0.001);
  }
  const std::string text = RenderText(m->Collect());
  EXPECT_THAT(text, HasSubstr("method=\"S/M0\""));
  EXPECT_THAT(text, Not(HasSubstr("method=\"S/M" +
                                  std::to_string(RpcServerMetrics::kMaxMethods + 10) + "\"")));
  EXPECT_THAT(text, HasSubstr("kvfabric_rpc_server_handled_total{code=\"OK\",method=\"other\","
                              "process=\"placement\"} 50"));
}

TEST(BuildInfoTest, NamesTheProcessAndVersion) {
  const std::string text = RenderText({BuildInfoFamily("cached")});
  EXPECT_THAT(text, HasSubstr("process=\"cached\""));
  EXPECT_THAT(text, HasSubstr("version=\"" + std::string(BuildVersion()) + "\""));
  EXPECT_THAT(text, HasSubstr("ucx="));
}

}  // namespace
}  // namespace kvfabric::metrics
