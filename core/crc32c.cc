#include "core/crc32c.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVF_CRC32C_HAVE_SSE42 1
#include <immintrin.h>
#include <nmmintrin.h>
#else
#define KVF_CRC32C_HAVE_SSE42 0
#endif

namespace kvfabric::crc32c {
namespace {

// Reflected Castagnoli polynomial.
constexpr std::uint32_t kPoly = 0x82f63b78u;

using ByteTable = std::array<std::uint32_t, 256>;

// kSlice[0] is the classic byte-at-a-time table; kSlice[k][b] is the CRC
// contribution of byte b followed by k zero bytes, which lets the portable path
// fold eight input bytes per step with eight independent lookups.
constexpr std::array<ByteTable, 8> MakeSlicingTables() {
  std::array<ByteTable, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (std::uint32_t i = 0; i < 256; ++i) {
      const std::uint32_t prev = t[k - 1][i];
      t[k][i] = (prev >> 8) ^ t[0][prev & 0xff];
    }
  }
  return t;
}

constexpr std::array<ByteTable, 8> kSlice = MakeSlicingTables();

// Little-endian load assembled from bytes, so the portable path is correct on
// big-endian hosts too; compilers turn it into a single load on little-endian.
inline std::uint32_t LoadLE32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

#if KVF_CRC32C_HAVE_SSE42

// The hardware path runs three independent `crc32` chains over adjacent
// stripes (the instruction has a latency of 3 cycles and a throughput of 1),
// then combines them: the CRC register after stripe A then stripe B equals
// (register after A, advanced over len(B) zero bytes) XOR (raw CRC of B). The
// "advance over N zero bytes" operator is linear over GF(2); it is built here at
// compile time as four 256-entry tables, one per byte of the register. This is
// the scheme of Mark Adler's crc32c.c (zlib author), restated.
constexpr std::size_t kLongStripe = 8192;
constexpr std::size_t kShortStripe = 256;

using Gf2Matrix = std::array<std::uint32_t, 32>;

constexpr std::uint32_t Gf2MatrixTimes(const Gf2Matrix& mat, std::uint32_t vec) {
  std::uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

constexpr Gf2Matrix Gf2MatrixSquare(const Gf2Matrix& mat) {
  Gf2Matrix sq{};
  for (int i = 0; i < 32; ++i) sq[i] = Gf2MatrixTimes(mat, mat[i]);
  return sq;
}

// Operator that advances a (reflected) CRC register over `len` zero bytes.
// REQUIRES: len is a power of two.
constexpr Gf2Matrix ZerosOperator(std::size_t len) {
  Gf2Matrix op{};  // one zero bit
  op[0] = kPoly;
  for (int i = 1; i < 32; ++i) op[i] = 1u << (i - 1);
  for (int i = 0; i < 3; ++i) op = Gf2MatrixSquare(op);  // one zero byte
  while (len > 1) {
    op = Gf2MatrixSquare(op);
    len >>= 1;
  }
  return op;
}

constexpr std::array<ByteTable, 4> MakeShiftTables(std::size_t len) {
  const Gf2Matrix op = ZerosOperator(len);
  std::array<ByteTable, 4> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (int k = 0; k < 4; ++k) t[k][i] = Gf2MatrixTimes(op, i << (8 * k));
  }
  return t;
}

constexpr std::array<ByteTable, 4> kShiftLong = MakeShiftTables(kLongStripe);
constexpr std::array<ByteTable, 4> kShiftShort = MakeShiftTables(kShortStripe);

inline std::uint32_t Shift(const std::array<ByteTable, 4>& t, std::uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

inline std::uint64_t Load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Processes as many whole groups of three `stripe`-byte stripes as fit.
__attribute__((target("sse4.2"))) inline std::uint32_t Sse42Stripes(
    std::uint32_t crc, const std::uint8_t*& p, std::size_t& n, std::size_t stripe,
    const std::array<ByteTable, 4>& shift) {
  while (n >= 3 * stripe) {
    std::uint64_t c0 = crc;
    std::uint64_t c1 = 0;
    std::uint64_t c2 = 0;
    const std::uint8_t* end = p + stripe;
    do {
      c0 = _mm_crc32_u64(c0, Load64(p));
      c1 = _mm_crc32_u64(c1, Load64(p + stripe));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * stripe));
      p += 8;
    } while (p < end);
    crc = Shift(shift, static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
    crc = Shift(shift, crc) ^ static_cast<std::uint32_t>(c2);
    p += 2 * stripe;
    n -= 3 * stripe;
  }
  return crc;
}

// One 8-byte store: non-temporal (movnti) when kStreaming.
template <bool kStreaming>
__attribute__((target("sse4.2"))) inline void Store64(std::uint8_t* at, std::uint64_t v) {
  if constexpr (kStreaming) {
    _mm_stream_si64(reinterpret_cast<long long*>(at), static_cast<long long>(v));
  } else {
    std::memcpy(at, &v, sizeof(v));
  }
}

// Copies one 64-byte line word by word, each word stored from the register
// the `crc32` instruction takes it from; returns the register after it.
// Streaming: 16-byte registers, each stored non-temporally (d 16-byte
// aligned) and its two words taken from it for the CRC.
template <bool kStreaming>
__attribute__((target("sse4.2"))) inline std::uint64_t CopyLine(std::uint64_t c, std::uint8_t* d,
                                                                const std::uint8_t* s) {
  if constexpr (kStreaming) {
    for (std::size_t w = 0; w < 64; w += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + w));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + w), v);
      c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
      c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(v, 1)));
    }
  } else {
    for (std::size_t w = 0; w < 64; w += 8) {
      const std::uint64_t v = Load64(s + w);
      Store64<false>(d + w, v);
      c = _mm_crc32_u64(c, v);
    }
  }
  return c;
}

