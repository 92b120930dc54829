// The io_uring engine on the real filesystem (io_uring cannot go through
// FaultInjectionEnv): a batch round trip, O_DIRECT alignment checks, and an
// NvmeTier round trip with recovery. Skipped, with one line, where the kernel
// refuses io_uring.
#include "server/cache_host/uring_io_engine.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/io_uring_probe.h"
#include "gtest/gtest.h"
#include "server/cache_host/nvme_tier.h"

namespace kvfabric::cache_host {
namespace {

class UringIoEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status probe = ProbeIoUring();
    if (!probe.ok()) GTEST_SKIP() << "io_uring unavailable here: " << probe;
    std::string tmpl = ::testing::TempDir() + "kvf_uring_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(UringIoEngineTest, BatchRoundTripWithDirectIoAndAlignmentChecks) {
  auto engine = NewUringIoEngine({.queue_depth = 8, .rings = 2});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->name(), "io_uring");
  FileOptions o;
  o.direct_io = true;
  o.create = true;
  auto file = (*engine)->Open(dir_ + "/f", o);
  ASSERT_TRUE(file.ok()) << file.status();
  constexpr size_t kUnits = 20;  // more than one ring's worth
  auto out = AlignedBuffer::Allocate(kUnits * 4096, 4096);
  auto in = AlignedBuffer::Allocate(kUnits * 4096, 4096);
  ASSERT_TRUE(out.ok() && in.ok());
  std::mt19937_64 rng(12);
  for (auto& b : out->span()) b = std::byte(rng());
  std::vector<IoRequest> batch(kUnits);
  for (size_t i = 0; i < kUnits; ++i) {
    batch[i].op = IoRequest::Op::kWrite;
    batch[i].file = file->get();
    batch[i].offset = i * 4096;
    batch[i].buffer = out->span().subspan(i * 4096, 4096);
  }
  (*engine)->Run(batch);
  for (const IoRequest& r : batch) ASSERT_TRUE(r.status.ok()) << r.status;
  IoRequest sync;
  sync.op = IoRequest::Op::kSync;
  sync.file = file->get();
  (*engine)->Run({&sync, 1});
  ASSERT_TRUE(sync.status.ok()) << sync.status;
  for (size_t i = 0; i < kUnits; ++i) {
    batch[i].op = IoRequest::Op::kRead;
    batch[i].buffer = in->span().subspan(i * 4096, 4096);
  }
  (*engine)->Run(batch);
  for (const IoRequest& r : batch) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.bytes_done, 4096u);
  }
  EXPECT_EQ(std::memcmp(in->data(), out->data(), kUnits * 4096), 0);
  IoRequest bad;
  bad.op = IoRequest::Op::kRead;
  bad.file = file->get();
  bad.offset = 100;
  bad.buffer = in->span().first(4096);
  (*engine)->Run({&bad, 1});
  EXPECT_TRUE(bad.status.IsInvalidArgument()) << bad.status;
  file->reset();
}

TEST_F(UringIoEngineTest, NvmeTierRoundTripsAndRecoversOverIoUring) {
  NvmeTierOptions o;
  o.dir = dir_ + "/tier";
  o.env = Env::Default();
  o.io_engine = IoEngineKind::kUring;
  o.capacity_bytes = uint64_t{64} << 20;
  o.segment_bytes = uint64_t{1} << 20;
  o.max_group_bytes = size_t{256} << 10;
  std::mt19937_64 rng(13);
  std::vector<BlockHeader> headers;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<NvmeLocation> locs;
  {
    auto opened = NvmeTier::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status();
    NvmeTier& tier = *opened->tier;
    EXPECT_EQ(tier.engine_name(), "io_uring");
    for (int i = 0; i < 40; ++i) {
      BlockHeader h;
      h.layers = 1 + static_cast<uint32_t>(rng() % 40);
      h.tokens = 16;
      h.kv_heads = 1;
      h.head_dim = 8;
      for (auto& k : h.key) k = static_cast<uint8_t>(rng());
      std::vector<std::byte> p(size_t{512} * h.layers);
      for (auto& x : p) x = std::byte(rng());
      ASSERT_TRUE(SealBlock(&h, p).ok());
      auto loc = tier.DemoteAndWait(h, p);
      ASSERT_TRUE(loc.ok()) << loc.status();
      headers.push_back(h);
      payloads.push_back(std::move(p));
      locs.push_back(*loc);
    }
  }
  auto opened = NvmeTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->blocks.size(), headers.size());
  for (size_t i = 0; i < headers.size(); ++i) {
    EXPECT_EQ(opened->blocks[i].location, locs[i]);
    auto buf = AlignedBuffer::Allocate(opened->tier->ReadBufferBytes(locs[i]), 4096);
    ASSERT_TRUE(buf.ok());
    auto h = opened->tier->Read(locs[i], headers[i].key, buf->span());
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(*h, headers[i]);
    EXPECT_EQ(std::memcmp(buf->data() + kBlockHeaderBytes, payloads[i].data(), payloads[i].size()),
              0);
  }
}

}  // namespace
}  // namespace kvfabric::cache_host
