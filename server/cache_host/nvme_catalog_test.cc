// NvmeCatalog on FaultInjectionEnv: round trips, last-record-wins, crash tests
// (acknowledged batches survive, unsynced ones do not), torn tails, corrupt
// records, compaction, and refusal of damaged headers and absurd sizes.
#include "server/cache_host/nvme_catalog.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/crc32c.h"
#include "core/testing/fault_injection_env.h"
#include "core/testing/test_seed.h"
#include "gtest/gtest.h"

namespace kvfabric::cache_host {
namespace {

BlockDigest KeyOf(uint64_t n) {
  BlockDigest key{};
  for (int i = 0; i < 8; ++i) key[i] = static_cast<uint8_t>(n >> (8 * i));
  key[31] = 0xa5;
  return key;
}

BlockDigest RandomKey(std::mt19937_64& rng) {
  BlockDigest key;
  for (auto& b : key) b = static_cast<uint8_t>(rng());
  return key;
}

// The block key the tests pair with NVMe key `key`: any value other than
// `key` itself, so that a mix-up of the two fields shows.
BlockDigest BlockKeyFor(const BlockDigest& key) {
  BlockDigest b = key;
  for (auto& x : b) x = static_cast<uint8_t>(x ^ 0x5a);
  return b;
}

CatalogEntry Entry(const BlockDigest& key, std::string tenant, uint64_t token_offset) {
  CatalogEntry e;
  e.key = key;
  e.block_key = BlockKeyFor(key);
  e.tenant = std::move(tenant);
  e.token_offset = token_offset;
  return e;
}

// A tenant of 0..kMaxNamespaceBytes random bytes from a small alphabet (NUL included).
std::string RandomTenant(std::mt19937_64& rng) {
  const size_t n = rng() % 4 == 0 ? kMaxNamespaceBytes : rng() % 24;
  std::string t(n, '\0');
  for (char& c : t) c = static_cast<char>(rng() % 8);
  return t;
}

void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

// The record the header comment specifies, encoded independently of the
// catalog. `tenant_bytes_field` overrides the tenant length written.
std::vector<std::byte> SpecRecord(const BlockDigest& key, std::string_view tenant,
                                  uint64_t token_offset,
                                  std::optional<uint16_t> tenant_bytes_field = std::nullopt) {
  const uint32_t body = static_cast<uint32_t>(74 + tenant.size());
  std::vector<std::byte> r(8 + body);
  PutU32(r.data() + 4, body);
  std::memcpy(r.data() + 8, key.data(), 32);
  const BlockDigest block_key = BlockKeyFor(key);
  std::memcpy(r.data() + 40, block_key.data(), 32);
  for (int i = 0; i < 8; ++i) r[72 + i] = static_cast<std::byte>(token_offset >> (8 * i));
  const uint16_t tenant_bytes = tenant_bytes_field.value_or(static_cast<uint16_t>(tenant.size()));
  r[80] = static_cast<std::byte>(tenant_bytes & 0xff);
  r[81] = static_cast<std::byte>(tenant_bytes >> 8);
  std::memcpy(r.data() + 82, tenant.data(), tenant.size());
  PutU32(r.data(), crc32c::Mask(crc32c::Value(r.data() + 4, 4 + body)));
  return r;
}

class NvmeCatalogTest : public ::testing::Test {
 protected:
  NvmeCatalogTest() {
    std::string tmpl = ::testing::TempDir() + "kvf_nvme_catalog_test_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl + "/tier";
  }
  ~NvmeCatalogTest() override {
    catalog_.reset();
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(dir_).parent_path(), ec);
  }

