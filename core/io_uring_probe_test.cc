#include "core/io_uring_probe.h"

#include <gtest/gtest.h>

namespace kvfabric {
namespace {

TEST(IoUringProbeTest, EitherWorksOrSaysWhy) {
  Status s = ProbeIoUring();
  if (!s.ok()) {
    EXPECT_FALSE(s.message().empty());
    GTEST_SKIP() << "io_uring unavailable here: " << s;
  }
}

}  // namespace
}  // namespace kvfabric
