#include "transport/data_transport.h"

#include <gtest/gtest.h>

namespace kvfabric::transport {
namespace {

DataTransportOptions Ucx(const char* tls) {
  DataTransportOptions o;
  o.ucx_tls = tls;
  return o;
}

TEST(DataTransportTest, UnknownKindIsRefusedNamingTheSetting) {
  const Status s = ValidateDataTransportKind("rdma", "kvf_options.data_transport");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kvf_options.data_transport=\"rdma\""), std::string::npos)
      << s.ToString();
}

TEST(DataTransportTest, SharedMemoryIsInTheDefaultUcxListAndNotInTcpOnes) {
  EXPECT_TRUE(UsesSharedMemory(DataTransportOptions{}));  // sm,self,tcp
  EXPECT_TRUE(UsesSharedMemory(Ucx("self,sysv,tcp")));
  EXPECT_TRUE(UsesSharedMemory(Ucx("cma,tcp")));
  EXPECT_TRUE(UsesSharedMemory(Ucx("all")));
  EXPECT_TRUE(UsesSharedMemory(Ucx("")));  // UCX's default: everything
  EXPECT_TRUE(UsesSharedMemory(Ucx("^rc")));
  EXPECT_FALSE(UsesSharedMemory(Ucx("tcp")));
  EXPECT_FALSE(UsesSharedMemory(Ucx("self,tcp")));
  EXPECT_FALSE(UsesSharedMemory(Ucx("rc,tcp")));
  EXPECT_FALSE(UsesSharedMemory(Ucx("^sm")));
  DataTransportOptions kernel;
  kernel.kind = "tcp";
  EXPECT_FALSE(UsesSharedMemory(kernel));
}

TEST(DataTransportTest, ASendRateCapNeedsTheKernelTcpPlane) {
  DataTransportOptions kernel;
  kernel.kind = "tcp";
  kernel.tcp_max_pacing_rate_bytes_per_s = 100'000'000;
  auto tcp = CreateDataTransport(kernel);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_TRUE(SetDataTransportPacingRate(tcp->get(), 1'000'000).ok());
  EXPECT_TRUE(SetDataTransportPacingRate(tcp->get(), 0).ok());
  EXPECT_TRUE(SetDataTransportPacingRate(nullptr, 1).code() == StatusCode::kFailedPrecondition);
  DataTransportOptions ucx = Ucx("tcp");
  auto u = CreateDataTransport(ucx);
  ASSERT_TRUE(u.ok()) << u.status();
  const Status s = SetDataTransportPacingRate(u->get(), 1'000'000);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--data-transport=tcp"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace kvfabric::transport