  // Opens the catalog (closing any open one) and keeps the recovery report.
  void Reopen() {
    catalog_.reset();
    auto opened = NvmeCatalog::Open(&env_, dir_, &report_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    catalog_ = std::move(opened).value();
  }

  Status OpenStatus() {
    catalog_.reset();
    return NvmeCatalog::Open(&env_, dir_, &report_).status();
  }

  // The process dies; with `drop_unsynced`, the power fails too; then reboot.
  void Crash(bool drop_unsynced) {
    env_.SetFilesystemActive(false);
    catalog_.reset();
    if (drop_unsynced) {
      ASSERT_TRUE(env_.DropUnsyncedData().ok());
    }
    env_.SetFilesystemActive(true);
  }

  void Append(const std::vector<CatalogEntry>& entries) {
    Status s = catalog_->AppendBatch(entries);
    ASSERT_TRUE(s.ok()) << s;
  }

  void ExpectFound(const CatalogEntry& expected) {
    std::optional<CatalogEntry> found = catalog_->Find(expected.key);
    ASSERT_TRUE(found.has_value()) << "token_offset " << expected.token_offset;
    EXPECT_EQ(*found, expected);
  }

  std::string LogPath() const { return dir_ + "/" + kCatalogFileName; }
  std::string TempPath() const { return dir_ + "/" + kCatalogTempFileName; }

  uint64_t LogSize() {
    auto size = env_.GetFileSize(LogPath());
    EXPECT_TRUE(size.ok()) << size.status();
    return size.ok() ? *size : 0;
  }

  // Writes `bytes` at the end of the log (or at `offset`), synced.
  void WriteRaw(std::span<const std::byte> bytes, std::optional<uint64_t> offset = std::nullopt) {
    auto file = env_.NewRandomRWFile(LogPath(), FileOptions{});
    ASSERT_TRUE(file.ok()) << file.status();
    const uint64_t at = offset.has_value() ? *offset : LogSize();
    ASSERT_TRUE((*file)->Write(at, bytes).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  void TruncateLog(uint64_t size) {
    auto file = env_.NewRandomRWFile(LogPath(), FileOptions{});
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Truncate(size).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  FaultInjectionEnv env_{Env::Default()};
  std::string dir_;
  std::unique_ptr<NvmeCatalog> catalog_;
  CatalogRecovery report_;
};

TEST_F(NvmeCatalogTest, AppendedEntriesAreFoundAndSurviveReopen) {
  Reopen();
  EXPECT_TRUE(report_.created);
  EXPECT_EQ(report_.records, 0u);
  EXPECT_EQ(LogSize(), kCatalogFileHeaderBytes);

  const std::vector<CatalogEntry> entries = {
      Entry(KeyOf(1), "", 0),
      Entry(KeyOf(2), "tenant-a", 16),
      Entry(KeyOf(3), std::string(kMaxNamespaceBytes, '\xff'), ~uint64_t{0}),
      Entry(KeyOf(4), std::string("nul\0inside", 10), 1u << 20),
  };
  Append(entries);
  uint64_t expected_bytes = kCatalogFileHeaderBytes;
  for (const CatalogEntry& e : entries) {
    ExpectFound(e);
    expected_bytes += CatalogRecordBytes(e);
  }
  EXPECT_FALSE(catalog_->Find(KeyOf(5)).has_value());
  CatalogStats stats = catalog_->stats();
  EXPECT_EQ(stats.records, 4u);
  EXPECT_EQ(stats.live_entries, 4u);
  EXPECT_EQ(stats.tenants, 4u);
  EXPECT_EQ(stats.batches, 1u);
  EXPECT_EQ(stats.file_bytes, expected_bytes);
  EXPECT_EQ(LogSize(), expected_bytes);

  Reopen();
  EXPECT_FALSE(report_.created);
  EXPECT_EQ(report_.records, 4u);
  EXPECT_EQ(report_.entries, 4u);
  EXPECT_EQ(report_.corrupt_records, 0u);
  EXPECT_EQ(report_.torn_records, 0u);
  EXPECT_EQ(report_.file_bytes, expected_bytes);
  for (const CatalogEntry& e : entries) ExpectFound(e);
}

TEST_F(NvmeCatalogTest, LastRecordOfAKeyWinsInMemoryAndAfterReopen) {
  Reopen();
  Append({Entry(KeyOf(1), "first", 0)});
  Append(
      {Entry(KeyOf(1), "second", 16), Entry(KeyOf(2), "other", 32), Entry(KeyOf(1), "third", 48)});
  ExpectFound(Entry(KeyOf(1), "third", 48));
  EXPECT_EQ(catalog_->stats().live_entries, 2u);
  EXPECT_EQ(catalog_->stats().records, 4u);
  Reopen();
  EXPECT_EQ(report_.records, 4u);
  EXPECT_EQ(report_.entries, 2u);
  ExpectFound(Entry(KeyOf(1), "third", 48));
  ExpectFound(Entry(KeyOf(2), "other", 32));
}

TEST_F(NvmeCatalogTest, AppendsAfterReopenExtendTheLog) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  Reopen();
  Append({Entry(KeyOf(2), "b", 2)});
  Reopen();
  Append({Entry(KeyOf(3), "a", 3), Entry(KeyOf(1), "a", 4)});
  Reopen();
  EXPECT_EQ(report_.records, 4u);
  EXPECT_EQ(report_.entries, 3u);
  EXPECT_EQ(report_.corrupt_records + report_.torn_records, 0u);
  ExpectFound(Entry(KeyOf(1), "a", 4));
  ExpectFound(Entry(KeyOf(2), "b", 2));
  ExpectFound(Entry(KeyOf(3), "a", 3));
  EXPECT_EQ(catalog_->stats().tenants, 2u);
}

TEST_F(NvmeCatalogTest, RefusesBatchWithOverLongTenantBeforeWritingAnything) {
  Reopen();
  const uint64_t before = LogSize();
  Status s = catalog_->AppendBatch(std::vector<CatalogEntry>{
      Entry(KeyOf(1), "fine", 0), Entry(KeyOf(2), std::string(kMaxNamespaceBytes + 1, 'x'), 0)});
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("257 bytes"), std::string_view::npos) << s;
  EXPECT_EQ(LogSize(), before);
  EXPECT_FALSE(catalog_->Find(KeyOf(1)).has_value());
  EXPECT_TRUE(catalog_->AppendBatch({}).ok());
  EXPECT_EQ(catalog_->stats().batches, 0u);
}

TEST_F(NvmeCatalogTest, SyncedBatchesSurviveCrashAndUnsyncedDoNot) {
  const uint64_t seed = TestSeed("NvmeCatalogTest.SyncedBatchesSurviveCrashAndUnsyncedDoNot");
  std::mt19937_64 rng(seed);
  Reopen();
  std::map<BlockDigest, CatalogEntry> acknowledged;
  std::vector<BlockDigest> keys;  // a pool, so that later batches overwrite earlier keys
  for (int i = 0; i < 40; ++i) keys.push_back(RandomKey(rng));
  std::vector<BlockDigest> unacknowledged_only;

  for (int round = 0; round < 3; ++round) {
    for (int batch = 0; batch < 5; ++batch) {
      std::vector<CatalogEntry> entries;
      const size_t n = 1 + rng() % 8;
      for (size_t i = 0; i < n; ++i) {
        entries.push_back(Entry(keys[rng() % keys.size()], RandomTenant(rng), rng()));
      }
      Append(entries);
      for (const CatalogEntry& e : entries) acknowledged[e.key] = e;
    }
    // A batch written but not synced when the process dies, with some keys
    // the acknowledged batches used and some new ones.
    std::vector<CatalogEntry> unsynced;
    for (int i = 0; i < 6; ++i) {
      BlockDigest key = i % 2 == 0 ? keys[rng() % keys.size()] : RandomKey(rng);
      if (i % 2 == 1) unacknowledged_only.push_back(key);
      unsynced.push_back(Entry(key, RandomTenant(rng), rng()));
    }
    ASSERT_TRUE(catalog_->TEST_AppendBatchWithoutSync(unsynced).ok());
    Crash(/*drop_unsynced=*/true);
    Reopen();
    SCOPED_TRACE("round " + std::to_string(round));
    EXPECT_EQ(report_.torn_records, 0u);
    EXPECT_EQ(report_.corrupt_records, 0u);
    EXPECT_EQ(report_.entries, acknowledged.size());
    for (const auto& [key, entry] : acknowledged) ExpectFound(entry);
    for (const BlockDigest& key : unacknowledged_only) EXPECT_FALSE(catalog_->Find(key));
  }
}

TEST_F(NvmeCatalogTest, RecoveryMakesIntactUnsyncedRecordsDurable) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  ASSERT_TRUE(
      catalog_->TEST_AppendBatchWithoutSync(std::vector<CatalogEntry>{Entry(KeyOf(2), "b", 2)})
          .ok());
  Crash(/*drop_unsynced=*/false);  // the process died; the page cache kept the write
  Reopen();
  ExpectFound(Entry(KeyOf(2), "b", 2));
  // The tier may now recover and sync the block this record describes, so
  // the record must outlive a power failure from here on.
  Crash(/*drop_unsynced=*/true);
  Reopen();
  ExpectFound(Entry(KeyOf(1), "a", 1));
  ExpectFound(Entry(KeyOf(2), "b", 2));
}

TEST_F(NvmeCatalogTest, TornTailIsTruncatedAndSyncedRecordsSurvive) {
  const uint64_t seed = TestSeed("NvmeCatalogTest.TornTailIsTruncatedAndSyncedRecordsSurvive");
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    catalog_.reset();
    if (env_.FileExists(LogPath())) {
      ASSERT_TRUE(env_.DeleteFile(LogPath()).ok());
    }
    Reopen();
    std::vector<CatalogEntry> synced;
    for (int i = 0; i < 5; ++i) synced.push_back(Entry(RandomKey(rng), RandomTenant(rng), rng()));
    Append(synced);
    const uint64_t synced_end = LogSize();
    std::vector<CatalogEntry> unsynced;
    std::vector<uint64_t> ends;  // where each unsynced record ends
    uint64_t end = synced_end;
    for (int i = 0; i < 5; ++i) {
      unsynced.push_back(Entry(RandomKey(rng), RandomTenant(rng), rng()));
      end += CatalogRecordBytes(unsynced.back());
      ends.push_back(end);
    }
    ASSERT_TRUE(catalog_->TEST_AppendBatchWithoutSync(unsynced).ok());
    Crash(/*drop_unsynced=*/false);
    // The crash kept only a prefix of the unsynced write.
    const uint64_t cut = synced_end + 1 + rng() % (end - synced_end - 1);
    TruncateLog(cut);

    Reopen();
    size_t whole = 0;
    while (whole < ends.size() && ends[whole] <= cut) ++whole;
    const uint64_t valid_end = whole == 0 ? synced_end : ends[whole - 1];
    EXPECT_EQ(report_.corrupt_records, 0u);
    EXPECT_EQ(report_.torn_records, valid_end == cut ? 0u : 1u) << "cut " << cut;
    EXPECT_EQ(report_.truncated_bytes, cut - valid_end);
    EXPECT_EQ(LogSize(), valid_end);
    for (const CatalogEntry& e : synced) ExpectFound(e);
    for (size_t i = 0; i < unsynced.size(); ++i) {
      EXPECT_EQ(catalog_->Find(unsynced[i].key).has_value(), i < whole) << "record " << i;
    }
    // Appending after the truncation leaves a clean log.
    CatalogEntry later = Entry(RandomKey(rng), "later", 7);
    Append({later});
    Reopen();
    EXPECT_EQ(report_.torn_records, 0u);
    EXPECT_EQ(report_.corrupt_records, 0u);
    ExpectFound(later);
  }
}

TEST_F(NvmeCatalogTest, BadCrcOnLastRecordIsATornTail) {
  Reopen();
  const std::vector<CatalogEntry> entries = {Entry(KeyOf(1), "a", 1), Entry(KeyOf(2), "b", 2),
                                             Entry(KeyOf(3), "c", 3)};
  Append(entries);
  const uint64_t third =
      kCatalogFileHeaderBytes + CatalogRecordBytes(entries[0]) + CatalogRecordBytes(entries[1]);
  catalog_.reset();
  ASSERT_TRUE(env_.CorruptBytes(LogPath(), third + 20, 1, 5).ok());
  Reopen();
  EXPECT_EQ(report_.torn_records, 1u);
  EXPECT_EQ(report_.corrupt_records, 0u);
  EXPECT_EQ(report_.records, 2u);
  EXPECT_EQ(LogSize(), third);
  ExpectFound(entries[0]);
  ExpectFound(entries[1]);
  EXPECT_FALSE(catalog_->Find(KeyOf(3)).has_value());
}

TEST_F(NvmeCatalogTest, FlippedByteInMiddleRecordIsCountedCorruptAndOthersSurvive) {
  const uint64_t seed =
      TestSeed("NvmeCatalogTest.FlippedByteInMiddleRecordIsCountedCorruptAndOthersSurvive");
  std::mt19937_64 rng(seed);
  Reopen();
  std::vector<CatalogEntry> entries;
  for (int i = 0; i < 5; ++i) entries.push_back(Entry(KeyOf(i), "tenant-" + std::to_string(i), i));
  Append(entries);
  const uint64_t size = LogSize();
  const uint64_t middle =
      kCatalogFileHeaderBytes + CatalogRecordBytes(entries[0]) + CatalogRecordBytes(entries[1]);
  catalog_.reset();
  // Any byte of record 2, its CRC and length field included.
  const uint64_t at = middle + rng() % CatalogRecordBytes(entries[2]);
  ASSERT_TRUE(env_.CorruptBytes(LogPath(), at, 1, rng()).ok());

  for (int reopen = 0; reopen < 2; ++reopen) {
    Reopen();
    EXPECT_EQ(report_.corrupt_records, 1u) << "flipped byte " << at - middle;
    EXPECT_EQ(report_.torn_records, 0u);
    EXPECT_EQ(report_.records, 4u);
    EXPECT_EQ(LogSize(), size);  // nothing truncated
    for (int i = 0; i < 5; ++i) {
      if (i == 2) {
        EXPECT_FALSE(catalog_->Find(KeyOf(2)).has_value());
      } else {
        ExpectFound(entries[i]);
      }
    }
  }
}

TEST_F(NvmeCatalogTest, FileBytesMatchTheDocumentedFormat) {
  Reopen();
  Append({Entry(KeyOf(1), "tenant", 1234567890123ull), Entry(KeyOf(2), "", 0)});
  catalog_.reset();
  std::vector<std::byte> expected = {std::byte{'K'}, std::byte{'V'}, std::byte{'F'}, std::byte{'C'},
                                     std::byte{2},   std::byte{0},   std::byte{0},   std::byte{0},
                                     std::byte{0},   std::byte{0},   std::byte{0},   std::byte{0}};
  PutU32(expected.data() + 8, crc32c::Mask(crc32c::Value(expected.data(), 8)));
  for (const auto& r :
       {SpecRecord(KeyOf(1), "tenant", 1234567890123ull), SpecRecord(KeyOf(2), "", 0)}) {
    expected.insert(expected.end(), r.begin(), r.end());
  }
  auto contents = ReadFileToString(&env_, LogPath());
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->size(), expected.size());
  EXPECT_EQ(std::memcmp(contents->data(), expected.data(), expected.size()), 0);
}

