#include "transport/ucx/ucx_status.h"

#include <gtest/gtest.h>

#include "transport/ucx/ucx_probe.h"

namespace kvfabric::ucx {
namespace {

TEST(UcxStatusTest, OkIsOk) { EXPECT_TRUE(StatusFromUcs(UCS_OK, "x").ok()); }

TEST(UcxStatusTest, PeerFailuresAreUnavailable) {
  EXPECT_TRUE(StatusFromUcs(UCS_ERR_UNREACHABLE, "x").IsUnavailable());
  EXPECT_TRUE(StatusFromUcs(UCS_ERR_CONNECTION_RESET, "x").IsUnavailable());
  EXPECT_TRUE(StatusFromUcs(UCS_ERR_ENDPOINT_TIMEOUT, "x").IsUnavailable());
}

TEST(UcxStatusTest, OtherCodes) {
  EXPECT_EQ(StatusFromUcs(UCS_ERR_TIMED_OUT, "x").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StatusFromUcs(UCS_ERR_CANCELED, "x").code(), StatusCode::kCancelled);
  EXPECT_EQ(StatusFromUcs(UCS_ERR_NO_MEMORY, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromUcs(UCS_ERR_INVALID_PARAM, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromUcs(UCS_ERR_UNSUPPORTED, "x").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(StatusFromUcs(UCS_ERR_MESSAGE_TRUNCATED, "x").code(), StatusCode::kOutOfRange);
}

TEST(UcxStatusTest, MessageNamesContextAndUcxText) {
  Status s = StatusFromUcs(UCS_ERR_TIMED_OUT, "ucp_ep_flush");
  EXPECT_EQ(s.message(), "ucp_ep_flush: Operation timed out (ucs_status_t -20)");
}

TEST(UcxProbeTest, CreatesAContextWithRmaAndAm) {
  UcxProbeResult r = ProbeUcx();
  EXPECT_FALSE(r.version.empty());
  EXPECT_TRUE(r.status.ok()) << r.status;
}

}  // namespace
}  // namespace kvfabric::ucx
