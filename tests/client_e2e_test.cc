// End to end through the client library: a real kvfabric-placement and two
// real kvfabric-cached processes on loopback, this test process as the
// engine.
//
//   1. A 16K-token history is "prefilled" (recomputed: nothing is cached),
//      saved layer by layer and written back to the daemons placement picks;
//      the context is finished (the client forgets it).
//   2. The same chain is matched again: placement plans fetches; the history
//      is loaded through a 4-page device arena (2 staging + 2 pool pages) and
//      attended; every byte equals the generator's and every output and LSE
//      equals the resident reference bit for bit.
//      Placement learned the load in its fetch model's terms: each daemon's
//      stream and, the load having used both, the client's ingest.
//   3. One daemon is SIGKILLed (placement still lists it: its membership TTL
//      is long); the same request completes: the dead daemon's blocks are
//      recomputed, the fallback is counted, and the result is still exact.
//
// The fixture is tests/client_e2e_fixture.h; the cases over NVMe tiers and a
// straggling stream are in client_e2e_tiers_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "tests/client_e2e_fixture.h"

// Every allocation through operator new is counted while g_counting is set:
// how many, and how many of at least kLargeAllocation bytes (the size at
// which glibc maps fresh pages, so the request would fault memory in); and,
// separately, those of the thread that set t_count_mine.
namespace {
constexpr std::size_t kLargeAllocation = std::size_t{64} << 10;
std::atomic<bool> g_counting{false};
thread_local bool t_count_mine = false;
thread_local std::uint64_t t_mine = 0;
std::atomic<std::uint64_t> g_allocations{0};
std::atomic<std::uint64_t> g_large_allocations{0};
std::atomic<std::uint64_t> g_largest_allocation{0};

void Count(std::size_t n) {
  if (t_count_mine) ++t_mine;
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n >= kLargeAllocation) g_large_allocations.fetch_add(1, std::memory_order_relaxed);
  std::uint64_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
  }
}
void* Allocate(std::size_t n) {
  Count(n);
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* AllocateAligned(std::size_t n, std::align_val_t a) {
  Count(n);
  const auto align = static_cast<std::size_t>(a);
  void* p = std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

// Every form, nothrow ones included (gRPC uses them): whatever one allocates
// the matching delete below frees, under ASan too.
void* operator new(std::size_t n) { return Allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  Count(n);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  Count(n);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  Count(n);
  const auto align = static_cast<std::size_t>(a);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  Count(n);
  const auto align = static_cast<std::size_t>(a);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void* operator new[](std::size_t n) { return Allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace kvfabric {
namespace {

TEST_F(ClientEndToEndTest, SavedHistoryLoadsExactlyAndSurvivesADaemonThroughRecompute) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  std::printf("%s\n", client_->DescribeArena().c_str());

  // 1. Nothing cached: prefill, save every layer, write back.
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());

  // 2. Cached: fetched through the 4-page arena, exact.
  // (The plan may still recompute a few front blocks while it fetches: a split.)
  const ContextReport fetched = LoadAndCheck("cached");
  EXPECT_GT(fetched.blocks_fetched, chain_.size() / 2) << fetched.kind;
  // Layer by layer: layer 0 of every block is ready no later than the last
  // layer, and strictly before it when everything was fetched (layer 0's
  // requests all go before any later layer's).
  std::printf("cached: layer 0 ready after %.0f us, all layers after %.0f us, load %.0f us\n",
              fetched.layer0_ready_us, fetched.all_layers_ready_us, fetched.load_us);
  EXPECT_GE(fetched.layer0_ready_us, 0);
  EXPECT_LE(fetched.layer0_ready_us, fetched.all_layers_ready_us);
  if (fetched.blocks_recomputed == 0) {
    EXPECT_LT(fetched.layer0_ready_us, fetched.all_layers_ready_us);
  }
  EXPECT_EQ(fetched.blocks_fetched + fetched.blocks_recomputed, chain_.size());
  EXPECT_EQ(fetched.blocks_recomputed, PlannedRecompute(fetched));
  EXPECT_EQ(client_->metrics().blocks_fallen_back, 0u);
  EXPECT_LE(client_->metrics().peak_arena_pages, 4u);
  // Over UCX shared memory the daemons checked every block where it landed
  // (daemon_checks_landing), and the bytes are exact (LoadAndCheck).
  EXPECT_GT(client_->metrics().bytes_fetched, 0u);
  EXPECT_EQ(client_->metrics().bytes_checked_by_daemon, client_->metrics().bytes_fetched);

  // What the load taught placement, in its FETCH MODEL's terms: each daemon's
  // stream was observed (its own path's error is scored).
  // A split's streams moved beside its prefill and are left out
  // (beside_prefill): nothing was scored from them.
  {
    std::set<std::string> sources;
    for (const client::RunOutcome& run : fetched.runs) {
      if (run.fetch) sources.insert(run.host_id);
    }
    const bool beside_prefill = fetched.kind == "split";
    const std::string text = ExplainFreshPlan();
    for (const std::string& host : sources) {
      // A daemon on the client's node is priced as memcpy until its own path is learned.
      std::string l = InputLine(text, "remote→local " + host + ":");
      if (l.empty()) l = InputLine(text, "memcpy " + host + ":");
      EXPECT_NE(l.find(beside_prefill ? "not scored yet" : "out-of-sample error"),
                std::string::npos)
          << fetched.kind << ": " << l << "\n"
          << text;
    }
    const std::string ingest = InputLine(text, "daemons→client:");
    ASSERT_FALSE(ingest.empty()) << text;
    std::printf("%s fetched from %zu daemons; placement: %s\n", fetched.kind.c_str(),
                sources.size(), ingest.c_str());
    // (The ingest is observed only when the streams ended within 2x of each
    // other, which a busy test machine does not promise: not asserted.)
    if (sources.size() >= 2 && beside_prefill) {
      EXPECT_NE(ingest.find("not scored yet"), std::string::npos) << ingest;
    }
  }

  // 3. One daemon dies; placement still plans with it.
  daemons_[1]->Kill(SIGKILL);
  const ContextReport after = LoadAndCheck("after kill");
  const client::ClientMetrics m = client_->metrics();
  std::printf("after kill: fetched %u, recomputed %u; fallbacks to recompute %llu (%llu blocks)\n",
              after.blocks_fetched, after.blocks_recomputed,
              static_cast<unsigned long long>(m.fallbacks_to_recompute),
              static_cast<unsigned long long>(m.blocks_fallen_back));
  EXPECT_GT(after.blocks_fetched, 0u);
  EXPECT_GT(after.blocks_recomputed, 0u);
  EXPECT_EQ(after.blocks_fetched + after.blocks_recomputed, chain_.size());
  EXPECT_GE(m.fallbacks_to_recompute, 1u);
  EXPECT_GT(m.blocks_fallen_back, 0u);
  EXPECT_EQ(m.blocks_fallen_back, after.blocks_recomputed - PlannedRecompute(after));
  EXPECT_EQ(m.crc_failures, 0u);
  // Three contexts in one pool (the byte-for-byte checks above ran on reused
  // pages); every page is back after Finish.
  EXPECT_EQ(m.history_pool_pages, (40u << 20) / *model_.BlockBytes());
  EXPECT_EQ(m.history_pages_in_use, 0u);
  EXPECT_EQ(m.peak_history_pages_in_use, chain_.size());
}

// daemon_checks_landing = false: the client reads every landed byte for its
// CRC itself, and the daemons are not asked to.
TEST_F(ClientEndToEndTest, WithoutTheDaemonsCheckTheClientChecksEveryLanding) {
  daemon_checks_landing_ = false;
  client_.reset();
  ASSERT_NO_FATAL_FAILURE(OpenClient());
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  const ContextReport fetched = LoadAndCheck("cached, checked by the client");
  EXPECT_GT(fetched.blocks_fetched, chain_.size() / 2) << fetched.kind;
  const client::ClientMetrics m = client_->metrics();
  EXPECT_GT(m.bytes_fetched, 0u);
  EXPECT_EQ(m.bytes_checked_by_daemon, 0u);
  EXPECT_EQ(m.crc_failures, 0u);
}

// Regression: Save counted calls per block, not layers, so saving layer 0
// layer_count times shipped blocks whose other layers were never written.
// After warm-up (one prefill and one fetched request of the same size), a
// request of 16K tokens (32 MiB of history) allocates nothing of 64 KiB or
// more anywhere in this process (the engine thread, the loaders, the saver,
// gRPC's and UCX's threads), and Attend allocates nothing on the engine's
// thread (the CPU device's own allocations are streaming_attention_test's).
// Before the history pool every context allocated its whole history, and
// before contexts were recycled its bookkeeping (68 KiB of run outcomes here).
// Small allocations remain (gRPC and protobuf per call, the loader threads):
// counted and printed, not yet zero.
TEST_F(ClientEndToEndTest, AfterWarmUpARequestAllocatesNoLargeBlockAndAttendNothing) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  ASSERT_TRUE(Serve(chain_).ok());  // warm: fetched, the sessions and buffers exist

  // The engine's report: Finish copies the context's into it, so one the
  // engine keeps (or reserves, as here: a run per block at most) receives it
  // without allocating. Likewise its MatchResult (below).
  ContextReport report;
  report.runs.reserve(chain_.size());
  g_allocations = 0;
  g_large_allocations = 0;
  g_largest_allocation = 0;
  // The engine's plan slot, warmed by one Match (Match fills it in place).
  client::MatchResult match;
  ASSERT_TRUE(client_->Match(chain_, 0, false, &match).ok());
  g_counting = true;
  Status matched = client_->Match(chain_, 0, false, &match);
  ASSERT_TRUE(matched.ok()) << matched.ToString();
  auto ctx = client_->NewContext(kTokens);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  ASSERT_TRUE(client_->Load(match, *ctx).ok());
  for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
    ASSERT_TRUE(client_->WaitLayer(*ctx, l).ok());
  }
  std::vector<float> q(kQHeads * model_.head_dim, 0.25f), out(q.size()), lse(kQHeads);
  t_mine = 0;
  t_count_mine = true;
  for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
    ASSERT_TRUE(client_->Attend(*ctx, l, 1, q, out, lse).ok());
  }
  t_count_mine = false;
  const std::uint64_t attend_allocations = t_mine;
  for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
    ASSERT_TRUE(client_->Save(*ctx, l, 0, chain_).ok());
  }
  EXPECT_TRUE(client_->Finish(*ctx, &report).ok());
  g_counting = false;
  std::printf(
      "warm request of %u tokens: %llu allocations (%llu of >= 64 KiB, largest %llu "
      "bytes); %llu in %u Attend calls; %u blocks fetched, %u recomputed\n",
      kTokens, static_cast<unsigned long long>(g_allocations.load()),
      static_cast<unsigned long long>(g_large_allocations.load()),
      static_cast<unsigned long long>(g_largest_allocation.load()),
      static_cast<unsigned long long>(attend_allocations), model_.layer_count,
      report.blocks_fetched, report.blocks_recomputed);
  EXPECT_EQ(g_large_allocations.load(), 0u) << "largest " << g_largest_allocation.load();
  EXPECT_EQ(attend_allocations, 0u);
  EXPECT_EQ(report.blocks_fetched + report.blocks_recomputed, chain_.size());
  EXPECT_GT(report.blocks_fetched, 0u);
}

