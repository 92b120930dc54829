#include "core/testing/fault_injection_env.h"

#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/env.h"
#include "core/status.h"
#include "core/testing/test_seed.h"
#include "gtest/gtest.h"

namespace kvfabric {
namespace {

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

class FaultInjectionEnvTest : public ::testing::Test {
 protected:
  FaultInjectionEnvTest() {
    std::string tmpl = ::testing::TempDir() + "kvf_fault_env_test_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl << ": " << std::strerror(errno);
    dir_ = tmpl;
  }
  ~FaultInjectionEnvTest() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Path(std::string_view name) const { return dir_ + "/" + std::string(name); }

  std::unique_ptr<RandomRWFile> Open(const std::string& path, bool create = true) {
    FileOptions o;
    o.create = create;
    auto file = env_.NewRandomRWFile(path, o);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? std::move(*file) : nullptr;
  }

  // Creates `path` holding `data`, with the data and the name durable.
  void WriteDurable(const std::string& path, std::string_view data) {
    auto f = Open(path);
    ASSERT_NE(f, nullptr);
    ASSERT_TRUE(f->Write(0, Bytes(data)).ok());
    ASSERT_TRUE(f->Sync().ok());
    ASSERT_TRUE(f->Close().ok());
    ASSERT_TRUE(env_.SyncDir(dir_).ok());
  }

  // The file's bytes as the disk holds them, read past the fault injection.
  std::string OnDisk(const std::string& path) {
    auto s = ReadFileToString(Env::Default(), path);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : "<unreadable>";
  }

  void Crash() {
    env_.SetFilesystemActive(false);
    Status s = env_.DropUnsyncedData();
    ASSERT_TRUE(s.ok()) << s;
    env_.SetFilesystemActive(true);
  }

