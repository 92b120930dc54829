// NvmeTier on FaultInjectionEnv with the thread-pool engine: group commit,
// reads that verify, removal, and RocksDB-style crash tests (write acknowledged
// and unacknowledged blocks, crash, reopen, check).
#include "server/cache_host/nvme_tier.h"

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/crc32c.h"
#include "core/testing/fault_injection_env.h"
#include "core/testing/test_seed.h"
#include "gtest/gtest.h"
#include "server/cache_host/segment_format.h"

namespace kvfabric::cache_host {
namespace {

// One block as a test keeps it: header (sealed) and payload.
struct TestBlock {
  BlockHeader header;
  std::vector<std::byte> payload;
};

// An exact fp16 block of `layers` layers x 16 tokens x 1 head x 8 dims
// (512 bytes per layer), with random key and bytes.
TestBlock MakeBlock(std::mt19937_64& rng, uint32_t layers) {
  TestBlock b;
  b.header.dtype = KvDtype::kFp16;
  b.header.layers = layers;
  b.header.tokens = 16;
  b.header.kv_heads = 1;
  b.header.head_dim = 8;
  for (auto& k : b.header.key) k = static_cast<uint8_t>(rng());
  for (auto& f : b.header.fingerprint) f = 7;
  b.payload.resize(size_t{512} * layers);
  for (auto& x : b.payload) x = static_cast<std::byte>(rng());
  EXPECT_TRUE(SealBlock(&b.header, b.payload).ok());
  return b;
}

// Forwards to a base Env; while `fail_syncs` is set, Sync() on files fails
// without reaching the base (so writes stay unsynced there).
class SyncFailingEnv final : public EnvWrapper {
 public:
  explicit SyncFailingEnv(Env* base) : EnvWrapper(base) {}
  std::atomic<bool> fail_syncs{false};

  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file,
                         target()->NewRandomRWFile(path, options));
    return std::unique_ptr<RandomRWFile>(std::make_unique<File>(this, std::move(file)));
  }

 private:
  class File final : public RandomRWFile {
   public:
    File(SyncFailingEnv* env, std::unique_ptr<RandomRWFile> f) : env_(env), f_(std::move(f)) {}
    StatusOr<size_t> Read(uint64_t o, std::span<std::byte> d) override { return f_->Read(o, d); }
    Status Write(uint64_t o, std::span<const std::byte> s) override { return f_->Write(o, s); }
    Status Sync() override {
      if (env_->fail_syncs) return Status::Unavailable("test: sync refused");
      return f_->Sync();
    }
    StatusOr<uint64_t> Size() override { return f_->Size(); }
    Status Truncate(uint64_t s) override { return f_->Truncate(s); }
    Status Close() override { return f_->Close(); }

   private:
    SyncFailingEnv* env_;
    std::unique_ptr<RandomRWFile> f_;
  };
};

class NvmeTierTest : public ::testing::Test {
 protected:
  NvmeTierTest() {
    std::string tmpl = ::testing::TempDir() + "kvf_nvme_tier_test_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl + "/tier";
  }
  ~NvmeTierTest() override {
    tier_.reset();
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(dir_).parent_path(), ec);
  }

  NvmeTierOptions Options() {
    NvmeTierOptions o;
    o.dir = dir_;
    o.env = &sync_env_;
    o.io_engine = IoEngineKind::kThreads;
    o.capacity_bytes = uint64_t{64} << 20;
    o.segment_bytes = uint64_t{1} << 20;
    o.max_group_bytes = size_t{256} << 10;
    o.io_threads = 2;
    return o;
  }

  // Opens the tier (replacing any open one) and keeps the recovery result.
  void Reopen(const NvmeTierOptions& options) {
    tier_.reset();
    auto opened = NvmeTier::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    tier_ = std::move(opened->tier);
    recovered_ = std::move(opened->blocks);
    report_ = opened->report;
  }
  void Reopen() { Reopen(Options()); }

  // Simulates a crash: the process dies (filesystem inactive, objects torn
  // down), then the power fails (unsynced data dropped), then reboot.
  void Crash(bool drop_unsynced = true) {
    env_.SetFilesystemActive(false);
    tier_.reset();
    if (drop_unsynced) {
      ASSERT_TRUE(env_.DropUnsyncedData().ok());
    }
    env_.SetFilesystemActive(true);
  }

  // Reads `location` and checks it holds exactly `block`.
  void ExpectReadsBack(const NvmeLocation& location, const TestBlock& block) {
    auto buf = AlignedBuffer::Allocate(tier_->ReadBufferBytes(location), tier_->alignment());
    ASSERT_TRUE(buf.ok());
    auto header = tier_->Read(location, block.header.key, buf->span());
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(*header, block.header);
    ASSERT_EQ(
        std::memcmp(buf->data() + kBlockHeaderBytes, block.payload.data(), block.payload.size()),
        0);
  }

  Status ReadStatus(const NvmeLocation& location, const BlockDigest& key) {
    auto buf = AlignedBuffer::Allocate(tier_->ReadBufferBytes(location), tier_->alignment());
    EXPECT_TRUE(buf.ok());
    return tier_->Read(location, key, buf->span()).status();
  }

  std::string SegmentPath(uint64_t id) const { return dir_ + "/" + SegmentFileName(id); }

  FaultInjectionEnv env_{Env::Default()};
  SyncFailingEnv sync_env_{&env_};
  std::string dir_;
  std::unique_ptr<NvmeTier> tier_;
  std::vector<RecoveredBlock> recovered_;
  NvmeRecoveryReport report_;
};

