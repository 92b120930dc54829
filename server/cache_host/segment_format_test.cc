#include "server/cache_host/segment_format.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvfabric::cache_host {
namespace {

TEST(SegmentFormatTest, SegmentHeaderRoundTripsAndEveryBitFlipIsCaught) {
  SegmentHeader h;
  h.segment_id = 0x0123456789abcdefULL;
  h.alignment = 4096;
  h.created_wall_micros = 1700000000000000ULL;
  std::vector<std::byte> unit(4096);
  EncodeSegmentHeader(h, unit);
  auto decoded = DecodeSegmentHeader(unit);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, h);
  for (size_t bit = 0; bit < kSegmentHeaderBytes * 8; ++bit) {
    std::vector<std::byte> flipped = unit;
    flipped[bit / 8] ^= std::byte(1u << (bit % 8));
    EXPECT_FALSE(DecodeSegmentHeader(flipped).ok()) << "bit " << bit;
  }
  EXPECT_TRUE(DecodeSegmentHeader(std::span(unit).first(10)).status().IsDataLoss());
}

TEST(SegmentFormatTest, TombstoneRoundTripsAndRejectsUnalignedRecordSizes) {
  Tombstone t;
  t.record_bytes = 3 * 4096;
  t.key[0] = 0xaa;
  t.key[31] = 0x55;
  std::vector<std::byte> unit(4096);
  EncodeTombstone(t, unit);
  EXPECT_TRUE(HasTombstoneMagic(unit));
  auto decoded = DecodeTombstone(unit, 4096);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, t);
  unit[40] ^= std::byte{4};
  EXPECT_TRUE(DecodeTombstone(unit, 4096).status().IsDataLoss());
  t.record_bytes = 4096 + 512;
  EncodeTombstone(t, unit);
  EXPECT_TRUE(DecodeTombstone(unit, 4096).status().IsDataLoss());
}

TEST(SegmentFormatTest, FileNamesRoundTripAndOthersAreIgnored) {
  EXPECT_EQ(SegmentFileName(1), "segment-0000000000000001.kvfseg");
  EXPECT_EQ(ParseSegmentFileName(SegmentFileName(0xfedcba9876543210ULL)), 0xfedcba9876543210ULL);
  EXPECT_FALSE(ParseSegmentFileName("segment-000000000000000G.kvfseg").has_value());
  EXPECT_FALSE(ParseSegmentFileName("segment-0000000000000001.kvfseg.tmp").has_value());
  EXPECT_FALSE(ParseSegmentFileName("segment-0000000000000001.KVFSEG").has_value());
  EXPECT_FALSE(ParseSegmentFileName("LOCK").has_value());
}

TEST(SegmentFormatTest, AlignUpRoundsToTheUnit) {
  EXPECT_EQ(AlignUp(0, 4096), 0u);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignUp(4097, 4096), 8192u);
}

}  // namespace
}  // namespace kvfabric::cache_host