  std::string dir_;
  FaultInjectionEnv env_{Env::Default()};
};

TEST_F(FaultInjectionEnvTest, SyncedDataSurvivesDropUnsyncedData) {
  const std::string path = Path("f");
  WriteDurable(path, "durable bytes");
  Crash();
  EXPECT_EQ(OnDisk(path), "durable bytes");
}

TEST_F(FaultInjectionEnvTest, UnsyncedAppendIsRolledBack) {
  const std::string path = Path("f");
  WriteDurable(path, "synced");
  auto f = Open(path);
  ASSERT_TRUE(f->Write(6, Bytes("+appended")).ok());
  EXPECT_EQ(OnDisk(path), "synced+appended") << "the base file must really hold the write";
  Crash();
  EXPECT_EQ(OnDisk(path), "synced");
}

TEST_F(FaultInjectionEnvTest, UnsyncedOverwritesOfSyncedRangeAreRestoredExactly) {
  const std::string path = Path("f");
  std::string synced(8192, '\0');
  for (size_t i = 0; i < synced.size(); ++i) synced[i] = static_cast<char>(i * 131 + 17);
  WriteDurable(path, synced);

  auto f = Open(path);
  ASSERT_TRUE(f->Write(100, Bytes(std::string(300, 'A'))).ok());
  ASSERT_TRUE(f->Write(250, Bytes(std::string(300, 'B'))).ok());   // overlaps the first
  ASSERT_TRUE(f->Write(8000, Bytes(std::string(500, 'C'))).ok());  // straddles the end
  ASSERT_TRUE(f->Truncate(5000).ok());
  ASSERT_TRUE(f->Write(6000, Bytes("after a hole")).ok());
  ASSERT_NE(OnDisk(path), synced);
  Crash();
  EXPECT_TRUE(OnDisk(path) == synced);
}

TEST_F(FaultInjectionEnvTest, SyncMakesLaterStateTheOneRestored) {
  const std::string path = Path("f");
  WriteDurable(path, "version 1");
  auto f = Open(path);
  ASSERT_TRUE(f->Write(8, Bytes("2")).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Write(8, Bytes("3 and more")).ok());
  Crash();
  EXPECT_EQ(OnDisk(path), "version 2");
}

TEST_F(FaultInjectionEnvTest, TruncateOnOpenIsRolledBack) {
  const std::string path = Path("f");
  WriteDurable(path, "keep me");
  FileOptions o;
  o.truncate = true;
  auto f = env_.NewRandomRWFile(path, o);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(OnDisk(path), "");
  Crash();
  EXPECT_EQ(OnDisk(path), "keep me");
}

// Random writes, truncations and syncs against a model of the file; after the
// crash the file must equal the model as it stood at the last successful Sync.
TEST_F(FaultInjectionEnvTest, RandomWorkloadRewindsToLastSync) {
  const uint64_t seed = TestSeed("FaultInjectionEnvTest.RandomWorkloadRewindsToLastSync");
  std::mt19937_64 rng(seed);
  const std::string path = Path("f");
  WriteDurable(path, "");
  std::string model;
  for (int round = 0; round < 20; ++round) {
    auto f = Open(path);
    ASSERT_NE(f, nullptr);
    std::string synced = model;
    const int ops = 1 + static_cast<int>(rng() % 40);
    for (int op = 0; op < ops; ++op) {
      switch (rng() % 8) {
        case 0: {
          uint64_t size = rng() % (model.size() + 2000);
          ASSERT_TRUE(f->Truncate(size).ok());
          model.resize(size, '\0');
          break;
        }
        case 1:
          ASSERT_TRUE(f->Sync().ok());
          synced = model;
          break;
        default: {
          uint64_t offset = rng() % (model.size() + 500);
          std::string data(1 + rng() % 700, '\0');
          for (char& c : data) c = static_cast<char>(rng());
          ASSERT_TRUE(f->Write(offset, Bytes(data)).ok());
          if (model.size() < offset + data.size()) model.resize(offset + data.size(), '\0');
          model.replace(offset, data.size(), data);
        }
      }
    }
    ASSERT_TRUE(OnDisk(path) == model) << "round " << round << ": model and file disagree";
    Crash();
    ASSERT_TRUE(OnDisk(path) == synced) << "round " << round << ": " << OnDisk(path).size()
                                        << " bytes on disk, " << synced.size() << " synced";
    model = synced;
  }
}

TEST_F(FaultInjectionEnvTest, NewFileWithoutDirSyncVanishes) {
  const std::string path = Path("new");
  auto f = Open(path);
  ASSERT_TRUE(f->Write(0, Bytes("data")).ok());
  ASSERT_TRUE(f->Sync().ok());  // the data, but not the name
  ASSERT_TRUE(env_.FileExists(path));
  Crash();
  EXPECT_FALSE(env_.FileExists(path));
  EXPECT_EQ(env_.counters().files_dropped, 1u);
}

TEST_F(FaultInjectionEnvTest, NewFileWithDirSyncKeepsOnlyItsSyncedData) {
  const std::string synced_path = Path("synced");
  const std::string unsynced_path = Path("unsynced");
  auto a = Open(synced_path);
  ASSERT_TRUE(a->Write(0, Bytes("data")).ok());
  ASSERT_TRUE(a->Sync().ok());
  auto b = Open(unsynced_path);
  ASSERT_TRUE(b->Write(0, Bytes("data")).ok());
  ASSERT_TRUE(env_.SyncDir(dir_ + "/").ok());  // trailing slash names the same directory
  Crash();
  EXPECT_EQ(OnDisk(synced_path), "data");
  EXPECT_EQ(OnDisk(unsynced_path), "") << "the name survives, the unsynced data does not";
}

TEST_F(FaultInjectionEnvTest, InactiveFilesystemFailsEveryChangeButAllowsReads) {
  const std::string path = Path("f");
  WriteDurable(path, "abc");
  auto f = Open(path);
  env_.SetFilesystemActive(false);
  EXPECT_FALSE(env_.IsFilesystemActive());

  auto expect_inactive = [](const Status& s) {
    EXPECT_TRUE(s.IsUnavailable()) << s;
    EXPECT_NE(s.message().find("filesystem inactive (simulated crash)"), std::string_view::npos)
        << s;
  };
  expect_inactive(f->Write(0, Bytes("x")));
  expect_inactive(f->Sync());
  expect_inactive(f->Truncate(0));
  FileOptions create;
  create.create = true;
  expect_inactive(env_.NewRandomRWFile(Path("g"), create).status());
  expect_inactive(env_.DeleteFile(path));
  expect_inactive(env_.RenameFile(path, Path("h")));
  expect_inactive(env_.SyncDir(dir_));
  expect_inactive(env_.CreateDirIfMissing(Path("d")));

  std::vector<std::byte> buf(3);
  auto n = f->Read(0, buf);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(OnDisk(path), "abc");
  EXPECT_FALSE(env_.FileExists(Path("g")));
  env_.SetFilesystemActive(true);
  EXPECT_TRUE(f->Write(0, Bytes("x")).ok());
}

// The RocksDB-style crash test in miniature: acknowledged records (synced)
// must all be there after the crash; unacknowledged ones may not be.
TEST_F(FaultInjectionEnvTest, AcknowledgedRecordsSurviveSimulatedCrash) {
  const std::string path = Path("log");
  auto f = Open(path);
  ASSERT_TRUE(env_.SyncDir(dir_).ok());
  std::string acknowledged;
  uint64_t offset = 0;
  for (int i = 0; i < 50; ++i) {
    std::string record = "record-" + std::to_string(i) + ";";
    ASSERT_TRUE(f->Write(offset, Bytes(record)).ok());
    offset += record.size();
    if (i % 7 == 6) {
      ASSERT_TRUE(f->Sync().ok());
      acknowledged = OnDisk(path);
    }
  }
  ASSERT_GT(OnDisk(path).size(), acknowledged.size());
  Crash();
  EXPECT_EQ(OnDisk(path), acknowledged);
}

TEST_F(FaultInjectionEnvTest, AtomicWriteHelperSurvivesCrash) {
  const std::string path = Path("CURRENT");
  ASSERT_TRUE(WriteStringToFileSync(&env_, "v1", path).ok());
  ASSERT_TRUE(WriteStringToFileSync(&env_, "v2", path).ok());
  Crash();
  EXPECT_EQ(OnDisk(path), "v2");
  EXPECT_FALSE(env_.FileExists(path + ".tmp"));
}

TEST_F(FaultInjectionEnvTest, AtomicReplaceCrashedBeforeDirSyncLeavesOldOrNewNeverMix) {
  const std::string path = Path("CURRENT");
  WriteDurable(path, "old contents");
  auto tmp = Open(path + ".tmp");
  ASSERT_TRUE(tmp->Write(0, Bytes("new")).ok());
  ASSERT_TRUE(tmp->Sync().ok());
  ASSERT_TRUE(env_.RenameFile(path + ".tmp", path).ok());
  Crash();  // before SyncDir
  std::string after = OnDisk(path);
  EXPECT_TRUE(after == "old contents" || after == "new") << after;
}

TEST_F(FaultInjectionEnvTest, RenameOfDurableFileIsUndoneWithoutDirSync) {
  const std::string a = Path("a");
  const std::string b = Path("b");
  WriteDurable(a, "payload");
  ASSERT_TRUE(env_.RenameFile(a, b).ok());
  Crash();
  EXPECT_EQ(OnDisk(a), "payload");
  EXPECT_FALSE(env_.FileExists(b));

  ASSERT_TRUE(env_.RenameFile(a, b).ok());
  ASSERT_TRUE(env_.SyncDir(dir_).ok());
  Crash();
  EXPECT_FALSE(env_.FileExists(a));
  EXPECT_EQ(OnDisk(b), "payload");
}

TEST_F(FaultInjectionEnvTest, HandleKeepsTrackingItsFileAfterRename) {
  const std::string a = Path("a");
  const std::string b = Path("b");
  WriteDurable(a, "synced");
  auto f = Open(a);
  ASSERT_TRUE(env_.RenameFile(a, b).ok());
  ASSERT_TRUE(env_.SyncDir(dir_).ok());
  ASSERT_TRUE(f->Write(0, Bytes("UNSYNC")).ok());
  Crash();
  EXPECT_EQ(OnDisk(b), "synced");
}

TEST_F(FaultInjectionEnvTest, DirectIoFileRollsBackToSyncedBlocks) {
  const size_t align = env_.DirectIoAlignment();
  FileOptions o;
  o.create = true;
  o.direct_io = true;
  const std::string path = Path("direct");
  auto opened = env_.NewRandomRWFile(path, o);
  if (!opened.ok() && opened.status().IsInvalidArgument()) {
    GTEST_SKIP() << "temp dir refuses O_DIRECT: " << opened.status();
  }
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto& f = *opened;
  auto buf = AlignedBuffer::Allocate(2 * align, align);
  ASSERT_TRUE(buf.ok());
  std::memset(buf->data(), 'S', buf->size());
  ASSERT_TRUE(f->Write(0, buf->span()).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(env_.SyncDir(dir_).ok());

  std::memset(buf->data(), 'U', buf->size());
  ASSERT_TRUE(f->Write(0, buf->span().first(align)).ok());          // overwrite block 0
  ASSERT_TRUE(f->Write(2 * align, buf->span().first(align)).ok());  // append block 2
  Status misaligned = f->Write(1, buf->span().first(align));
  EXPECT_TRUE(misaligned.IsInvalidArgument()) << misaligned;
  Crash();
  EXPECT_EQ(OnDisk(path), std::string(2 * align, 'S'));
}

TEST_F(FaultInjectionEnvTest, WriteFailuresHappenAtSeededRateAndReplay) {
  const uint64_t seed = TestSeed("FaultInjectionEnvTest.WriteFailuresHappenAtSeededRateAndReplay");
  constexpr int kWrites = 5000;
  constexpr uint32_t kOneIn = 10;
  auto run = [&](const std::string& path) {
    std::vector<bool> failed;
    auto f = Open(path);
    env_.ResetCounters();
    env_.SetWriteFailureOneIn(kOneIn, seed);
    for (int i = 0; i < kWrites; ++i) {
      Status s = f->Write(static_cast<uint64_t>(i), Bytes("x"));
      if (!s.ok()) {
        EXPECT_TRUE(s.IsUnavailable()) << s;
        EXPECT_NE(s.message().find("injected write failure"), std::string_view::npos) << s;
      }
      failed.push_back(!s.ok());
    }
    env_.SetWriteFailureOneIn(0, 0);
    return failed;
  };
  std::vector<bool> first = run(Path("first"));
  const uint64_t failures = static_cast<uint64_t>(std::count(first.begin(), first.end(), true));
  EXPECT_EQ(env_.counters().injected_write_failures, failures);
  EXPECT_EQ(env_.counters().writes, static_cast<uint64_t>(kWrites));
  // Binomial(5000, 0.1): mean 500, standard deviation 21; the band is +-7 sigma.
  EXPECT_GT(failures, 350u);
  EXPECT_LT(failures, 650u);

  // A failed write changed nothing; a successful one landed.
  std::string disk = OnDisk(Path("first"));
  for (int i = 0; i < kWrites && i < static_cast<int>(disk.size()); ++i) {
    ASSERT_EQ(disk[i] == 'x', !first[i]) << "write " << i;
  }

  EXPECT_EQ(run(Path("second")), first) << "the same seed must fail the same writes";
}

TEST_F(FaultInjectionEnvTest, FailedSyncKeepsDataUnsynced) {
  const std::string path = Path("f");
  WriteDurable(path, "old");
  auto f = Open(path);
  ASSERT_TRUE(f->Write(0, Bytes("new")).ok());
  env_.SetWriteFailureOneIn(1, 7);
  Status s = f->Sync();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  env_.SetWriteFailureOneIn(0, 0);
  Crash();
  EXPECT_EQ(OnDisk(path), "old");
}

TEST_F(FaultInjectionEnvTest, ReadFailuresAreDataLossAtSeededRate) {
  const uint64_t seed = TestSeed("FaultInjectionEnvTest.ReadFailuresAreDataLossAtSeededRate");
  const std::string path = Path("f");
  WriteDurable(path, "0123456789");
  auto f = Open(path);
  env_.SetReadFailureOneIn(4, seed);
  constexpr int kReads = 4000;
  int failures = 0;
  std::vector<std::byte> buf(10);
  for (int i = 0; i < kReads; ++i) {
    auto n = f->Read(0, buf);
    if (!n.ok()) {
      ++failures;
      EXPECT_TRUE(n.status().IsDataLoss()) << n.status();
    } else {
      EXPECT_EQ(*n, 10u);
    }
  }
  EXPECT_EQ(env_.counters().injected_read_failures, static_cast<uint64_t>(failures));
  EXPECT_EQ(env_.counters().reads, static_cast<uint64_t>(kReads));
  // Binomial(4000, 0.25): mean 1000, standard deviation 27.
  EXPECT_GT(failures, 800);
  EXPECT_LT(failures, 1200);
}

TEST_F(FaultInjectionEnvTest, ReadCorruptionFlipsOneBitOfTheReturnedBytesOnly) {
  const uint64_t seed =
      TestSeed("FaultInjectionEnvTest.ReadCorruptionFlipsOneBitOfTheReturnedBytesOnly");
  const std::string path = Path("f");
  const std::string data(64, 'z');
  WriteDurable(path, data);
  auto f = Open(path);
  env_.SetReadCorruptionOneIn(1, seed);
  for (int i = 0; i < 20; ++i) {
    std::vector<std::byte> buf(64);
    auto n = f->Read(0, buf);
    ASSERT_TRUE(n.ok()) << n.status();
    int flipped_bits = 0;
    for (size_t j = 0; j < buf.size(); ++j) {
      flipped_bits += std::popcount(static_cast<unsigned>(buf[j] ^ std::byte{'z'}));
    }
    EXPECT_EQ(flipped_bits, 1) << "read " << i;
  }
  EXPECT_EQ(env_.counters().injected_read_corruptions, 20u);
  EXPECT_EQ(OnDisk(path), data) << "read corruption must not touch the file";
}

TEST_F(FaultInjectionEnvTest, CorruptBytesChangesExactlyTheRequestedBytes) {
  const uint64_t seed =
      TestSeed("FaultInjectionEnvTest.CorruptBytesChangesExactlyTheRequestedBytes");
  const std::string path = Path("f");
  std::string original(4096, '\0');
  for (size_t i = 0; i < original.size(); ++i) original[i] = static_cast<char>(i);
  WriteDurable(path, original);

  ASSERT_TRUE(env_.CorruptBytes(path, 1000, 24, seed).ok());
  std::string corrupted = OnDisk(path);
  ASSERT_EQ(corrupted.size(), original.size());
  for (size_t i = 0; i < original.size(); ++i) {
    const bool inside = i >= 1000 && i < 1024;
    const int bits = std::popcount(static_cast<unsigned char>(original[i] ^ corrupted[i]));
    EXPECT_EQ(bits, inside ? 1 : 0) << "byte " << i;
  }

  // The same seed flips the same bits: corrupting again restores the file.
  ASSERT_TRUE(env_.CorruptBytes(path, 1000, 24, seed).ok());
  EXPECT_TRUE(OnDisk(path) == original);

  Status s = env_.CorruptBytes(path, 4090, 10, seed);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(env_.CorruptBytes(Path("missing"), 0, 1, seed).IsNotFound());
}

TEST_F(FaultInjectionEnvTest, CountersCountCalls) {
  const std::string path = Path("f");
  auto f = Open(path);
  env_.ResetCounters();
  ASSERT_TRUE(f->Write(0, Bytes("ab")).ok());
  ASSERT_TRUE(f->Write(2, Bytes("cd")).ok());
  ASSERT_TRUE(f->Sync().ok());
  std::vector<std::byte> buf(4);
  ASSERT_TRUE(f->Read(0, buf).ok());
  FaultInjectionCounters c = env_.counters();
  EXPECT_EQ(c.writes, 2u);
  EXPECT_EQ(c.syncs, 1u);
  EXPECT_EQ(c.reads, 1u);
  EXPECT_EQ(c.injected_write_failures + c.injected_read_failures + c.injected_read_corruptions, 0u);
}

}  // namespace
}  // namespace kvfabric