TEST_F(NvmeTierTest, DemotedBlocksReadBackExactly) {
  std::mt19937_64 rng(1);
  Reopen();
  EXPECT_EQ(tier_->engine_name(), "threads");
  std::vector<TestBlock> blocks;
  std::vector<NvmeLocation> locations;
  for (uint32_t layers : {1u, 7u, 8u, 9u, 40u}) {
    blocks.push_back(MakeBlock(rng, layers));
    auto loc = tier_->DemoteAndWait(blocks.back().header, blocks.back().payload);
    ASSERT_TRUE(loc.ok()) << loc.status();
    EXPECT_EQ(loc->offset % tier_->alignment(), 0u);
    // Format version 2: header, payload, one CRC per layer.
    EXPECT_EQ(loc->bytes, kBlockHeaderBytes + blocks.back().payload.size() + 4 * layers);
    locations.push_back(*loc);
  }
  for (size_t i = 0; i < blocks.size(); ++i) ExpectReadsBack(locations[i], blocks[i]);
  const NvmeTierStats stats = tier_->stats();
  EXPECT_EQ(stats.demotions_ok, 5u);
  EXPECT_EQ(stats.live_blocks, 5u);
  EXPECT_EQ(stats.reads_ok, 5u);
  EXPECT_EQ(stats.crc_failures, 0u);
}

TEST_F(NvmeTierTest, ConcurrentDemotionsShareGroupsAndOneSyncPerSegment) {
  std::mt19937_64 rng(2);
  Reopen();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(MakeBlock(rng, 1 + i % 4));
  std::mutex mu;
  std::map<size_t, StatusOr<NvmeLocation>> outcomes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    tier_->Demote(blocks[i].header, blocks[i].payload, [&, i](StatusOr<NvmeLocation> r) {
      std::lock_guard<std::mutex> lock(mu);
      outcomes.emplace(i, std::move(r));
    });
  }
  ASSERT_TRUE(tier_->Close().ok());  // drains the queue
  ASSERT_EQ(outcomes.size(), blocks.size());
  for (auto& [i, r] : outcomes) {
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectReadsBack(*r, blocks[i]);
  }
  const NvmeTierStats stats = tier_->stats();
  // Every demotion is acknowledged only after a sync, and a group syncs each
  // segment it touched once: no more syncs than groups times segments.
  EXPECT_GE(stats.group_syncs, stats.groups);
  EXPECT_LE(stats.group_syncs, stats.groups * stats.segments_created);
  EXPECT_LT(stats.groups, blocks.size());  // queued demotions were batched
}

