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

}  // namespace
}  // namespace kvfabric::transport
