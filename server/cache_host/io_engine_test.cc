#include "server/cache_host/io_engine.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/aligned_buffer.h"
#include "gtest/gtest.h"

namespace kvfabric::cache_host {
namespace {

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "kvf_io_engine_test_XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

TEST(IoEngineTest, ThreadPoolBatchWritesSyncsAndReadsBackWithDirectIo) {
  const std::string dir = MakeTempDir();
  auto engine = NewThreadPoolIoEngine(Env::Default(), 3);
  EXPECT_EQ(engine->name(), "threads");
  FileOptions o;
  o.direct_io = true;
  o.create = true;
  auto file = engine->Open(dir + "/f", o);
  ASSERT_TRUE(file.ok()) << file.status();
  constexpr size_t kUnits = 32;
  auto out = AlignedBuffer::Allocate(kUnits * 4096, 4096);
  auto in = AlignedBuffer::Allocate(kUnits * 4096, 4096);
  ASSERT_TRUE(out.ok() && in.ok());
  std::mt19937_64 rng(11);
  for (auto& b : out->span()) b = std::byte(rng());
  std::vector<IoRequest> batch(kUnits);
  for (size_t i = 0; i < kUnits; ++i) {
    batch[i].op = IoRequest::Op::kWrite;
    batch[i].file = file->get();
    batch[i].offset = i * 4096;
    batch[i].buffer = out->span().subspan(i * 4096, 4096);
  }
  engine->Run(batch);
  for (const IoRequest& r : batch) ASSERT_TRUE(r.status.ok()) << r.status;
  IoRequest sync;
  sync.op = IoRequest::Op::kSync;
  sync.file = file->get();
  engine->Run({&sync, 1});
  ASSERT_TRUE(sync.status.ok()) << sync.status;
  for (size_t i = 0; i < kUnits; ++i) {
    batch[i].op = IoRequest::Op::kRead;
    batch[i].buffer = in->span().subspan(i * 4096, 4096);
  }
  engine->Run(batch);
  for (const IoRequest& r : batch) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.bytes_done, 4096u);
  }
  EXPECT_EQ(std::memcmp(in->data(), out->data(), kUnits * 4096), 0);
  // A read past the end is short, not an error.
  IoRequest past;
  past.op = IoRequest::Op::kRead;
  past.file = file->get();
  past.offset = kUnits * 4096;
  past.buffer = in->span().first(4096);
  engine->Run({&past, 1});
  EXPECT_TRUE(past.status.ok());
  EXPECT_EQ(past.bytes_done, 0u);
  file->reset();
  std::filesystem::remove_all(dir);
}

TEST(IoEngineTest, ParsesKindNames) {
  EXPECT_EQ(*ParseIoEngineKind("auto"), IoEngineKind::kAuto);
  EXPECT_EQ(*ParseIoEngineKind("uring"), IoEngineKind::kUring);
  EXPECT_EQ(*ParseIoEngineKind("threads"), IoEngineKind::kThreads);
  EXPECT_TRUE(ParseIoEngineKind("aio").status().IsInvalidArgument());
  EXPECT_EQ(IoEngineKindName(IoEngineKind::kThreads), "threads");
}

}  // namespace
}  // namespace kvfabric::cache_host