TEST_F(NvmeTierTest, AcknowledgedBlocksSurviveCrashAndNothingReadsBackCorrupt) {
  const uint64_t seed =
      TestSeed("NvmeTierTest.AcknowledgedBlocksSurviveCrashAndNothingReadsBackCorrupt");
  std::mt19937_64 rng(seed);
  std::map<BlockDigest, TestBlock> written;          // every block ever demoted
  std::map<BlockDigest, NvmeLocation> acknowledged;  // demotions that returned OK
  for (int round = 0; round < 4; ++round) {
    Reopen();
    // Everything acknowledged before is still there and intact.
    std::map<BlockDigest, NvmeLocation> found;
    for (const RecoveredBlock& b : recovered_) found[b.header.key] = b.location;
    for (const auto& [key, loc] : acknowledged) ASSERT_TRUE(found.count(key)) << "round " << round;
    for (const auto& [key, loc] : found) {
      ASSERT_TRUE(written.count(key));
      ExpectReadsBack(loc, written.at(key));
    }
    EXPECT_EQ(report_.dropped_corrupt, 0u);
    acknowledged = found;  // recovered unacknowledged blocks are legitimately there now

    // Acknowledged demotions.
    const int acked = 5 + static_cast<int>(rng() % 20);
    for (int i = 0; i < acked; ++i) {
      TestBlock b = MakeBlock(rng, 1 + rng() % 24);
      auto loc = tier_->DemoteAndWait(b.header, b.payload);
      ASSERT_TRUE(loc.ok()) << loc.status();
      acknowledged[b.header.key] = *loc;
      written[b.header.key] = std::move(b);
    }
    // Unacknowledged ones: written, never synced.
    sync_env_.fail_syncs = true;
    const int unacked = 1 + static_cast<int>(rng() % 10);
    for (int i = 0; i < unacked; ++i) {
      TestBlock b = MakeBlock(rng, 1 + rng() % 24);
      auto loc = tier_->DemoteAndWait(b.header, b.payload);
      EXPECT_FALSE(loc.ok());
      written[b.header.key] = std::move(b);
    }
    sync_env_.fail_syncs = false;
    Crash(/*drop_unsynced=*/rng() % 4 != 0);
  }
}

TEST_F(NvmeTierTest, TornTailIsDroppedAndCounted) {
  std::mt19937_64 rng(3);
  Reopen();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(MakeBlock(rng, 12));
    ASSERT_TRUE(tier_->DemoteAndWait(blocks.back().header, blocks.back().payload).ok());
  }
  Crash();
  // The tail a crash can leave: a unit of garbage, then a block whose header
  // made it to the disk and whose payload did not.
  const std::string path = SegmentPath(1);
  auto size = Env::Default()->GetFileSize(path);
  ASSERT_TRUE(size.ok());
  {
    FileOptions o;
    auto f = Env::Default()->NewRandomRWFile(path, o);
    ASSERT_TRUE(f.ok());
    std::vector<std::byte> garbage(4096);
    for (auto& x : garbage) x = static_cast<std::byte>(rng() | 1);
    ASSERT_TRUE((*f)->Write(*size, garbage).ok());
    TestBlock cut = MakeBlock(rng, 24);
    std::vector<std::byte> record(kBlockHeaderBytes + cut.payload.size() / 2);
    ASSERT_TRUE(EncodeBlockHeader(cut.header, std::span(record).first<kBlockHeaderBytes>()).ok());
    std::memcpy(record.data() + kBlockHeaderBytes, cut.payload.data(),
                record.size() - kBlockHeaderBytes);
    ASSERT_TRUE((*f)->Write(*size + 4096, record).ok());
  }
  Reopen();
  EXPECT_EQ(report_.recovered, 3u);
  EXPECT_EQ(report_.dropped_torn, 2u);
  EXPECT_EQ(report_.dropped_corrupt, 0u);
  for (size_t i = 0; i < 3; ++i) ExpectReadsBack(recovered_[i].location, blocks[i]);
}

TEST_F(NvmeTierTest, CorruptPayloadIsDataLossCountedRemovedAndNotRecovered) {
  std::mt19937_64 rng(4);
  Reopen();
  std::vector<TestBlock> blocks;
  std::vector<NvmeLocation> locs;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(MakeBlock(rng, 10));
    auto loc = tier_->DemoteAndWait(blocks.back().header, blocks.back().payload);
    ASSERT_TRUE(loc.ok());
    locs.push_back(*loc);
  }
  ASSERT_TRUE(
      env_.CorruptBytes(SegmentPath(1), locs[1].offset + kBlockHeaderBytes + 1000, 1, 9).ok());
  Status s = ReadStatus(locs[1], blocks[1].header.key);
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("removed"), std::string_view::npos) << s;
  EXPECT_EQ(tier_->stats().crc_failures, 1u);
  EXPECT_EQ(tier_->stats().removes, 1u);
  EXPECT_EQ(tier_->stats().live_blocks, 2u);
  EXPECT_TRUE(ReadStatus(locs[1], blocks[1].header.key).IsNotFound());
  ExpectReadsBack(locs[0], blocks[0]);
  ExpectReadsBack(locs[2], blocks[2]);

  Crash();
  Reopen();
  EXPECT_EQ(report_.recovered, 2u);
  EXPECT_EQ(report_.tombstones, 1u);
  for (const RecoveredBlock& b : recovered_) EXPECT_NE(b.header.key, blocks[1].header.key);
}

