// Tests of Sha256 and StatusFromOpenSsl: the FIPS 180-2 vectors, incremental
// hashing against one-shot hashing across random split points, reuse after
// Finish(), and the libcrypto error conversion.
//
// KVF_TEST_SEED fixes the seed of the randomised test.
#include "core/sha256.h"

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

// FIPS 180-2, appendix B.
constexpr std::string_view kAbcHex =
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr std::string_view kEmptyHex =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr std::string_view k448BitMessage =
    "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
constexpr std::string_view k448BitHex =
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr std::string_view kMillionAHex =
    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

std::string Hex(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

Sha256 MustCreate() {
  StatusOr<Sha256> sha = Sha256::Create();
  EXPECT_TRUE(sha.ok()) << sha.status();
  if (!sha.ok()) std::abort();
  return std::move(sha).value();
}

std::string MustFinishHex(Sha256& sha) {
  StatusOr<Sha256Digest> digest = sha.Finish();
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.ok() ? Hex(*digest) : std::string();
}

std::string MustOneShotHex(std::string_view message) {
  StatusOr<Sha256Digest> digest = Sha256Of(message);
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.ok() ? Hex(*digest) : std::string();
}

// -------------------------------------------------------------- FIPS vectors

TEST(Sha256Test, OneShotMatchesFipsVectors) {
  EXPECT_EQ(MustOneShotHex("abc"), kAbcHex);
  EXPECT_EQ(MustOneShotHex(""), kEmptyHex);
  EXPECT_EQ(MustOneShotHex(k448BitMessage), k448BitHex);
}

TEST(Sha256Test, EveryOneShotOverloadAgrees) {
  const std::string abc = "abc";
  StatusOr<Sha256Digest> from_span = Sha256Of(AsBytes(abc));
  StatusOr<Sha256Digest> from_pointer = Sha256Of(abc.data(), abc.size());
  ASSERT_TRUE(from_span.ok()) << from_span.status();
  ASSERT_TRUE(from_pointer.ok()) << from_pointer.status();
  EXPECT_EQ(Hex(*from_span), kAbcHex);
  EXPECT_EQ(Hex(*from_pointer), kAbcHex);
  StatusOr<Sha256Digest> null_empty = Sha256Of(nullptr, 0);
  ASSERT_TRUE(null_empty.ok()) << null_empty.status();
  EXPECT_EQ(Hex(*null_empty), kEmptyHex);
}

TEST(Sha256Test, IncrementalMatchesFipsVectors) {
  Sha256 sha = MustCreate();
  EXPECT_EQ(MustFinishHex(sha), kEmptyHex);

  sha.Update(std::string_view("a"));
  sha.Update(AsBytes("b"));
  sha.Update("c", 1);
  EXPECT_EQ(MustFinishHex(sha), kAbcHex);

  sha.Update(k448BitMessage.substr(0, 20));
  sha.Update(k448BitMessage.substr(20));
  EXPECT_EQ(MustFinishHex(sha), k448BitHex);
}

TEST(Sha256Test, OneMillionAInChunksMatchesFipsVector) {
  // 997 is prime, so the chunks straddle the 64-byte block boundary at every offset.
  const std::string chunk(997, 'a');
  Sha256 sha = MustCreate();
  std::size_t left = 1'000'000;
  while (left > 0) {
    const std::size_t n = std::min(left, chunk.size());
    sha.Update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(MustFinishHex(sha), kMillionAHex);
}

TEST(Sha256Test, EmptyUpdatesDoNotChangeTheDigest) {
  Sha256 sha = MustCreate();
  sha.Update(nullptr, 0);
  sha.Update(std::span<const std::byte>());
  sha.Update("abc", 3);
  sha.Update(std::string_view());
  EXPECT_EQ(MustFinishHex(sha), kAbcHex);
}

// ------------------------------------------------------ incremental vs one-shot

TEST(Sha256Test, IncrementalEqualsOneShotAcrossRandomSplitPointsRandomised) {
  const std::uint64_t seed =
      TestSeed("Sha256Test.IncrementalEqualsOneShotAcrossRandomSplitPointsRandomised");
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);

  // One hasher for every trial: also proves Finish() leaves it ready for reuse.
  Sha256 sha = MustCreate();
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t size = std::uniform_int_distribution<std::size_t>(0, 4096)(rng);
    std::vector<std::byte> message(size);
    for (std::byte& b : message) b = static_cast<std::byte>(rng() & 0xff);

    std::vector<std::size_t> cuts(std::uniform_int_distribution<std::size_t>(0, 16)(rng));
    for (std::size_t& c : cuts) c = std::uniform_int_distribution<std::size_t>(0, size)(rng);
    cuts.push_back(0);
    cuts.push_back(size);
    std::sort(cuts.begin(), cuts.end());  // repeated cuts give empty pieces, on purpose

    const std::span<const std::byte> all(message);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const std::span<const std::byte> piece = all.subspan(cuts[i], cuts[i + 1] - cuts[i]);
      if (i % 2 == 0) {
        sha.Update(piece);
      } else {
        sha.Update(piece.data(), piece.size());
      }
    }
    StatusOr<Sha256Digest> incremental = sha.Finish();
    StatusOr<Sha256Digest> one_shot = Sha256Of(all);
    ASSERT_TRUE(incremental.ok()) << incremental.status();
    ASSERT_TRUE(one_shot.ok()) << one_shot.status();
    ASSERT_EQ(Hex(*incremental), Hex(*one_shot))
        << "trial " << trial << ", " << size << " bytes in " << cuts.size() - 1 << " pieces";
  }
}

