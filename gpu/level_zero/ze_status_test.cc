#include "gpu/level_zero/ze_status.h"

#include <level_zero/ze_api.h>

#include <gtest/gtest.h>

namespace kvfabric::level_zero {
namespace {

TEST(ZeStatusTest, SuccessIsOk) { EXPECT_TRUE(StatusFromZeResult(ZE_RESULT_SUCCESS, "x").ok()); }

TEST(ZeStatusTest, UninitializedMeansThisMachineCannotRunIt) {
  Status s = StatusFromZeResult(ZE_RESULT_ERROR_UNINITIALIZED, "zeInit");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "zeInit: ZE_RESULT_ERROR_UNINITIALIZED (ze_result_t 0x78000001)");
}

TEST(ZeStatusTest, MemoryAndArgumentErrors) {
  EXPECT_EQ(StatusFromZeResult(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, "x").code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromZeResult(ZE_RESULT_ERROR_INVALID_SIZE, "x").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromZeResult(0x7fff0000u, "x").code(), StatusCode::kUnknown);
}

TEST(ZeProbeTest, ReportsDriversOrWhyNone) {
  ZeProbeResult r = ProbeLevelZero();
  if (r.driver_count == 0) {
    EXPECT_FALSE(r.status.ok() && r.device_count > 0);
    GTEST_SKIP() << "no Level Zero driver: " << r.status;
  }
  EXPECT_TRUE(r.status.ok()) << r.status;
}

}  // namespace
}  // namespace kvfabric::level_zero
