#include "server/placement/directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric::placement {
namespace {

BlockKey Key(int i) {
  BlockKey::Bytes b{};
  b[0] = static_cast<std::uint8_t>(i);
  b[1] = static_cast<std::uint8_t>(i >> 8);
  b[31] = 0xAB;
  return BlockKey(b);
}

BlockEvent Ev(BlockEventKind kind, int key, Tier tier, std::string ns = "t",
              std::uint64_t bytes = 4096) {
  BlockEvent e;
  e.kind = kind;
  e.ns = std::move(ns);
  e.key = Key(key);
  e.tier = tier;
  e.payload_bytes = bytes;
  e.representation = 1;
  return e;
}

DirectoryEntry One(Directory& d, int key, std::string ns = "t") {
  const BlockKey k = Key(key);
  return d.Lookup(ns, {&k, 1}, /*touch=*/false, 0)[0];
}

TEST(DirectoryTest, TracksTiersThroughCommitDemotePromoteAndEvict) {
  Directory d({});
  d.SetHostIncarnation("a", 7);
  using K = BlockEventKind;
  std::vector<BlockEvent> ev = {Ev(K::kCommitted, 1, Tier::kHost)};
  EXPECT_EQ(d.Apply("a", 7, ev, 10), 1u);
  DirectoryEntry e = One(d, 1);
  ASSERT_EQ(e.replicas.size(), 1u);
  EXPECT_EQ(e.replicas[0].host_id, "a");
  EXPECT_EQ(e.replicas[0].incarnation, 7u);
  EXPECT_TRUE(e.replicas[0].on_host);
  EXPECT_FALSE(e.replicas[0].on_nvme);
  EXPECT_EQ(e.replicas[0].payload_bytes, 4096u);
  EXPECT_EQ(e.last_access_us, 10u);

  ev = {Ev(K::kDemoted, 1, Tier::kNvme)};
  d.Apply("a", 7, ev, 11);
  e = One(d, 1);
  ASSERT_EQ(e.replicas.size(), 1u);
  EXPECT_FALSE(e.replicas[0].on_host);
  EXPECT_TRUE(e.replicas[0].on_nvme);
  EXPECT_EQ(e.replicas[0].best_tier(), Tier::kNvme);

  ev = {Ev(K::kPromoted, 1, Tier::kHost), Ev(K::kCommitted, 1, Tier::kNvme)};
  d.Apply("a", 7, ev, 12);
  e = One(d, 1);
  ASSERT_EQ(e.replicas.size(), 1u);
  EXPECT_TRUE(e.replicas[0].on_host);
  EXPECT_TRUE(e.replicas[0].on_nvme);
  EXPECT_EQ(e.replicas[0].best_tier(), Tier::kHost);

  ev = {Ev(K::kEvicted, 1, Tier::kHost)};
  d.Apply("a", 7, ev, 13);
  e = One(d, 1);
  ASSERT_EQ(e.replicas.size(), 1u);
  EXPECT_FALSE(e.replicas[0].on_host);
  EXPECT_TRUE(e.replicas[0].on_nvme);

  ev = {Ev(K::kEvicted, 1, Tier::kNvme)};
  d.Apply("a", 7, ev, 14);
  EXPECT_TRUE(One(d, 1).replicas.empty());
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.counters().replicas, 0u);
  EXPECT_EQ(d.HostReplicas("a"), 0u);
}

TEST(DirectoryTest, DeletedAndCorruptedRemoveTheReplicaFromEveryTier) {
  Directory d({});
  d.SetHostIncarnation("a", 1);
  d.SetHostIncarnation("b", 1);
  using K = BlockEventKind;
  std::vector<BlockEvent> ev = {Ev(K::kCommitted, 1, Tier::kHost),
                                Ev(K::kCommitted, 1, Tier::kNvme),
                                Ev(K::kCommitted, 2, Tier::kHost)};
  d.Apply("a", 1, ev, 0);
  d.Apply("b", 1, ev, 0);
  ev = {Ev(K::kDeleted, 1, Tier::kHost), Ev(K::kCorrupted, 2, Tier::kUnspecified)};
  EXPECT_EQ(d.Apply("a", 1, ev, 0), 2u);
  ASSERT_EQ(One(d, 1).replicas.size(), 1u);
  EXPECT_EQ(One(d, 1).replicas[0].host_id, "b");
  ASSERT_EQ(One(d, 2).replicas.size(), 1u);
  EXPECT_EQ(One(d, 2).replicas[0].host_id, "b");
  EXPECT_EQ(d.HostReplicas("a"), 0u);
  EXPECT_EQ(d.HostReplicas("b"), 2u);
}

