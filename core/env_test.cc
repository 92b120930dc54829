#include "core/env.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace kvfabric {
namespace {

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::string Str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

FileOptions CreateOptions() {
  FileOptions o;
  o.create = true;
  return o;
}

// A fresh directory under the test temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "kvf_env_test_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl << ": " << std::strerror(errno);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

class PosixEnvTest : public ::testing::Test {
 protected:
  Env* env_ = Env::Default();
  ScratchDir dir_;
};

TEST_F(PosixEnvTest, DefaultIsOneProcessWideInstance) { EXPECT_EQ(Env::Default(), env_); }

TEST_F(PosixEnvTest, WrittenBytesReadBackAtTheirOffsets) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Write(0, Bytes("hello world")).ok());
  ASSERT_TRUE((*file)->Write(6, Bytes("WORLD")).ok());
  ASSERT_TRUE((*file)->Sync().ok());

  std::vector<std::byte> buf(11);
  auto n = (*file)->Read(0, buf);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 11u);
  EXPECT_EQ(Str(buf), "hello WORLD");

  std::vector<std::byte> mid(3);
  ASSERT_EQ(*(*file)->Read(2, mid), 3u);
  EXPECT_EQ(Str(mid), "llo");
  EXPECT_EQ(*(*file)->Size(), 11u);
  EXPECT_TRUE((*file)->Close().ok());
}

TEST_F(PosixEnvTest, ReadAtEndOfFileReportsShortCount) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Write(0, Bytes("0123456789")).ok());

  std::vector<std::byte> buf(8, std::byte{0x55});
  auto n = (*file)->Read(6, buf);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(Str(std::span(buf).first(4)), "6789");
  EXPECT_EQ(buf[4], std::byte{0x55}) << "bytes past the short read must be untouched";

  EXPECT_EQ(*(*file)->Read(10, buf), 0u);
  EXPECT_EQ(*(*file)->Read(1000, buf), 0u);
}

TEST_F(PosixEnvTest, WritePastEndFillsGapWithZeros) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Write(4, Bytes("x")).ok());
  std::vector<std::byte> buf(5);
  ASSERT_EQ(*(*file)->Read(0, buf), 5u);
  EXPECT_EQ(Str(buf), std::string("\0\0\0\0x", 5));
}

TEST_F(PosixEnvTest, TruncateShrinksAndGrows) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Write(0, Bytes("abcdef")).ok());
  ASSERT_TRUE((*file)->Truncate(2).ok());
  EXPECT_EQ(*(*file)->Size(), 2u);
  ASSERT_TRUE((*file)->Truncate(4).ok());
  std::vector<std::byte> buf(8);
  ASSERT_EQ(*(*file)->Read(0, buf), 4u);
  EXPECT_EQ(Str(std::span(buf).first(4)), std::string("ab\0\0", 4));
}

TEST_F(PosixEnvTest, OpenMissingFileWithoutCreateIsNotFoundNamingThePath) {
  const std::string path = dir_.File("missing");
  auto file = env_->NewRandomRWFile(path, FileOptions{});
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(file.status().IsNotFound()) << file.status();
  EXPECT_NE(file.status().message().find("open " + path), std::string_view::npos) << file.status();
  EXPECT_FALSE(env_->FileExists(path)) << "a failed open must not create the file";
}

TEST_F(PosixEnvTest, TruncateOptionEmptiesExistingFile) {
  const std::string path = dir_.File("f");
  ASSERT_TRUE(WriteStringToFileSync(env_, "old contents", path).ok());
  FileOptions o;
  o.truncate = true;
  auto file = env_->NewRandomRWFile(path, o);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->Size(), 0u);
}