// Blocks written in format version 1 (no layer CRC table) by an older daemon
// are recovered and read beside version 2 ones, and both give their layer
// CRCs; a flipped bit in a version 2 layer table is DataLoss naming the layer.
TEST_F(NvmeTierTest, VersionOneAndTwoRecordsRecoverAndGiveTheirLayerCrcs) {
  std::mt19937_64 rng(11);
  Reopen();
  std::vector<TestBlock> blocks;
  std::vector<NvmeLocation> locs;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(MakeBlock(rng, 5));
    if (i % 2 == 0) blocks.back().header.format_version = 1;
    auto loc = tier_->DemoteAndWait(blocks.back().header, blocks.back().payload);
    ASSERT_TRUE(loc.ok()) << loc.status();
    EXPECT_EQ(loc->bytes, BlockRecordBytes(blocks.back().header));
    locs.push_back(*loc);
  }
  EXPECT_EQ(locs[0].bytes + 20, locs[1].bytes);
  Crash();
  Reopen();
  ASSERT_EQ(report_.recovered, 4u);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    auto buf = AlignedBuffer::Allocate(tier_->ReadBufferBytes(locs[i]), tier_->alignment());
    ASSERT_TRUE(buf.ok());
    std::vector<std::uint32_t> crcs;
    auto header = tier_->Read(locs[i], blocks[i].header.key, buf->span(), &crcs);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->format_version, i % 2 == 0 ? 1 : 2);
    ASSERT_EQ(crcs.size(), 5u);
    for (std::uint32_t l = 0; l < 5; ++l) {
      EXPECT_EQ(
          crcs[l],
          crc32c::Value(
              std::span<const std::byte>(blocks[i].payload).subspan(std::size_t{l} * 512, 512)))
          << "block " << i << " layer " << l;
    }
  }
  // Layer 3's table entry of block 1 (version 2).
  ASSERT_TRUE(env_.CorruptBytes(SegmentPath(1),
                                locs[1].offset + kBlockHeaderBytes + 5 * 512 + 3 * 4 + 1, 1, 9)
                  .ok());
  const Status s = ReadStatus(locs[1], blocks[1].header.key);
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("layer 3 CRC mismatch"), std::string_view::npos) << s;
}

TEST_F(NvmeTierTest, RecoveryDropsCorruptBlocksItHasNotRead) {
  std::mt19937_64 rng(5);
  Reopen();
  std::vector<TestBlock> blocks;
  std::vector<NvmeLocation> locs;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(MakeBlock(rng, 10));
    auto loc = tier_->DemoteAndWait(blocks.back().header, blocks.back().payload);
    ASSERT_TRUE(loc.ok());
    locs.push_back(*loc);
  }
  // One payload byte of block 1, one header byte of block 2.
  ASSERT_TRUE(
      env_.CorruptBytes(SegmentPath(1), locs[1].offset + kBlockHeaderBytes + 77, 1, 1).ok());
  ASSERT_TRUE(env_.CorruptBytes(SegmentPath(1), locs[2].offset + 40, 1, 2).ok());
  Crash();
  Reopen();
  EXPECT_EQ(report_.recovered, 2u);
  EXPECT_EQ(report_.dropped_corrupt, 2u);
  ASSERT_EQ(recovered_.size(), 2u);
  EXPECT_EQ(recovered_[0].header.key, blocks[0].header.key);
  EXPECT_EQ(recovered_[1].header.key, blocks[3].header.key);
  ExpectReadsBack(recovered_[1].location, blocks[3]);
}