TEST(DirectoryTest, IgnoresAndCountsEventsFromAnotherIncarnationOrUnknownHost) {
  Directory d({});
  d.SetHostIncarnation("a", 5);
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, 1, Tier::kHost),
                                Ev(BlockEventKind::kCommitted, 2, Tier::kHost)};
  EXPECT_EQ(d.Apply("a", 4, ev, 0), 0u);
  EXPECT_EQ(d.Apply("zz", 5, ev, 0), 0u);
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.counters().events_ignored_incarnation, 4u);
  EXPECT_EQ(d.counters().events_applied, 0u);
}

TEST(DirectoryTest, IgnoresAndCountsMalformedEvents) {
  Directory d({});
  d.SetHostIncarnation("a", 5);
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kUnspecified, 1, Tier::kHost),
                                Ev(BlockEventKind::kCommitted, 2, Tier::kUnspecified),
                                Ev(BlockEventKind::kEvicted, 3, Tier::kHost)};
  EXPECT_EQ(d.Apply("a", 5, ev, 0), 1u);
  EXPECT_EQ(d.counters().events_ignored_malformed, 2u);
  EXPECT_EQ(d.counters().events_without_replica, 1u);
  EXPECT_EQ(d.size(), 0u);
}

TEST(DirectoryTest, NewIncarnationDropsTheOldOnesReplicas) {
  Directory d({});
  d.SetHostIncarnation("a", 1);
  d.SetHostIncarnation("b", 1);
  std::vector<BlockEvent> ev;
  for (int i = 0; i < 10; ++i) ev.push_back(Ev(BlockEventKind::kCommitted, i, Tier::kHost));
  d.Apply("a", 1, ev, 0);
  d.Apply("b", 1, std::span(ev).first(3), 0);
  EXPECT_EQ(d.SetHostIncarnation("a", 1), 0u);  // same incarnation: nothing happens
  EXPECT_EQ(d.HostReplicas("a"), 10u);
  EXPECT_EQ(d.SetHostIncarnation("a", 2), 10u);
  EXPECT_EQ(d.HostIncarnation("a"), 2u);
  EXPECT_EQ(d.HostReplicas("a"), 0u);
  EXPECT_EQ(d.size(), 3u);                // b's three remain
  EXPECT_EQ(d.Apply("a", 1, ev, 0), 0u);  // the old incarnation's late report is ignored
  EXPECT_EQ(d.Apply("a", 2, ev, 0), 10u);
  EXPECT_EQ(d.HostReplicas("a"), 10u);
  EXPECT_EQ(d.counters().replicas_dropped_with_host, 10u);
}

TEST(DirectoryTest, DropHostRemovesOnlyThatHostsReplicas) {
  Directory d({});
  for (const char* h : {"a", "b", "c"}) d.SetHostIncarnation(h, 1);
  std::vector<BlockEvent> ev;
  for (int i = 0; i < 100; ++i) ev.push_back(Ev(BlockEventKind::kCommitted, i, Tier::kHost));
  d.Apply("a", 1, ev, 0);
  d.Apply("b", 1, std::span(ev).first(50), 0);
  d.Apply("c", 1, std::span(ev).subspan(90), 0);
  EXPECT_EQ(d.DropHost("a"), 100u);
  EXPECT_EQ(d.DropHost("a"), 0u);
  EXPECT_EQ(d.HostIncarnation("a"), 0u);
  EXPECT_EQ(d.size(), 60u);
  EXPECT_EQ(d.counters().replicas, 60u);
  EXPECT_EQ(d.counters().hosts, 2u);
  for (int i = 0; i < 100; ++i) {
    const DirectoryEntry e = One(d, i);
    std::set<std::string> hosts;
    for (const auto& r : e.replicas) hosts.insert(r.host_id);
    std::set<std::string> want;
    if (i < 50) want.insert("b");
    if (i >= 90) want.insert("c");
    EXPECT_EQ(hosts, want) << "key " << i;
  }
}

