#include "server/placement/membership_store.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/testing/fake_clock_env.h"
#include "core/testing/test_seed.h"

namespace kvfabric::placement {
namespace {

using namespace std::chrono_literals;

MemberRecord Record(const std::string& host_id, uint64_t incarnation = 7) {
  MemberRecord r;
  r.host_id = host_id;
  r.incarnation = incarnation;
  r.grpc_address = "10.0.0.1:7000";
  r.transport_address = "10.0.0.1:7001";
  r.node_name = "node-a";
  r.host_capacity_bytes = 1 << 30;
  r.host_free_bytes = 1 << 29;
  r.nvme_capacity_bytes = uint64_t{1} << 40;
  r.nvme_free_bytes = 12345;
  r.joined_unix_us = 1'700'000'000'000'000;
  return r;
}

std::string RandomString(std::mt19937_64& rng, size_t max_len) {
  static const std::vector<std::string> kPieces = {"a",  "Z", "0", ":",  "/",    "\"",  "\\",
                                                   "\n", " ", "é", "漢", "🙂", "\x01"};
  std::string s;
  const size_t n = rng() % (max_len + 1);
  while (s.size() < n) {
    const std::string& p = kPieces[rng() % kPieces.size()];
    if (s.size() + p.size() > max_len) break;
    s += p;
  }
  return s;
}

// ---- Encoding ----

TEST(MemberRecordTest, EncodesVersionAndIncarnationAsString) {
  const std::string json = EncodeMemberRecord(Record("h1", 18446744073709551615u));
  EXPECT_NE(json.find("\"v\":1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"incarnation\":\"18446744073709551615\""), std::string::npos) << json;
}

TEST(MemberRecordTest, RandomRecordsRoundTrip) {
  const uint64_t seed = TestSeed("MemberRecordTest.RandomRecordsRoundTrip");
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 500; ++i) {
    MemberRecord r;
    r.host_id = "h" + RandomString(rng, 127);
    r.incarnation = rng();
    r.grpc_address = RandomString(rng, 256);
    r.transport_address = RandomString(rng, 256);
    r.node_name = RandomString(rng, 256);
    r.host_capacity_bytes = rng();
    r.host_free_bytes = r.host_capacity_bytes == 0 ? 0 : rng() % r.host_capacity_bytes;
    r.nvme_capacity_bytes = rng() >> (rng() % 64);
    r.nvme_free_bytes = r.nvme_capacity_bytes;
    r.draining = (rng() & 1) != 0;
    r.joined_unix_us = rng();
    if (rng() & 1) r.token_digest = MembershipTokenDigest(NewMembershipToken());
    ASSERT_TRUE(ValidateMemberRecord(r).ok()) << ValidateMemberRecord(r);
    StatusOr<MemberRecord> back = DecodeMemberRecord(EncodeMemberRecord(r));
    ASSERT_TRUE(back.ok()) << back.status() << " seed " << seed;
    EXPECT_EQ(*back, r) << EncodeMemberRecord(r);
  }
}

TEST(MemberRecordTest, MembershipTokensAreRandomAndMatchOnlyTheirDigest) {
  const std::string a = NewMembershipToken(), b = NewMembershipToken();
  ASSERT_EQ(a.size(), kMembershipTokenBytes);
  EXPECT_NE(a, b);
  const std::string digest = MembershipTokenDigest(a);
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_TRUE(MembershipTokenMatches(digest, a));
  EXPECT_FALSE(MembershipTokenMatches(digest, b));
  EXPECT_FALSE(MembershipTokenMatches(digest, ""));
  EXPECT_TRUE(MembershipTokenMatches("", b)) << "a record from before tokens";
  MemberRecord r = Record("h1");
  r.token_digest = "not hex";
  EXPECT_EQ(ValidateMemberRecord(r).code(), StatusCode::kInvalidArgument);
  r.token_digest = std::string(64, 'A');
  EXPECT_FALSE(ValidateMemberRecord(r).ok()) << "upper-case hex";
}

TEST(MemberRecordTest, DecodeNamesEachMissingField) {
  const std::string good = EncodeMemberRecord(Record("h1"));
  for (const char* field :
       {"v", "host_id", "incarnation", "grpc_address", "transport_address", "node_name",
        "host_capacity_bytes", "host_free_bytes", "nvme_capacity_bytes", "nvme_free_bytes",
        "draining", "joined_unix_us"}) {
    nlohmann::json j = nlohmann::json::parse(good);
    j.erase(field);
    const StatusOr<MemberRecord> r = DecodeMemberRecord(j.dump());
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
    EXPECT_NE(r.status().message().find(std::string("\"") + field + "\""), std::string::npos)
        << r.status();
  }
}

TEST(MemberRecordTest, DecodeRejectsMistypedAndOutOfRangeFields) {
  const nlohmann::json good = nlohmann::json::parse(EncodeMemberRecord(Record("h1")));
  struct Case {
    const char* field;
    nlohmann::json value;
  };
  const std::vector<Case> cases = {
      {"v", 2},
      {"v", "1"},
      {"host_id", 5},
      {"host_id", ""},
      {"host_id", std::string(129, 'x')},
      {"incarnation", 7},
      {"incarnation", "-1"},
      {"incarnation", "1e3"},
      {"incarnation", ""},
      {"incarnation", " 7"},
      {"incarnation", "18446744073709551616"},
      {"grpc_address", std::string(257, 'x')},
      {"host_capacity_bytes", -1},
      {"host_capacity_bytes", 1.5},
      {"host_capacity_bytes", "1"},
      {"host_free_bytes", uint64_t{1} << 31},  // above capacity
      {"nvme_free_bytes", uint64_t{1} << 41},
      {"draining", 0},
      {"joined_unix_us", nullptr},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    j[c.field] = c.value;
    const StatusOr<MemberRecord> r = DecodeMemberRecord(j.dump());
    ASSERT_FALSE(r.ok()) << c.field << "=" << c.value.dump();
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  }
}

TEST(MemberRecordTest, DecodeRejectsNonObjectsAndOversizedInput) {
  for (const std::string bad :
       {"", "{", "[]", "null", "42", "\"x\"", "{\"v\":1}}", "{\"v\":1,\"v\":1", "\xff"}) {
    EXPECT_TRUE(DecodeMemberRecord(bad).status().IsInvalidArgument()) << bad;
  }
  std::string big = EncodeMemberRecord(Record("h1"));
  big.insert(1, "\"pad\":\"" + std::string(kMaxMemberRecordBytes, 'x') + "\",");
  EXPECT_TRUE(DecodeMemberRecord(big).status().IsInvalidArgument());
}

TEST(MemberRecordTest, DecodeIgnoresUnknownFields) {
  nlohmann::json j = nlohmann::json::parse(EncodeMemberRecord(Record("h1")));
  j["zone"] = "eu-1";
  const StatusOr<MemberRecord> r = DecodeMemberRecord(j.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, Record("h1"));
}

TEST(MemberRecordTest, MutatedEncodingsNeverCrashTheDecoder) {
  const uint64_t seed = TestSeed("MemberRecordTest.MutatedEncodingsNeverCrashTheDecoder");
  std::mt19937_64 rng(seed);
  const std::string good = EncodeMemberRecord(Record("h1"));
  for (int i = 0; i < 3000; ++i) {
    std::string s = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[pos] = static_cast<char>(rng());
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        default:
          s.insert(pos, 1, "{}[]\",:0-e\\"[rng() % 11]);
          break;
      }
      if (s.empty()) s = "{";
    }
    const StatusOr<MemberRecord> r = DecodeMemberRecord(s);
    if (!r.ok()) {
      EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status() << " seed " << seed;
    } else {
      EXPECT_TRUE(ValidateMemberRecord(*r).ok());
    }
  }
}

