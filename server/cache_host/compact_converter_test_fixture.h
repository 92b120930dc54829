// The fixture of the tests that run the compact converter over a real node
// (compact_converter_test.cc, compact_eviction_test.cc): a CacheHostNodeTest
// with a converter, blocks of finite fp16 values it can encode, and a check
// that a copy decodes to within the codec's bound.
#ifndef KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_TEST_FIXTURE_H_
#define KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_TEST_FIXTURE_H_

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/block_key.h"
#include "core/crc32c.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/float_convert.h"
#include "server/cache_host/cache_host_node_test_fixture.h"
#include "server/cache_host/compact_converter.h"

namespace kvfabric::cache_host::node_test {

inline BlockKey CompactKey(const BlockKey& exact) {
  return CompactInt8BlockKey(exact);
}

inline gpu::CompactShape ShapeOf(const BlockMeta& m) {
  return {m.dtype, m.layers, m.tokens, m.kv_heads, m.head_dim};
}

class CompactConverterTest : public CacheHostNodeTest {
 protected:
  void TearDown() override {
    converter_.reset();  // before the node
    CacheHostNodeTest::TearDown();
  }

  CompactConverterOptions ConverterOptions(int threads) {
    CompactConverterOptions o;
    o.threads = threads;
    o.max_block_bytes = 4 << 20;
    o.retry_interval = std::chrono::milliseconds(5);
    return o;
  }

  void StartConverter(CompactConverterOptions o) {
    auto c = CompactConverter::Create(std::move(o), node_.get());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    converter_ = std::move(*c);
  }

  // Fills staging [offset, +meta.bytes) with finite fp16 values in [-4, 4)
  // (a NaN at element `nan_at` if given) and returns them as floats.
  std::vector<float> FillFp16(const BlockMeta& meta, std::uint64_t offset,
                              std::optional<std::size_t> nan_at = std::nullopt) {
    std::mt19937_64 g(seed_ ^ offset ^ meta.token_offset);
    std::uniform_real_distribution<float> d(-4.0f, 4.0f);
    const std::size_t n = meta.bytes / 2;
    std::vector<float> values(n);
    auto dst = Staging(offset, meta.bytes);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t bits = gpu::FloatToFp16Bits(d(g));
      if (nan_at == i) bits = 0x7e00;
      values[i] = gpu::Fp16BitsToFloat(bits);
      std::memcpy(dst.data() + 2 * i, &bits, 2);
    }
    return values;
  }

  // Reserve, put staging [offset, +meta.bytes) as it is, commit.
  Status PutStaged(const std::string& ns, const BlockKey& key, const BlockMeta& meta,
                   std::uint64_t offset) {
    ReserveEntry e{key, meta};
    auto r = node_->Reserve(Namespace{ns}, std::span<const ReserveEntry>(&e, 1), 0);
    if (!r.ok()) return r.status();
    if (!r->results[0].status.ok()) return r->results[0].status;
    KVF_RETURN_IF_ERROR(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token,
                                      region_, Ranges(r->results[0].extents, offset),
                                      Clock::now() + std::chrono::seconds(10)));
    CommitEntry c{key, crc32c::Value(Staging(offset, meta.bytes))};
    auto s = node_->Commit(Namespace{ns}, GrantRef{r->grant.lease_id, r->grant.token},
                           std::span<const CommitEntry>(&c, 1), true);
    if (!s.ok()) return s.status();
    return (*s)[0];
  }

  // Reads the compact copy of `exact_key` (lease, fetch, client-side CRC
  // check) and checks that it decodes to within the codec's bound of
  // `exact`: half a scale step, the scale at most the block's largest |x|
  // over 127, plus the scale's fp16 rounding.
  void ExpectCopyDecodesTo(const std::string& ns, const BlockKey& exact_key, const BlockMeta& meta,
                           const std::vector<float>& exact) {
    const BlockKey ckey = CompactKey(exact_key);
    auto looked = node_->Lookup(Namespace{ns}, std::span<const BlockKey>(&ckey, 1));
    ASSERT_TRUE(looked[0].status.ok()) << looked[0].status.ToString();
    const BlockMeta& cm = looked[0].meta;
    EXPECT_EQ(cm.representation, BlockRepresentation::kCompactInt8);
    EXPECT_EQ(cm.dtype, meta.dtype);
    EXPECT_EQ(cm.token_offset, meta.token_offset);
    EXPECT_EQ(cm.fingerprint, meta.fingerprint);
    const std::uint64_t bytes =
        gpu::CompactPayloadBytes(meta.layers, meta.tokens, meta.kv_heads, meta.head_dim);
    ASSERT_EQ(cm.bytes, bytes);
    constexpr std::uint64_t kAt = 6 << 20;
    ASSERT_TRUE(Get(ns, ckey, kAt).ok());  // checks the bytes against the block's CRC
    EXPECT_EQ(crc32c::Value(Staging(kAt, bytes)), looked[0].crc32c);
    std::vector<float> decoded(exact.size());
    ASSERT_TRUE(gpu::DecodeCompactInt8(ShapeOf(meta), Staging(kAt, bytes), decoded).ok());
    float max_abs = 0;
    for (float x : exact) max_abs = std::max(max_abs, std::fabs(x));
    const float bound = max_abs / 127.0f * (0.5f + 1.0f / 1024.0f);
    for (std::size_t i = 0; i < exact.size(); ++i) {
      ASSERT_LE(std::fabs(decoded[i] - exact[i]), bound) << "element " << i;
    }
  }

  bool HasCopy(const std::string& ns, const BlockKey& exact_key) {
    const BlockKey ckey = CompactKey(exact_key);
    return node_->Lookup(Namespace{ns}, std::span<const BlockKey>(&ckey, 1))[0].status.ok();
  }

  std::unique_ptr<CompactConverter> converter_;
};

}  // namespace kvfabric::cache_host::node_test

#endif  // KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_TEST_FIXTURE_H_
