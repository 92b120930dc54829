#include "core/units.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

using std::chrono::microseconds;

constexpr std::uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;

std::uint64_t BytesOrDie(std::string_view text) {
  StatusOr<std::uint64_t> r = ParseBytes(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status();
  return r.ok() ? *r : ~std::uint64_t{0};
}

std::int64_t MicrosOrDie(std::string_view text) {
  StatusOr<microseconds> r = ParseDuration(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status();
  return r.ok() ? r->count() : -1;
}

// Asserts that `text` is rejected with InvalidArgument, the message quoting it and containing
// `fragment`.
void ExpectBadBytes(std::string_view text, std::string_view fragment) {
  StatusOr<std::uint64_t> r = ParseBytes(text);
  ASSERT_FALSE(r.ok()) << "accepted \"" << text << "\" as " << *r;
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  EXPECT_NE(r.status().message().find(fragment), std::string_view::npos) << r.status();
}

void ExpectBadDuration(std::string_view text, std::string_view fragment) {
  StatusOr<microseconds> r = ParseDuration(text);
  ASSERT_FALSE(r.ok()) << "accepted \"" << text << "\" as " << r->count() << "us";
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  EXPECT_NE(r.status().message().find(fragment), std::string_view::npos) << r.status();
}

TEST(ParseBytesTest, PlainIntegersAreBytes) {
  EXPECT_EQ(BytesOrDie("0"), 0u);
  EXPECT_EQ(BytesOrDie("512"), 512u);
  EXPECT_EQ(BytesOrDie("512B"), 512u);
  EXPECT_EQ(BytesOrDie("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseBytesTest, SingleLettersAndIecSuffixesArePowersOf1024) {
  EXPECT_EQ(BytesOrDie("4K"), 4 * kKiB);
  EXPECT_EQ(BytesOrDie("4Ki"), 4 * kKiB);
  EXPECT_EQ(BytesOrDie("4KiB"), 4 * kKiB);
  EXPECT_EQ(BytesOrDie("64M"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("64MiB"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("2G"), 2 * kGiB);
  EXPECT_EQ(BytesOrDie("2GiB"), 2 * kGiB);
  EXPECT_EQ(BytesOrDie("3T"), 3 * kTiB);
  EXPECT_EQ(BytesOrDie("3TiB"), 3 * kTiB);
}

TEST(ParseBytesTest, TwoLetterSiSuffixesArePowersOf1000) {
  EXPECT_EQ(BytesOrDie("4KB"), 4000u);
  EXPECT_EQ(BytesOrDie("64MB"), 64000000u);
  EXPECT_EQ(BytesOrDie("2GB"), 2000000000u);
  EXPECT_EQ(BytesOrDie("3TB"), 3000000000000u);
}

TEST(ParseBytesTest, PrefixAndICaseInsensitiveButFinalBMustBeUpper) {
  EXPECT_EQ(BytesOrDie("64m"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("64miB"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("64MIB"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("4kB"), 4000u);
  ExpectBadBytes("64Mb", "bits");
  ExpectBadBytes("64mib", "bits");
  ExpectBadBytes("64b", "bits");
}

TEST(ParseBytesTest, WhitespaceAroundAndBetweenNumberAndUnit) {
  EXPECT_EQ(BytesOrDie("64 MiB"), 64 * kMiB);
  EXPECT_EQ(BytesOrDie("  64\tMiB \n"), 64 * kMiB);
  ExpectBadBytes("6 4MiB", "unknown unit");
  ExpectBadBytes("64 Mi B", "unknown unit");
}

TEST(ParseBytesTest, FractionsAllowedWhenResultIsWholeBytes) {
  EXPECT_EQ(BytesOrDie("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(BytesOrDie("1.50 KiB"), 1536u);
  EXPECT_EQ(BytesOrDie("0.5K"), 512u);
  EXPECT_EQ(BytesOrDie("1.1GB"), 1100000000u);
  ExpectBadBytes("0.5", "whole number");
  ExpectBadBytes("1.1KiB", "whole number");
  ExpectBadBytes("1.", "decimal point");
  ExpectBadBytes(".5K", "expected a number");
}

TEST(ParseBytesTest, RejectsOverflow) {
  ExpectBadBytes("18446744073709551616", "out of range");
  ExpectBadBytes("16777216TiB", "out of range");  // exactly 2^64
  EXPECT_EQ(BytesOrDie("16777215TiB"), 16777215 * kTiB);
  ExpectBadBytes("99999999999999999999999999999999999999999", "too many digits");
}

TEST(ParseBytesTest, RejectsNegativeEmptyAndGarbageQuotingTheText) {
  ExpectBadBytes("-1", "negative");
  ExpectBadBytes("-1", "\"-1\"");
  ExpectBadBytes("", "empty");
  ExpectBadBytes("   ", "empty");
  ExpectBadBytes("lots", "\"lots\"");
  ExpectBadBytes("+5", "expected a number");
  ExpectBadBytes("5QiB", "\"QiB\"");
  ExpectBadBytes("5 KiB extra", "unknown unit");
  ExpectBadBytes("1e6", "unknown unit");
  ExpectBadBytes("0x10", "unknown unit");
  // A control character in the input is escaped, so the message stays on one line.
  ExpectBadBytes("5\x01K", "\\x01");
}

TEST(FormatBytesTest, ExactMultiplesPrintAsWholeNumbers) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(kKiB), "1 KiB");
  EXPECT_EQ(FormatBytes(64 * kMiB), "64 MiB");
  EXPECT_EQ(FormatBytes(kGiB), "1 GiB");
  EXPECT_EQ(FormatBytes(2048 * kTiB), "2048 TiB");
}

TEST(FormatBytesTest, InexactValuesPrintOneRoundedDecimal) {
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.5 GiB");
  EXPECT_EQ(FormatBytes(64 * kMiB + 1), "64.0 MiB");
  EXPECT_EQ(FormatBytes(1025), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1024 + 972), "1.9 KiB");  // 1.949...
  EXPECT_EQ(FormatBytes(1024 + 973), "2.0 KiB");  // 1.950..., rounds up
  EXPECT_EQ(FormatBytes(kGiB - 1), "1.0 GiB");    // would be "1024.0 MiB": promoted
  EXPECT_EQ(FormatBytes(std::numeric_limits<std::uint64_t>::max()), "16777216.0 TiB");
}

TEST(FormatBytesTest, ExactFormAddsByteCountOnlyWhenRounded) {
  EXPECT_EQ(FormatBytesExact(64 * kMiB), "64 MiB");
  EXPECT_EQ(FormatBytesExact(64 * kMiB + 1), "64.0 MiB (67108865 bytes)");
}

TEST(FormatBytesTest, WholeNumberOutputParsesBackExactlyAndRoundedOutputIsWithinHalfATenth) {
  std::mt19937_64 rng(TestSeed(
      "FormatBytesTest.WholeNumberOutputParsesBackExactlyAndRoundedOutputIsWithinHalfATenth"));
  for (int i = 0; i < 20000; ++i) {
    const int shift = static_cast<int>(rng() % 64);
    std::uint64_t v = rng() >> shift;
    if (i % 2 == 0) v &= ~((std::uint64_t{1} << (rng() % 41)) - 1);  // often a unit multiple
    const std::string text = FormatBytes(v);
    if (text.find('.') == std::string::npos) {
      ASSERT_EQ(BytesOrDie(text), v) << text;
      continue;
    }
    // "<x.y> <unit>": x.y must be v / unit rounded to a tenth, and below 1024 unless in TiB.
    char unit_name[8] = {};
    double shown = 0;
    ASSERT_EQ(std::sscanf(text.c_str(), "%lf %7s", &shown, unit_name), 2) << text;
    const std::string unit_str = unit_name;
    const double unit = unit_str == "KiB"   ? kKiB
                        : unit_str == "MiB" ? kMiB
                        : unit_str == "GiB" ? kGiB
                                            : kTiB;
    ASSERT_TRUE(unit_str == "TiB" || shown < 1024.0) << text;
    ASSERT_LE(std::abs(shown - static_cast<double>(v) / unit), 0.05 + 1e-9) << v << " -> " << text;
  }
}

TEST(ParseDurationTest, EachUnit) {
  EXPECT_EQ(MicrosOrDie("1500us"), 1500);
  EXPECT_EQ(MicrosOrDie("7\xc2\xb5s"), 7);
  EXPECT_EQ(MicrosOrDie("7\xce\xbcs"), 7);
  EXPECT_EQ(MicrosOrDie("250ms"), 250000);
  EXPECT_EQ(MicrosOrDie("30s"), 30000000);
  EXPECT_EQ(MicrosOrDie("5m"), 300000000);
  EXPECT_EQ(MicrosOrDie("1h"), 3600000000);
  EXPECT_EQ(MicrosOrDie("0"), 0);
  EXPECT_EQ(MicrosOrDie("0s"), 0);
}

TEST(ParseDurationTest, CompoundFractionsAndWhitespace) {
  EXPECT_EQ(MicrosOrDie("1h30m"), 5400000000);
  EXPECT_EQ(MicrosOrDie("1h 30m 15s"), 5415000000);
  EXPECT_EQ(MicrosOrDie("1.5s"), 1500000);
  EXPECT_EQ(MicrosOrDie("0.25ms"), 250);
  EXPECT_EQ(MicrosOrDie(" 30 s "), 30000000);
}

TEST(ParseDurationTest, RejectsMissingUnknownAndUpperCaseUnits) {
  ExpectBadDuration("30", "needs a unit");
  ExpectBadDuration("5M", "unknown unit \"M\"");
  ExpectBadDuration("5MS", "unknown unit");
  ExpectBadDuration("5 sec", "unknown unit \"sec\"");
  ExpectBadDuration("5d", "unknown unit");
  ExpectBadDuration("5s garbage", "expected a number");
}

TEST(ParseDurationTest, RejectsNegativeEmptySubMicrosecondAndOverflow) {
  ExpectBadDuration("-5s", "negative");
  ExpectBadDuration("", "empty");
  ExpectBadDuration("0.5us", "whole number of microseconds");
  ExpectBadDuration("9223372036854775808us", "out of range");
  ExpectBadDuration("3000000000h", "out of range");
  EXPECT_EQ(MicrosOrDie("9223372036854775807us"), std::numeric_limits<std::int64_t>::max());
}

TEST(FormatDurationTest, ReadableExactForms) {
  EXPECT_EQ(FormatDuration(microseconds(0)), "0s");
  EXPECT_EQ(FormatDuration(microseconds(750)), "750us");
  EXPECT_EQ(FormatDuration(microseconds(1500)), "1.5ms");
  EXPECT_EQ(FormatDuration(microseconds(250000)), "250ms");
  EXPECT_EQ(FormatDuration(microseconds(30000000)), "30s");
  EXPECT_EQ(FormatDuration(microseconds(300000000)), "5m");
  EXPECT_EQ(FormatDuration(microseconds(3600000000)), "1h");
  EXPECT_EQ(FormatDuration(microseconds(5400000000)), "1h30m");
  EXPECT_EQ(FormatDuration(microseconds(3601500000)), "1h1.5s");
  EXPECT_EQ(FormatDuration(microseconds(1000001)), "1.000001s");
  EXPECT_EQ(FormatDuration(microseconds(-1500)), "-1.5ms");
  EXPECT_EQ(FormatDuration(microseconds::min()), "-2562047788h54.775808s");
}

TEST(FormatDurationTest, RoundTripsThroughParse) {
  std::mt19937_64 rng(TestSeed("FormatDurationTest.RoundTripsThroughParse"));
  for (int i = 0; i < 20000; ++i) {
    const auto v = static_cast<std::int64_t>((rng() >> 1) >> (rng() % 63));
    const std::string text = FormatDuration(microseconds(v));
    ASSERT_EQ(MicrosOrDie(text), v) << text;
  }
}

}  // namespace
}  // namespace kvfabric
