#include "core/guarded_copy.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/crc32c.h"

namespace kvfabric {
namespace {

// Four pages of a memory file, mapped shared; its owner may shrink the file
// under the mapping (Shrink), as a hostile client does.
class ShrinkableMapping {
 public:
  ShrinkableMapping() : page_(sysconf(_SC_PAGESIZE)), fd_(memfd_create("kvf-guarded-copy", 0)) {
    if (fd_ < 0 || ftruncate(fd_, 4 * page_) != 0) return;
    void* map = mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (map != MAP_FAILED) bytes_ = static_cast<std::byte*>(map);
  }
  ~ShrinkableMapping() {
    if (bytes_ != nullptr) munmap(bytes_, 4 * page_);
    if (fd_ >= 0) close(fd_);
  }
  ShrinkableMapping(const ShrinkableMapping&) = delete;
  ShrinkableMapping& operator=(const ShrinkableMapping&) = delete;

  std::byte* bytes() const { return bytes_; }  // null if the setup failed
  long page() const { return page_; }
  bool Shrink(long pages) { return ftruncate(fd_, pages * page_) == 0; }

 private:
  const long page_;
  const int fd_;
  std::byte* bytes_ = nullptr;
};

// Issue 17's attack on the daemon, in one process: memory backed by a file
// its owner then shrinks. Touching it raises SIGBUS; a guarded copy reports
// it instead, in either direction, and the process goes on.
TEST(GuardedCopyTest, CopyFromOrIntoAShrunkMappingFailsInsteadOfKilling) {
  ShrinkableMapping mapping;
  ASSERT_NE(mapping.bytes(), nullptr);
  const long page = mapping.page();
  std::byte* bytes = mapping.bytes();
  std::vector<std::byte> local(4 * page, std::byte{7});
  EXPECT_TRUE(GuardedCopy(bytes, local.data(), local.size(), false).ok());
  EXPECT_TRUE(GuardedCopy(local.data(), bytes, local.size(), true).ok());

  ASSERT_TRUE(mapping.Shrink(1));  // the owner shrinks it to one page
  Status from = GuardedCopy(local.data(), bytes, local.size(), /*streaming=*/true);
  EXPECT_EQ(from.code(), StatusCode::kDataLoss) << from;
  EXPECT_NE(from.message().find("SIGBUS"), std::string_view::npos) << from;
  Status into = GuardedCopy(bytes + page, local.data(), page, /*streaming=*/false);
  EXPECT_EQ(into.code(), StatusCode::kDataLoss) << into;
  // The page still backed copies fine, again and again.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(GuardedCopy(local.data(), bytes, page, false).ok());
}

// A checked copy's CRC is the destination's, with and without streaming
// stores, for lengths around the read-back path's piece size; on a shrunk
// mapping it fails as a plain guarded copy does and leaves the CRC alone.
TEST(GuardedCopyTest, CheckedCopyReportsTheDestinationsCrcOrTheFault) {
  constexpr std::size_t kPiece = crc32c::kCopyPieceBytes;
  std::vector<unsigned char> src(3 * kPiece + 100);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (bool streaming : {false, true}) {
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, kPiece - 1, kPiece, kPiece + 1, src.size()}) {
      std::vector<unsigned char> dst(src.size(), 0);
      std::uint32_t crc = 0xdeadbeefu;
      ASSERT_TRUE(GuardedCopyChecked(dst.data(), src.data(), n, streaming, &crc).ok());
      EXPECT_EQ(std::memcmp(dst.data(), src.data(), n), 0) << n << " streaming " << streaming;
      EXPECT_EQ(crc, crc32c::Value(src.data(), n)) << n << " streaming " << streaming;
    }
  }
  ShrinkableMapping mapping;
  ASSERT_NE(mapping.bytes(), nullptr);
  ASSERT_TRUE(mapping.Shrink(1));
  for (bool streaming : {false, true}) {
    std::uint32_t crc = 0x12345678u;
    Status into =
        GuardedCopyChecked(mapping.bytes(), src.data(), 2 * mapping.page(), streaming, &crc);
    EXPECT_EQ(into.code(), StatusCode::kDataLoss) << into;
    EXPECT_EQ(crc, 0x12345678u);
  }
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