TEST(MemberRecordTest, ValidateChecksSizesUtf8AndFreeBytes) {
  MemberRecord r = Record(std::string(128, 'h'));
  EXPECT_TRUE(ValidateMemberRecord(r).ok());
  r.host_id += "h";
  EXPECT_NE(ValidateMemberRecord(r).message().find("host_id"), std::string::npos);
  r = Record("h1");
  r.transport_address = std::string(257, 'a');
  EXPECT_NE(ValidateMemberRecord(r).message().find("transport_address"), std::string::npos);
  for (const std::string bad : {"\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80"}) {
    r = Record("h1");
    r.node_name = "n" + bad;
    EXPECT_NE(ValidateMemberRecord(r).message().find("node_name is not valid UTF-8"),
              std::string::npos)
        << ValidateMemberRecord(r);
  }
  r = Record("h1");
  r.host_free_bytes = r.host_capacity_bytes + 1;
  EXPECT_NE(ValidateMemberRecord(r).message().find("host_free_bytes"), std::string::npos);
}

// ---- MemoryMembershipStore ----

class MemoryMembershipStoreTest : public ::testing::Test {
 protected:
  MemoryMembershipStoreTest() {
    store_.Watch([this](const MemberEvent& e) { events_.push_back(e); });
  }

  std::vector<std::string> ListedHosts() {
    StatusOr<std::vector<Member>> members = store_.List();
    EXPECT_TRUE(members.ok()) << members.status();
    std::vector<std::string> hosts;
    if (members.ok()) {
      for (const Member& m : *members) hosts.push_back(m.record.host_id);
    }
    return hosts;
  }