// Sse42Stripes with a copy fused in: each 8-byte word is loaded once into a
// register, stored from it and fed to the `crc32` instruction from it, so
// the CRC covers exactly the values the stores wrote. Three independent
// chains keep the instruction's latency (3 cycles) hidden, as above.
template <bool kStreaming>
__attribute__((target("sse4.2"))) inline std::uint32_t Sse42CopyStripes(
    std::uint32_t crc, std::uint8_t*& d, const std::uint8_t*& s, std::size_t& n, std::size_t stripe,
    const std::array<ByteTable, 4>& shift) {
  while (n >= 3 * stripe) {
    std::uint64_t c0 = crc;
    std::uint64_t c1 = 0;
    std::uint64_t c2 = 0;
    // A 64-byte line of each stripe at a time: streaming stores then fill
    // one write-combining buffer per line before the next; the out-of-order
    // core overlaps the three chains.
    for (std::size_t i = 0; i < stripe; i += 64) {
      c0 = CopyLine<kStreaming>(c0, d + i, s + i);
      c1 = CopyLine<kStreaming>(c1, d + stripe + i, s + stripe + i);
      c2 = CopyLine<kStreaming>(c2, d + 2 * stripe + i, s + 2 * stripe + i);
    }
    crc = Shift(shift, static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
    crc = Shift(shift, crc) ^ static_cast<std::uint32_t>(c2);
    s += 3 * stripe;
    d += 3 * stripe;
    n -= 3 * stripe;
  }
  return crc;
}

// The one-pass copy with the `crc32` instruction, for CPUs without the
// folding path. Streaming: non-temporal stores, 16-byte within the stripes
// and 8-byte after them (the caller fences).
template <bool kStreaming>
__attribute__((target("sse4.2"))) std::uint32_t CopySse42(std::uint32_t crc, std::uint8_t* d,
                                                          const std::uint8_t* s, std::size_t n) {
  std::uint32_t l = crc ^ 0xffffffffu;
  // Leading bytes up to a boundary of the destination, so every store after
  // them is aligned: 8 bytes, or a 64-byte line when streaming (16-byte
  // stores fill whole lines).
  constexpr std::uintptr_t kAlign = kStreaming ? 63 : 7;
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(d) & kAlign) != 0) {
    *d = *s++;
    l = _mm_crc32_u8(l, *d++);
    --n;
  }
  // Short stripes only: the three streams of stores then stay within 768
  // bytes of each other. Non-temporal stores to three lines 8 KiB apart ran
  // at 1.3-2.8 GB/s on AMD EPYC (one stream: 11-12); 256-byte stripes run
  // at 10-11 GB/s, ordinary stores as fast as with the long stripes.
  l = Sse42CopyStripes<kStreaming>(l, d, s, n, kShortStripe, kShiftShort);
  std::uint64_t l64 = l;
  while (n >= 8) {
    const std::uint64_t v = Load64(s);
    Store64<kStreaming>(d, v);
    l64 = _mm_crc32_u64(l64, v);
    s += 8;
    d += 8;
    n -= 8;
  }
  l = static_cast<std::uint32_t>(l64);
  while (n > 0) {
    const std::uint8_t v = *s++;
    *d++ = v;
    l = _mm_crc32_u8(l, v);
    --n;
  }
  return l ^ 0xffffffffu;
}