TEST_F(NvmeCatalogTest, RecordWithOverLongTenantLengthIsCorruptNotAllocated) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  catalog_.reset();
  // A record whose CRC holds but whose tenant length (1000, above
  // kMaxNamespaceBytes) disagrees with its 4-byte tenant.
  WriteRaw(SpecRecord(KeyOf(2), "abcd", 2, uint16_t{1000}));

  Reopen();
  EXPECT_EQ(report_.corrupt_records, 1u);
  EXPECT_EQ(report_.torn_records, 0u);
  EXPECT_FALSE(catalog_->Find(KeyOf(2)).has_value());
  Append({Entry(KeyOf(3), "c", 3)});
  Reopen();
  EXPECT_EQ(report_.corrupt_records, 1u);
  EXPECT_EQ(report_.records, 2u);
  ExpectFound(Entry(KeyOf(1), "a", 1));
  ExpectFound(Entry(KeyOf(3), "c", 3));
}

TEST_F(NvmeCatalogTest, AbsurdRecordLengthIsNeverTrusted) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  const uint64_t good_end = LogSize();
  catalog_.reset();
  // A prefix claiming a 2 GiB body, then a few bytes.
  std::vector<std::byte> bad(kCatalogRecordPrefixBytes + 16, std::byte{0x5a});
  PutU32(bad.data() + 4, 0x7fffffffu);

  // At the end of the log it is a torn tail.
  WriteRaw(bad);
  Reopen();
  EXPECT_EQ(report_.torn_records, 1u);
  EXPECT_EQ(report_.corrupt_records, 0u);
  EXPECT_EQ(report_.truncated_bytes, bad.size());
  EXPECT_EQ(LogSize(), good_end);
  ExpectFound(Entry(KeyOf(1), "a", 1));

  // Followed by an intact record, it is one corrupt region and the record
  // after it survives.
  catalog_.reset();
  WriteRaw(bad);
  WriteRaw(SpecRecord(KeyOf(2), "b", 2));
  Reopen();
  EXPECT_EQ(report_.corrupt_records, 1u);
  EXPECT_EQ(report_.torn_records, 0u);
  EXPECT_EQ(report_.records, 2u);
  ExpectFound(Entry(KeyOf(1), "a", 1));
  ExpectFound(Entry(KeyOf(2), "b", 2));
}

