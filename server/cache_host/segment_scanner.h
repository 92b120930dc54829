// ScanSegment: the recovery pass over one NVMe-tier segment file. Reads the
// segment header and every record, verifies each block's header CRC and
// payload CRC, skips tombstones, and classifies everything else as torn or
// corrupt (the rules are in docs/nvme-tier.md, "Recovery").
//
// Used by NvmeTier::Open; exposed on its own so tests can scan a file and so
// an offline checker can reuse it.
//
// Thread safety: ScanSegment may run concurrently on distinct files.
#ifndef KVFABRIC_SERVER_CACHE_HOST_SEGMENT_SCANNER_H_
#define KVFABRIC_SERVER_CACHE_HOST_SEGMENT_SCANNER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/block_format.h"
#include "core/statusor.h"
#include "server/cache_host/block_location.h"
#include "server/cache_host/io_engine.h"

namespace kvfabric::cache_host {

// A block found intact by recovery. Its key is header.key.
struct RecoveredBlock {
  NvmeLocation location;
  BlockHeader header;
};

// What scanning one segment found.
struct SegmentScan {
  uint64_t file_bytes = 0;   // size of the file
  uint64_t alignment = 0;    // record alignment the segment was written with
  bool header_ok = false;    // the segment header verified and named this id
  uint64_t blocks = 0;       // intact blocks appended to the output
  uint64_t block_bytes = 0;  // their padded record bytes
  uint64_t torn = 0;         // records cut short: see docs/nvme-tier.md
  uint64_t corrupt = 0;      // records or regions that fail a CRC before an intact record
  uint64_t tombstones = 0;   // removed blocks skipped
};

// Scans `file`, the segment named `segment_id`, appending every intact block
// to *blocks in file order. `alignment` is the direct-I/O alignment of the
// Env; the segment's own alignment (from its header) must be a multiple of it.
// Errors: I/O errors from the engine; FailedPrecondition for a segment written
// by another format version or with an incompatible alignment (such a file is
// never deleted or rewritten). Damage inside the file is counted, not an error.
// REQUIRES: blocks != nullptr; file opened by `engine`, with direct I/O.
StatusOr<SegmentScan> ScanSegment(IoEngine& engine, IoFile& file, uint64_t segment_id,
                                  size_t alignment, std::vector<RecoveredBlock>* blocks);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_SEGMENT_SCANNER_H_