TEST(DirectoryTest, FullDirectoryDropsTheLeastRecentlyAccessedEntry) {
  Directory d({.max_entries = 4});
  d.SetHostIncarnation("a", 1);
  for (int i = 0; i < 4; ++i) {
    std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, i, Tier::kHost)};
    d.Apply("a", 1, ev, 100 + i);
  }
  // Key 0 is the oldest, but a lookup makes it the most recent; key 1 is now the oldest.
  const BlockKey k0 = Key(0);
  const auto found = d.Lookup("t", {&k0, 1}, /*touch=*/true, 200);
  EXPECT_EQ(found[0].hit_count, 1u);
  EXPECT_EQ(found[0].last_access_us, 200u);
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, 4, Tier::kHost)};
  d.Apply("a", 1, ev, 300);
  EXPECT_EQ(d.size(), 4u);
  EXPECT_TRUE(One(d, 1).replicas.empty());
  for (int i : {0, 2, 3, 4}) EXPECT_EQ(One(d, i).replicas.size(), 1u) << i;
  EXPECT_EQ(d.counters().entries_evicted, 1u);
  EXPECT_EQ(d.HostReplicas("a"), 4u);
  // Next to go: 2, then 3.
  ev = {Ev(BlockEventKind::kCommitted, 5, Tier::kHost),
        Ev(BlockEventKind::kCommitted, 6, Tier::kHost)};
  d.Apply("a", 1, ev, 400);
  EXPECT_TRUE(One(d, 2).replicas.empty());
  EXPECT_TRUE(One(d, 3).replicas.empty());
  EXPECT_EQ(One(d, 0).replicas.size(), 1u);
  EXPECT_EQ(d.counters().entries_evicted, 3u);
}

TEST(DirectoryTest, RefusesAndCountsReplicasBeyondTheLimit) {
  Directory d({.max_replicas = 2});
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, 1, Tier::kHost)};
  for (const char* h : {"a", "b", "c"}) {
    d.SetHostIncarnation(h, 1);
    d.Apply(h, 1, ev, 0);
  }
  EXPECT_EQ(One(d, 1).replicas.size(), 2u);
  EXPECT_EQ(d.counters().replicas_refused, 1u);
  EXPECT_EQ(d.HostReplicas("c"), 0u);
  // A slot frees up: c's next report gets in.
  d.DropHost("a");
  d.Apply("c", 1, ev, 0);
  EXPECT_EQ(One(d, 1).replicas.size(), 2u);
  EXPECT_EQ(d.HostReplicas("c"), 1u);
}

TEST(DirectoryTest, ReportStaleRemovesTheNamedReplicaAndCountsIt) {
  Directory d({});
  d.SetHostIncarnation("a", 1);
  d.SetHostIncarnation("b", 1);
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, 1, Tier::kHost)};
  d.Apply("a", 1, ev, 0);
  d.Apply("b", 1, ev, 0);
  EXPECT_TRUE(d.ReportStale("t", Key(1), "a"));
  EXPECT_FALSE(d.ReportStale("t", Key(1), "a"));
  EXPECT_FALSE(d.ReportStale("other", Key(1), "b"));
  EXPECT_FALSE(d.ReportStale("t", Key(2), "b"));
  ASSERT_EQ(One(d, 1).replicas.size(), 1u);
  EXPECT_EQ(One(d, 1).replicas[0].host_id, "b");
  EXPECT_EQ(d.counters().stale_replicas_removed, 1u);
  EXPECT_EQ(d.counters().stale_reports_unmatched, 3u);
}

TEST(DirectoryTest, NamespacesAreSeparate) {
  Directory d({});
  d.SetHostIncarnation("a", 1);
  std::vector<BlockEvent> ev = {Ev(BlockEventKind::kCommitted, 1, Tier::kHost, "x")};
  d.Apply("a", 1, ev, 0);
  EXPECT_EQ(One(d, 1, "x").replicas.size(), 1u);
  EXPECT_TRUE(One(d, 1, "y").replicas.empty());
  EXPECT_TRUE(One(d, 1, "").replicas.empty());
  EXPECT_TRUE(d.Get("", Key(1)).replicas.empty());
  EXPECT_EQ(d.Get("x", Key(1)).replicas.size(), 1u);
}

