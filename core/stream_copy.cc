#include "core/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define KVF_HAVE_STREAMING_STORES 1
#endif

namespace kvfabric {

void StreamingCopy(void* dst, const void* src, std::size_t n) {
#ifdef KVF_HAVE_STREAMING_STORES
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Streaming stores need a 16-byte aligned destination: copy up to it.
  std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  // One 64-byte line per iteration: four unaligned loads, four streaming stores.
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), x3);
  }
  std::memcpy(d, s, n);
  _mm_sfence();  // streaming stores are weakly ordered
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace kvfabric
