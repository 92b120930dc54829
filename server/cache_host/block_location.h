// Where a cached block's bytes live: pages of the host pool, a place on the
// NVMe tier, or both. Plain values shared by the host page pool, the block
// index, the lease table and (later) the NVMe tier.
//
// A block occupies ceil(bytes / page_bytes) pages of the host pool, as one
// contiguous run when the allocator finds one (the usual case) and otherwise as
// at most kMaxRunsPerBlock runs; the block's bytes are the concatenation of its
// runs, in order, truncated to `bytes`. PageRuns stores its runs inline so that
// handing a location around never allocates.
//
// NvmeLocation is opaque to everything but the NVMe tier (server/cache_host/
// nvme_tier.h), which defines what segment_id and offset mean.
//
// Thread safety: values.
#ifndef KVFABRIC_SERVER_CACHE_HOST_BLOCK_LOCATION_H_
#define KVFABRIC_SERVER_CACHE_HOST_BLOCK_LOCATION_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvfabric::cache_host {

// Most runs one block may be split into when the pool is fragmented.
inline constexpr std::size_t kMaxRunsPerBlock = 4;

// Pages [first, first + count) of the host pool.
struct PageRun {
  std::uint32_t first = 0;
  std::uint32_t count = 0;

  friend bool operator==(const PageRun&, const PageRun&) = default;
};

// The pages of one block, in byte order.
struct PageRuns {
  std::array<PageRun, kMaxRunsPerBlock> runs{};
  std::uint32_t size = 0;  // runs in use, <= kMaxRunsPerBlock

  bool empty() const { return size == 0; }
  const PageRun* begin() const { return runs.data(); }
  const PageRun* end() const { return runs.data() + size; }
  std::uint64_t TotalPages() const {
    std::uint64_t total = 0;
    for (const PageRun& r : *this) total += r.count;
    return total;
  }
  // "pages [12,+4)" or "pages [12,+2) [40,+2)".
  std::string ToString() const {
    std::string out = "pages";
    for (const PageRun& r : *this) {
      out += " [" + std::to_string(r.first) + ",+" + std::to_string(r.count) + ")";
    }
    return out;
  }

  friend bool operator==(const PageRuns& a, const PageRuns& b) {
    if (a.size != b.size) return false;
    for (std::uint32_t i = 0; i < a.size; ++i) {
      if (!(a.runs[i] == b.runs[i])) return false;
    }
    return true;
  }
};

// A block's place on the NVMe tier. Defined by the tier; opaque here.
struct NvmeLocation {
  std::uint64_t segment_id = 0;
  std::uint64_t offset = 0;  // bytes into the segment
  std::uint64_t bytes = 0;   // bytes the block occupies there (header included)

  friend bool operator==(const NvmeLocation&, const NvmeLocation&) = default;
};

// Which tiers hold a copy. Numbered explicitly: exported in stats and RPCs.
enum class BlockTier : std::uint8_t {
  kHost = 1,  // host pool only
  kNvme = 2,  // NVMe tier only (a read stages it into the pool first)
  kBoth = 3,  // both; the host copy can be dropped without losing the block
};

inline bool InHost(BlockTier tier) { return tier == BlockTier::kHost || tier == BlockTier::kBoth; }
inline bool OnNvme(BlockTier tier) { return tier == BlockTier::kNvme || tier == BlockTier::kBoth; }

// "host", "nvme", "both".
inline const char* BlockTierName(BlockTier tier) {
  switch (tier) {
    case BlockTier::kHost:
      return "host";
    case BlockTier::kNvme:
      return "nvme";
    case BlockTier::kBoth:
      return "both";
  }
  return "unknown";
}

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_BLOCK_LOCATION_H_