TEST(DirectoryTest, SnapshotDropsWhatItDidNotMention) {
  Directory d({});
  d.SetHostIncarnation("a", 1);
  d.SetHostIncarnation("b", 1);
  std::vector<BlockEvent> ev;
  for (int i = 0; i < 6; ++i) ev.push_back(Ev(BlockEventKind::kCommitted, i, Tier::kHost));
  d.Apply("a", 1, ev, 0);
  d.Apply("b", 1, ev, 0);
  d.BeginSnapshot("a");
  // Snapshot chunks: keys 0, 2 on host; 4 on NVMe; 7 new.
  std::vector<BlockEvent> chunk1 = {Ev(BlockEventKind::kPresent, 0, Tier::kHost),
                                    Ev(BlockEventKind::kPresent, 2, Tier::kHost)};
  std::vector<BlockEvent> chunk2 = {Ev(BlockEventKind::kPresent, 4, Tier::kNvme),
                                    Ev(BlockEventKind::kPresent, 7, Tier::kHost)};
  d.Apply("a", 1, chunk1, 0);
  d.Apply("a", 1, chunk2, 0);
  EXPECT_EQ(d.EndSnapshot("a"), 3u);  // 1, 3, 5
  EXPECT_EQ(d.EndSnapshot("a"), 0u);  // no snapshot in progress
  std::set<int> held;
  for (int i = 0; i < 8; ++i) {
    for (const auto& r : One(d, i).replicas) {
      if (r.host_id == "a") held.insert(i);
    }
  }
  EXPECT_EQ(held, (std::set<int>{0, 2, 4, 7}));
  EXPECT_EQ(d.HostReplicas("a"), 4u);
  EXPECT_EQ(d.HostReplicas("b"), 6u);
  EXPECT_EQ(d.counters().replicas_dropped_by_snapshot, 3u);
  // Key 4 was on host and the snapshot reports it on NVMe only: the snapshot's tiers win.
  EXPECT_TRUE(One(d, 4).replicas[0].on_nvme);
  EXPECT_FALSE(One(d, 4).replicas[0].on_host);
  // Outside a snapshot PRESENT adds a tier.
  std::vector<BlockEvent> more = {Ev(BlockEventKind::kPresent, 4, Tier::kHost)};
  d.Apply("a", 1, more, 0);
  EXPECT_TRUE(One(d, 4).replicas[0].on_nvme);
  EXPECT_TRUE(One(d, 4).replicas[0].on_host);
}

