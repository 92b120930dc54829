#include "core/block_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/model_fingerprint.h"
#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

using Header = std::array<std::byte, kBlockHeaderBytes>;

std::vector<std::byte> RandomBytes(std::size_t n, std::mt19937& rng) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

BlockDigest DigestOf(std::uint8_t first) {
  BlockDigest d;
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(first + 7 * i);
  return d;
}

// A valid exact header of the given shape, sealed over an all-zero payload.
BlockHeader ExactHeader(KvDtype dtype, std::uint32_t layers, std::uint32_t tokens,
                        std::uint32_t kv_heads, std::uint32_t head_dim) {
  BlockHeader h;
  h.representation = BlockRepresentation::kExact;
  h.dtype = dtype;
  h.key = DigestOf(0x10);
  h.fingerprint = DigestOf(0xA0);
  h.layers = layers;
  h.tokens = tokens;
  h.kv_heads = kv_heads;
  h.head_dim = head_dim;
  h.payload_bytes = ExactPayloadBytes(dtype, layers, tokens, kv_heads, head_dim).value();
  h.payload_crc32c = 0x01234567u;
  return h;
}

BlockHeader SmallHeader() { return ExactHeader(KvDtype::kBf16, 4, 16, 2, 8); }

Header Encode(const BlockHeader& h) {
  Header out{};
  const Status s = EncodeBlockHeader(h, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

void PutLE(Header& bytes, std::size_t offset, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) bytes[offset + i] = static_cast<std::byte>(v >> (8 * i));
}

// Rewrites the header CRC so that a deliberately edited header passes the
// integrity check and reaches the semantic checks behind it.
void Reseal(Header& bytes) { PutLE(bytes, 124, crc32c::Mask(crc32c::Value(bytes.data(), 124)), 4); }

bool Contains(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string_view::npos;
}

TEST(BlockFormatTest, RoundTripPreservesEveryField) {
  const std::uint64_t seed = TestSeed("BlockFormatTest.RoundTripPreservesEveryField");
  std::mt19937 rng(seed);
  for (BlockRepresentation rep : {BlockRepresentation::kExact, BlockRepresentation::kCompactInt8}) {
    BlockHeader h = ExactHeader(KvDtype::kFp16, 3, 16, 4, 64);
    h.representation = rep;
    if (rep == BlockRepresentation::kCompactInt8) h.payload_bytes = 3 * 2 * 1000;
    for (auto& b : h.key) b = static_cast<std::uint8_t>(rng());
    for (auto& b : h.fingerprint) b = static_cast<std::uint8_t>(rng());
    h.payload_crc32c = static_cast<std::uint32_t>(rng());
    const Header bytes = Encode(h);
    StatusOr<BlockHeader> decoded = DecodeBlockHeader(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status() << " seed " << seed;
    EXPECT_EQ(*decoded, h) << "seed " << seed;
  }
}

// The dtype byte is the KvDtype code of docs/block-key.md: fp16, bf16, fp32,
// fp8_e4m3, int8 are bytes 1 to 5. Checked against those literal bytes rather
// than the enum's values, because they are on disk and must never change.
TEST(BlockFormatTest, RoundTripsEveryDtypeAsItsKvDtypeCode) {
  const KvDtype in_code_order[] = {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32,
                                   KvDtype::kFp8E4M3, KvDtype::kInt8};
  for (std::size_t i = 0; i < std::size(in_code_order); ++i) {
    const KvDtype dtype = in_code_order[i];
    const BlockHeader h = ExactHeader(dtype, 2, 16, 1, 128);
    const Header bytes = Encode(h);
    EXPECT_EQ(bytes[7], static_cast<std::byte>(i + 1)) << KvDtypeName(dtype);
    StatusOr<BlockHeader> decoded = DecodeBlockHeader(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status() << " " << KvDtypeName(dtype);
    EXPECT_EQ(*decoded, h);
  }
}

// Builds the expected bytes from docs/block-format.md's table, independently of
// the encoder, so a moved field or a wrong byte order fails here.
TEST(BlockFormatTest, EncodingPlacesFieldsAtDocumentedOffsets) {
  BlockHeader h = ExactHeader(KvDtype::kFp32, 0x0102, 0x10, 0x03, 0x0104);
  h.payload_crc32c = 0xDEADBEEFu;
  const Header actual = Encode(h);

  Header expected{};
  expected[0] = std::byte{'K'};
  expected[1] = std::byte{'V'};
  expected[2] = std::byte{'F'};
  expected[3] = std::byte{'B'};
  PutLE(expected, 4, 2, 2);  // format version
  PutLE(expected, 6, 1, 1);  // representation: exact
  PutLE(expected, 7, 3, 1);  // dtype: fp32
  PutLE(expected, 8, 0, 4);  // flags
  PutLE(expected, 12, 0x0102, 4);
  PutLE(expected, 16, 0x10, 4);
  PutLE(expected, 20, 0x03, 4);
  PutLE(expected, 24, 0x0104, 4);
  PutLE(expected, 28, crc32c::Mask(0xDEADBEEFu), 4);
  PutLE(expected, 32, std::uint64_t{0x0102} * 2 * 0x10 * 0x03 * 0x0104 * 4, 8);
  for (std::size_t i = 0; i < 32; ++i) {
    expected[40 + i] = static_cast<std::byte>(h.key[i]);
    expected[72 + i] = static_cast<std::byte>(h.fingerprint[i]);
  }
  // Bytes 104..123 reserved (zero); the header CRC over [0, 124), masked.
  Reseal(expected);
  for (std::size_t i = 0; i < kBlockHeaderBytes; ++i) {
    EXPECT_EQ(actual[i], expected[i]) << "byte " << i;
  }
}

TEST(BlockFormatTest, DetectsEverySingleBitFlipInHeader) {
  const Header good = Encode(SmallHeader());
  ASSERT_TRUE(DecodeBlockHeader(good).ok());
  for (std::size_t bit = 0; bit < kBlockHeaderBytes * 8; ++bit) {
    Header bad = good;
    bad[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    StatusOr<BlockHeader> decoded = DecodeBlockHeader(bad);
    ASSERT_FALSE(decoded.ok()) << "flip of bit " << bit << " went unnoticed";
    EXPECT_TRUE(decoded.status().IsDataLoss()) << "bit " << bit << ": " << decoded.status();
  }
}

TEST(BlockFormatTest, DetectsTornAndTruncatedHeaders) {
  const Header good = Encode(SmallHeader());
  // Torn write: the second half of the header never reached the medium.
  for (std::byte fill : {std::byte{0x00}, std::byte{0xFF}}) {
    Header torn = good;
    for (std::size_t i = 64; i < kBlockHeaderBytes; ++i) torn[i] = fill;
    StatusOr<BlockHeader> decoded = DecodeBlockHeader(torn);
    ASSERT_FALSE(decoded.ok());
    EXPECT_TRUE(decoded.status().IsDataLoss()) << decoded.status();
    EXPECT_TRUE(Contains(decoded.status(), "header CRC mismatch")) << decoded.status();
  }
  StatusOr<BlockHeader> truncated =
      DecodeBlockHeader(std::span<const std::byte>(good).first(kBlockHeaderBytes - 1));
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(truncated.status().IsDataLoss()) << truncated.status();
  EXPECT_TRUE(Contains(truncated.status(), "truncated")) << truncated.status();
  EXPECT_TRUE(DecodeBlockHeader({}).status().IsDataLoss());
}

TEST(BlockFormatTest, DecodesHeaderAtTheFrontOfAWholeBlock) {
  const BlockHeader h = SmallHeader();
  std::vector<std::byte> block(kBlockHeaderBytes + h.payload_bytes, std::byte{0x5A});
  const Header bytes = Encode(h);
  std::copy(bytes.begin(), bytes.end(), block.begin());
  StatusOr<BlockHeader> decoded = DecodeBlockHeader(block);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, h);
}

TEST(BlockFormatTest, NamesBadMagic) {
  Header bytes = Encode(SmallHeader());
  bytes[3] = std::byte{'C'};
  Reseal(bytes);
  const Status s = DecodeBlockHeader(bytes).status();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_TRUE(Contains(s, "magic")) << s;
}

TEST(BlockFormatTest, NamesHeaderCrcMismatch) {
  Header bytes = Encode(SmallHeader());
  bytes[20] ^= std::byte{0x01};
  const Status s = DecodeBlockHeader(bytes).status();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_TRUE(Contains(s, "header CRC mismatch: stored 0x")) << s;
}

TEST(BlockFormatTest, RejectsNonzeroReservedBytesEvenWithValidCrc) {
  for (std::size_t off = 104; off < 124; ++off) {
    Header bytes = Encode(SmallHeader());
    bytes[off] = std::byte{0x01};
    Reseal(bytes);
    const Status s = DecodeBlockHeader(bytes).status();
    EXPECT_TRUE(s.IsDataLoss()) << "offset " << off << ": " << s;
    EXPECT_TRUE(Contains(s, "reserved")) << s;
    EXPECT_TRUE(Contains(s, "offset " + std::to_string(off))) << s;
  }
}

TEST(BlockFormatTest, RejectsUnsupportedVersion) {
  for (std::uint16_t version : {0, 3, 0xFFFF}) {
    Header bytes = Encode(SmallHeader());
    PutLE(bytes, 4, version, 2);
    Reseal(bytes);
    const Status s = DecodeBlockHeader(bytes).status();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(Contains(s, "version " + std::to_string(version))) << s;
  }
  BlockHeader h = SmallHeader();
  h.format_version = 3;
  Header out{};
  EXPECT_EQ(EncodeBlockHeader(h, out).code(), StatusCode::kFailedPrecondition);
}

TEST(BlockFormatTest, ReadsVersionOneHeadersAndWritesVersionTwo) {
  EXPECT_EQ(SmallHeader().format_version, 2);
  BlockHeader v1 = SmallHeader();
  v1.format_version = 1;
  const StatusOr<BlockHeader> decoded = DecodeBlockHeader(Encode(v1));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->format_version, 1);
  EXPECT_EQ(LayerCrcTableBytes(*decoded), 0u);
  EXPECT_EQ(BlockRecordBytes(*decoded), kBlockHeaderBytes + v1.payload_bytes);
  EXPECT_EQ(LayerCrcTableBytes(SmallHeader()), 4u * SmallHeader().layers);
}

TEST(BlockFormatTest, RefusesMoreLayersThanTheTableBound) {
  BlockHeader h = ExactHeader(KvDtype::kInt8, kMaxBlockLayers, 1, 1, 1);
  EXPECT_TRUE(ValidateBlockHeader(h).ok());
  h = ExactHeader(KvDtype::kInt8, kMaxBlockLayers, 1, 1, 1);
  h.layers = kMaxBlockLayers + 1;
  h.payload_bytes = std::uint64_t{2} * h.layers;
  const Status s = ValidateBlockHeader(h);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_TRUE(Contains(s, "kMaxBlockLayers")) << s;
}

// A version 2 block: header, payload, layer CRC table. Every layer verifies
// on its own, the table folds to the header's CRC, and a flipped bit in a
// slice or in the table is DataLoss naming the layer.
TEST(BlockFormatTest, LayerCrcTableVerifiesEachLayerAndTiesToTheHeader) {
  const std::uint64_t seed =
      TestSeed("BlockFormatTest.LayerCrcTableVerifiesEachLayerAndTiesToTheHeader");
  std::mt19937 rng(seed);
  BlockHeader h = ExactHeader(KvDtype::kFp16, 6, 16, 2, 16);  // 6 x 1024 bytes
  std::vector<std::byte> body = RandomBytes(h.payload_bytes + LayerCrcTableBytes(h), rng);
  const std::span<std::byte> payload = std::span<std::byte>(body).first(h.payload_bytes);
  ASSERT_TRUE(SealBlock(&h, payload).ok());
  std::vector<std::uint32_t> crcs(h.layers);
  ASSERT_TRUE(ComputeLayerCrcs(h, payload, crcs).ok());
  const std::uint64_t layer_bytes = h.payload_bytes / h.layers;
  for (std::uint32_t l = 0; l < h.layers; ++l) {
    EXPECT_EQ(crcs[l], crc32c::Value(payload.subspan(l * layer_bytes, layer_bytes)));
  }
  // A range's CRC from the table equals the CRC of its bytes.
  for (std::uint32_t first = 0; first < h.layers; ++first) {
    for (std::uint32_t count = 1; first + count <= h.layers; ++count) {
      EXPECT_EQ(LayerRangeCrc(crcs, layer_bytes, first, count).value(),
                crc32c::Value(payload.subspan(first * layer_bytes, count * layer_bytes)));
    }
  }
  EXPECT_EQ(LayerRangeCrc(crcs, layer_bytes, 5, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(LayerRangeCrc(crcs, layer_bytes, 0, 0).status().code(), StatusCode::kOutOfRange);

  const std::span<std::byte> table = std::span<std::byte>(body).subspan(h.payload_bytes);
  ASSERT_TRUE(EncodeLayerCrcTable(h, crcs, table).ok());
  std::vector<std::uint32_t> read(h.layers);
  ASSERT_TRUE(VerifyBlockBody(h, body, read).ok()) << VerifyBlockBody(h, body, read);
  EXPECT_EQ(read, crcs);
  EXPECT_TRUE(VerifyBlockBody(h, body, {}).ok());

  for (int trial = 0; trial < 64; ++trial) {
    const std::size_t i = rng() % body.size();
    const auto flip = static_cast<std::byte>(1u << (rng() % 8));
    body[i] ^= flip;
    const Status s = VerifyBlockBody(h, body, {});
    ASSERT_TRUE(s.IsDataLoss()) << "byte " << i << " seed " << seed << ": " << s;
    const std::uint64_t layer = i < h.payload_bytes ? i / layer_bytes : (i - h.payload_bytes) / 4;
    ASSERT_TRUE(Contains(s, "layer " + std::to_string(layer) + " CRC mismatch"))
        << "byte " << i << ": " << s;
    body[i] ^= flip;
  }
  // CRCs that do not fold to the header's CRC are not written.
  crcs[3] ^= 1;
  EXPECT_TRUE(EncodeLayerCrcTable(h, crcs, table).IsInvalidArgument());
  // A consistent table that disagrees with the header: DataLoss.
  BlockHeader other = h;
  other.payload_crc32c ^= 1;
  EXPECT_TRUE(VerifyBlockBody(other, body, {}).IsDataLoss());
  // The body must be payload + table.
  EXPECT_TRUE(
      VerifyBlockBody(h, std::span<const std::byte>(body).first(h.payload_bytes), {}).IsDataLoss());
  // Version 1: no table, layer CRCs still computed from the payload.
  BlockHeader v1 = h;
  v1.format_version = 1;
  EXPECT_TRUE(EncodeLayerCrcTable(v1, read, table).IsInvalidArgument());
  std::vector<std::uint32_t> from_v1(h.layers);
  ASSERT_TRUE(VerifyBlockBody(v1, payload, from_v1).ok());
  EXPECT_EQ(from_v1, read);
}

TEST(BlockFormatTest, RejectsUnknownRepresentationAndDtype) {
  for (std::uint8_t rep : {0, 3, 0xFF}) {
    Header bytes = Encode(SmallHeader());
    PutLE(bytes, 6, rep, 1);
    Reseal(bytes);
    const Status s = DecodeBlockHeader(bytes).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << s;
    EXPECT_TRUE(Contains(s, "representation " + std::to_string(rep))) << s;
  }
  for (std::uint8_t dtype : {0, 6, 0xFF}) {
    Header bytes = Encode(SmallHeader());
    PutLE(bytes, 7, dtype, 1);
    Reseal(bytes);
    const Status s = DecodeBlockHeader(bytes).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << s;
    EXPECT_TRUE(Contains(s, "dtype " + std::to_string(dtype))) << s;
  }
}

TEST(BlockFormatTest, RejectsUnknownFlags) {
  Header bytes = Encode(SmallHeader());
  PutLE(bytes, 8, 0x80000000u, 4);
  Reseal(bytes);
  const Status s = DecodeBlockHeader(bytes).status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_TRUE(Contains(s, "flag")) << s;
}

TEST(BlockFormatTest, RejectsPayloadBytesThatDisagreeWithShape) {
  const BlockHeader good = SmallHeader();
  for (std::uint64_t bytes :
       {std::uint64_t{0}, good.payload_bytes - 1, good.payload_bytes + 1, good.payload_bytes * 2}) {
    BlockHeader h = good;
    h.payload_bytes = bytes;
    EXPECT_TRUE(ValidateBlockHeader(h).IsInvalidArgument()) << bytes;
    Header encoded = Encode(good);
    PutLE(encoded, 32, bytes, 8);
    Reseal(encoded);
    const Status s = DecodeBlockHeader(encoded).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << s;
    EXPECT_TRUE(Contains(s, "disagrees with its shape")) << s;
  }
}

TEST(BlockFormatTest, RejectsZeroDimensions) {
  for (std::size_t offset : {12, 16, 20, 24}) {
    Header bytes = Encode(SmallHeader());
    PutLE(bytes, offset, 0, 4);
    Reseal(bytes);
    const Status s = DecodeBlockHeader(bytes).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << "offset " << offset << ": " << s;
    EXPECT_TRUE(Contains(s, "zero dimension")) << s;
  }
}

TEST(BlockFormatTest, AcceptsPayloadOfExactlyTheLimitAndRejectsOneStepAbove) {
  StatusOr<std::uint64_t> at_limit = ExactPayloadBytes(KvDtype::kFp32, 256, 32, 8, 128);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(*at_limit, kMaxBlockPayloadBytes);
  const Status above = ExactPayloadBytes(KvDtype::kFp32, 256, 33, 8, 128).status();
  EXPECT_TRUE(above.IsInvalidArgument()) << above;
  EXPECT_TRUE(Contains(above, "kMaxBlockPayloadBytes")) << above;
}

TEST(BlockFormatTest, RejectsAbsurdSizesWithoutOverflow) {
  // Every dimension at its maximum: the product overflows 64 bits.
  const Status s =
      ExactPayloadBytes(KvDtype::kFp32, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu)
          .status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_TRUE(Contains(s, "overflows")) << s;

  // A shape whose true size is 2^64 + 4096 bytes: with wrapping arithmetic it
  // would masquerade as a plausible 4096-byte block.
  Header bytes = Encode(SmallHeader());
  PutLE(bytes, 7, static_cast<std::uint8_t>(KvDtype::kFp8E4M3), 1);
  PutLE(bytes, 12, 2048, 4);
  PutLE(bytes, 16, 14586017, 4);
  PutLE(bytes, 20, 308761441, 4);
  PutLE(bytes, 24, 1, 4);
  PutLE(bytes, 32, 4096, 8);
  Reseal(bytes);
  const Status wrapped = DecodeBlockHeader(bytes).status();
  EXPECT_TRUE(wrapped.IsInvalidArgument()) << wrapped;
  EXPECT_TRUE(Contains(wrapped, "overflows 64 bits")) << wrapped;

  // A huge payload_bytes on a compact block, and on an exact one.
  for (BlockRepresentation rep : {BlockRepresentation::kExact, BlockRepresentation::kCompactInt8}) {
    Header huge = Encode(SmallHeader());
    PutLE(huge, 6, static_cast<std::uint8_t>(rep), 1);
    PutLE(huge, 32, ~std::uint64_t{0} - 7, 8);  // a multiple of 2 x 4 layers
    Reseal(huge);
    EXPECT_TRUE(DecodeBlockHeader(huge).status().IsInvalidArgument());
  }

  // Slices of an invalid header are refused, not computed.
  BlockHeader h = SmallHeader();
  h.tokens = 0xFFFFFFFFu;
  h.kv_heads = 0xFFFFFFFFu;
  EXPECT_TRUE(LayerSlice(h, 1).status().IsInvalidArgument());
  EXPECT_TRUE(KeySlice(h, 1).status().IsInvalidArgument());
  EXPECT_TRUE(ValueSlice(h, 1).status().IsInvalidArgument());
}

TEST(BlockFormatTest, RejectsCompactPayloadThatDoesNotSplitIntoLayerHalves) {
  BlockHeader h = SmallHeader();  // 4 layers
  h.representation = BlockRepresentation::kCompactInt8;
  h.payload_bytes = 8 * 100;
  EXPECT_TRUE(ValidateBlockHeader(h).ok());
  h.payload_bytes = 8 * 100 + 4;  // a multiple of layers but not of 2 x layers
  EXPECT_TRUE(ValidateBlockHeader(h).IsInvalidArgument());
  h.payload_bytes = 0;
  EXPECT_TRUE(ValidateBlockHeader(h).IsInvalidArgument());
}

struct Shape {
  BlockRepresentation rep;
  KvDtype dtype;
  std::uint32_t layers, tokens, kv_heads, head_dim;
  std::uint64_t compact_bytes;  // payload_bytes for compact shapes
};

TEST(BlockFormatTest, LayerSlicesTileThePayloadExactly) {
  const Shape shapes[] = {
      {BlockRepresentation::kExact, KvDtype::kFp16, 1, 16, 1, 64, 0},
      {BlockRepresentation::kExact, KvDtype::kBf16, 32, 16, 8, 128, 0},
      {BlockRepresentation::kExact, KvDtype::kFp32, 3, 7, 5, 3, 0},
      {BlockRepresentation::kExact, KvDtype::kFp8E4M3, 80, 256, 1, 1, 0},
      {BlockRepresentation::kExact, KvDtype::kInt8, 61, 16, 1, 576, 0},
      {BlockRepresentation::kCompactInt8, KvDtype::kFp16, 5, 16, 2, 64, 5 * 2 * 2080},
  };
  for (const Shape& s : shapes) {
    BlockHeader h;
    h.representation = s.rep;
    h.dtype = s.dtype;
    h.layers = s.layers;
    h.tokens = s.tokens;
    h.kv_heads = s.kv_heads;
    h.head_dim = s.head_dim;
    h.payload_bytes =
        s.rep == BlockRepresentation::kExact
            ? ExactPayloadBytes(s.dtype, s.layers, s.tokens, s.kv_heads, s.head_dim).value()
            : s.compact_bytes;
    ASSERT_TRUE(ValidateBlockHeader(h).ok()) << ValidateBlockHeader(h);
    const std::string label = std::string(BlockRepresentationName(s.rep)) + " " +
                              std::string(KvDtypeName(s.dtype)) + " layers " +
                              std::to_string(s.layers);
    std::uint64_t next = 0;
    for (std::uint32_t l = 0; l < h.layers; ++l) {
      const PayloadSlice layer = LayerSlice(h, l).value();
      const PayloadSlice k = KeySlice(h, l).value();
      const PayloadSlice v = ValueSlice(h, l).value();
      ASSERT_EQ(layer.offset, next) << label << " layer " << l;
      ASSERT_GT(layer.bytes, 0u) << label;
      ASSERT_EQ(k.offset, layer.offset) << label << " layer " << l;
      ASSERT_EQ(v.offset, k.offset + k.bytes) << label << " layer " << l;
      ASSERT_EQ(v.offset + v.bytes, layer.offset + layer.bytes) << label << " layer " << l;
      ASSERT_EQ(k.bytes, v.bytes) << label;
      if (s.rep == BlockRepresentation::kExact) {
        ASSERT_EQ(k.bytes, std::uint64_t{s.tokens} * s.kv_heads * s.head_dim * KvDtypeSize(s.dtype))
            << label;
      }
      next = layer.offset + layer.bytes;
    }
    EXPECT_EQ(next, h.payload_bytes) << label;
    const Status past_end = LayerSlice(h, h.layers).status();
    EXPECT_EQ(past_end.code(), StatusCode::kOutOfRange) << label << ": " << past_end;
  }
}

TEST(BlockFormatTest, SealedPayloadVerifiesAndEveryCorruptionIsDataLoss) {
  const std::uint64_t seed =
      TestSeed("BlockFormatTest.SealedPayloadVerifiesAndEveryCorruptionIsDataLoss");
  std::mt19937 rng(seed);
  BlockHeader h = ExactHeader(KvDtype::kFp16, 2, 16, 2, 16);  // 2048 bytes
  std::vector<std::byte> payload = RandomBytes(h.payload_bytes, rng);
  ASSERT_TRUE(SealBlock(&h, payload).ok());
  EXPECT_EQ(h.payload_crc32c, crc32c::Value(payload));
  ASSERT_TRUE(VerifyPayload(h, payload).ok()) << VerifyPayload(h, payload);

  // The CRC survives the trip through the encoded header.
  const BlockHeader decoded = DecodeBlockHeader(Encode(h)).value();
  ASSERT_TRUE(VerifyPayload(decoded, payload).ok());

  for (std::size_t i = 0; i < payload.size(); ++i) {
    const auto flip = static_cast<std::byte>(1u << (rng() % 8));
    payload[i] ^= flip;
    const Status s = VerifyPayload(decoded, payload);
    ASSERT_TRUE(s.IsDataLoss()) << "byte " << i << " seed " << seed << ": " << s;
    ASSERT_TRUE(Contains(s, "payload CRC mismatch: stored 0x")) << s;
    ASSERT_TRUE(Contains(s, " computed 0x")) << s;
    payload[i] ^= flip;
  }
  ASSERT_TRUE(VerifyPayload(decoded, payload).ok());

  const Status short_payload =
      VerifyPayload(decoded, std::span<const std::byte>(payload).first(payload.size() - 1));
  EXPECT_TRUE(short_payload.IsDataLoss()) << short_payload;
  EXPECT_TRUE(Contains(short_payload, "payload size mismatch")) << short_payload;
  payload.push_back(std::byte{0});
  const Status long_payload = VerifyPayload(decoded, payload);
  EXPECT_TRUE(long_payload.IsDataLoss()) << long_payload;
  EXPECT_TRUE(Contains(long_payload, "payload size mismatch")) << long_payload;
}

TEST(BlockFormatTest, SealRejectsPayloadOfTheWrongSizeAndLeavesHeaderUnchanged) {
  BlockHeader h = SmallHeader();
  const BlockHeader before = h;
  std::vector<std::byte> payload(h.payload_bytes + 2);
  const Status s = SealBlock(&h, payload);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_EQ(h, before);
}

TEST(BlockFormatTest, EncodeRefusesInvalidHeaderAndLeavesOutputUntouched) {
  // 0x101 names no KvDtype but would truncate to the valid byte 1 (fp16).
  for (std::uint32_t dtype : {0u, 9u, 0x101u}) {
    BlockHeader h = SmallHeader();
    h.dtype = static_cast<KvDtype>(dtype);
    Header out;
    out.fill(std::byte{0xEE});
    const Status s = EncodeBlockHeader(h, out);
    EXPECT_TRUE(s.IsInvalidArgument()) << dtype << ": " << s;
    EXPECT_TRUE(Contains(s, "dtype " + std::to_string(dtype))) << s;
    for (std::byte b : out) ASSERT_EQ(b, std::byte{0xEE}) << dtype;
  }
}

TEST(BlockFormatTest, RepresentationValuesAreTheDocumentedNumbers) {
  // On disk and on the wire: these numbers never change. The dtype numbers are
  // checked byte by byte in RoundTripsEveryDtypeAsItsKvDtypeCode.
  EXPECT_EQ(static_cast<int>(BlockRepresentation::kExact), 1);
  EXPECT_EQ(static_cast<int>(BlockRepresentation::kCompactInt8), 2);
}

}  // namespace
}  // namespace kvfabric
