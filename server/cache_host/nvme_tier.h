// NvmeTier: the cache host's second tier. Blocks demoted from the host pool
// are appended to segment files in one directory (O_DIRECT), each as its
// 128-byte block header (core/block_format.h) and payload, padded to the
// direct-I/O alignment. docs/nvme-tier.md specifies the layout, the
// durability rule and recovery; in short:
//  - Demote() queues a block; a committer thread gathers whatever is queued
//    into a group, writes every block of the group, then issues one fdatasync
//    per segment the group touched. A demotion is done (its callback receives
//    the location) only after that sync returned OK. After a crash every done
//    demotion reads back exactly; others may or may not be there, and nothing
//    that fails its CRC is ever served.
//  - Read() reads one block into a caller-provided aligned buffer (a staging
//    page of the host pool) and verifies its header, its key and its payload
//    CRC. A block that fails verification is never returned (DataLoss), is
//    counted, and is removed.
//  - Open() scans every segment, verifies every header and CRC, and returns the
//    intact blocks (for the block index to rebuild itself) with counts of what
//    it dropped as torn or corrupt.
//  - Space is reclaimed a whole segment at a time: a segment file is deleted
//    when its last live block is removed (no compaction).
//
// Ownership: the tier owns its files, its I/O engine and its committer thread.
// It does not know keys beyond what a block header says: the block index
// (another class) maps keys to NvmeLocations and calls Remove when it drops one.
// Callers own the payloads they demote (which must stay valid until the
// demotion's callback has run) and the buffers they read into.
//
// Thread safety: every public method may be called from any thread, except
// that DemoteAndWait must not be called from a demotion callback (callbacks
// run on the committer thread, which would wait on itself). Callbacks must not
// block for long: the next group waits for them.
#ifndef KVFABRIC_SERVER_CACHE_HOST_NVME_TIER_H_
#define KVFABRIC_SERVER_CACHE_HOST_NVME_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/block_format.h"
#include "core/env.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/block_location.h"
#include "server/cache_host/io_engine.h"
#include "server/cache_host/segment_scanner.h"

namespace kvfabric::cache_host {

struct NvmeTierOptions {
  // Directory holding the segment files; created if missing (its parent must
  // exist). Nothing else should write there. Required.
  std::string dir;

  // Files, directories and clocks. Required; Env::Default() in production,
  // FaultInjectionEnv in crash tests. The io_uring engine reads and writes
  // segment data with its own file descriptors, bypassing this Env (names and
  // directories still go through it), so tests that inject faults choose
  // IoEngineKind::kThreads.
  Env* env = nullptr;

  // auto: io_uring when built in and the kernel allows it, else threads.
  IoEngineKind io_engine = IoEngineKind::kAuto;

  // Most bytes the segment files may occupy together (headers, live and dead
  // records). A demotion that would pass it fails with ResourceExhausted;
  // space returns when whole segments are deleted. Required (> 0): like the
  // host pool, the tier's size is a decision, not a default.
  uint64_t capacity_bytes = 0;

  // A segment is closed and a new one started once the next record would pass
  // this size. Default 256 MiB: large enough that segment creation (a header
  // write, fdatasync and directory sync) is rare, small enough that one
  // long-lived block pins little dead space (space returns a whole segment at
  // a time). Must be at least one alignment unit plus max_group_bytes, so that
  // every accepted record fits in a fresh segment.
  uint64_t segment_bytes = uint64_t{256} << 20;

  // Size of the committer's staging buffer, allocated once at Open: the most
  // bytes one group writes, and the largest record (header + payload, padded)
  // the tier accepts. Default 16 MiB: eight 2 MiB blocks per group.
  size_t max_group_bytes = size_t{16} << 20;

  // Worker threads of the thread-pool engine (its callers work too). Default 4.
  int io_threads = 4;

