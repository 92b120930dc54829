// UcxCore's task queue: what a task posts from the progress thread runs
// right after that task, before the rest of its batch; what those post is
// queued as usual.
#include "transport/ucx/ucx_core.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::ucx::internal {
namespace {

TEST(UcxCoreTest, WhatATaskPostsRunsRightAfterIt) {
  UcxTransportOptions options;
  options.tls = "tcp";
  auto core = UcxCore::Create(options, std::make_shared<CoreGroup>(), nullptr);
  ASSERT_TRUE(core.ok()) << core.status().ToString();
  UcxCore* c = core->get();

  Mutex mu;
  CondVar cv;
  bool release = false;
  bool blocked = false;
  std::vector<std::string> order;
  auto note = [&](const std::string& what) {
    MutexLock l(&mu);
    order.push_back(what);
    cv.NotifyAll();
  };
  // Holds the progress thread, so that A and B go into one batch.
  ASSERT_TRUE(c->Post([&] {
    MutexLock l(&mu);
    blocked = true;
    cv.NotifyAll();
    cv.Wait(&mu, [&]() KVF_REQUIRES(mu) { return release; });
  }));
  {
    MutexLock l(&mu);
    cv.Wait(&mu, [&]() KVF_REQUIRES(mu) { return blocked; });
  }
  ASSERT_TRUE(c->Post([&] {
    note("A");
    // A's reply, say: runs before B.
    EXPECT_TRUE(c->Post([&] {
      note("A's post");
      // Posted by a post: queued behind B.
      EXPECT_TRUE(c->Post([&] { note("its post"); }));
    }));
  }));
  ASSERT_TRUE(c->Post([&] { note("B"); }));
  {
    MutexLock l(&mu);
    release = true;
    cv.NotifyAll();
    cv.Wait(&mu, [&]() KVF_REQUIRES(mu) { return order.size() == 4; });
  }
  EXPECT_EQ(order, (std::vector<std::string>{"A", "A's post", "B", "its post"}));
  (*core)->Shutdown();
}

}  // namespace
}  // namespace kvfabric::ucx::internal