TEST_F(ClientEndToEndTest, ALayerSavedTwiceIsRefusedAndAnIncompleteBlockIsNeverWrittenBack) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  auto match = client_->Match(chain_, 0);
  ASSERT_TRUE(match.ok()) << match.status().ToString();
  auto ctx = client_->NewContext(kTokens);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  ASSERT_TRUE(client_->Load(*match, *ctx).ok());
  for (std::uint32_t l = 0; l < model_.layer_count; ++l)
    ASSERT_TRUE(client_->WaitLayer(*ctx, l).ok());
  ASSERT_TRUE(client_->Save(*ctx, 0, 0, chain_).ok());
  for (std::uint32_t i = 1; i < model_.layer_count; ++i) {
    Status again = client_->Save(*ctx, 0, 0, chain_);
    EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
    EXPECT_NE(again.message().find("layer 0 of block 0"), std::string_view::npos)
        << again.ToString();
  }
  // Layers 1.. of the second half only: those blocks stay incomplete too.
  const std::span<const BlockKey> half =
      std::span<const BlockKey>(chain_).subspan(chain_.size() / 2);
  for (std::uint32_t l = 1; l < model_.layer_count; ++l) {
    ASSERT_TRUE(client_->Save(*ctx, l, static_cast<std::uint32_t>(chain_.size() / 2), half).ok());
  }
  // A refused call recorded nothing: layer 1 of block 0 can still be saved.
  EXPECT_TRUE(client_->Save(*ctx, 1, 0, std::span<const BlockKey>(chain_).first(1)).ok());
  ContextReport report;
  ASSERT_TRUE(client_->Finish(*ctx, &report).ok());
  EXPECT_EQ(report.blocks_written, chain_.size() / 2);  // the complete second half only
  EXPECT_EQ(report.save_failures, 0u);
  auto again = client_->Match(chain_, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cached_prefix_blocks, 0u) << "block 0 was written back without its layers";
}