  FakeClockEnv env_;
  MemoryMembershipStore store_{&env_};
  std::vector<MemberEvent> events_;
};

TEST_F(MemoryMembershipStoreTest, ListsLiveMembersSortedByHostId) {
  ASSERT_TRUE(store_.Join(Record("b"), 10s).ok());
  ASSERT_TRUE(store_.Join(Record("c"), 10s).ok());
  StatusOr<uint64_t> lease = store_.Join(Record("a"), 10s);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(ListedHosts(), (std::vector<std::string>{"a", "b", "c"}));
  StatusOr<std::vector<Member>> members = store_.List();
  ASSERT_TRUE(members.ok());
  EXPECT_EQ((*members)[0].lease_id, *lease);
  EXPECT_EQ((*members)[0].record, Record("a"));
  ASSERT_EQ(events_.size(), 3u);
  EXPECT_EQ(events_[2].kind, MemberEventKind::kJoined);
  EXPECT_EQ(events_[2].record.host_id, "a");
}

TEST_F(MemoryMembershipStoreTest, MemberWithoutKeepAliveIsGoneAfterItsTtl) {
  ASSERT_TRUE(store_.Join(Record("a"), 5s).ok());
  env_.Advance(4999ms);
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"a"});
  env_.Advance(1ms);
  EXPECT_TRUE(ListedHosts().empty());
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, MemberEventKind::kLeft);
  EXPECT_EQ(events_[1].record, Record("a"));
}

TEST_F(MemoryMembershipStoreTest, KeepAliveRenewsForTheOriginalTtl) {
  StatusOr<uint64_t> lease = store_.Join(Record("a"), 5s);
  ASSERT_TRUE(lease.ok());
  for (int i = 0; i < 10; ++i) {
    env_.Advance(4s);
    ASSERT_TRUE(store_.KeepAlive(*lease, nullptr).ok());
  }
  env_.Advance(4s);
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"a"});
  env_.Advance(1s);
  EXPECT_TRUE(ListedHosts().empty());
  EXPECT_TRUE(store_.KeepAlive(*lease, nullptr).IsNotFound());
}

TEST_F(MemoryMembershipStoreTest, ExpireNowTellsWatchersWithoutOtherCalls) {
  ASSERT_TRUE(store_.Join(Record("a"), 1s).ok());
  env_.Advance(2s);
  store_.ExpireNow();
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, MemberEventKind::kLeft);
}

TEST_F(MemoryMembershipStoreTest, KeepAliveOfUnknownLeaseIsNotFound) {
  EXPECT_TRUE(store_.KeepAlive(42, nullptr).IsNotFound());
}

