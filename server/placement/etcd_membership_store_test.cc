#include "server/placement/etcd_membership_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "core/testing/wait_for.h"
#include "server/placement/etcd_client.h"
#include "server/placement/testing/etcd_process.h"

namespace kvfabric::placement {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

MemberRecord Record(const std::string& host_id, uint64_t incarnation = 7) {
  MemberRecord r;
  r.host_id = host_id;
  r.incarnation = incarnation;
  r.grpc_address = "10.0.0.1:7000";
  r.transport_address = "10.0.0.1:7001";
  r.host_capacity_bytes = 1 << 30;
  r.host_free_bytes = 1 << 29;
  return r;
}

// Collects watch events; Await blocks until at least n arrived.
class EventLog {
 public:
  MemberWatcher Watcher() {
    return [this](const MemberEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
  }
  std::vector<MemberEvent> Await(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 15s, [&] { return events_.size() >= n; });
    return events_;
  }
  std::vector<MemberEvent> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<MemberEvent> events_;
};

std::string Describe(const std::vector<MemberEvent>& events) {
  std::string out;
  for (const MemberEvent& e : events) {
    out += std::string(e.kind == MemberEventKind::kJoined    ? "joined "
                       : e.kind == MemberEventKind::kUpdated ? "updated "
                                                             : "left ") +
           e.record.host_id + "#" + std::to_string(e.record.incarnation) +
           (e.record.draining ? "(draining)" : "") + "; ";
  }
  return out;
}

TEST(EtcdMembershipStoreOptionsTest, CreateRefusesBadPrefixAndEndpoint) {
  EtcdMembershipStoreOptions options;
  options.prefix = "/kvfabric/v1";
  EXPECT_TRUE(EtcdMembershipStore::Create(options).status().IsInvalidArgument());
  options.prefix = "";
  EXPECT_TRUE(EtcdMembershipStore::Create(options).status().IsInvalidArgument());
  options = EtcdMembershipStoreOptions();
  options.endpoint = "https://127.0.0.1:2379";
  EXPECT_TRUE(EtcdMembershipStore::Create(options).status().IsInvalidArgument());
  options = EtcdMembershipStoreOptions();
  StatusOr<std::unique_ptr<EtcdMembershipStore>> store = EtcdMembershipStore::Create(options);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->name(), "etcd(http://127.0.0.1:2379)");
}

class EtcdMembershipStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::EtcdProcess::SkipReason().empty()) return;
    StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd = testing::EtcdProcess::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(etcd).value().release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    const std::string reason = testing::EtcdProcess::SkipReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_NE(etcd_, nullptr);
    prefix_ =
        std::string("/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
    store_ = NewStore();
    EtcdClientOptions options;
    options.endpoint = etcd_->endpoint();
    raw_ = std::move(EtcdClient::Create(options)).value();
  }

  std::unique_ptr<EtcdMembershipStore> NewStore() {
    EtcdMembershipStoreOptions options;
    options.endpoint = etcd_->endpoint();
    options.prefix = prefix_;
    options.request_timeout = 3s;
    options.watch_retry_interval = 1s;
    return std::move(EtcdMembershipStore::Create(options)).value();
  }

  std::vector<std::string> ListedHosts() {
    StatusOr<std::vector<Member>> members = store_->List();
    EXPECT_TRUE(members.ok()) << members.status();
    std::vector<std::string> hosts;
    if (members.ok()) {
      for (const Member& m : *members) hosts.push_back(m.record.host_id);
    }
    return hosts;
  }

  static testing::EtcdProcess* etcd_;
  std::string prefix_;
  std::unique_ptr<EtcdMembershipStore> store_;
  std::unique_ptr<EtcdClient> raw_;  // to look at and tamper with the keys directly
};

testing::EtcdProcess* EtcdMembershipStoreTest::etcd_ = nullptr;

TEST_F(EtcdMembershipStoreTest, JoinListsMembersUnderTheirLeasesAndLeaveRemovesThem) {
  StatusOr<uint64_t> lease_b = store_->Join(Record("b"), 10s);
  ASSERT_TRUE(lease_b.ok()) << lease_b.status();
  StatusOr<uint64_t> lease_a = store_->Join(Record("a"), 10s);
  ASSERT_TRUE(lease_a.ok()) << lease_a.status();
  StatusOr<std::vector<Member>> members = store_->List();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].record, Record("a"));
  EXPECT_EQ((*members)[0].lease_id, *lease_a);
  EXPECT_EQ((*members)[1].lease_id, *lease_b);
  StatusOr<EtcdRangeResult> raw = raw_->Range(prefix_ + "members/a");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->kvs.size(), 1u);
  EXPECT_EQ(DecodeMemberRecord(raw->kvs[0].value).value(), Record("a"));
  ASSERT_TRUE(store_->Leave(*lease_a).ok());
  ASSERT_TRUE(store_->Leave(*lease_a).ok());
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"b"});
  EXPECT_TRUE(store_->KeepAlive(*lease_a, nullptr).IsNotFound());
}

