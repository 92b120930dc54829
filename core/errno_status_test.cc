#include "core/errno_status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace kvfabric {
namespace {

TEST(ErrnoStatusTest, MapsCommonErrnosToSpecificCodes) {
  EXPECT_EQ(StatusFromErrno(ENOENT, "open").code(), StatusCode::kNotFound);
  EXPECT_EQ(StatusFromErrno(EEXIST, "open").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(StatusFromErrno(EACCES, "open").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusFromErrno(ENOSPC, "write").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromErrno(ENOMEM, "mmap").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromErrno(EINVAL, "open").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromErrno(EIO, "pread").code(), StatusCode::kDataLoss);
  EXPECT_EQ(StatusFromErrno(ETIMEDOUT, "connect").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StatusFromErrno(ECONNREFUSED, "connect").code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromErrno(ENOSYS, "io_uring_setup").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(StatusFromErrno(EXDEV, "rename").code(), StatusCode::kUnknown);
}

TEST(ErrnoStatusTest, MessageNamesContextTextAndNumber) {
  Status s = StatusFromErrno(ENOENT, "open /data/seg-7");
  EXPECT_EQ(s.message(), "open /data/seg-7: No such file or directory (errno 2)");
}

}  // namespace
}  // namespace kvfabric
