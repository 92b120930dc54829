// Copies through the shared-memory mapping: inline copies on the caller's
// thread (inline_copy_max_bytes) and copies split across helper threads
// (copy_threads).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "core/crc32c.h"
#include "core/testing/test_seed.h"
#include "transport/ucx/ucx_test_fixture.h"

namespace kvfabric::ucx::ucx_test {
namespace {

// Shared memory with a small inline limit, and a region UCX allocated on
// the server side, so that both sides of the limit can be exercised.
class UcxInlineCopyTest : public UcxTransportTest {
 protected:
  static constexpr std::uint64_t kLimit = kMiB;

  UcxTransportOptions MakeOptions() const override {
    UcxTransportOptions options = UcxTransportTest::MakeOptions();
    options.inline_copy_max_bytes = kLimit;
    return options;
  }

  void SetUp() override {
    UcxTransportTest::SetUp();
    if (HasFatalFailure()) return;
    auto owned = server_->AllocateMemory(4 * kMiB, MemoryKind::kHost);
    ASSERT_TRUE(owned.ok()) << owned.status();
    owned_ = std::move(*owned);
    Fill(owned_->bytes(), 7);
    auto local = client_->AllocateMemory(4 * kMiB, MemoryKind::kHost);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    remote_ = Share(*owned_, *client_ep_);
    ASSERT_NE(remote_, nullptr);
  }

  void TearDown() override {
    remote_.reset();
    local_.reset();
    owned_.reset();
    registered_.clear();
    registered_bytes_.clear();
    UcxTransportTest::TearDown();
  }

  // `size` bytes of `fill` that the fixture owns (*bytes), registered on the
  // server (memory UCX did not allocate, so transfers to it are
  // owner-placed) and imported by the client; null on a failure (reported).
  // The import must go before TearDown.
  std::unique_ptr<RemoteRegion> ImportRegistered(std::size_t size, std::byte fill,
                                                 std::span<std::byte>* bytes) {
    registered_bytes_.push_back(std::make_unique<std::vector<std::byte>>(size, fill));
    *bytes = *registered_bytes_.back();
    auto region = server_->RegisterMemory(*bytes, MemoryKind::kHost);
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return nullptr;
    registered_.push_back(std::move(*region));
    auto exported = registered_.back()->Export(0, size);
    EXPECT_TRUE(exported.ok()) << exported.status();
    if (!exported.ok()) return nullptr;
    auto imported = client_ep_->ImportRegion(*exported);
    EXPECT_TRUE(imported.ok()) << imported.status();
    return imported.ok() ? std::move(*imported) : nullptr;
  }

  std::vector<std::unique_ptr<std::vector<std::byte>>> registered_bytes_;
  std::vector<std::unique_ptr<MemoryRegion>> registered_;
  std::unique_ptr<MemoryRegion> owned_, local_;
  std::unique_ptr<RemoteRegion> remote_;
};

TEST_P(UcxInlineCopyTest, SmallBatchIsCopiedBeforeSubmitReturns) {
  const auto before = TEST_GetCounters(*client_);
  std::vector<Transfer> ts = {Read(local_.get(), 0, remote_.get(), kMiB / 2, kMiB / 2),
                              Write(local_.get(), 0, remote_.get(), 3 * kMiB, kMiB / 2)};
  auto batch = client_ep_->Submit(ts);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE((*batch)->Done());  // no hand-off to the progress thread
  ASSERT_TRUE((*batch)->FirstError().ok()) << (*batch)->FirstError();
  EXPECT_EQ((*batch)->TotalBytes(), kMiB);
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers - before.inline_transfers, 2u);
  EXPECT_EQ(after.one_sided_transfers - before.one_sided_transfers, 2u);
  EXPECT_TRUE(Same(local_->bytes().subspan(0, kMiB / 2), owned_->bytes().subspan(kMiB / 2, kMiB / 2)));
  EXPECT_TRUE(Same(owned_->bytes().subspan(3 * kMiB, kMiB / 2),
                   owned_->bytes().subspan(kMiB / 2, kMiB / 2)));
}

TEST_P(UcxInlineCopyTest, BatchOverTheLimitGoesThroughTheProgressThread) {
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(
      SubmitAndWait(*client_ep_, {Read(local_.get(), 0, remote_.get(), 0, kLimit),
                                  Read(local_.get(), kLimit, remote_.get(), kLimit, 4096)})
          .ok());
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers, before.inline_transfers);
  EXPECT_EQ(after.one_sided_transfers - before.one_sided_transfers, 2u);
  EXPECT_TRUE(Same(local_->bytes().subspan(0, kLimit + 4096),
                   owned_->bytes().subspan(0, kLimit + 4096)));
}

TEST_P(UcxInlineCopyTest, BatchWithAnOwnerPlacedEntryIsNotCopiedInline) {
  std::span<std::byte> user;
  std::unique_ptr<RemoteRegion> to_user = ImportRegistered(4096, std::byte{0}, &user);
  ASSERT_NE(to_user, nullptr);
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Read(local_.get(), 0, remote_.get(), 0, 4096),
                                          Write(local_.get(), 0, to_user.get(), 0, 4096)})
                  .ok());
  const auto after = TEST_GetCounters(*client_);
  EXPECT_EQ(after.inline_transfers, before.inline_transfers);
  EXPECT_EQ(after.owner_placed_transfers - before.owner_placed_transfers, 1u);
  EXPECT_TRUE(Same(std::span(user), owned_->bytes().subspan(0, 4096)));
}