TEST_F(EtcdMembershipStoreTest, MemberWithoutKeepAliveDisappearsAfterItsTtl) {
  StatusOr<uint64_t> lease = store_->Join(Record("a"), 1s);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"a"});
  ASSERT_TRUE(WaitFor([&] { return ListedHosts().empty(); }, 15s, "etcd to expire a's 1 s lease"));
  EXPECT_TRUE(store_->KeepAlive(*lease, nullptr).IsNotFound());
}

TEST_F(EtcdMembershipStoreTest, KeepAliveKeepsMemberAndStoresUpdatedRecord) {
  StatusOr<uint64_t> lease = store_->Join(Record("a"), 2s);
  ASSERT_TRUE(lease.ok()) << lease.status();
  MemberRecord updated = Record("a");
  // The sleep is the behaviour under test: etcd expires leases on its own
  // clock, in another process, so only keep-alives paced in real time across
  // more than a TTL show that they hold the member.
  for (auto end = Clock::now() + 3s; Clock::now() < end;) {  // 1.5 TTLs
    updated.host_free_bytes -= 4096;
    ASSERT_TRUE(store_->KeepAlive(*lease, &updated).ok());
    std::this_thread::sleep_for(250ms);
  }
  StatusOr<std::vector<Member>> members = store_->List();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].record, updated);
  EXPECT_EQ((*members)[0].lease_id, *lease);
}

TEST_F(EtcdMembershipStoreTest, NewIncarnationReplacesRecordAndRevokesOldLease) {
  StatusOr<uint64_t> old_lease = store_->Join(Record("a", 1), 10s);
  ASSERT_TRUE(old_lease.ok()) << old_lease.status();
  StatusOr<uint64_t> new_lease = store_->Join(Record("a", 2), 10s);
  ASSERT_TRUE(new_lease.ok()) << new_lease.status();
  EXPECT_NE(*old_lease, *new_lease);
  EXPECT_TRUE(store_->KeepAlive(*old_lease, nullptr).IsNotFound());
  EXPECT_TRUE(store_->KeepAlive(*new_lease, nullptr).ok());
  ASSERT_TRUE(store_->Leave(*old_lease).ok());  // must not remove the new incarnation
  StatusOr<std::vector<Member>> members = store_->List();
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].record.incarnation, 2u);
  EXPECT_EQ((*members)[0].lease_id, *new_lease);
}

TEST_F(EtcdMembershipStoreTest, KeepAliveRefusesRecordTheLeaseDoesNotHold) {
  StatusOr<uint64_t> lease_a = store_->Join(Record("a"), 10s);
  StatusOr<uint64_t> lease_b = store_->Join(Record("b"), 10s);
  ASSERT_TRUE(lease_a.ok() && lease_b.ok());
  MemberRecord b = Record("b");
  b.draining = true;
  EXPECT_TRUE(store_->KeepAlive(*lease_a, &b).IsNotFound());
  const MemberRecord c = Record("c");
  EXPECT_TRUE(store_->KeepAlive(*lease_a, &c).IsNotFound());
  EXPECT_EQ(ListedHosts(), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(store_->List()->at(1).record.draining);
  EXPECT_TRUE(store_->KeepAlive(0, nullptr).IsNotFound());
}

TEST_F(EtcdMembershipStoreTest, ListSkipsRecordsThatDoNotDecode) {
  ASSERT_TRUE(store_->Join(Record("a"), 10s).ok());
  ASSERT_TRUE(raw_->Put(prefix_ + "members/garbage", "{not json").ok());
  ASSERT_TRUE(raw_->Put(prefix_ + "members/other", EncodeMemberRecord(Record("x"))).ok());
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"a"});
}

