#include "transport/transfer_batch.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

namespace kvfabric::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(TransferBatchTest, DoneAfterEveryEntryCompletes) {
  auto c = std::make_shared<BatchCompletion>(3, nullptr);
  TransferBatch b(c);
  EXPECT_FALSE(b.Done());
  c->Complete(0, Status::OK(), 10);
  c->Complete(2, Status::OK(), 30);
  EXPECT_FALSE(b.Done());
  EXPECT_EQ(b.Wait(steady_clock::now() + milliseconds(1)).code(), StatusCode::kDeadlineExceeded);
  c->Complete(1, Status::Unavailable("peer gone"), 0);
  ASSERT_TRUE(b.Done());
  EXPECT_TRUE(b.Wait(steady_clock::now()).ok());
  EXPECT_EQ(b.TotalBytes(), 40u);
  EXPECT_EQ(b.FirstError().ToString(), "Unavailable: transfer 1: peer gone");
}

TEST(TransferBatchTest, SecondCompletionOfAnEntryIsIgnored) {
  auto c = std::make_shared<BatchCompletion>(1, nullptr);
  TransferBatch b(c);
  c->Complete(0, Status::OK(), 8);
  c->Complete(0, Status::Cancelled("late cancel"), 0);
  EXPECT_TRUE(b.results()[0].status.ok());
  EXPECT_EQ(b.results()[0].bytes, 8u);
}

TEST(TransferBatchTest, CancelCallsBackendOnceAndDestructorWaits) {
  std::atomic<int> cancels{0};
  std::shared_ptr<BatchCompletion> c;
  c = std::make_shared<BatchCompletion>(2, [&] {
    cancels++;
    // The backend completes asynchronously, as a progress thread would.
    std::thread([c] {
      std::this_thread::sleep_for(milliseconds(20));
      c->Complete(0, Status::Cancelled("cancelled"), 0);
      c->Complete(1, Status::Cancelled("cancelled"), 0);
    }).detach();
  });
  {
    TransferBatch b(c);
    b.Cancel();
    b.Cancel();
  }  // the destructor returns only after both entries completed
  EXPECT_TRUE(c->Done());
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_EQ(c->results()[1].status.code(), StatusCode::kCancelled);
}

TEST(TransferBatchTest, OnDoneRunsOnceWhenLastEntryCompletesOrAtOnce) {
  auto c = std::make_shared<BatchCompletion>(1, nullptr);
  int calls = 0;
  c->OnDone([&] { calls++; });
  EXPECT_EQ(calls, 0);
  c->Complete(0, Status::OK(), 1);
  EXPECT_EQ(calls, 1);
  c->OnDone([&] { calls++; });
  EXPECT_EQ(calls, 2);
}

TEST(TransferBatchTest, EmptyBatchIsDoneAtOnce) {
  TransferBatch b(std::make_shared<BatchCompletion>(0, nullptr));
  EXPECT_TRUE(b.Done());
  EXPECT_TRUE(b.FirstError().ok());
}

TEST(TransferBatchTest, CompletionsFromManyThreads) {
  constexpr int kEntries = 1000;
  auto c = std::make_shared<BatchCompletion>(kEntries, nullptr);
  TransferBatch b(c);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kEntries; i += 4) c->Complete(i, Status::OK(), 1);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(b.Wait(steady_clock::now() + std::chrono::seconds(5)).ok());
  EXPECT_EQ(b.TotalBytes(), static_cast<std::uint64_t>(kEntries));
}

}  // namespace
}  // namespace kvfabric::transport