TEST_F(MemoryMembershipStoreTest, KeepAliveWithRecordReportsUpdate) {
  StatusOr<uint64_t> lease = store_.Join(Record("a"), 5s);
  ASSERT_TRUE(lease.ok());
  MemberRecord changed = Record("a");
  changed.draining = true;
  ASSERT_TRUE(store_.KeepAlive(*lease, &changed).ok());
  ASSERT_TRUE(store_.KeepAlive(*lease, &changed).ok());  // unchanged: no event
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, MemberEventKind::kUpdated);
  EXPECT_TRUE(events_[1].record.draining);
  StatusOr<std::vector<Member>> members = store_.List();
  ASSERT_TRUE(members.ok());
  EXPECT_TRUE((*members)[0].record.draining);
}

TEST_F(MemoryMembershipStoreTest, KeepAliveRefusesRecordOfAnotherHost) {
  StatusOr<uint64_t> lease = store_.Join(Record("a"), 5s);
  ASSERT_TRUE(lease.ok());
  const MemberRecord other = Record("b");
  EXPECT_TRUE(store_.KeepAlive(*lease, &other).IsInvalidArgument());
  MemberRecord bad = Record("a");
  bad.host_free_bytes = bad.host_capacity_bytes + 1;
  EXPECT_TRUE(store_.KeepAlive(*lease, &bad).IsInvalidArgument());
  EXPECT_EQ(ListedHosts(), std::vector<std::string>{"a"});
}

TEST_F(MemoryMembershipStoreTest, NewIncarnationReplacesRecordAndOldLease) {
  StatusOr<uint64_t> old_lease = store_.Join(Record("a", 1), 5s);
  ASSERT_TRUE(old_lease.ok());
  StatusOr<uint64_t> new_lease = store_.Join(Record("a", 2), 5s);
  ASSERT_TRUE(new_lease.ok());
  EXPECT_NE(*old_lease, *new_lease);
  EXPECT_TRUE(store_.KeepAlive(*old_lease, nullptr).IsNotFound());
  ASSERT_TRUE(store_.Leave(*old_lease).ok());  // must not remove the new incarnation
  StatusOr<std::vector<Member>> members = store_.List();
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].record.incarnation, 2u);
  EXPECT_EQ((*members)[0].lease_id, *new_lease);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, MemberEventKind::kJoined);
  EXPECT_EQ(events_[1].record.incarnation, 2u);
}

TEST_F(MemoryMembershipStoreTest, RejoinWithSameRecordReportsNothing) {
  ASSERT_TRUE(store_.Join(Record("a"), 5s).ok());
  ASSERT_TRUE(store_.Join(Record("a"), 5s).ok());
  EXPECT_EQ(events_.size(), 1u);
}

TEST_F(MemoryMembershipStoreTest, LeaveRemovesMemberOnceAndIsIdempotent) {
  StatusOr<uint64_t> lease = store_.Join(Record("a"), 5s);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store_.Leave(*lease).ok());
  ASSERT_TRUE(store_.Leave(*lease).ok());
  ASSERT_TRUE(store_.Leave(999).ok());
  EXPECT_TRUE(ListedHosts().empty());
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, MemberEventKind::kLeft);
  EXPECT_EQ(events_[1].record, Record("a"));
}

TEST_F(MemoryMembershipStoreTest, JoinRefusesBadRecordAndTtl) {
  EXPECT_TRUE(store_.Join(Record(""), 5s).status().IsInvalidArgument());
  EXPECT_TRUE(store_.Join(Record("a"), 0ms).status().IsInvalidArgument());
  EXPECT_TRUE(store_.Join(Record("a"), -1ms).status().IsInvalidArgument());
  EXPECT_TRUE(store_.Join(Record("a"), kMaxMemberTtl + 1ms).status().IsInvalidArgument());
  EXPECT_TRUE(ListedHosts().empty());
  EXPECT_TRUE(events_.empty());
}