// Regression: Finish returned OK after a failed load and after failed
// write-backs, and counted blocks placement already held as saved.
TEST_F(ClientEndToEndTest, FinishReturnsAFailedLoadAndFailedWriteBacksAndSeparatesCachedBlocks) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  // A load whose prefill fails: Finish says so.
  fail_prefill_ = true;
  {
    auto match = client_->Match(chain_, 0);
    ASSERT_TRUE(match.ok());
    auto ctx = client_->NewContext(kTokens);
    ASSERT_TRUE(ctx.ok());
    ASSERT_TRUE(client_->Load(*match, *ctx).ok());
    EXPECT_FALSE(client_->WaitLayer(*ctx, 0).ok());
    auto finished = client_->Finish(*ctx);
    ASSERT_FALSE(finished.ok());
    EXPECT_NE(finished.status().message().find("load failed"), std::string_view::npos)
        << finished.status().ToString();
  }
  fail_prefill_ = false;
  // Saved once, then saved again: the second time every block is already cached.
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  {
    auto match = client_->Match(chain_, 0);
    ASSERT_TRUE(match.ok());
    auto ctx = client_->NewContext(kTokens);
    ASSERT_TRUE(ctx.ok());
    ASSERT_TRUE(client_->Load(*match, *ctx).ok());
    for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
      ASSERT_TRUE(client_->WaitLayer(*ctx, l).ok());
      ASSERT_TRUE(client_->Save(*ctx, l, 0, chain_).ok());
    }
    ContextReport report;
    ASSERT_TRUE(client_->Finish(*ctx, &report).ok());
    EXPECT_EQ(report.blocks_written, 0u);
    EXPECT_EQ(report.blocks_already_cached, chain_.size());
  }
  // Both daemons die (placement keeps listing them): every write-back fails,
  // and Finish says how many.
  daemons_[0]->Kill(SIGKILL);
  daemons_[1]->Kill(SIGKILL);
  const std::vector<BlockKey> fresh = ChainOf(7, 2048);
  ContextReport report;
  {
    auto match = client_->Match(fresh, 0);
    ASSERT_TRUE(match.ok());
    auto ctx = client_->NewContext(2048);
    ASSERT_TRUE(ctx.ok());
    {
      std::lock_guard<std::mutex> l(chains_mu_);
      chain_of_context_[*ctx] = fresh;
    }
    ASSERT_TRUE(client_->Load(*match, *ctx).ok());
    for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
      ASSERT_TRUE(client_->WaitLayer(*ctx, l).ok());
      ASSERT_TRUE(client_->Save(*ctx, l, 0, fresh).ok());
    }
    Status s = client_->Finish(*ctx, &report);
    ASSERT_FALSE(s.ok()) << "Finish returned OK after failed write-backs";
    EXPECT_NE(s.message().find(std::to_string(fresh.size()) + " of " +
                               std::to_string(fresh.size()) + " blocks were not written back"),
              std::string_view::npos)
        << s.ToString();
  }
  EXPECT_EQ(report.save_failures, fresh.size());
  EXPECT_EQ(report.blocks_written, 0u);
}

