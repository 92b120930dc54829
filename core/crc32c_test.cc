#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric::crc32c {
namespace {

using ExtendFn = std::uint32_t (*)(std::uint32_t, const void*, std::size_t);

struct Impl {
  const char* name;
  ExtendFn extend;
};

// Every implementation this machine can run: the portable path always, the
// hardware path where the CPU has it, and the dispatching public entry point.
std::vector<Impl> RunnableImpls() {
  std::vector<Impl> impls = {{"portable", &internal::ExtendPortable},
                             {"dispatch", static_cast<ExtendFn>(&Extend)}};
  if (internal::HardwareAvailable()) impls.push_back({"hardware", &internal::ExtendHardware});
  if (internal::FoldingAvailable()) impls.push_back({"folding", &internal::ExtendFolding});
  return impls;
}

TEST(Crc32cTest, StandardCheckValueOnEveryPath) {
  const std::string input = "123456789";
  for (const Impl& impl : RunnableImpls()) {
    EXPECT_EQ(impl.extend(0, input.data(), input.size()), 0xE3069283u) << impl.name;
  }
  EXPECT_EQ(Value(input.data(), input.size()), 0xE3069283u);
}

TEST(Crc32cTest, EmptyInputIsZeroAndExtendOfEmptyIsIdentity) {
  for (const Impl& impl : RunnableImpls()) {
    EXPECT_EQ(impl.extend(0, nullptr, 0), 0u) << impl.name;
    EXPECT_EQ(impl.extend(0x12345678u, nullptr, 0), 0x12345678u) << impl.name;
  }
  EXPECT_EQ(Value(std::span<const std::byte>()), 0u);
}

// RFC 3720 (iSCSI) appendix B.4 test vectors.
TEST(Crc32cTest, MatchesRfc3720Vectors) {
  std::vector<std::uint8_t> zeros(32, 0x00);
  std::vector<std::uint8_t> ones(32, 0xFF);
  std::vector<std::uint8_t> ascending(32);
  std::vector<std::uint8_t> descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<std::uint8_t>(i);
    descending[i] = static_cast<std::uint8_t>(31 - i);
  }
  for (const Impl& impl : RunnableImpls()) {
    EXPECT_EQ(impl.extend(0, zeros.data(), zeros.size()), 0x8A9136AAu) << impl.name;
    EXPECT_EQ(impl.extend(0, ones.data(), ones.size()), 0x62A8AB43u) << impl.name;
    EXPECT_EQ(impl.extend(0, ascending.data(), ascending.size()), 0x46DD794Eu) << impl.name;
    EXPECT_EQ(impl.extend(0, descending.data(), descending.size()), 0x113FDB5Cu) << impl.name;
  }
}

// Long inputs exercise the hardware path's three-stripe combination for both
// stripe sizes; a wrong shift table changes every one of these values.
TEST(Crc32cTest, LongInputsAgreeAcrossPathsOnKnownPattern) {
  std::vector<std::uint8_t> data(3 * 8192 * 2 + 3 * 256 + 13);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31 + 7);
  // Reference: the plain bitwise definition, independent of both tables.
  std::uint32_t bitwise = 0xffffffffu;
  for (std::uint8_t b : data) {
    bitwise ^= b;
    for (int k = 0; k < 8; ++k)
      bitwise = (bitwise & 1) ? (bitwise >> 1) ^ 0x82f63b78u : bitwise >> 1;
  }
  bitwise ^= 0xffffffffu;
  for (const Impl& impl : RunnableImpls()) {
    EXPECT_EQ(impl.extend(0, data.data(), data.size()), bitwise) << impl.name;
  }
}

TEST(Crc32cTest, HardwareMatchesPortableOnRandomLengthsAlignmentsAndSplits) {
  if (!internal::HardwareAvailable()) GTEST_SKIP() << "no hardware CRC32C on this CPU/build";
  const std::uint64_t seed =
      TestSeed("Crc32cTest.HardwareMatchesPortableOnRandomLengthsAlignmentsAndSplits");
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> buffer(3 * 8192 * 3 + 64);
  for (auto& b : buffer) b = static_cast<std::uint8_t>(rng());
  for (int iter = 0; iter < 2000; ++iter) {
    const std::size_t offset = rng() % 16;
    // Mostly short lengths, sometimes long enough for the striped paths.
    const std::size_t max_len = (iter % 4 == 0) ? buffer.size() - offset : 1024;
    const std::size_t len = rng() % (max_len + 1);
    const std::size_t split = len == 0 ? 0 : rng() % (len + 1);
    const std::uint8_t* p = buffer.data() + offset;
    const std::uint32_t init = (iter % 3 == 0) ? static_cast<std::uint32_t>(rng()) : 0;

    const std::uint32_t portable = internal::ExtendPortable(init, p, len);
    ASSERT_EQ(internal::ExtendHardware(init, p, len), portable)
        << "seed " << seed << " offset " << offset << " len " << len;
    const std::uint32_t hw_split =
        internal::ExtendHardware(internal::ExtendHardware(init, p, split), p + split, len - split);
    ASSERT_EQ(hw_split, portable) << "seed " << seed << " len " << len << " split " << split;
    const std::uint32_t sw_split =
        internal::ExtendPortable(internal::ExtendPortable(init, p, split), p + split, len - split);
    ASSERT_EQ(sw_split, portable) << "seed " << seed << " len " << len << " split " << split;
  }
}