TEST_F(PosixEnvTest, ExclusiveCreateRefusesExistingFile) {
  const std::string path = dir_.File("f");
  FileOptions o = CreateOptions();
  o.exclusive = true;
  ASSERT_TRUE(env_->NewRandomRWFile(path, o).ok());
  auto again = env_->NewRandomRWFile(path, o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status();
}

TEST_F(PosixEnvTest, ReadOnlyFileRefusesWrites) {
  const std::string path = dir_.File("f");
  ASSERT_TRUE(WriteStringToFileSync(env_, "abc", path).ok());
  FileOptions o;
  o.read_only = true;
  auto file = env_->NewRandomRWFile(path, o);
  ASSERT_TRUE(file.ok()) << file.status();
  Status s = (*file)->Write(0, Bytes("x"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ((*file)->Truncate(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFileToString(env_, path), "abc");
}

TEST_F(PosixEnvTest, ClosedFileRefusesEveryCall) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  std::vector<std::byte> buf(1);
  EXPECT_EQ((*file)->Read(0, buf).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*file)->Write(0, Bytes("x")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*file)->Sync().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*file)->Close().code(), StatusCode::kFailedPrecondition);
}

TEST_F(PosixEnvTest, ConcurrentWritesAtDistinctOffsetsAllLand) {
  auto file = env_->NewRandomRWFile(dir_.File("f"), CreateOptions());
  ASSERT_TRUE(file.ok());
  RandomRWFile* f = file->get();
  constexpr int kThreads = 4;
  constexpr int kChunksPerThread = 64;
  constexpr size_t kChunk = 512;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([f, t] {
      std::vector<std::byte> chunk(kChunk, static_cast<std::byte>('a' + t));
      for (int i = 0; i < kChunksPerThread; ++i) {
        uint64_t offset = (static_cast<uint64_t>(i) * kThreads + t) * kChunk;
        EXPECT_TRUE(f->Write(offset, chunk).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::byte> all(kThreads * kChunksPerThread * kChunk);
  ASSERT_EQ(*f->Read(0, all), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i], static_cast<std::byte>('a' + (i / kChunk) % kThreads)) << "byte " << i;
  }
}

TEST_F(PosixEnvTest, WriteStringToFileSyncReplacesContentsAndLeavesNoTemporary) {
  const std::string path = dir_.File("CURRENT");
  ASSERT_TRUE(WriteStringToFileSync(env_, "first", path).ok());
  EXPECT_EQ(*ReadFileToString(env_, path), "first");
  ASSERT_TRUE(WriteStringToFileSync(env_, "second, longer", path).ok());
  EXPECT_EQ(*ReadFileToString(env_, path), "second, longer");
  ASSERT_TRUE(WriteStringToFileSync(env_, "", path).ok());
  EXPECT_EQ(*ReadFileToString(env_, path), "");
  auto children = env_->GetChildren(dir_.path());
  ASSERT_TRUE(children.ok());
  EXPECT_EQ(*children, std::vector<std::string>{"CURRENT"});
}

TEST_F(PosixEnvTest, ReadFileToStringReadsFilesLargerThanOneChunk) {
  std::string data(200 * 1024 + 7, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  const std::string path = dir_.File("big");
  ASSERT_TRUE(WriteStringToFileSync(env_, data, path).ok());
  auto read = ReadFileToString(env_, path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == data);
  EXPECT_TRUE(ReadFileToString(env_, dir_.File("nope")).status().IsNotFound());
}

TEST_F(PosixEnvTest, GetChildrenListsEntriesSortedWithoutDots) {
  ASSERT_TRUE(WriteStringToFileSync(env_, "b", dir_.File("b")).ok());
  ASSERT_TRUE(WriteStringToFileSync(env_, "a", dir_.File("a")).ok());
  ASSERT_TRUE(env_->CreateDirIfMissing(dir_.File("sub")).ok());
  auto children = env_->GetChildren(dir_.path());
  ASSERT_TRUE(children.ok()) << children.status();
  EXPECT_EQ(*children, (std::vector<std::string>{"a", "b", "sub"}));
  EXPECT_TRUE(env_->GetChildren(dir_.File("nope")).status().IsNotFound());
}

TEST_F(PosixEnvTest, DirectoriesAreCreatedIdempotentlyAndDeletedWhenEmpty) {
  const std::string sub = dir_.File("sub");
  ASSERT_TRUE(env_->CreateDirIfMissing(sub).ok());
  ASSERT_TRUE(env_->CreateDirIfMissing(sub).ok());
  EXPECT_TRUE(env_->FileExists(sub));
  ASSERT_TRUE(WriteStringToFileSync(env_, "x", sub + "/f").ok());
  EXPECT_FALSE(env_->DeleteDir(sub).ok()) << "a non-empty directory must not be removed";
  ASSERT_TRUE(env_->DeleteFile(sub + "/f").ok());
  ASSERT_TRUE(env_->DeleteDir(sub).ok());
  EXPECT_FALSE(env_->FileExists(sub));

  ASSERT_TRUE(WriteStringToFileSync(env_, "x", dir_.File("plain")).ok());
  EXPECT_EQ(env_->CreateDirIfMissing(dir_.File("plain")).code(), StatusCode::kAlreadyExists);
}

TEST_F(PosixEnvTest, RenameReplacesTargetAndDeleteRemoves) {
  const std::string a = dir_.File("a");
  const std::string b = dir_.File("b");
  ASSERT_TRUE(WriteStringToFileSync(env_, "from a", a).ok());
  ASSERT_TRUE(WriteStringToFileSync(env_, "from b", b).ok());
  ASSERT_TRUE(env_->RenameFile(a, b).ok());
  EXPECT_FALSE(env_->FileExists(a));
  EXPECT_EQ(*ReadFileToString(env_, b), "from a");
  EXPECT_EQ(*env_->GetFileSize(b), 6u);
  ASSERT_TRUE(env_->DeleteFile(b).ok());
  EXPECT_FALSE(env_->FileExists(b));

  Status s = env_->DeleteFile(b);
  EXPECT_TRUE(s.IsNotFound()) << s;
  EXPECT_NE(s.message().find(b), std::string_view::npos) << s;
  auto size = env_->GetFileSize(b);
  EXPECT_TRUE(size.status().IsNotFound()) << size.status();
  EXPECT_NE(size.status().message().find("stat " + b), std::string_view::npos);
  EXPECT_TRUE(env_->RenameFile(a, b).IsNotFound());
}

TEST_F(PosixEnvTest, SyncDirSucceedsOnDirectoryAndFailsOnMissingOne) {
  EXPECT_TRUE(env_->SyncDir(dir_.path()).ok());
  Status s = env_->SyncDir(dir_.File("nope"));
  EXPECT_TRUE(s.IsNotFound()) << s;
}

TEST(DirNameTest, TakesEverythingBeforeTheLastComponent) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("a/b/"), "a");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(DirName("/a//c"), "/a");
}

TEST_F(PosixEnvTest, MonotonicClockAdvancesAcrossSleep) {
  uint64_t before = env_->NowMicros();
  env_->SleepForMicros(2000);
  uint64_t after = env_->NowMicros();
  EXPECT_GE(after - before, 2000u);  // a lower bound nanosleep guarantees
  // 2020-01-01 in microseconds since the epoch: the wall clock is in real time.
  EXPECT_GT(env_->WallMicros(), 1577836800ull * 1000000);
}

// ---- O_DIRECT ----

TEST(AlignedBufferTest, IsAlignedZeroedAndMovable) {
  auto buf = AlignedBuffer::Allocate(10000, 4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 4096, 0u);
  EXPECT_EQ(buf->size(), 10000u);
  for (std::byte b : buf->span()) ASSERT_EQ(b, std::byte{0});
  AlignedBuffer moved = std::move(*buf);
  EXPECT_EQ(moved.size(), 10000u);
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_TRUE(AlignedBuffer::Allocate(100, 3000).status().IsInvalidArgument());
}

class DirectIoTest : public PosixEnvTest {
 protected:
  void SetUp() override {
    FileOptions o = CreateOptions();
    o.direct_io = true;
    auto probe = env_->NewRandomRWFile(dir_.File("probe"), o);
    if (!probe.ok() && probe.status().IsInvalidArgument()) {
      GTEST_SKIP() << "the test temp dir " << dir_.path()
                   << " refuses O_DIRECT (run with TEST_TMPDIR on ext4 or xfs): " << probe.status();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
  }

  std::unique_ptr<RandomRWFile> OpenDirect(std::string_view name) {
    FileOptions o = CreateOptions();
    o.direct_io = true;
    auto file = env_->NewRandomRWFile(dir_.File(name), o);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? std::move(*file) : nullptr;
  }

  const size_t align_ = env_->DirectIoAlignment();
};

TEST_F(DirectIoTest, AlignmentIsDocumented4096) { EXPECT_EQ(align_, 4096u); }

TEST_F(DirectIoTest, AlignedWritesReadBack) {
  auto file = OpenDirect("direct");
  ASSERT_NE(file, nullptr);
  auto out = AlignedBuffer::Allocate(3 * align_, align_);
  ASSERT_TRUE(out.ok());
  for (size_t i = 0; i < out->size(); ++i) out->data()[i] = static_cast<std::byte>(i * 7 + 1);
  ASSERT_TRUE(file->Write(align_, out->span()).ok());
  ASSERT_TRUE(file->Sync().ok());
  EXPECT_EQ(*file->Size(), 4 * align_);

  auto in = AlignedBuffer::Allocate(4 * align_, align_);
  ASSERT_TRUE(in.ok());
  auto n = file->Read(0, in->span());
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 4 * align_);
  for (size_t i = 0; i < align_; ++i) ASSERT_EQ(in->data()[i], std::byte{0});
  EXPECT_EQ(std::memcmp(in->data() + align_, out->data(), out->size()), 0);

  // Reading past the end is a short read, not an error.
  auto tail = file->Read(3 * align_, in->span());
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, align_);
}

TEST_F(DirectIoTest, MisalignedCallsAreRejectedNamingTheValue) {
  auto file = OpenDirect("direct");
  ASSERT_NE(file, nullptr);
  auto buf = AlignedBuffer::Allocate(2 * align_, align_);
  ASSERT_TRUE(buf.ok());

  Status s = file->Write(100, buf->span().first(align_));
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("offset 100"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("4096"), std::string_view::npos) << s;

  s = file->Write(0, buf->span().first(1000));
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("length 1000"), std::string_view::npos) << s;

  s = file->Write(0, buf->span().subspan(8, align_));
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("buffer address"), std::string_view::npos) << s;

  auto r = file->Read(512, buf->span().first(align_));
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  EXPECT_EQ(*file->Size(), 0u) << "a rejected write must not touch the file";
}

