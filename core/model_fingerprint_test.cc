// Tests of ModelFingerprint's block-key v2 fields (docs/block-key.md, section
// 6): their limits and refusals, the v1 compatibility rule, the digest each
// field changes, the value-head arithmetic, the KV scales digest and the RoPE
// canonical form. The v1 fields and keys are block_key_test.cc's.
#include "core/model_fingerprint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "core/status.h"
#include "core/statusor.h"
#include "core/testing/block_key_golden.h"

namespace kvfabric {
namespace {

ModelFingerprint Llama8bV2() { return testing::GoldenLlama8bV2(); }

FingerprintDigest SomeScalesDigest() {
  const float k[] = {0.5f, 0.25f}, v[] = {0.75f, 1.5f};
  StatusOr<FingerprintDigest> d = KvScalesDigest(k, v, 2);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : FingerprintDigest{};
}

bool Contains(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string_view::npos;
}

std::string DigestHex(const ModelFingerprint& fp) {
  StatusOr<FingerprintDigest> d = fp.Digest();
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? FingerprintDigestToHex(*d) : "";
}

TEST(ModelFingerprintV2Test, NewFingerprintsUseV2WithEveryNewFieldUnstated) {
  ModelFingerprint fp;
  EXPECT_EQ(fp.key_version, 2u);
  EXPECT_EQ(fp.key_version, kLatestBlockKeyVersion);
  EXPECT_TRUE(fp.weights_revision.empty() && fp.quantization.empty() &&
              fp.kv_scale_scheme.empty() && fp.rope.empty());
  EXPECT_EQ(fp.kv_scales_digest, FingerprintDigest{});
  EXPECT_EQ(fp.v_head_dim, 0u);
  EXPECT_EQ(fp.vocab_size, 0u);
  EXPECT_TRUE(Llama8bV2().Validate().ok()) << Llama8bV2().Validate();
}

TEST(ModelFingerprintV2Test, EachNewFieldChangesTheDigest) {
  const ModelFingerprint base = Llama8bV2();
  std::map<std::string, std::string> seen = {{DigestHex(base), "base"}};
  auto differs = [&](const char* what, const ModelFingerprint& fp) {
    auto [it, inserted] = seen.emplace(DigestHex(fp), what);
    EXPECT_TRUE(inserted) << what << " has the digest of " << it->second;
  };
  ModelFingerprint fp = base;
  fp.weights_revision = "5206a32e0bd3067aef1ce90f5528ade7d866253f";
  differs("weights_revision", fp);
  fp = base;
  fp.quantization = "awq-int4";
  differs("quantization", fp);
  fp = base;
  fp.kv_scale_scheme = "fp8-per-tensor";
  fp.kv_scales_digest = SomeScalesDigest();
  differs("kv_scale_scheme and kv_scales_digest", fp);
  fp.kv_scales_digest[31] ^= 1;
  differs("kv_scales_digest alone", fp);
  fp.kv_scale_scheme = "fp8-per-head";
  differs("kv_scale_scheme alone", fp);
  fp = base;
  fp.rope = "theta=1000000";
  differs("rope", fp);
  fp = base;
  fp.v_head_dim = 64;
  differs("v_head_dim", fp);
  fp = base;
  fp.vocab_size = 128000;
  differs("vocab_size", fp);
  fp.vocab_size = 0;
  differs("vocab_size unstated", fp);
  fp = base;
  fp.key_version = 1;
  fp.weights_revision.clear();
  fp.rope.clear();
  fp.vocab_size = 0;
  differs("the same v1 fields under v1", fp);
  fp.key_version = 2;
  differs("the same v1 fields under v2", fp);
}

TEST(ModelFingerprintV2Test, ValueHeadDimEqualToHeadDimIsHashedAsUnstated) {
  ModelFingerprint a = Llama8bV2(), b = Llama8bV2();
  b.v_head_dim = b.head_dim;
  EXPECT_EQ(DigestHex(a), DigestHex(b));
  EXPECT_EQ(a.EffectiveVHeadDim(), 128u);
  b.v_head_dim = 96;
  EXPECT_EQ(b.EffectiveVHeadDim(), 96u);
  EXPECT_NE(DigestHex(a), DigestHex(b));
}

TEST(ModelFingerprintV2Test, NeighbouringTextFieldsCannotAbsorbEachOther) {
  ModelFingerprint a = Llama8bV2(), b = Llama8bV2();
  a.weights_revision = "ab";
  a.quantization = "c";
  b.weights_revision = "a";
  b.quantization = "bc";
  EXPECT_NE(DigestHex(a), DigestHex(b));
  a = b = Llama8bV2();
  a.quantization = "x";
  a.kv_scale_scheme = "";
  b.quantization = "";
  b.kv_scale_scheme = "x";
  b.kv_scales_digest = SomeScalesDigest();
  a.kv_scales_digest = {};
  EXPECT_NE(DigestHex(a), DigestHex(b));
  a = b = Llama8bV2();
  a.model_id = "m";
  a.weights_revision = "";
  b.model_id = "m";
  b.weights_revision = std::string("\0", 1);  // NUL is data
  EXPECT_NE(DigestHex(a), DigestHex(b));
}

struct BadCase {
  const char* name;
  void (*mutate)(ModelFingerprint&);
  const char* message_part;
};

// The refusals of each v2 field are in block_key_test's table of invalid
// fields (RejectsEachInvalidFieldWithAClearMessage); these are their limits.
TEST(ModelFingerprintV2Test, AcceptsEachV2FieldAtItsLimit) {
  ModelFingerprint fp = Llama8bV2();
  fp.weights_revision.assign(256, 'r');
  fp.quantization.assign(64, 'q');
  fp.kv_scale_scheme.assign(64, 's');
  fp.kv_scales_digest = SomeScalesDigest();
  fp.rope = "scaling=" + std::string(248, 'a');
  EXPECT_TRUE(fp.Validate().ok()) << fp.Validate();
}

TEST(ModelFingerprintV2Test, KeyVersion1RefusesEveryV2OnlyFieldNamingIt) {
  const BadCase cases[] = {
      {"weights_revision", [](ModelFingerprint& f) { f.weights_revision = "abc"; },
       "weights_revision \"abc\""},
      {"quantization", [](ModelFingerprint& f) { f.quantization = "awq-int4"; }, "quantization"},
      {"kv_scale_scheme",
       [](ModelFingerprint& f) {
         f.kv_scale_scheme = "fp8-per-tensor";
         f.kv_scales_digest[0] = 1;
       },
       "kv_scale_scheme"},
      {"kv_scales_digest", [](ModelFingerprint& f) { f.kv_scales_digest[0] = 1; },
       "kv_scales_digest"},
      {"rope", [](ModelFingerprint& f) { f.rope = "theta=10000"; }, "rope"},
      {"v_head_dim", [](ModelFingerprint& f) { f.v_head_dim = 64; }, "v_head_dim 64"},
      {"vocab_size", [](ModelFingerprint& f) { f.vocab_size = 32000; }, "vocab_size 32000"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    ModelFingerprint fp = Llama8bV2();
    fp.weights_revision.clear();
    fp.rope.clear();
    fp.vocab_size = 0;
    fp.key_version = 1;
    ASSERT_TRUE(fp.Validate().ok()) << fp.Validate();
    c.mutate(fp);
    Status s = fp.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s, c.message_part)) << s;
    EXPECT_TRUE(Contains(s, "cannot be expressed in block-key v1; set key_version 2")) << s;
    fp.key_version = 2;  // the same value is fine under v2
    if (std::string(c.name) != "kv_scales_digest") {
      EXPECT_TRUE(fp.Validate().ok()) << fp.Validate();
    }
  }
  // v_head_dim == head_dim says what v1 assumes: accepted.
  ModelFingerprint fp = Llama8bV2();
  fp.weights_revision.clear();
  fp.rope.clear();
  fp.vocab_size = 0;
  fp.key_version = 1;
  fp.v_head_dim = fp.head_dim;
  EXPECT_TRUE(fp.Validate().ok()) << fp.Validate();
}

TEST(ModelFingerprintV2Test, Fp8AndInt8WithoutAScaleSchemeAreUnscaledAndAccepted) {
  for (KvDtype dtype : {KvDtype::kFp8E4M3, KvDtype::kInt8}) {
    ModelFingerprint unscaled = Llama8bV2();
    unscaled.dtype = dtype;
    EXPECT_TRUE(unscaled.Validate().ok()) << unscaled.Validate();
    ModelFingerprint scaled = unscaled;
    scaled.kv_scale_scheme = "fp8-per-tensor";
    scaled.kv_scales_digest = SomeScalesDigest();
    EXPECT_TRUE(scaled.Validate().ok()) << scaled.Validate();
    EXPECT_NE(DigestHex(unscaled), DigestHex(scaled));
  }
  // A scheme on a 16-bit cache is accepted too (hashing more never shares wrongly).
  ModelFingerprint bf16 = Llama8bV2();
  bf16.kv_scale_scheme = "per-tensor";
  bf16.kv_scales_digest = SomeScalesDigest();
  EXPECT_TRUE(bf16.Validate().ok()) << bf16.Validate();
}

TEST(ModelFingerprintV2Test, BlockBytesCountsKeyAndValueHeadsSeparately) {
  ModelFingerprint fp = Llama8bV2();
  EXPECT_EQ(*fp.BlockBytes(), 32u * 2 * 16 * 8 * 128 * 2);
  fp.v_head_dim = 128;
  EXPECT_EQ(*fp.BlockBytes(), 32u * 2 * 16 * 8 * 128 * 2);
  fp.layer_count = 3;
  fp.kv_heads = 1;
  fp.head_dim = 192;
  fp.v_head_dim = 128;
  EXPECT_EQ(*fp.BlockBytes(), 3u * 16 * 1 * (192 + 128) * 2);
  fp.dtype = KvDtype::kFp8E4M3;
  EXPECT_EQ(*fp.BlockBytes(), 3u * 16 * 1 * (192 + 128) * 1);

  ModelFingerprint huge = Llama8bV2();
  huge.layer_count = 0xffffffffu;
  huge.kv_heads = 0xffffffffu;
  huge.head_dim = 0xffffffffu;
  huge.v_head_dim = 0xffffffffu;
  StatusOr<std::uint64_t> overflow = huge.BlockBytes();
  EXPECT_EQ(overflow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(overflow.status(), "v_head_dim=4294967295")) << overflow.status();
}

TEST(ModelFingerprintV2Test, UnequalKeyAndValueHalvesAreKeyedButNotStorable) {
  ModelFingerprint fp = Llama8bV2();
  EXPECT_TRUE(fp.RequireEqualKvHalves().ok());
  fp.v_head_dim = fp.head_dim;
  EXPECT_TRUE(fp.RequireEqualKvHalves().ok());
  fp.v_head_dim = 64;
  EXPECT_TRUE(fp.Validate().ok());
  EXPECT_TRUE(fp.Digest().ok());
  Status s = fp.RequireEqualKvHalves();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s;
  EXPECT_TRUE(Contains(s, "v_head_dim 64 != head_dim 128")) << s;
}

TEST(ModelFingerprintV2Test, ToStringShowsTheV2FieldsThatAreSet) {
  ModelFingerprint fp = Llama8bV2();
  fp.v_head_dim = 64;
  const std::string text = fp.ToString();
  for (const char* part : {"key_version=2", "weights_revision=0e9e39f2", "rope=factor=8;",
                           "v_head_dim=64", "vocab_size=128256"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
  }
  EXPECT_EQ(text.find("quantization="), std::string::npos) << text;
}

// ------------------------------------------------------------ KV scales

TEST(KvScalesDigestTest, IsSha256OfEachLayersKThenVScalesAsF32LittleEndian) {
  const float k[] = {0.5f, 0.25f, 0.125f, 1.0f};  // 2 layers x 2 heads
  const float v[] = {2.0f, 0.0625f, 3.5f, 0.375f};
  std::string bytes;
  for (const float* f : {&k[0], &k[1], &v[0], &v[1], &k[2], &k[3], &v[2], &v[3]}) {
    std::uint32_t bits;
    std::memcpy(&bits, f, 4);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(bits >> (8 * i)));
  }
  StatusOr<Sha256Digest> expected = Sha256Of(bytes);
  ASSERT_TRUE(expected.ok());
  StatusOr<FingerprintDigest> d = KvScalesDigest(k, v, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, *expected);
  // The same values as one layer of four heads are other bytes in another order.
  EXPECT_NE(*KvScalesDigest(k, v, 1), *d);
  // The reference script's value (docs/block-key.md, scales per_head_2x2).
  EXPECT_EQ(FingerprintDigestToHex(*d),
            "ed04873e3ce07a2cfe7a7a37c9294ccde383aa2440f0b17446c7ff0fd759b6e5");
}

TEST(KvScalesDigestTest, RefusesMismatchedCountsAndScalesThatAreNotPositive) {
  const float two[] = {1.0f, 2.0f}, three[] = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(KvScalesDigest(two, three, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvScalesDigest(three, three, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvScalesDigest(two, two, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvScalesDigest({}, {}, 1).status().code(), StatusCode::kInvalidArgument);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const float v[] = {1.0f, bad};
    Status s = KvScalesDigest(two, v, 2).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(s, "v scale 1 (layer 1)")) << s;
  }
}

// ------------------------------------------------------------ RoPE

TEST(RopeCanonicalFormTest, NumbersAreShortestRoundTripWithoutExponent) {
  const std::pair<double, const char*> cases[] = {
      {500000.0, "500000"},
      {1e6, "1000000"},
      {8.0, "8"},
      {0.25, "0.25"},
      {1e-5, "0.00001"},
      {0.1, "0.1"},
      {-2.5, "-2.5"},
      {-0.0, "0"},
      {0.0, "0"},
      {1e21, "1000000000000000000000"},
      {1.0 / 3, "0.3333333333333333"},
  };
  for (const auto& [value, text] : cases) {
    StatusOr<std::string> got = CanonicalRopeNumber(value);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, text);
  }
  EXPECT_FALSE(CanonicalRopeNumber(std::nan("")).ok());
  EXPECT_FALSE(CanonicalRopeNumber(std::numeric_limits<double>::infinity()).ok());
}

TEST(RopeCanonicalFormTest, AcceptsCanonicalStringsAndNamesWhatIsNot) {
  for (const char* good :
       {"", "theta=10000",
        "factor=8;high_freq_factor=4;low_freq_factor=1;original_max_position_embeddings=8192;"
        "scaling=llama3;theta=500000",
        "long_factor=1,1.5,2;scaling=longrope;theta=10000", "mscale=0.707;scaling=yarn",
        "a=-1;b=true;c=sha256-0a1b"}) {
    EXPECT_TRUE(ValidateRope(good).ok()) << good << ": " << ValidateRope(good);
  }
  const std::pair<const char*, const char*> bad[] = {
      {"theta=1e6", "write 1e6 as 1000000"},
      {"theta=500000.0", "write 500000.0 as 500000"},
      {"theta=010", "write 010 as 10"},
      {"theta=-0", "write -0 as 0"},
      {"theta=10000;", "is not key=value"},
      {"theta", "is not key=value"},
      {"theta=1;factor=8", "key factor follows theta"},
      {"theta=1;theta=2", "key theta follows theta"},
      {"Theta=1", "key \"Theta\""},
      {"=1", "key \"\""},
      {"theta=", "theta has an empty value"},
      {"scaling=Llama3", "scaling=Llama3"},
      {"scaling=.x", "scaling=.x"},
      {"theta=-inf", "is not a finite decimal number"},
      {"f=1,,2", "\"\" is not a finite decimal number"},
      {"theta=1 ", "is not a finite decimal number"},
  };
  for (const auto& [text, part] : bad) {
    Status s = ValidateRope(text);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(Contains(s, part)) << text << ": " << s;
  }
}

}  // namespace
}  // namespace kvfabric