TEST_F(NvmeTierTest, InjectedWriteFailuresFailExactlyTheAffectedDemotions) {
  const uint64_t seed =
      TestSeed("NvmeTierTest.InjectedWriteFailuresFailExactlyTheAffectedDemotions");
  std::mt19937_64 rng(seed);
  Reopen();
  // Waves of 8 demotions, each waited for: the committer groups whatever is
  // queued, so one burst of 120 can become a single group write on a busy
  // machine, and then every demotion fails or none does. Waves give at least
  // one write each; they go on until both outcomes were seen (each write,
  // truncate and sync fails one time in four).
  constexpr size_t kWave = 8;
  constexpr size_t kMaxBlocks = 480;
  std::vector<TestBlock> blocks;
  env_.SetWriteFailureOneIn(4, seed);
  std::mutex mu;
  std::condition_variable cv;
  std::map<size_t, StatusOr<NvmeLocation>> outcomes;
  size_t failed = 0;
  std::map<BlockDigest, size_t> acked;
  while (blocks.size() < 120 || ((failed == 0 || acked.empty()) && blocks.size() < kMaxBlocks)) {
    const size_t first = blocks.size();
    for (size_t k = 0; k < kWave; ++k) blocks.push_back(MakeBlock(rng, 1 + rng() % 16));
    for (size_t i = first; i < blocks.size(); ++i) {
      tier_->Demote(blocks[i].header, blocks[i].payload, [&, i](StatusOr<NvmeLocation> r) {
        std::lock_guard<std::mutex> lock(mu);
        outcomes.emplace(i, std::move(r));
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                            [&] { return outcomes.size() == blocks.size(); }))
        << "demotions did not complete";
    for (size_t i = first; i < blocks.size(); ++i) {
      const StatusOr<NvmeLocation>& r = outcomes.at(i);
      if (r.ok()) {
        acked[blocks[i].header.key] = i;
      } else {
        ++failed;
        EXPECT_TRUE(r.status().IsUnavailable()) << r.status();
        EXPECT_NE(r.status().message().find("injected write failure"), std::string_view::npos);
      }
    }
  }
  ASSERT_TRUE(tier_->Close().ok());
  env_.SetWriteFailureOneIn(0, 0);
  for (auto& [digest, i] : acked) ExpectReadsBack(outcomes.at(i).value(), blocks[i]);
  EXPECT_GT(env_.counters().injected_write_failures, 0u);
  EXPECT_GT(failed, 0u);
  EXPECT_GT(acked.size(), 0u);
  EXPECT_EQ(tier_->stats().demotions_failed, failed);
  // After a crash exactly the acknowledged blocks are there: a failed write
  // wrote nothing, and a block whose sync failed was never synced.
  Crash();
  Reopen();
  ASSERT_EQ(recovered_.size(), acked.size());
  for (const RecoveredBlock& b : recovered_) {
    ASSERT_TRUE(acked.count(b.header.key));
    ExpectReadsBack(b.location, blocks[acked.at(b.header.key)]);
  }
  EXPECT_EQ(report_.dropped_corrupt, 0u);
}

TEST_F(NvmeTierTest, RemovedBlocksStayRemovedAndEmptySegmentsAreDeleted) {
  std::mt19937_64 rng(6);
  Reopen();
  // 24 KiB records in 1 MiB segments: several segments.
  std::vector<TestBlock> blocks;
  std::vector<NvmeLocation> locs;
  for (int i = 0; i < 100; ++i) {
    blocks.push_back(MakeBlock(rng, 40));
    auto loc = tier_->DemoteAndWait(blocks.back().header, blocks.back().payload);
    ASSERT_TRUE(loc.ok());
    locs.push_back(*loc);
  }
  ASSERT_GE(tier_->stats().segments, 3u);
  EXPECT_TRUE(env_.FileExists(SegmentPath(1)));
  const uint64_t used_before = tier_->stats().used_bytes;
  for (size_t i = 0; i < locs.size(); ++i) {
    if (locs[i].segment_id != 1) continue;
    ASSERT_TRUE(tier_->Remove(locs[i], blocks[i].header.key).ok());
    EXPECT_TRUE(tier_->Remove(locs[i], blocks[i].header.key).IsNotFound());
  }
  EXPECT_FALSE(env_.FileExists(SegmentPath(1)));
  EXPECT_LT(tier_->stats().used_bytes, used_before);
  // Remove one block of segment 2 too, then restart.
  size_t removed2 = 0;
  while (locs[removed2].segment_id != 2) ++removed2;
  EXPECT_EQ(tier_->Remove(locs[removed2], blocks[removed2 + 1].header.key).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier_->Remove(locs[removed2], blocks[removed2].header.key).ok());
  Crash();
  Reopen();
  EXPECT_EQ(report_.tombstones, 1u);
  for (const RecoveredBlock& b : recovered_) {
    EXPECT_NE(b.location.segment_id, 1u);
    EXPECT_NE(b.header.key, blocks[removed2].header.key);
  }
}

TEST_F(NvmeTierTest, RecoveryKeepsTheNewestCopyOfAKey) {
  std::mt19937_64 rng(7);
  Reopen();
  TestBlock b = MakeBlock(rng, 3);
  auto first = tier_->DemoteAndWait(b.header, b.payload);
  auto second = tier_->DemoteAndWait(b.header, b.payload);
  ASSERT_TRUE(first.ok() && second.ok());
  Reopen();
  EXPECT_EQ(report_.dropped_duplicate, 1u);
  ASSERT_EQ(recovered_.size(), 1u);
  EXPECT_EQ(recovered_[0].location, *second);
}

TEST_F(NvmeTierTest, ReadWithAnotherKeyIsRefusedAndRemovesNothing) {
  std::mt19937_64 rng(8);
  Reopen();
  TestBlock a = MakeBlock(rng, 3);
  TestBlock other = MakeBlock(rng, 3);
  auto loc = tier_->DemoteAndWait(a.header, a.payload);
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(ReadStatus(*loc, other.header.key).code(), StatusCode::kFailedPrecondition);
  ExpectReadsBack(*loc, a);
  EXPECT_EQ(tier_->stats().crc_failures, 0u);
  NvmeLocation nowhere = *loc;
  nowhere.segment_id = 99;
  EXPECT_TRUE(ReadStatus(nowhere, a.header.key).IsNotFound());
}

TEST_F(NvmeTierTest, DemotionPastCapacityIsResourceExhausted) {
  std::mt19937_64 rng(9);
  NvmeTierOptions o = Options();
  o.capacity_bytes = 4096 + 3 * 8192;  // segment header + three 8 KiB records
  Reopen(o);
  for (int i = 0; i < 3; ++i) {
    TestBlock b = MakeBlock(rng, 15);  // 128 + 7680 bytes: two units
    ASSERT_TRUE(tier_->DemoteAndWait(b.header, b.payload).ok());
  }
  TestBlock b = MakeBlock(rng, 15);
  auto loc = tier_->DemoteAndWait(b.header, b.payload);
  EXPECT_EQ(loc.status().code(), StatusCode::kResourceExhausted) << loc.status();
  EXPECT_NE(loc.status().message().find("capacity_bytes"), std::string_view::npos);
}

TEST_F(NvmeTierTest, RefusesBadOptionsAndDemotionsAfterClose) {
  NvmeTierOptions o = Options();
  o.capacity_bytes = 0;
  EXPECT_TRUE(NvmeTier::Open(o).status().IsInvalidArgument());
  o = Options();
  o.segment_bytes = o.max_group_bytes;
  EXPECT_TRUE(NvmeTier::Open(o).status().IsInvalidArgument());
  o = Options();
  o.max_group_bytes = 1000;
  EXPECT_TRUE(NvmeTier::Open(o).status().IsInvalidArgument());

  std::mt19937_64 rng(10);
  Reopen();
  TestBlock b = MakeBlock(rng, 2);
  ASSERT_TRUE(tier_->Close().ok());
  EXPECT_TRUE(tier_->DemoteAndWait(b.header, b.payload).status().IsUnavailable());
  TestBlock big = MakeBlock(rng, 600);  // 300 KiB > max_group_bytes
  Reopen();
  EXPECT_TRUE(tier_->DemoteAndWait(big.header, big.payload).status().IsInvalidArgument());
  b.payload[0] ^= std::byte{1};  // payload no longer matches its CRC
  EXPECT_TRUE(tier_->DemoteAndWait(b.header, b.payload).status().IsDataLoss());
}

TEST_F(NvmeTierTest, SegmentOfAnotherVersionIsRefusedAndKept) {
  Reopen();
  tier_.reset();
  const std::string path = SegmentPath(5);
  std::vector<std::byte> unit(4096);
  SegmentHeader h;
  h.segment_id = 5;
  h.alignment = 4096;
  EncodeSegmentHeader(h, unit);
  unit[8] = std::byte{2};  // version 2, CRC recomputed below
  const uint32_t crc = crc32c::Mask(crc32c::Value(std::span(unit).first(32)));
  for (int i = 0; i < 4; ++i) unit[32 + i] = std::byte(crc >> (8 * i));
  ASSERT_TRUE(WriteStringToFileSync(
                  Env::Default(),
                  std::string_view(reinterpret_cast<const char*>(unit.data()), unit.size()), path)
                  .ok());
  auto opened = NvmeTier::Open(Options());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status();
  EXPECT_TRUE(Env::Default()->FileExists(path));
}

}  // namespace
}  // namespace kvfabric::cache_host