TEST_F(NvmeCatalogTest, CompactKeepsExactlyTheLiveKeysAndSurvivesReopen) {
  Reopen();
  for (uint64_t i = 0; i < 10; ++i) Append({Entry(KeyOf(i), "t" + std::to_string(i % 3), i)});
  Append({Entry(KeyOf(4), "newer", 400)});
  const uint64_t before = LogSize();
  const std::vector<BlockDigest> live = {KeyOf(0), KeyOf(4), KeyOf(4), KeyOf(7), KeyOf(99)};
  ASSERT_TRUE(catalog_->Compact(live).ok());
  EXPECT_FALSE(env_.FileExists(TempPath()));

  const std::vector<CatalogEntry> kept = {Entry(KeyOf(0), "t0", 0), Entry(KeyOf(4), "newer", 400),
                                          Entry(KeyOf(7), "t1", 7)};
  uint64_t expected_bytes = kCatalogFileHeaderBytes;
  for (const CatalogEntry& e : kept) expected_bytes += CatalogRecordBytes(e);
  auto check = [&] {
    for (const CatalogEntry& e : kept) ExpectFound(e);
    for (uint64_t i : {1, 2, 3, 5, 6, 8, 9, 99}) EXPECT_FALSE(catalog_->Find(KeyOf(i))) << i;
    const CatalogStats stats = catalog_->stats();
    EXPECT_EQ(stats.live_entries, 3u);
    EXPECT_EQ(stats.records, 3u);
    EXPECT_EQ(stats.tenants, 3u);
    EXPECT_EQ(stats.file_bytes, expected_bytes);
  };
  check();
  EXPECT_LT(LogSize(), before);
  EXPECT_EQ(catalog_->stats().compactions, 1u);

  Crash(/*drop_unsynced=*/true);
  Reopen();
  EXPECT_EQ(report_.records, 3u);
  EXPECT_EQ(report_.corrupt_records + report_.torn_records, 0u);
  check();

  // Appends go to the new log.
  Append({Entry(KeyOf(11), "t0", 11)});
  Crash(/*drop_unsynced=*/true);
  Reopen();
  ExpectFound(Entry(KeyOf(11), "t0", 11));
  EXPECT_EQ(report_.records, 4u);
}