// The folding path: carry-less multiplication (VPCLMULQDQ on 512-bit
// registers), four times the bytes per cycle of the `crc32` instruction,
// which retires 8 bytes a cycle at best (15 GB/s in cache on the development
// VM; a 2 MiB block's CRC pass was what held its loads below memcpy speed).
//
// The algebra, in the CRC's reflected bit order (bit t of a little-endian
// 128-bit lane is the coefficient of x^(E - t), E fixed by the lane's place
// in the message): a lane can be moved D bits further along the message
// without changing the CRC of the whole, by replacing it with
//   clmul(lo64, x^(D+31) mod P) xor clmul(hi64, x^(D-33) mod P),
// each constant in the register's 32-bit reflected form. (The product of a
// 64-bit reflected operand and a 32-bit one fills bits 0..94; the exponents
// +31 and -33 place bit t of the product at x^(E - D - t), exactly the lane D
// bits on, so it is XORed into the data found there with no shift.) Four
// registers of four lanes each fold 256 bytes at a time; at the end they
// fold into one lane, then lane by lane, and the last 16-byte lane is fed
// through the `crc32` instruction from a zero register, which yields the
// register of the whole prefix (the incoming register was XORed into the
// first four bytes, as the instruction itself would have combined it).

// x^m mod P, reflected (bit 31 is x^0).
constexpr std::uint32_t XPowModP(std::uint32_t m) {
  std::uint32_t r = 0x80000000u;
  for (std::uint32_t i = 0; i < m; ++i) r = (r & 1) ? (r >> 1) ^ kPoly : r >> 1;
  return r;
}

// The pair of constants that folds a lane `bits` further on.
struct FoldPair {
  std::uint64_t lo;
  std::uint64_t hi;
};
constexpr FoldPair FoldBy(std::uint32_t bits) { return {XPowModP(bits + 31), XPowModP(bits - 33)}; }

constexpr FoldPair kFold128 = FoldBy(128);
constexpr FoldPair kFold256 = FoldBy(256);
constexpr FoldPair kFold384 = FoldBy(384);
constexpr FoldPair kFold512 = FoldBy(512);
constexpr FoldPair kFold2048 = FoldBy(2048);

// Below this many bytes the three `crc32` chains are as fast.
constexpr std::size_t kFoldMinBytes = 1024;

__attribute__((target("sse4.2,pclmul"))) inline __m128i Fold128(__m128i x, FoldPair k) {
  const __m128i kk = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
  return _mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11));
}

__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i Fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                          _mm512_clmulepi64_epi128(x, k, 0x11));
}

__attribute__((target("avx512f"))) inline __m512i Broadcast(FoldPair k) {
  const auto lo = static_cast<long long>(k.lo);
  const auto hi = static_cast<long long>(k.hi);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

// Folds four registers, each 256 bytes after the one before it, into one
// 16-byte lane.
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) inline __m128i FoldFour(__m512i z0,
                                                                                    __m512i z1,
                                                                                    __m512i z2,
                                                                                    __m512i z3) {
  const __m512i k512 = Broadcast(kFold512);
  z1 = _mm512_xor_si512(z1, Fold512(z0, k512));
  z2 = _mm512_xor_si512(z2, Fold512(z1, k512));
  z3 = _mm512_xor_si512(z3, Fold512(z2, k512));
  // The four lanes through memory: GCC 12's extract intrinsics warn about
  // their own placeholder operand.
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, z3);
  __m128i x = lanes[3];
  x = _mm_xor_si128(x, Fold128(lanes[0], kFold384));
  x = _mm_xor_si128(x, Fold128(lanes[1], kFold256));
  return _mm_xor_si128(x, Fold128(lanes[2], kFold128));
}

