#include "client/synthetic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/kernels/float_convert.h"

namespace kvfabric::client {
namespace {

ModelFingerprint SmallModel(KvDtype dtype) {
  ModelFingerprint m;
  m.model_id = "synthetic/test";
  m.layer_count = 2;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.dtype = dtype;
  m.tokens_per_block = 16;
  return m;
}

TEST(SyntheticKvTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const ModelFingerprint m = SmallModel(KvDtype::kFp16);
  const std::uint64_t bytes = *m.BlockBytes();
  std::vector<std::byte> a(bytes), b(bytes), c(bytes);
  ASSERT_TRUE(SyntheticKv(m, 7, 16, a).ok());
  ASSERT_TRUE(SyntheticKv(m, 7, 16, b).ok());
  ASSERT_TRUE(SyntheticKv(m, 8, 16, c).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(SyntheticKvTest, ValuesAreFiniteAndBelowOneInEveryDtype) {
  for (KvDtype d : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    const ModelFingerprint m = SmallModel(d);
    std::vector<std::byte> a(*m.BlockBytes());
    ASSERT_TRUE(SyntheticKv(m, 3, 16, a).ok());
    const std::uint32_t e = KvDtypeSize(d);
    for (std::size_t i = 0; i < a.size(); i += e) {
      float x = 0;
      if (d == KvDtype::kFp32) {
        std::memcpy(&x, &a[i], 4);
      } else {
        std::uint16_t h = 0;
        std::memcpy(&h, &a[i], 2);
        x = d == KvDtype::kFp16 ? gpu::Fp16BitsToFloat(h) : gpu::Bf16BitsToFloat(h);
      }
      ASSERT_TRUE(std::isfinite(x)) << "element " << i / e;
      ASSERT_GE(std::fabs(x), 1.0f / 16) << "element " << i / e;
      ASSERT_LT(std::fabs(x), 1.0f) << "element " << i / e;
    }
  }
}

TEST(SyntheticKvTest, RowsPastAPartialBlockAreZero) {
  const ModelFingerprint m = SmallModel(KvDtype::kFp16);
  std::vector<std::byte> a(*m.BlockBytes());
  ASSERT_TRUE(SyntheticKv(m, 3, 5, a).ok());
  const std::size_t row = 2 * 16 * 2, half = row * 16;
  for (std::size_t base = 0; base < a.size(); base += half) {
    for (std::size_t i = 5 * row; i < half; ++i) ASSERT_EQ(a[base + i], std::byte{0});
    bool nonzero = false;
    for (std::size_t i = 0; i < 5 * row; ++i) nonzero = nonzero || a[base + i] != std::byte{0};
    EXPECT_TRUE(nonzero);
  }
}

TEST(SyntheticKvTest, RefusesAWrongSizeOrDtype) {
  ModelFingerprint m = SmallModel(KvDtype::kFp16);
  std::vector<std::byte> a(*m.BlockBytes() - 2);
  EXPECT_EQ(SyntheticKv(m, 1, 16, a).code(), StatusCode::kInvalidArgument);
  m.dtype = KvDtype::kInt8;
  std::vector<std::byte> b(*m.BlockBytes());
  EXPECT_EQ(SyntheticKv(m, 1, 16, b).code(), StatusCode::kInvalidArgument);
}

TEST(ResidentAttentionTest, OutputIsAConvexCombinationOfValues) {
  const ModelFingerprint m = SmallModel(KvDtype::kFp16);
  const std::uint64_t bytes = *m.BlockBytes();
  std::vector<std::byte> history(3 * bytes);
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(SyntheticKv(m, 100 + b, 16, std::span(history).subspan(b * bytes, bytes)).ok());
  }
  std::vector<float> q(4 * 16, 0.5f), out(4 * 16), lse(4);
  ASSERT_TRUE(ResidentAttention(m, 4, 16, history, 40, 1, q, out, lse).ok());
  for (float x : out) EXPECT_LT(std::fabs(x), 1.0f);
  for (float x : lse) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(ResidentAttention(m, 4, 16, history, 49, 1, q, out, lse).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfabric::client