TEST_F(NvmeCatalogTest, CompactWithoutKeysDropsForgottenAndSupersededRecords) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1), Entry(KeyOf(1), "a", 2), Entry(KeyOf(2), "b", 3)});
  EXPECT_TRUE(catalog_->Forget(KeyOf(2)));
  EXPECT_FALSE(catalog_->Forget(KeyOf(2)));
  ASSERT_TRUE(catalog_->Compact().ok());
  EXPECT_EQ(catalog_->stats().records, 1u);
  Reopen();
  EXPECT_EQ(report_.records, 1u);
  ExpectFound(Entry(KeyOf(1), "a", 2));
  EXPECT_FALSE(catalog_->Find(KeyOf(2)).has_value());
}

TEST_F(NvmeCatalogTest, FailedCompactLeavesTheOldLogInUse) {
  const uint64_t seed = TestSeed("NvmeCatalogTest.FailedCompactLeavesTheOldLogInUse");
  Reopen();
  Append({Entry(KeyOf(1), "a", 1), Entry(KeyOf(2), "b", 2)});
  const uint64_t before = LogSize();
  env_.SetWriteFailureOneIn(1, seed);  // every write and sync fails
  const BlockDigest live[] = {KeyOf(1)};
  Status s = catalog_->Compact(live);
  EXPECT_TRUE(s.IsUnavailable()) << s;
  env_.SetWriteFailureOneIn(0, seed);
  EXPECT_FALSE(env_.FileExists(TempPath()));
  EXPECT_EQ(LogSize(), before);
  ExpectFound(Entry(KeyOf(2), "b", 2));  // nothing dropped from memory either
  Append({Entry(KeyOf(3), "c", 3)});
  Crash(/*drop_unsynced=*/true);
  Reopen();
  EXPECT_EQ(report_.records, 3u);
  ExpectFound(Entry(KeyOf(1), "a", 1));
  ExpectFound(Entry(KeyOf(3), "c", 3));
}