  // io_uring engine: ring entries, and rings (batches in flight at once).
  unsigned uring_queue_depth = 64;
  int uring_rings = 4;
};

// What Open() found. Dropped blocks are not returned; their space stays dead
// until their segment is deleted.
struct NvmeRecoveryReport {
  uint64_t segments = 0;           // segment files scanned
  uint64_t recovered = 0;          // intact blocks returned
  uint64_t recovered_bytes = 0;    // their record bytes (padded)
  uint64_t dropped_torn = 0;       // incomplete records (see docs/nvme-tier.md)
  uint64_t dropped_corrupt = 0;    // complete records failing a CRC
  uint64_t dropped_duplicate = 0;  // older copies of a key found again later
  uint64_t tombstones = 0;         // removed blocks skipped
  uint64_t bad_segment_headers = 0;
  uint64_t segments_deleted = 0;  // left without a live block, deleted
  uint64_t ignored_files = 0;     // names in the directory that are not segments
};

// Counters since Open. A snapshot; see NvmeTier::stats().
struct NvmeTierStats {
  uint64_t demotions_ok = 0;
  uint64_t demotions_failed = 0;
  uint64_t groups = 0;         // groups committed
  uint64_t group_syncs = 0;    // fdatasync calls issued by group commits
  uint64_t bytes_written = 0;  // record bytes (padded) of successful demotions
  uint64_t reads_ok = 0;
  uint64_t read_errors = 0;   // I/O errors on Read (not CRC failures)
  uint64_t crc_failures = 0;  // Reads that found a damaged block (each removed)
  uint64_t removes = 0;       // blocks removed (by Remove or after a CRC failure)
  uint64_t segments = 0;      // segment files now
  uint64_t segments_created = 0;
  uint64_t segments_deleted = 0;
  uint64_t used_bytes = 0;  // bytes the segment files occupy (vs capacity_bytes)
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;  // padded record bytes of live blocks
};

// InvalidArgument naming the option when `options` cannot work with records
// aligned to `alignment` (the device's direct-I/O alignment; --check-config
// uses Env::kDefaultDirectIoAlignment). NvmeTier::Open checks the same.
Status ValidateNvmeTierOptions(const NvmeTierOptions& options, size_t alignment);

class NvmeTier {
 public:
  struct OpenResult {
    std::unique_ptr<NvmeTier> tier;
    std::vector<RecoveredBlock> blocks;  // intact blocks, one per key (the newest copy)
    NvmeRecoveryReport report;
  };

  // Receives the outcome of one demotion, on the committer thread (or inline,
  // for a demotion refused before it was queued).
  using DemoteCallback = std::function<void(StatusOr<NvmeLocation>)>;

  // Opens the tier in options.dir, recovering every segment there, and starts
  // the committer. Logs one line with the recovery counts. Errors:
  // InvalidArgument for bad options (naming the field); FailedPrecondition for
  // a segment of another format version (never deleted); I/O errors.
  static StatusOr<OpenResult> Open(const NvmeTierOptions& options);

  // Close()s.
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Queues `payload` (described by `header`, sealed by SealBlock) for the next
  // group. `done` receives the location once the block is durable, or the
  // error that kept this block (and only this block, unless the group's sync
  // failed) from being written: InvalidArgument (bad header, size mismatch,
  // record larger than max_group_bytes), DataLoss (payload does not match its
  // CRC), ResourceExhausted (capacity), Unavailable (closed), I/O errors.
  // REQUIRES: payload stays valid and unchanged until `done` has run.
  void Demote(const BlockHeader& header, std::span<const std::byte> payload, DemoteCallback done);

  // Demote() and wait for the outcome.
  // REQUIRES: not called from a DemoteCallback.
  StatusOr<NvmeLocation> DemoteAndWait(const BlockHeader& header,
                                       std::span<const std::byte> payload);

  // Bytes a Read() of `location` needs in `dst`: location.bytes rounded up to
  // the alignment.
  uint64_t ReadBufferBytes(const NvmeLocation& location) const;