// The register after the last lane: fed through the `crc32` instruction from
// a zero register (see above).
__attribute__((target("sse4.2"))) inline std::uint32_t LastLane(__m128i x) {
  std::uint64_t r = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(x)));
  r = _mm_crc32_u64(r, static_cast<std::uint64_t>(_mm_extract_epi64(x, 1)));
  return static_cast<std::uint32_t>(r);
}

// Consumes the largest multiple of 16 bytes of [p, p + n) (n >= 256) and
// returns the register after them. `l` is the register before them.
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) std::uint32_t FoldAvx512(
    std::uint32_t l, const std::uint8_t*& p, std::size_t& n) {
  __m512i z0 = _mm512_loadu_si512(p);
  __m512i z1 = _mm512_loadu_si512(p + 64);
  __m512i z2 = _mm512_loadu_si512(p + 128);
  __m512i z3 = _mm512_loadu_si512(p + 192);
  z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(l))));
  p += 256;
  n -= 256;
  const __m512i k2048 = Broadcast(kFold2048);
  while (n >= 256) {
    z0 = _mm512_xor_si512(Fold512(z0, k2048), _mm512_loadu_si512(p));
    z1 = _mm512_xor_si512(Fold512(z1, k2048), _mm512_loadu_si512(p + 64));
    z2 = _mm512_xor_si512(Fold512(z2, k2048), _mm512_loadu_si512(p + 128));
    z3 = _mm512_xor_si512(Fold512(z3, k2048), _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  __m128i x = FoldFour(z0, z1, z2, z3);
  while (n >= 16) {
    x = _mm_xor_si128(Fold128(x, kFold128), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    n -= 16;
  }
  return LastLane(x);
}

// One 64-byte store: non-temporal (`at` 64-byte aligned) when kStreaming.
template <bool kStreaming>
__attribute__((target("avx512f"))) inline void Store512(std::uint8_t* at, __m512i v) {
  if constexpr (kStreaming) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(at), v);
  } else {
    _mm512_storeu_si512(at, v);
  }
}

// FoldAvx512's loop with a copy fused in: copies n bytes (a positive multiple
// of 256) from s to d, storing each 64-byte register it loaded and folding
// that same register, and returns the register after them (`l` before).
// Streaming: non-temporal stores; d must then be 64-byte aligned (the caller
// fences).
template <bool kStreaming>
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) std::uint32_t FoldCopyAvx512(
    std::uint32_t l, std::uint8_t* d, const std::uint8_t* s, std::size_t n) {
  constexpr auto store = Store512<kStreaming>;
  __m512i v0 = _mm512_loadu_si512(s);
  __m512i v1 = _mm512_loadu_si512(s + 64);
  __m512i v2 = _mm512_loadu_si512(s + 128);
  __m512i v3 = _mm512_loadu_si512(s + 192);
  store(d, v0);
  store(d + 64, v1);
  store(d + 128, v2);
  store(d + 192, v3);
  __m512i z0 = _mm512_xor_si512(v0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(l))));
  __m512i z1 = v1;
  __m512i z2 = v2;
  __m512i z3 = v3;
  const __m512i k2048 = Broadcast(kFold2048);
  for (std::size_t at = 256; at < n; at += 256) {
    v0 = _mm512_loadu_si512(s + at);
    v1 = _mm512_loadu_si512(s + at + 64);
    v2 = _mm512_loadu_si512(s + at + 128);
    v3 = _mm512_loadu_si512(s + at + 192);
    store(d + at, v0);
    store(d + at + 64, v1);
    store(d + at + 128, v2);
    store(d + at + 192, v3);
    z0 = _mm512_xor_si512(Fold512(z0, k2048), v0);
    z1 = _mm512_xor_si512(Fold512(z1, k2048), v1);
    z2 = _mm512_xor_si512(Fold512(z2, k2048), v2);
    z3 = _mm512_xor_si512(Fold512(z3, k2048), v3);
  }
  return LastLane(FoldFour(z0, z1, z2, z3));
}

