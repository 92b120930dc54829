#include "core/guarded_copy.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace kvfabric {
namespace {

// Issue 17's attack on the daemon, in one process: memory backed by a file
// its owner then shrinks. Touching it raises SIGBUS; a guarded copy reports
// it instead, in either direction, and the process goes on.
TEST(GuardedCopyTest, CopyFromOrIntoAShrunkMappingFailsInsteadOfKilling) {
  const long page = sysconf(_SC_PAGESIZE);
  const int fd = memfd_create("kvf-guarded-copy-test", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4 * page), 0);
  void* map = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* bytes = static_cast<std::byte*>(map);
  std::vector<std::byte> local(4 * page, std::byte{7});
  EXPECT_TRUE(GuardedCopy(bytes, local.data(), local.size(), false).ok());
  EXPECT_TRUE(GuardedCopy(local.data(), bytes, local.size(), true).ok());

  ASSERT_EQ(ftruncate(fd, page), 0);  // the owner shrinks it to one page
  Status from = GuardedCopy(local.data(), bytes, local.size(), /*streaming=*/true);
  EXPECT_EQ(from.code(), StatusCode::kDataLoss) << from;
  EXPECT_NE(from.message().find("SIGBUS"), std::string_view::npos) << from;
  Status into = GuardedCopy(bytes + page, local.data(), page, /*streaming=*/false);
  EXPECT_EQ(into.code(), StatusCode::kDataLoss) << into;
  // The page still backed copies fine, again and again.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(GuardedCopy(local.data(), bytes, page, false).ok());
  munmap(map, 4 * page);
  close(fd);
}

// Outside a guarded copy a fault is what it always was.
TEST(GuardedCopyDeathTest, AFaultOutsideAGuardStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::byte x{};
  ASSERT_TRUE(GuardedCopy(&x, &x + 0, 0, false).ok());
  EXPECT_DEATH(
      {
        std::byte b{1};
        ASSERT_TRUE(GuardedCopy(&x, &b, 1, false).ok());  // installs the handler
        volatile int* null = nullptr;
        *null = 1;
      },
      "");
}

}  // namespace
}  // namespace kvfabric