TEST_F(NvmeCatalogTest, AppendFailingBeyondRollbackRefusesAppendsUntilCompact) {
  const uint64_t seed =
      TestSeed("NvmeCatalogTest.AppendFailingBeyondRollbackRefusesAppendsUntilCompact");
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  env_.SetWriteFailureOneIn(1, seed);  // the write fails, and so does the rollback
  Status s = catalog_->AppendBatch(std::vector<CatalogEntry>{Entry(KeyOf(2), "b", 2)});
  EXPECT_TRUE(s.IsUnavailable()) << s;
  env_.SetWriteFailureOneIn(0, seed);
  s = catalog_->AppendBatch(std::vector<CatalogEntry>{Entry(KeyOf(3), "c", 3)});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("reopen"), std::string_view::npos) << s;
  EXPECT_FALSE(catalog_->Find(KeyOf(2)).has_value());

  ASSERT_TRUE(catalog_->Compact().ok());  // rewrites the file from memory
  Append({Entry(KeyOf(4), "d", 4)});
  Crash(/*drop_unsynced=*/true);
  Reopen();
  EXPECT_EQ(report_.torn_records + report_.corrupt_records, 0u);
  ExpectFound(Entry(KeyOf(1), "a", 1));
  ExpectFound(Entry(KeyOf(4), "d", 4));
  EXPECT_FALSE(catalog_->Find(KeyOf(2)).has_value());
  EXPECT_FALSE(catalog_->Find(KeyOf(3)).has_value());
}

