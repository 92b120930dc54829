// CompactConversionStats: the counters of the daemon's background compact
// converter (server/cache_host/compact_converter.h), as plain values so that
// CacheHostSnapshot can carry them to /metrics without the node or the
// metrics library linking the converter. The node leaves them zero; the
// daemon's snapshot source fills them from CompactConverter::Stats().
#ifndef KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERSION_STATS_H_
#define KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERSION_STATS_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace kvfabric::cache_host {

// Why a conversion produced no compact copy. The block stays exact only; the
// loss is the bytes the copy would have saved.
enum class CompactFailure : std::uint8_t {
  kEncode = 0,    // the codec refused the block: a non-finite value, or a scale past fp16
  kNoSaving = 1,  // the compact copy would not be smaller than the exact block
  kTooLarge = 2,  // larger than the converter's buffers (--model sizes them)
  kEvicted = 3,   // the exact block left the host pool (evicted, demoted, deleted) first
  kError = 4,     // anything else (the node refused the publish); logged, rate-limited
};
inline constexpr std::size_t kCompactFailureKinds = 5;
// "encode", "no_saving", "too_large", "evicted", "error": the `reason` label.
constexpr std::string_view CompactFailureName(CompactFailure f) {
  switch (f) {
    case CompactFailure::kEncode:
      return "encode";
    case CompactFailure::kNoSaving:
      return "no_saving";
    case CompactFailure::kTooLarge:
      return "too_large";
    case CompactFailure::kEvicted:
      return "evicted";
    case CompactFailure::kError:
      break;
  }
  return "error";
}

struct CompactConversionStats {
  std::uint32_t threads = 0;                                 // --compact-threads (0: off)
  std::uint64_t queued = 0;                                  // conversions waiting now
  std::uint64_t converted = 0;                               // compact copies published
  std::array<std::uint64_t, kCompactFailureKinds> failed{};  // by CompactFailure
  std::uint64_t dropped = 0;                // pending conversions dropped by a full queue
  std::uint64_t paused = 0;                 // times a conversion was put off (free bytes, refusal)
  std::uint64_t paused_for_load = 0;        // ... for clients' leases (--compact-pause-leases)
  std::uint64_t bytes_written = 0;          // payload bytes of the compact copies published
  std::uint64_t exact_bytes_converted = 0;  // payload bytes of the exact blocks they copy
  double seconds = 0;                       // time spent converting (read, encode, publish)
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERSION_STATS_H_