// The folding path (inputs of 1 KiB and more): every length around its
// 256-byte main loop and 16-byte tail, every alignment, a non-zero incoming
// CRC, and a single flipped bit anywhere in a long input.
TEST(Crc32cTest, FoldingMatchesPortableAroundEveryBoundary) {
  if (!internal::FoldingAvailable()) GTEST_SKIP() << "no AVX-512 VPCLMULQDQ on this CPU/build";
  const std::uint64_t seed = TestSeed("Crc32cTest.FoldingMatchesPortableAroundEveryBoundary");
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> buffer((1u << 20) + 128);
  for (auto& b : buffer) b = static_cast<std::uint8_t>(rng());
  std::vector<std::size_t> lengths;
  for (std::size_t len = 1000; len <= 1600; ++len) lengths.push_back(len);
  for (std::size_t k : {4096u, 8192u, 65536u, 1u << 20}) {
    for (std::size_t d = 0; d < 20; ++d) lengths.push_back(k - d);
  }
  for (int i = 0; i < 300; ++i) lengths.push_back(1024 + rng() % ((1u << 20) - 1024));
  for (std::size_t len : lengths) {
    const std::size_t offset = rng() % 64;
    const std::uint32_t init = static_cast<std::uint32_t>(rng());
    const std::uint8_t* p = buffer.data() + offset;
    ASSERT_EQ(internal::ExtendFolding(init, p, len), internal::ExtendPortable(init, p, len))
        << "seed " << seed << " offset " << offset << " len " << len;
  }
  std::vector<std::uint8_t> block(buffer.begin(), buffer.begin() + (64 << 10));
  const std::uint32_t intact = internal::ExtendFolding(0, block.data(), block.size());
  for (int i = 0; i < 200; ++i) {
    const std::size_t bit = rng() % (block.size() * 8);
    block[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
    const std::uint32_t flipped = internal::ExtendFolding(0, block.data(), block.size());
    EXPECT_NE(flipped, intact) << "seed " << seed << " bit " << bit;
    EXPECT_EQ(flipped, internal::ExtendPortable(0, block.data(), block.size()))
        << "seed " << seed << " bit " << bit;
    block[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
  }
}

// ExtendCopy, through each of its paths and the dispatching entry point,
// with and without streaming stores: the destination holds the source's
// bytes and nothing past them changed, and the CRC is the one Extend gives,
// for lengths around the 64-byte head, the 256-byte loop and the read-back
// piece and the `crc32` path's stripes, at every source and destination
// alignment mod 64.
TEST(Crc32cTest, ExtendCopyCopiesAndReturnsTheCrcOfWhatItStored) {
  const std::uint64_t seed = TestSeed("Crc32cTest.ExtendCopyCopiesAndReturnsTheCrcOfWhatItStored");
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> src((1u << 18) + 256);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng());
  std::vector<std::size_t> lengths = {0, 1, 63, 64, 255, 256, 257, 1023, 1024, 1025, 1279, 1280};
  // 768 and 24576: three stripes of the `crc32` path's short and long loops.
  for (std::size_t k : {std::size_t{768}, std::size_t{4096}, std::size_t{24576}, kCopyPieceBytes,
                        std::size_t{1} << 18}) {
    for (std::size_t d = 0; d < 4; ++d) lengths.push_back(k - d);
  }
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % (1u << 18));
  using CopyFn = std::uint32_t (*)(std::uint32_t, void*, const void*, std::size_t, bool);
  std::vector<std::pair<const char*, CopyFn>> paths = {
      {"dispatch", &ExtendCopy},
      {"read-back", [](std::uint32_t c, void* d, const void* s, std::size_t n, bool) {
         return internal::ExtendCopyReadBack(c, d, s, n);
       }}};
  if (internal::FoldingAvailable()) paths.push_back({"folding", &internal::ExtendCopyFolding});
  if (internal::HardwareAvailable()) paths.push_back({"crc32", &internal::ExtendCopyHardware});
  std::vector<std::uint8_t> dst(src.size() + 128);
  for (const auto& [name, copy] : paths) {
    for (bool streaming : {false, true}) {
      for (std::size_t len : lengths) {
        const std::size_t from = rng() % 64;
        const std::size_t to = rng() % 64;
        const auto init = static_cast<std::uint32_t>(rng());
        std::fill(dst.begin(), dst.end(), std::uint8_t{0xa5});
        const std::uint32_t got = copy(init, dst.data() + to, src.data() + from, len, streaming);
        ASSERT_EQ(got, internal::ExtendPortable(init, src.data() + from, len))
            << name << " streaming " << streaming << " seed " << seed << " len " << len << " from "
            << from << " to " << to;
        ASSERT_EQ(std::memcmp(dst.data() + to, src.data() + from, len), 0)
            << name << " len " << len;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          if (i < to || i >= to + len) {
            ASSERT_EQ(dst[i], 0xa5) << name << " wrote byte " << i;
          }
        }
      }
    }
  }
}