TEST_F(NvmeCatalogTest, UnderInjectedWriteFailuresOnlyAcknowledgedBatchesAreRecorded) {
  const uint64_t seed =
      TestSeed("NvmeCatalogTest.UnderInjectedWriteFailuresOnlyAcknowledgedBatchesAreRecorded");
  std::mt19937_64 rng(seed);
  Reopen();
  std::map<BlockDigest, CatalogEntry> acknowledged;
  std::vector<BlockDigest> refused;
  uint64_t failures = 0;
  env_.SetWriteFailureOneIn(3, seed);
  for (int batch = 0; batch < 60; ++batch) {
    std::vector<CatalogEntry> entries;
    for (int i = 0; i < 3; ++i) entries.push_back(Entry(RandomKey(rng), RandomTenant(rng), rng()));
    Status s = catalog_->AppendBatch(entries);
    if (s.ok()) {
      for (const CatalogEntry& e : entries) acknowledged[e.key] = e;
      continue;
    }
    ++failures;
    for (const CatalogEntry& e : entries) refused.push_back(e.key);
    if (s.code() == StatusCode::kFailedPrecondition) {
      // The rollback failed too: rewrite the file (without injected faults).
      env_.SetWriteFailureOneIn(0, seed);
      Status c = catalog_->Compact();
      ASSERT_TRUE(c.ok()) << c;
      env_.SetWriteFailureOneIn(3, rng());
    }
  }
  env_.SetWriteFailureOneIn(0, seed);
  EXPECT_GT(failures, 0u);
  EXPECT_GT(acknowledged.size(), 0u);
  Crash(/*drop_unsynced=*/true);
  Reopen();
  EXPECT_EQ(report_.torn_records + report_.corrupt_records, 0u);
  EXPECT_EQ(report_.entries, acknowledged.size());
  for (const auto& [key, entry] : acknowledged) ExpectFound(entry);
  for (const BlockDigest& key : refused) EXPECT_FALSE(catalog_->Find(key).has_value());
}

TEST_F(NvmeCatalogTest, LeftoverTempFileIsDeletedAtOpen) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  catalog_.reset();
  ASSERT_TRUE(WriteStringToFileSync(&env_, "half a compaction", TempPath() + ".x").ok());
  ASSERT_TRUE(env_.RenameFile(TempPath() + ".x", TempPath()).ok());
  Reopen();
  EXPECT_TRUE(report_.deleted_temp);
  EXPECT_FALSE(env_.FileExists(TempPath()));
  ExpectFound(Entry(KeyOf(1), "a", 1));
}

