// UcxCore's task queue: what a task posts from the progress thread runs
// right after that task, before the rest of its batch; what those post is
// queued as usual. Ranked tasks run after plain ones, lowest rank first,
// unless the first posted waited past its bound.
#include "transport/ucx/ucx_core.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::ucx::internal {
namespace {

// Holds a core's progress thread in a task while the test queues others,
// then lets it go and collects the order they ran in (Note).
class HeldProgressThread {
 public:
  explicit HeldProgressThread(UcxCore* c) {
    EXPECT_TRUE(c->Post([this] {
      MutexLock l(&mu_);
      blocked_ = true;
      cv_.NotifyAll();
      cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return release_; });
    }));
    MutexLock l(&mu_);
    cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return blocked_; });
  }
  void Note(const std::string& what) {
    MutexLock l(&mu_);
    order_.push_back(what);
    cv_.NotifyAll();
  }
  // Releases the thread and waits for `n` notes.
  std::vector<std::string> ReleaseAndWaitFor(std::size_t n) {
    MutexLock l(&mu_);
    release_ = true;
    cv_.NotifyAll();
    cv_.Wait(&mu_, [&]() KVF_REQUIRES(mu_) { return order_.size() == n; });
    return order_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool release_ KVF_GUARDED_BY(mu_) = false;
  bool blocked_ KVF_GUARDED_BY(mu_) = false;
  std::vector<std::string> order_ KVF_GUARDED_BY(mu_);
};

TEST(UcxCoreTest, WhatATaskPostsRunsRightAfterIt) {
  UcxTransportOptions options;
  options.tls = "tcp";
  auto core = UcxCore::Create(options, std::make_shared<CoreGroup>(), nullptr);
  ASSERT_TRUE(core.ok()) << core.status().ToString();
  UcxCore* c = core->get();
  // Held, so that A and B go into one batch.
  HeldProgressThread held(c);
  ASSERT_TRUE(c->Post([&] {
    held.Note("A");
    // A's reply, say: runs before B.
    EXPECT_TRUE(c->Post([&] {
      held.Note("A's post");
      // Posted by a post: queued behind B.
      EXPECT_TRUE(c->Post([&] { held.Note("its post"); }));
    }));
  }));
  ASSERT_TRUE(c->Post([&] { held.Note("B"); }));
  EXPECT_EQ(held.ReleaseAndWaitFor(4),
            (std::vector<std::string>{"A", "A's post", "B", "its post"}));
  (*core)->Shutdown();
}

// Posts `ranks` as ranked tasks (and one plain task last) while the progress
// thread is held, releases it and returns the order they ran in.
std::vector<std::string> RankedOrder(const UcxTransportOptions& options,
                                     const std::vector<std::uint32_t>& ranks) {
  auto core = UcxCore::Create(options, std::make_shared<CoreGroup>(), nullptr);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  if (!core.ok()) return {};
  UcxCore* c = core->get();
  HeldProgressThread held(c);
  for (std::uint32_t r : ranks) {
    EXPECT_TRUE(c->PostRanked(r, [&held, r] { held.Note("rank " + std::to_string(r)); }));
  }
  EXPECT_TRUE(c->Post([&] { held.Note("plain"); }));
  std::vector<std::string> order = held.ReleaseAndWaitFor(ranks.size() + 1);
  (*core)->Shutdown();
  return order;
}

TEST(UcxCoreTest, RankedTasksRunAfterPlainOnesLowestRankFirst) {
  UcxTransportOptions options;
  options.tls = "tcp";
  options.max_rank_deferral = std::chrono::minutes(1);
  // Rank 0 is a plain task: it runs in posting order with the others.
  EXPECT_EQ(RankedOrder(options, {7, 2, 0, 7, 1}),
            (std::vector<std::string>{"rank 0", "plain", "rank 1", "rank 2", "rank 7", "rank 7"}));
}

TEST(UcxCoreTest, ARankedTaskPastItsDeferralBoundRunsFirst) {
  UcxTransportOptions options;
  options.tls = "tcp";
  // Every ranked task has waited its bound: first posted, first run.
  options.max_rank_deferral = std::chrono::milliseconds(0);
  EXPECT_EQ(RankedOrder(options, {7, 2, 5}),
            (std::vector<std::string>{"plain", "rank 7", "rank 2", "rank 5"}));
}

}  // namespace
}  // namespace kvfabric::ucx::internal