// The `crc32` chains, with the folding path for long inputs when `fold`.
__attribute__((target("sse4.2"))) std::uint32_t ExtendSse42(std::uint32_t crc, const void* data,
                                                            std::size_t n, bool fold) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::uint32_t l = crc ^ 0xffffffffu;
  if (fold && n >= kFoldMinBytes) l = FoldAvx512(l, p, n);
  // Leading bytes up to an 8-byte boundary, so the 64-bit loads are aligned.
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7) != 0) {
    l = _mm_crc32_u8(l, *p++);
    --n;
  }
  l = Sse42Stripes(l, p, n, kLongStripe, kShiftLong);
  l = Sse42Stripes(l, p, n, kShortStripe, kShiftShort);
  std::uint64_t l64 = l;
  while (n >= 8) {
    l64 = _mm_crc32_u64(l64, Load64(p));
    p += 8;
    n -= 8;
  }
  l = static_cast<std::uint32_t>(l64);
  while (n > 0) {
    l = _mm_crc32_u8(l, *p++);
    --n;
  }
  return l ^ 0xffffffffu;
}

#endif  // KVF_CRC32C_HAVE_SSE42

}  // namespace

namespace internal {

std::uint32_t ExtendPortable(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::uint32_t l = crc ^ 0xffffffffu;
  while (n >= 8) {
    const std::uint32_t lo = LoadLE32(p) ^ l;
    const std::uint32_t hi = LoadLE32(p + 4);
    l = kSlice[7][lo & 0xff] ^ kSlice[6][(lo >> 8) & 0xff] ^ kSlice[5][(lo >> 16) & 0xff] ^
        kSlice[4][lo >> 24] ^ kSlice[3][hi & 0xff] ^ kSlice[2][(hi >> 8) & 0xff] ^
        kSlice[1][(hi >> 16) & 0xff] ^ kSlice[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    l = kSlice[0][(l ^ *p++) & 0xff] ^ (l >> 8);
    --n;
  }
  return l ^ 0xffffffffu;
}

bool FoldingAvailable() {
#if KVF_CRC32C_HAVE_SSE42
  // __builtin_cpu_supports also checks that the OS saves the registers.
  return HardwareAvailable() && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
#else
  return false;
#endif
}

std::uint32_t ExtendFolding(std::uint32_t crc, const void* data, std::size_t n) {
#if KVF_CRC32C_HAVE_SSE42
  return ExtendSse42(crc, data, n, /*fold=*/true);
#else
  return ExtendPortable(crc, data, n);
#endif
}

bool HardwareAvailable() {
#if KVF_CRC32C_HAVE_SSE42
  // __builtin_cpu_init is only required before main (e.g. from a static
  // initialiser that computes a CRC), but is cheap and idempotent.
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

std::uint32_t ExtendHardware(std::uint32_t crc, const void* data, std::size_t n) {
#if KVF_CRC32C_HAVE_SSE42
  return ExtendSse42(crc, data, n, /*fold=*/false);
#else
  return ExtendPortable(crc, data, n);
#endif
}

std::uint32_t ExtendCopyFolding(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                                bool streaming) {
#if KVF_CRC32C_HAVE_SSE42
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* s = static_cast<const std::uint8_t*>(src);
  // Up to a 64-byte boundary of the destination (streaming stores need it),
  // and the bytes after the last whole 256: copied, then read back from cache.
  const std::size_t head =
      std::min(n, (64 - (reinterpret_cast<std::uintptr_t>(d) & 63)) & std::size_t{63});
  if (head > 0) {
    std::memcpy(d, s, head);
    crc = Extend(crc, d, head);
  }
  const std::size_t body = (n - head) & ~std::size_t{255};
  if (body > 0) {
    const std::uint32_t l = crc ^ 0xffffffffu;
    crc = (streaming ? FoldCopyAvx512<true>(l, d + head, s + head, body)
                     : FoldCopyAvx512<false>(l, d + head, s + head, body)) ^
          0xffffffffu;
  }
  const std::size_t tail = n - head - body;
  if (tail > 0) {
    std::memcpy(d + head + body, s + head + body, tail);
    crc = Extend(crc, d + head + body, tail);
  }
  if (streaming && body > 0) _mm_sfence();  // streaming stores are weakly ordered
  return crc;
#else
  (void)streaming;
  return ExtendCopyReadBack(crc, dst, src, n);
#endif
}

std::uint32_t ExtendCopyHardware(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                                 bool streaming) {
#if KVF_CRC32C_HAVE_SSE42
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* s = static_cast<const std::uint8_t*>(src);
  if (!streaming) return CopySse42<false>(crc, d, s, n);
  crc = CopySse42<true>(crc, d, s, n);
  _mm_sfence();  // streaming stores are weakly ordered
  return crc;
#else
  (void)streaming;
  return ExtendCopyReadBack(crc, dst, src, n);
#endif
}

std::uint32_t ExtendCopyReadBack(std::uint32_t crc, void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* s = static_cast<const std::uint8_t*>(src);
  for (std::size_t at = 0; at < n; at += kCopyPieceBytes) {
    const std::size_t piece = std::min(kCopyPieceBytes, n - at);
    std::memcpy(d + at, s + at, piece);
    crc = Extend(crc, d + at, piece);
  }
  return crc;
}

}  // namespace internal

std::uint32_t ExtendCopy(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                         bool streaming) {
#if KVF_CRC32C_HAVE_SSE42
  static const bool kUseFolding = internal::FoldingAvailable();
  static const bool kUseHardware = internal::HardwareAvailable();
  if (kUseFolding && n >= kFoldMinBytes) {
    return internal::ExtendCopyFolding(crc, dst, src, n, streaming);
  }
  if (kUseHardware) return internal::ExtendCopyHardware(crc, dst, src, n, streaming);
#endif
  (void)streaming;
  return internal::ExtendCopyReadBack(crc, dst, src, n);
}

std::uint32_t Extend(std::uint32_t crc, const void* data, std::size_t n) {
#if KVF_CRC32C_HAVE_SSE42
  // Decided once; function-local static initialisation is thread-safe.
  static const bool kUseHardware = internal::HardwareAvailable();
  static const bool kUseFolding = internal::FoldingAvailable();
  if (kUseHardware) return ExtendSse42(crc, data, n, kUseFolding);
#endif
  return internal::ExtendPortable(crc, data, n);
}

namespace {

// Polynomials over GF(2) modulo the CRC polynomial, in the CRC's reflected
// bit order: bit 31 holds the coefficient of x^0, bit 0 that of x^31.
constexpr std::uint32_t kReflectedPoly = 0x82f63b78u;

// a * b mod P.
std::uint32_t MulModP(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m != 0 && a != 0; m >>= 1) {
    if ((a & m) != 0) {
      product ^= b;
      a ^= m;
    }
    b = (b & 1u) != 0 ? (b >> 1) ^ kReflectedPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) mod P for k = 0..66 (enough for a length in bytes of 64 bits).
struct PowerTable {
  std::uint32_t x2k[67];
  PowerTable() {
    x2k[0] = 1u << 30;  // x^1
    for (int k = 1; k < 67; ++k) x2k[k] = MulModP(x2k[k - 1], x2k[k - 1]);
  }
};

}  // namespace

std::uint32_t ShiftFor(std::uint64_t len_b) {
  static const PowerTable kTable;
  std::uint32_t shift = 1u << 31;  // x^0
  for (int k = 3; len_b != 0; len_b >>= 1, ++k) {
    if ((len_b & 1u) != 0) shift = MulModP(kTable.x2k[k], shift);
  }
  return shift;  // x^(8 len_b) mod P
}

std::uint32_t CombineShifted(std::uint32_t crc_a, std::uint32_t crc_b, std::uint32_t shift) {
  // With the standard pre- and post-inversion, the register algebra gives
  // CRC(A ++ B) = CRC(A) * x^(8 len_b) mod P  xor  CRC(B).
  return MulModP(shift, crc_a) ^ crc_b;
}

std::uint32_t Combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  return CombineShifted(crc_a, crc_b, ShiftFor(len_b));
}

}  // namespace kvfabric::crc32c