TEST_F(NvmeCatalogTest, DamagedHeaderIsFailedPreconditionAndTheFileIsKept) {
  Reopen();
  Append({Entry(KeyOf(1), "a", 1)});
  catalog_.reset();
  const uint64_t size = LogSize();
  for (uint64_t byte : {0, 5, 9}) {  // magic, version, CRC
    SCOPED_TRACE("byte " + std::to_string(byte));
    ASSERT_TRUE(env_.CorruptBytes(LogPath(), byte, 1, byte).ok());
    Status s = OpenStatus();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("move it aside"), std::string_view::npos) << s;
    EXPECT_EQ(LogSize(), size);
    ASSERT_TRUE(env_.CorruptBytes(LogPath(), byte, 1, byte).ok());  // flips the same bit back
    Reopen();
    ExpectFound(Entry(KeyOf(1), "a", 1));
    catalog_.reset();
  }
  TruncateLog(5);
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(LogSize(), 5u);
}

TEST_F(NvmeCatalogTest, OtherFormatVersionIsFailedPrecondition) {
  Reopen();
  catalog_.reset();
  std::byte header[kCatalogFileHeaderBytes] = {};
  for (size_t i = 0; i < 4; ++i) header[i] = static_cast<std::byte>(kCatalogMagic[i]);
  header[4] = std::byte{3};
  PutU32(header + 8, crc32c::Mask(crc32c::Value(header, 8)));
  WriteRaw(header, 0);
  Status s = OpenStatus();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("format version 3"), std::string_view::npos) << s;
}

// Issue 17: a version-1 log keyed blocks by their block key alone, so its
// records cannot say which namespace's block is which. It is replaced by an
// empty version-2 log (the daemon then drops those blocks as orphans).
TEST_F(NvmeCatalogTest, VersionOneLogIsReplacedByAnEmptyLog) {
  Reopen();
  catalog_.reset();
  std::vector<std::byte> v1(kCatalogFileHeaderBytes);
  for (size_t i = 0; i < 4; ++i) v1[i] = static_cast<std::byte>(kCatalogMagic[i]);
  v1[4] = std::byte{1};
  PutU32(v1.data() + 8, crc32c::Mask(crc32c::Value(v1.data(), 8)));
  // One version-1 record: key, token_offset, tenant length, tenant.
  std::vector<std::byte> r(8 + 42 + 1);
  PutU32(r.data() + 4, 43);
  r[48] = std::byte{1};
  r[50] = std::byte{'a'};
  PutU32(r.data(), crc32c::Mask(crc32c::Value(r.data() + 4, 4 + 43)));
  v1.insert(v1.end(), r.begin(), r.end());
  WriteRaw(v1, 0);
  Reopen();
  EXPECT_EQ(report_.dropped_v1_bytes, v1.size());
  EXPECT_EQ(report_.records, 0u);
  EXPECT_EQ(LogSize(), kCatalogFileHeaderBytes);
  // It is a version-2 log now: appends and reopens work.
  Append({Entry(KeyOf(1), "a", 1)});
  Reopen();
  EXPECT_EQ(report_.dropped_v1_bytes, 0u);
  ExpectFound(Entry(KeyOf(1), "a", 1));
}

TEST_F(NvmeCatalogTest, ConcurrentAppendsAreAllRecorded) {
  Reopen();
  constexpr int kThreads = 4;
  constexpr int kBatches = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int b = 0; b < kBatches; ++b) {
        const uint64_t n = uint64_t(t) * kBatches + b;
        EXPECT_TRUE(catalog_
                        ->AppendBatch(std::vector<CatalogEntry>{
                            Entry(KeyOf(2 * n), "t" + std::to_string(t), n),
                            Entry(KeyOf(2 * n + 1), "t" + std::to_string(t), n)})
                        .ok());
        EXPECT_TRUE(catalog_->Find(KeyOf(2 * n)).has_value());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  Reopen();
  EXPECT_EQ(report_.records, uint64_t{2} * kThreads * kBatches);
  EXPECT_EQ(report_.corrupt_records + report_.torn_records, 0u);
  for (int t = 0; t < kThreads; ++t) {
    for (int b = 0; b < kBatches; ++b) {
      const uint64_t n = uint64_t(t) * kBatches + b;
      ExpectFound(Entry(KeyOf(2 * n + 1), "t" + std::to_string(t), n));
    }
  }
}

}  // namespace
}  // namespace kvfabric::cache_host