// Opening with O_DIRECT where the filesystem refuses it must say so clearly.
void ExpectDirectIoRefusal(const StatusOr<std::unique_ptr<RandomRWFile>>& file,
                           const std::string& path) {
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(file.status().IsInvalidArgument()) << file.status();
  EXPECT_NE(file.status().message().find("O_DIRECT is not supported"), std::string_view::npos)
      << file.status();
  EXPECT_NE(file.status().message().find(path), std::string_view::npos) << file.status();
}

TEST(DirectIoRefusalTest, TmpfsPathIsRefusedWithClearMessageOrRoundTrips) {
  if (!Env::Default()->FileExists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  Env* env = Env::Default();
  const std::string path = "/dev/shm/kvf_env_test_odirect_" + std::to_string(::getpid());
  FileOptions o = CreateOptions();
  o.direct_io = true;
  auto file = env->NewRandomRWFile(path, o);
  if (file.ok()) {
    // Linux 6.6 and later support O_DIRECT on tmpfs; then it must work.
    std::cout << "note: this kernel accepts O_DIRECT on tmpfs\n";
    auto buf = AlignedBuffer::Allocate(4096, 4096);
    ASSERT_TRUE(buf.ok());
    buf->data()[0] = std::byte{42};
    EXPECT_TRUE((*file)->Write(0, buf->span()).ok());
    (*file)->Close().IgnoreError();  // the file is deleted next
    ASSERT_TRUE(env->DeleteFile(path).ok());
    return;
  }
  ExpectDirectIoRefusal(file, path);
  EXPECT_FALSE(env->FileExists(path)) << "a refused O_DIRECT open must not leave a file";
}

TEST(DirectIoRefusalTest, ProcfsFileIsRefusedWithClearMessage) {
  const std::string path = "/proc/self/status";
  if (!Env::Default()->FileExists(path)) GTEST_SKIP() << "no procfs";
  FileOptions o;
  o.direct_io = true;
  o.read_only = true;
  ExpectDirectIoRefusal(Env::Default()->NewRandomRWFile(path, o), path);
}

}  // namespace
}  // namespace kvfabric