// Regression: daemon handles were raw pointers into a map that the loader
// and saver erased from while other threads used them (and connecting held
// the map's lock). Eight engine threads serve requests (load, check, save,
// finish) through both daemons; one daemon is killed under them. Every byte
// any load returns is right, and no thread touches freed memory (run under
// ASan and TSan in CI).
TEST_F(ClientEndToEndTest, EightContextsLoadAndSaveConcurrentlyWhileADaemonDies) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 4;
  constexpr std::uint32_t kContextTokens = 1024;  // 64 blocks of 32 KiB each
  // An arena that admits every thread's context (a floor of 2 pages each).
  client_.reset();
  pool_pages_ = 2 * kThreads;
  ASSERT_NO_FATAL_FAILURE(OpenClient());
  std::vector<std::vector<BlockKey>> chains;
  for (int t = 0; t < kThreads * kRounds; ++t) chains.push_back(ChainOf(100 + t, kContextTokens));
  // Each round serves a new chain and then the previous round's (cached) one;
  // one daemon is killed once half the threads have written back a chain.
  const testing::ServedCounts n = testing::RunEngineThreads(
      kThreads, kRounds,
      [&](int t, int r) {
        std::vector<Status> got;
        for (int which : {t * kRounds + r, t * kRounds + std::max(0, r - 1)}) {
          got.push_back(Serve(chains[which]));
        }
        return got;
      },
      [&] { daemons_[0]->Kill(SIGKILL); });
  const client::ClientMetrics m = client_->metrics();
  std::printf(
      "served %d requests OK, %d reported a failure (write-backs to the dead daemon); "
      "fallbacks to recompute %llu, blocks fallen back %llu, save failures %llu\n",
      n.ok, n.failed, static_cast<unsigned long long>(m.fallbacks_to_recompute),
      static_cast<unsigned long long>(m.blocks_fallen_back),
      static_cast<unsigned long long>(m.save_failures));
  EXPECT_FALSE(wrong_bytes_) << "a load returned wrong bytes";
  EXPECT_EQ(m.crc_failures, 0u);
  EXPECT_GT(n.ok, 0);
  EXPECT_EQ(n.ok + n.failed, kThreads * kRounds * 2);
}
}  // namespace
}  // namespace kvfabric