TEST_F(EtcdMembershipStoreTest, WatchReportsJoinsUpdatesLeavesAndExpiry) {
  StatusOr<uint64_t> before = store_->Join(Record("old"), 10s);  // there before Watch: no news
  ASSERT_TRUE(before.ok());
  EventLog log;
  store_->Watch(log.Watcher());
  StatusOr<uint64_t> lease_a = store_->Join(Record("a"), 1s);  // expires
  ASSERT_TRUE(lease_a.ok()) << lease_a.status();
  StatusOr<uint64_t> lease_b = store_->Join(Record("b", 1), 10s);
  ASSERT_TRUE(lease_b.ok());
  MemberRecord draining = Record("b", 1);
  draining.draining = true;
  ASSERT_TRUE(store_->KeepAlive(*lease_b, &draining).ok());
  ASSERT_TRUE(store_->KeepAlive(*lease_b, &draining).ok());       // unchanged: no event
  ASSERT_TRUE(raw_->Put(prefix_ + "members/junk", "junk").ok());  // ignored
  StatusOr<uint64_t> lease_b2 = store_->Join(Record("b", 2), 10s);
  ASSERT_TRUE(lease_b2.ok());
  ASSERT_TRUE(store_->Leave(*lease_b2).ok());
  // Once a's lease has expired, one more join marks the end: etcd delivers a
  // watch's events in revision order, so when the marker's event is in, so
  // is every event (wanted or extra) of each change made before it.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::vector<MemberEvent> events = log.Snapshot();
        return std::any_of(events.begin(), events.end(), [](const MemberEvent& e) {
          return e.record.host_id == "a" && e.kind == MemberEventKind::kLeft;
        });
      },
      15s, "etcd to expire a's 1 s lease"));
  ASSERT_TRUE(store_->Join(Record("marker"), 10s).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::vector<MemberEvent> events = log.Snapshot();
        return !events.empty() && events.back().record.host_id == "marker";
      },
      15s, "the marker's join event"));
  // Per host, in order (a's expiry may fall anywhere among b's events).
  std::vector<MemberEvent> a;
  std::vector<MemberEvent> b;
  std::vector<MemberEvent> marker;
  for (const MemberEvent& e : log.Snapshot()) {
    (e.record.host_id == "a" ? a : e.record.host_id == "marker" ? marker : b).push_back(e);
  }
  EXPECT_EQ(Describe(a), "joined a#7; left a#7; ");
  EXPECT_EQ(Describe(b), "joined b#1; updated b#1(draining); joined b#2; left b#2; ");
  EXPECT_EQ(Describe(marker), "joined marker#7; ");
}

TEST_F(EtcdMembershipStoreTest, ReplacedWatcherIsNotCalledAgain) {
  EventLog first;
  EventLog second;
  store_->Watch(first.Watcher());
  ASSERT_TRUE(store_->Join(Record("a"), 10s).ok());
  first.Await(1);
  store_->Watch(second.Watcher());
  ASSERT_TRUE(store_->Join(Record("b"), 10s).ok());
  EXPECT_EQ(Describe(second.Await(1)), "joined b#7; ");
  EXPECT_EQ(Describe(first.Snapshot()), "joined a#7; ");
}

TEST_F(EtcdMembershipStoreTest, CompareAndSwapSucceedsOnceAndFailsOnStaleValue) {
  EXPECT_FALSE(store_->Get("calibration").value().has_value());
  EXPECT_TRUE(store_->CompareAndSwap("calibration", std::nullopt, "v1").value());
  EXPECT_FALSE(store_->CompareAndSwap("calibration", std::nullopt, "v1").value());
  EXPECT_FALSE(store_->CompareAndSwap("calibration", "v0", "v2").value());
  EXPECT_TRUE(store_->CompareAndSwap("calibration", "v1", "v2").value());
  EXPECT_FALSE(store_->CompareAndSwap("calibration", "v1", "v3").value());  // stale
  EXPECT_EQ(store_->Get("calibration").value(), std::optional<std::string>("v2"));
  EXPECT_EQ(raw_->Range(prefix_ + "config/calibration")->kvs.at(0).value, "v2");
  EXPECT_TRUE(store_->CompareAndSwap("", std::nullopt, "v").status().IsInvalidArgument());
}

TEST_F(EtcdMembershipStoreTest, UnreachableEtcdIsUnavailableNamingTheEndpoint) {
  EtcdMembershipStoreOptions options;
  options.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  std::unique_ptr<EtcdMembershipStore> store =
      std::move(EtcdMembershipStore::Create(options)).value();
  const Status s = store->Join(Record("a"), 10s).status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("http://127.0.0.1:1"), std::string::npos) << s;
  EXPECT_TRUE(store->List().status().IsUnavailable());
}

// Restarts the shared etcd (same endpoint and data: later tests do not mind).
TEST_F(EtcdMembershipStoreTest, WatchCatchesUpAfterEtcdRestart) {
  StatusOr<uint64_t> lease_a = store_->Join(Record("a"), 30s);
  ASSERT_TRUE(lease_a.ok());
  EventLog log;
  store_->Watch(log.Watcher());
  ASSERT_TRUE(etcd_->Restart().ok()) << etcd_->LogTail();
  // Changed while the store's watch is (most likely) still broken: reported
  // from the re-listing's difference, or by the new watch if it was quicker.
  std::unique_ptr<EtcdMembershipStore> other = NewStore();
  ASSERT_TRUE(other->Leave(*lease_a).ok());
  ASSERT_TRUE(other->Join(Record("b"), 30s).ok());
  EXPECT_EQ(Describe(log.Await(2)), "left a#7; joined b#7; ");
  ASSERT_TRUE(other->Join(Record("c"), 30s).ok());  // and the new watch works
  EXPECT_EQ(Describe(log.Await(3)), "left a#7; joined b#7; joined c#7; ");
}

}  // namespace
}  // namespace kvfabric::placement