// ------------------------------------------------------------------ lifetime

TEST(Sha256Test, MovedHasherKeepsItsPartialMessage) {
  Sha256 a = MustCreate();
  a.Update("ab", 2);
  Sha256 b = std::move(a);
  b.Update("c", 1);
  EXPECT_EQ(MustFinishHex(b), kAbcHex);

  Sha256 c = MustCreate();
  c.Update("xyz", 3);
  c = std::move(b);  // c's own context is freed; b's (now empty) message carries over
  c.Update("abc", 3);
  EXPECT_EQ(MustFinishHex(c), kAbcHex);
}

TEST(Sha256Test, DistinctMessagesGiveDistinctDigests) {
  EXPECT_NE(MustOneShotHex("abc"), MustOneShotHex("abd"));
  EXPECT_NE(MustOneShotHex(""), MustOneShotHex(std::string_view("\0", 1)));
}

// --------------------------------------------------------- StatusFromOpenSsl

TEST(StatusFromOpenSslTest, ReportsTheQueuedErrorAsInternalAndClearsTheQueue) {
  ERR_clear_error();
  // Queue a real libcrypto error: EVP_DigestInit_ex with no digest fails and
  // records why.
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ASSERT_NE(ctx, nullptr);
  ASSERT_NE(EVP_DigestInit_ex(ctx, nullptr, nullptr), 1);
  EVP_MD_CTX_free(ctx);
  const unsigned long queued = ERR_peek_error();  // NOLINT(runtime/int)
  ASSERT_NE(queued, 0u) << "libcrypto queued no error; the test cannot check the message";
  char expected[256];
  ERR_error_string_n(queued, expected, sizeof(expected));

  Status s = StatusFromOpenSsl("EVP_DigestInit_ex(test)");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), std::string("EVP_DigestInit_ex(test) failed: ") + expected);
  EXPECT_EQ(ERR_peek_error(), 0u) << "the error queue was left non-empty";
}

TEST(StatusFromOpenSslTest, ReportsTheEarliestOfSeveralQueuedErrors) {
  ERR_clear_error();
  ERR_raise(ERR_LIB_EVP, EVP_R_UNSUPPORTED_ALGORITHM);
  ERR_raise(ERR_LIB_EVP, EVP_R_INVALID_DIGEST);
  char earliest[256];
  ERR_error_string_n(ERR_peek_error(), earliest, sizeof(earliest));
  char latest[256];
  ERR_error_string_n(ERR_peek_last_error(), latest, sizeof(latest));
  ASSERT_STRNE(earliest, latest);

  Status s = StatusFromOpenSsl("ctx");
  EXPECT_EQ(s.message(), std::string("ctx failed: ") + earliest);
  EXPECT_EQ(ERR_peek_error(), 0u);
  // Nothing stale explains the next failure.
  EXPECT_EQ(StatusFromOpenSsl("next").message(), "next failed: no OpenSSL error queued");
}

TEST(StatusFromOpenSslTest, EmptyQueueIsStillInternal) {
  ERR_clear_error();
  Status s = StatusFromOpenSsl("EVP_MD_CTX_new");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "EVP_MD_CTX_new failed: no OpenSSL error queued");
}

}  // namespace
}  // namespace kvfabric