  // Reads the block at `location` into dst (its header in the first 128 bytes,
  // the payload after it, then for format version 2 its layer CRC table, then
  // padding) and returns its verified header; with `layer_crcs`, also each
  // layer slice's verified CRC (from the table, or computed for a version 1
  // block in the same pass). Blocks are written in format version 2.
  // Errors: NotFound (no such segment, or the block was removed);
  // FailedPrecondition (the location holds another key or size: the caller's
  // index is wrong; nothing is removed); DataLoss (the block failed its header
  // or payload CRC: counted and removed, never returned); I/O errors (the
  // block is kept). InvalidArgument if dst is misaligned or too small.
  // REQUIRES: dst.data() aligned to alignment(); dst.size() >= ReadBufferBytes().
  StatusOr<BlockHeader> Read(const NvmeLocation& location, const BlockDigest& expected_key,
                             std::span<std::byte> dst,
                             std::vector<std::uint32_t>* layer_crcs = nullptr);

  // Removes the block at `location`: writes a tombstone over its record and
  // syncs it, so it does not come back after a restart; deletes the segment
  // file when it was the segment's last live block (and the segment is no
  // longer being appended to). NotFound if already removed; FailedPrecondition
  // if the location holds another key.
  Status Remove(const NvmeLocation& location, const BlockDigest& expected_key);

  // Stops accepting demotions (later ones fail with Unavailable), commits the
  // ones already queued, and stops the committer. Read and Remove keep
  // working. Idempotent; returns OK (kept a Status for future flushing).
  Status Close();

  NvmeTierStats stats() const;
  std::string_view engine_name() const { return engine_->name(); }
  size_t alignment() const { return alignment_; }

 private:
  struct Segment;
  // What happens to one demotion of the group being committed.
  struct Slot {
    Status status;
    NvmeLocation location{};
    Segment* segment = nullptr;
    size_t request = SIZE_MAX;  // index of its write in requests_
  };
  struct Pending {
    BlockHeader header;
    std::span<const std::byte> payload;
    DemoteCallback done;
  };

  NvmeTier(const NvmeTierOptions& options, std::unique_ptr<IoEngine> engine, AlignedBuffer staging,
           AlignedBuffer remove_unit);

  Status Recover(OpenResult* result);
  void CommitterLoop();
  // Writes, syncs and acknowledges group_[begin, end) (which fits staging).
  void CommitGroup(size_t begin, size_t end);
  StatusOr<std::shared_ptr<Segment>> NewSegment();
  void SealActiveSegment();
  std::shared_ptr<Segment> FindSegment(const NvmeLocation& location, Status* error) const;
  // Tombstones the record at `location` unless it already is one. With
  // `expected_key`, refuses a record that holds a valid block of another key.
  Status RemoveRecord(const NvmeLocation& location, const BlockDigest* expected_key);
  // Deletes `segment`'s file if it is sealed and holds no live block.
  void MaybeDeleteSegment(const std::shared_ptr<Segment>& segment);

  const NvmeTierOptions options_;
  const size_t alignment_;
  std::unique_ptr<IoEngine> engine_;

  mutable Mutex mu_;
  CondVar pending_cv_;
  std::vector<Pending> pending_ KVF_GUARDED_BY(mu_);  // swapped with group_ by the committer
  bool closing_ KVF_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<Segment>> segments_ KVF_GUARDED_BY(mu_);
  NvmeTierStats stats_ KVF_GUARDED_BY(mu_);

  // Committer thread only.
  std::vector<Pending> group_;
  std::vector<std::uint32_t> layer_crcs_;  // committer thread: one record's layer CRCs
  std::vector<IoRequest> requests_;
  std::vector<Slot> slots_;
  std::vector<std::shared_ptr<Segment>> touched_;
  std::vector<std::shared_ptr<Segment>> retired_;
  std::shared_ptr<Segment> active_;  // the segment being appended to, or null
  uint64_t next_segment_id_ = 1;
  AlignedBuffer staging_;

  // Serialises removals (cold path).
  Mutex remove_mu_;
  AlignedBuffer remove_unit_ KVF_GUARDED_BY(remove_mu_);

  Mutex close_mu_;  // serialises Close()
  std::thread committer_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_NVME_TIER_H_