TEST_F(MemoryMembershipStoreTest, WatchReplacesThePreviousWatcher) {
  std::vector<MemberEvent> second;
  store_.Watch([&second](const MemberEvent& e) { second.push_back(e); });
  ASSERT_TRUE(store_.Join(Record("a"), 5s).ok());
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(second.size(), 1u);
  store_.Watch(nullptr);
  ASSERT_TRUE(store_.Join(Record("b"), 5s).ok());
  EXPECT_EQ(second.size(), 1u);
}

TEST_F(MemoryMembershipStoreTest, CompareAndSwapSwapsOnlyOnExpectedValue) {
  StatusOr<std::optional<std::string>> got = store_.Get("calibration");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(store_.CompareAndSwap("calibration", "x", "v1").value(), false);
  EXPECT_EQ(store_.CompareAndSwap("calibration", std::nullopt, "v1").value(), true);
  EXPECT_EQ(store_.CompareAndSwap("calibration", std::nullopt, "v2").value(), false);
  EXPECT_EQ(store_.CompareAndSwap("calibration", "v0", "v2").value(), false);
  EXPECT_EQ(store_.CompareAndSwap("calibration", "v1", "v2").value(), true);
  EXPECT_EQ(store_.Get("calibration").value(), std::optional<std::string>("v2"));
}

TEST_F(MemoryMembershipStoreTest, ConfigRefusesBadKeysAndLargeValues) {
  EXPECT_TRUE(store_.Get("").status().IsInvalidArgument());
  EXPECT_TRUE(store_.Get(std::string(kMaxConfigKeyBytes + 1, 'k')).status().IsInvalidArgument());
  EXPECT_TRUE(store_.CompareAndSwap("k", std::nullopt, std::string(kMaxConfigValueBytes + 1, 'v'))
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(
      store_.CompareAndSwap("k", std::nullopt, std::string(kMaxConfigValueBytes, 'v')).value());
}

TEST_F(MemoryMembershipStoreTest, RandomOperationsMatchAReferenceModel) {
  const uint64_t seed = TestSeed("MemoryMembershipStoreTest.RandomOperationsMatchAReferenceModel");
  std::mt19937_64 rng(seed);
  struct Live {
    uint64_t lease;
    uint64_t expires_us;
    uint64_t ttl_us;
  };
  std::map<std::string, Live> model;
  for (int step = 0; step < 2000; ++step) {
    const std::string host = "h" + std::to_string(rng() % 6);
    const uint64_t now = env_.NowMicros();
    for (auto it = model.begin(); it != model.end();) {
      it = it->second.expires_us <= now ? model.erase(it) : std::next(it);
    }
    switch (rng() % 4) {
      case 0: {
        const auto ttl = std::chrono::milliseconds(1 + rng() % 3000);
        StatusOr<uint64_t> lease = store_.Join(Record(host, rng() % 3), ttl);
        ASSERT_TRUE(lease.ok()) << "seed " << seed;
        const uint64_t ttl_us = static_cast<uint64_t>(ttl.count()) * 1000;
        model[host] = {*lease, now + ttl_us, ttl_us};
        break;
      }
      case 1: {
        const auto it = model.find(host);
        const uint64_t lease = it == model.end() ? 12345678 : it->second.lease;
        const Status s = store_.KeepAlive(lease, nullptr);
        ASSERT_EQ(s.ok(), it != model.end()) << s << " seed " << seed;
        if (it != model.end()) it->second.expires_us = now + it->second.ttl_us;
        break;
      }
      case 2: {
        const auto it = model.find(host);
        if (it != model.end() && rng() % 2 == 0) {
          ASSERT_TRUE(store_.Leave(it->second.lease).ok());
          model.erase(it);
        }
        break;
      }
      default:
        env_.Advance(std::chrono::microseconds(rng() % 1'000'000));
        break;
    }
    std::vector<std::string> want;
    for (const auto& [h, live] : model) {
      if (live.expires_us > env_.NowMicros()) want.push_back(h);
    }
    ASSERT_EQ(ListedHosts(), want) << "step " << step << " seed " << seed;
  }
}

}  // namespace
}  // namespace kvfabric::placement