// The mapping an inline copy uses is released by the progress thread when
// the endpoint closes; copies racing the close either finish or fail
// cleanly, never touch an unmapped page (run under ASan).
TEST_P(UcxInlineCopyTest, CopiesRacingACloseFinishOrFailCleanly) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::thread reader([&] {
    while (!stop.load()) {
      CountRacingBatch(client_ep_->Submit(std::vector<Transfer>{
                           Read(local_.get(), 0, remote_.get(), 0, kLimit)}),
                       &ok, &failed);
    }
  });
  while (ok.load() < 20) std::this_thread::yield();
  EXPECT_TRUE(client_ep_->Close(CloseMode::kForce, In(10)).ok());
  while (failed.load() < 5) std::this_thread::yield();
  stop = true;
  reader.join();
  EXPECT_GE(ok.load(), 20);
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, UcxInlineCopyTest, ::testing::Values("sm,self,tcp"));

// The same transports with two copy helpers (copy_threads): batches split
// across the helpers land byte for byte, on the progress thread (above the
// inline limit) and inline, at odd offsets and lengths.
class UcxCopyHelpersTest : public UcxInlineCopyTest {
 protected:
  UcxTransportOptions MakeOptions() const override {
    UcxTransportOptions options = UcxInlineCopyTest::MakeOptions();
    options.copy_threads = 2;
    options.streaming_copy_min_bytes = kMiB;  // streamed too
    return options;
  }
};

TEST_P(UcxCopyHelpersTest, SplitBatchesLandExactly) {
  const std::uint64_t a = kMiB + 12345, b = 2 * kMiB - 777;
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Read(local_.get(), 3, remote_.get(), 5, a),
                                          Read(local_.get(), a + 3, remote_.get(), a + 9, b)})
                  .ok());
  EXPECT_TRUE(Same(local_->bytes().subspan(3, a), owned_->bytes().subspan(5, a)));
  EXPECT_TRUE(Same(local_->bytes().subspan(a + 3, b), owned_->bytes().subspan(a + 9, b)));
  // Inline (at most kLimit), written back to the far end of the region.
  const auto before = TEST_GetCounters(*client_);
  ASSERT_TRUE(SubmitAndWait(*client_ep_, {Write(local_.get(), 3, remote_.get(), 3 * kMiB + 1,
                                                kLimit - 1)})
                  .ok());
  EXPECT_EQ(TEST_GetCounters(*client_).inline_transfers - before.inline_transfers, 1u);
  EXPECT_TRUE(Same(owned_->bytes().subspan(3 * kMiB + 1, kLimit - 1),
                   local_->bytes().subspan(3, kLimit - 1)));
}

// Transfer::checksum: entries copied through the mapping, inline, on the
// progress thread and split across the helpers, report the CRC32C of their
// destination's bytes; entries without it, and an owner-placed entry (the
// bytes are placed by the peer), report none.
TEST_P(UcxCopyHelpersTest, CheckedEntriesReportTheirDestinationsCrc) {
  const std::uint64_t a = kMiB + 12345, b = 2 * kMiB - 777;
  auto checked = [](Transfer t) {
    t.checksum = true;
    return t;
  };
  std::vector<Transfer> queued = {checked(Read(local_.get(), 3, remote_.get(), 5, a)),
                                  Read(local_.get(), a + 3, remote_.get(), a + 9, b)};
  auto big = client_ep_->Submit(queued);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE((*big)->Wait(Clock::now() + std::chrono::seconds(10)).ok());
  ASSERT_TRUE((*big)->FirstError().ok()) << (*big)->FirstError();
  ASSERT_TRUE((*big)->results()[0].landed_crc32c.has_value());
  EXPECT_EQ(*(*big)->results()[0].landed_crc32c, crc32c::Value(local_->bytes().subspan(3, a)));
  EXPECT_FALSE((*big)->results()[1].landed_crc32c.has_value());

  std::vector<Transfer> small = {
      checked(Write(local_.get(), 3, remote_.get(), 3 * kMiB + 1, 4099))};
  auto inline_batch = client_ep_->Submit(small);
  ASSERT_TRUE(inline_batch.ok()) << inline_batch.status();
  ASSERT_TRUE((*inline_batch)->Done());
  ASSERT_TRUE((*inline_batch)->results()[0].landed_crc32c.has_value());
  EXPECT_EQ(*(*inline_batch)->results()[0].landed_crc32c,
            crc32c::Value(owned_->bytes().subspan(3 * kMiB + 1, 4099)));

  std::span<std::byte> user;
  std::unique_ptr<RemoteRegion> to_user = ImportRegistered(4096, std::byte{9}, &user);
  ASSERT_NE(to_user, nullptr);
  std::vector<Transfer> placed = {checked(Write(local_.get(), 0, to_user.get(), 0, 4096))};
  auto owner = client_ep_->Submit(placed);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ASSERT_TRUE((*owner)->Wait(Clock::now() + std::chrono::seconds(10)).ok());
  ASSERT_TRUE((*owner)->FirstError().ok()) << (*owner)->FirstError();
  EXPECT_FALSE((*owner)->results()[0].landed_crc32c.has_value());
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, UcxCopyHelpersTest, ::testing::Values("sm,self,tcp"));

}  // namespace
}  // namespace kvfabric::ucx::ucx_test
