// CompactConverter: the daemon's background conversion of exact blocks to
// compact_int8 copies (issue 24; the codec is docs/compact.md, the copy's key
// docs/block-key.md section 8).
//
// What it does. It watches the node's block events (set_block_event_tap).
// When an exact fp16, bf16 or fp32 block is committed (committed means every
// layer is written and its CRC checked), the block is queued. A worker then
// leases the block host-only (its pages cannot be evicted while it is read),
// copies it out (CacheHostNode::ReadLeasedBlock) and checks its CRC, releases
// it, encodes it (EncodeCompactInt8) into the worker's own buffer, computes
// the copy's CRC from its layer CRCs, and publishes it in the same namespace
// under CompactBlockKey(exact key, kCompactInt8Codec, kCompactInt8Version)
// with representation compact_int8, through the node's own
// ReserveWithoutEviction, WriteReservedBlock and Commit: quotas, reservation
// accounting and the events to placement are the node's as for any client.
//
// What it never does. No load waits on it: the exact block is served exactly
// as before, and a reader asking for the exact key never sees the copy (other
// key). It never evicts to make room: while the pool's free bytes would fall
// under max(min_free_bytes, the high watermark's reserve) with the copy
// placed, or the node refuses the reservation (pool full, namespace quota,
// too many reservations), or more than pause_above_leases read leases are held
// (clients are loading: they come first), the conversion is put back at the
// head of the queue and every worker waits retry_interval before trying
// again (counted as paused, by reason). A block the codec refuses (a non-finite value, a scale past
// fp16), one whose copy would not be smaller, or one that left the host pool
// first only costs the bytes the copy would have saved, and is counted by
// reason (CompactFailure).
//
// Bounds. `threads` workers, each with one buffer pair allocated at Create
// (2 x max_block_bytes: the exact payload, and the copy, which is smaller or
// not made); a queue of at most `queue_blocks` pending conversions, a full
// queue dropping the oldest (counted). Blocks larger than max_block_bytes
// are not converted (counted as too_large).
//
// Not done here (issue 24 continues): nothing reads compact copies until the
// planner chooses them. Eviction keeps a copy in place of its exact block
// within --compact-keep-bytes (eviction_policy.h, "Compact copies"; the node
// pairs them by the key this converter writes). The lease that reads a block
// is no access (LeaseRequestOptions::count_access): eviction does not see it
// as hot.
//
// Thread safety: Stats() from any thread. The workers call the node; the
// tap only queues (it never blocks and never calls the node).
// REQUIRES: the node outlives the converter (destroy the converter first).
#ifndef KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_H_
#define KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/block_format.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/compact_conversion_stats.h"

namespace kvfabric::cache_host {

struct CompactConverterOptions {
  // --compact-threads. Default 0: off (no tap, no buffers, nothing queued).
  // Off by default because nothing reads compact copies yet (the planner's
  // choice is issue 24's next part): a copy now only costs pool bytes.
  int threads = 0;
  // --compact-queue-blocks. Pending conversions kept; a full queue drops the
  // oldest. Default 1024. >= 1.
  std::size_t queue_blocks = 1024;
  // --compact-min-free-bytes. Conversion pauses while the pool's free bytes,
  // less the copy's pages, would be under this. nullopt (the default): 10% of
  // the pool. The high watermark's reserve (pool - floor(pool x high)) is
  // kept free in any case, so a copy never starts a background eviction.
  std::optional<std::uint64_t> min_free_bytes;
  // Largest exact block converted; each worker's buffers are 2 x this,
  // allocated at Create. Default kMaxBlockPayloadBytes (64 MiB); the daemon
  // sets the largest block of its --model list when it has one.
  std::uint64_t max_block_bytes = kMaxBlockPayloadBytes;
  // --compact-pause-leases. Conversion pauses while more than this many read
  // leases are held on the node (clients' loads in flight, plus the
  // converter's own one per thread): serving loads comes first. 0: never for
  // load. Default 32.
  std::uint64_t pause_above_leases = 32;
  // How long the workers wait after a pause before trying again. Default 100 ms.
  std::chrono::milliseconds retry_interval{100};
  // TTL of the converter's own leases and reservations. Default 10 s (a
  // conversion takes milliseconds; the TTL only bounds a stuck one).
  std::uint64_t ttl_us = 10'000'000;

  // InvalidArgument naming the flag.
  Status Validate() const;
};

class CompactConverter {
 public:
  // Allocates the buffers, starts the workers and installs the node's event
  // tap (none of this with threads == 0). `node` is borrowed.
  static StatusOr<std::unique_ptr<CompactConverter>> Create(CompactConverterOptions options,
                                                            CacheHostNode* node);
  // Removes the tap, stops the workers (a conversion in progress finishes or
  // is abandoned; its reservation is released) and drops what is queued.
  ~CompactConverter();
  CompactConverter(const CompactConverter&) = delete;
  CompactConverter& operator=(const CompactConverter&) = delete;

  CompactConversionStats Stats() const;
  // The free bytes under which conversion pauses (min_free_bytes resolved).
  std::uint64_t min_free_bytes() const { return min_free_bytes_; }

  // Blocks until the queue is empty and no worker is converting, or
  // `timeout` passes (false). A paused queue does not empty (tests).
  bool TEST_WaitIdle(std::chrono::milliseconds timeout);

 private:
  struct State;
  struct Job;
  enum class Outcome : std::uint8_t { kDone, kPause, kPauseForLoad };

  CompactConverter(CompactConverterOptions options, CacheHostNode* node);
  void Work(std::size_t worker);
  Outcome Convert(const Job& job, std::span<std::byte> exact, std::span<std::byte> compact);
  void Fail(CompactFailure reason, const Status& status);

  const CompactConverterOptions options_;
  CacheHostNode* const node_;
  const std::uint64_t min_free_bytes_;
  std::shared_ptr<State> state_;
  std::vector<AlignedBuffer> buffers_;  // 2 per worker: exact, compact
  std::vector<std::thread> workers_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_COMPACT_CONVERTER_H_