TEST(Crc32cTest, ExtendOfValueEqualsValueOfConcatenation) {
  const std::uint64_t seed = TestSeed("Crc32cTest.ExtendOfValueEqualsValueOfConcatenation");
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    std::string a(rng() % 300, '\0');
    std::string b(rng() % 300, '\0');
    for (char& c : a) c = static_cast<char>(rng());
    for (char& c : b) c = static_cast<char>(rng());
    const std::string ab = a + b;
    ASSERT_EQ(Extend(Value(a.data(), a.size()), b.data(), b.size()), Value(ab.data(), ab.size()))
        << "seed " << seed << " |a| " << a.size() << " |b| " << b.size();
  }
  const std::string hello = "hello ";
  const std::string world = "world";
  EXPECT_EQ(Extend(Value(hello.data(), hello.size()), world.data(), world.size()),
            Value("hello world", 11));
}

TEST(Crc32cTest, CombineEqualsValueOfConcatenationWithoutTheBytes) {
  const std::uint64_t seed =
      TestSeed("Crc32cTest.CombineEqualsValueOfConcatenationWithoutTheBytes");
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    // Lengths from empty to past a megabyte, so the power table's high
    // entries are used.
    const std::size_t la = (iter % 5 == 0) ? rng() % (3u << 20) : rng() % 500;
    const std::size_t lb = (iter % 7 == 0) ? rng() % (3u << 20) : rng() % 500;
    std::string ab(la + lb, '\0');
    for (char& c : ab) c = static_cast<char>(rng());
    const std::uint32_t a = Value(ab.data(), la);
    const std::uint32_t b = Value(ab.data() + la, lb);
    ASSERT_EQ(Combine(a, b, lb), Value(ab.data(), ab.size()))
        << "seed " << seed << " |a| " << la << " |b| " << lb;
  }
  EXPECT_EQ(Combine(0xdeadbeefu, 0, 0), 0xdeadbeefu);          // B empty
  EXPECT_EQ(Combine(0, Value("abc", 3), 3), Value("abc", 3));  // A empty
  // Folding per-slice CRCs gives the whole CRC (how block format v2 ties its
  // layer table to the header's payload CRC).
  std::string payload(64 * 1024, '\0');
  for (char& c : payload) c = static_cast<char>(rng());
  std::uint32_t folded = 0;
  for (std::size_t at = 0; at < payload.size(); at += 8192) {
    folded = Combine(folded, Value(payload.data() + at, 8192), 8192);
  }
  EXPECT_EQ(folded, Value(payload.data(), payload.size()));
}

TEST(Crc32cTest, ValueDependsOnEveryByte) {
  std::vector<std::uint8_t> data(100, 0x5A);
  const std::uint32_t base = Value(data.data(), data.size());
  for (std::size_t i = 0; i < data.size(); ++i) {
    data[i] ^= 0x01;
    EXPECT_NE(Value(data.data(), data.size()), base) << "byte " << i;
    data[i] ^= 0x01;
  }
}

TEST(Crc32cTest, MaskRoundTripsAndChangesTheValue) {
  const std::string foo = "foo";
  const std::uint32_t crc = Value(foo.data(), foo.size());
  EXPECT_NE(crc, Mask(crc));
  EXPECT_NE(crc, Mask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
  const std::uint64_t seed = TestSeed("Crc32cTest.MaskRoundTripsAndChangesTheValue");
  std::mt19937 rng(seed);
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t v = rng();
    ASSERT_EQ(Unmask(Mask(v)), v) << "seed " << seed << " value " << v;
  }
  for (std::uint32_t v : {0u, 1u, 0xffffffffu, kMaskDelta}) EXPECT_EQ(Unmask(Mask(v)), v);
}

}  // namespace
}  // namespace kvfabric::crc32c