// Random operations against a plain model (replicas in insertion order, an access tick per entry
// for LRU): the reverse index, the LRU links and the counters must agree with it throughout.
void RunRandomOperations(std::uint64_t seed, std::size_t max_entries) {
  std::mt19937_64 rng(seed);
  constexpr int kKeys = 64;
  constexpr int kSteps = 20000;
  const std::vector<std::string> hosts = {"h0", "h1", "h2", "h3"};
  const std::vector<std::string> spaces = {"", "t1"};
  Directory d({.max_entries = max_entries, .max_replicas = 3});
  using Reps = std::vector<std::pair<std::string, int>>;  // host, tiers (1 host, 2 nvme)
  struct ModelEntry {
    Reps reps;
    std::uint64_t tick = 0;
  };
  std::map<std::pair<std::string, int>, ModelEntry> model;
  std::uint64_t tick = 0;
  std::uint64_t evicted = 0;
  std::map<std::string, std::uint64_t> inc;
  for (const auto& h : hosts) {
    inc[h] = 1;
    d.SetHostIncarnation(h, 1);
  }
  const auto drop_host = [&](const std::string& h) {
    for (auto it = model.begin(); it != model.end();) {
      std::erase_if(it->second.reps, [&](const auto& r) { return r.first == h; });
      it = it->second.reps.empty() ? model.erase(it) : std::next(it);
    }
  };
  // An upsert of (ns, key) by h with tiers `bits` (replace or add).
  const auto upsert = [&](const std::string& ns, int key, const std::string& h, int bits,
                          bool replace) {
    auto it = model.find({ns, key});
    if (it == model.end()) {
      if (model.size() >= max_entries) {
        auto victim = std::min_element(
            model.begin(), model.end(),
            [](const auto& a, const auto& b) { return a.second.tick < b.second.tick; });
        model.erase(victim);
        ++evicted;
      }
      it = model.emplace(std::make_pair(ns, key), ModelEntry{{}, ++tick}).first;
    }
    Reps& reps = it->second.reps;
    auto mine = std::find_if(reps.begin(), reps.end(), [&](const auto& r) { return r.first == h; });
    if (mine != reps.end()) {
      mine->second = replace ? bits : (mine->second | bits);
    } else if (reps.size() < 3) {
      reps.push_back({h, bits});
      it->second.tick = ++tick;
    }
  };
  const auto remove = [&](const std::string& ns, int key, const std::string& h, int bits) {
    auto it = model.find({ns, key});
    if (it == model.end()) return;
    Reps& reps = it->second.reps;
    auto mine = std::find_if(reps.begin(), reps.end(), [&](const auto& r) { return r.first == h; });
    if (mine == reps.end()) return;
    mine->second &= ~bits;
    if (mine->second == 0) reps.erase(mine);
    if (reps.empty()) model.erase(it);
  };
  for (int step = 0; step < kSteps; ++step) {
    const std::string& h = hosts[rng() % hosts.size()];
    const std::string& ns = spaces[rng() % spaces.size()];
    const int key = static_cast<int>(rng() % kKeys);
    const int op = static_cast<int>(rng() % 100);
    const Tier tier = rng() % 2 ? Tier::kHost : Tier::kNvme;
    const int bit = tier == Tier::kHost ? 1 : 2;
    std::vector<BlockEvent> ev;
    if (op < 40) {
      ev = {Ev(BlockEventKind::kCommitted, key, tier, ns)};
      upsert(ns, key, h, bit, false);
    } else if (op < 50) {
      ev = {Ev(BlockEventKind::kDemoted, key, Tier::kNvme, ns)};
      upsert(ns, key, h, 2, true);
    } else if (op < 65) {
      ev = {Ev(BlockEventKind::kEvicted, key, tier, ns)};
      remove(ns, key, h, bit);
    } else if (op < 72) {
      ev = {Ev(BlockEventKind::kDeleted, key, tier, ns)};
      remove(ns, key, h, 3);
    } else if (op < 78) {
      d.ReportStale(ns, Key(key), h);
      remove(ns, key, h, 3);
    } else if (op < 92) {
      const BlockKey k = Key(key);
      d.Lookup(ns, {&k, 1}, /*touch=*/true, step);
      auto it = model.find({ns, key});
      if (it != model.end()) it->second.tick = ++tick;
    } else if (op < 96) {
      d.SetHostIncarnation(h, ++inc[h]);
      drop_host(h);
    } else {
      d.DropHost(h);
      drop_host(h);
      d.SetHostIncarnation(h, inc[h]);
    }
    if (!ev.empty()) d.Apply(h, inc[h], ev, step);

    if (step % 97 != 0 && step != kSteps - 1) continue;
    std::uint64_t replicas = 0;
    std::map<std::string, std::size_t> per_host;
    for (const auto& [k, e] : model) {
      replicas += e.reps.size();
      for (const auto& x : e.reps) ++per_host[x.first];
    }
    ASSERT_EQ(d.size(), model.size()) << "step " << step;
    ASSERT_LE(d.size(), max_entries);
    ASSERT_EQ(d.counters().replicas, replicas) << "step " << step;
    ASSERT_EQ(d.counters().entries_evicted, evicted) << "step " << step;
    for (const auto& host : hosts) {
      ASSERT_EQ(d.HostReplicas(host), per_host[host]) << host << " step " << step;
    }
    for (const auto& sp : spaces) {
      for (int k = 0; k < kKeys; ++k) {
        Reps got;
        for (const auto& r : d.Get(sp, Key(k)).replicas) {
          got.push_back({r.host_id, (r.on_host ? 1 : 0) | (r.on_nvme ? 2 : 0)});
          EXPECT_EQ(r.incarnation, inc[r.host_id]);
        }
        auto it = model.find({sp, k});
        const Reps want = it == model.end() ? Reps{} : it->second.reps;
        ASSERT_EQ(got, want) << "ns '" << sp << "' key " << k << " step " << step;
      }
    }
  }
  if (max_entries < 2 * kKeys) {
    EXPECT_GT(evicted, 0u);  // the bound was exercised
  }
}

TEST(DirectoryTest, RandomOperationsMatchAReferenceModel) {
  RunRandomOperations(TestSeed("DirectoryTest.RandomOperationsMatchAReferenceModel"), 1u << 20);
}

TEST(DirectoryTest, RandomOperationsAtCapacityMatchAReferenceModel) {
  RunRandomOperations(TestSeed("DirectoryTest.RandomOperationsAtCapacityMatchAReferenceModel"), 20);
}

}  // namespace
}  // namespace kvfabric::placement
