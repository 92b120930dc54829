#include "server/cache_host/segment_scanner.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/aligned_buffer.h"
#include "server/cache_host/segment_format.h"

namespace kvfabric::cache_host {
namespace {

StatusOr<size_t> ReadAt(IoEngine& engine, IoFile& file, uint64_t offset, std::span<std::byte> dst) {
  IoRequest r;
  r.op = IoRequest::Op::kRead;
  r.file = &file;
  r.offset = offset;
  r.buffer = dst;
  engine.Run({&r, 1});
  if (!r.status.ok()) return r.status;
  return r.bytes_done;
}

bool AllZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

// A stretch of bytes that held no intact record.
struct BadRegion {
  uint64_t offset;
  bool zero;  // its first unit is all zeros: never written (a lost or failed write)
};

}  // namespace

StatusOr<SegmentScan> ScanSegment(IoEngine& engine, IoFile& file, uint64_t segment_id,
                                  size_t alignment, std::vector<RecoveredBlock>* blocks) {
  SegmentScan scan;
  KVF_ASSIGN_OR_RETURN(scan.file_bytes, file.Size());
  KVF_ASSIGN_OR_RETURN(AlignedBuffer unit, AlignedBuffer::Allocate(alignment, alignment));

  // The segment header. A segment whose header never reached the disk (a crash
  // right after creation) is scanned with the Env's alignment: its blocks, if
  // any, verify on their own.
  uint64_t unit_bytes = alignment;
  KVF_ASSIGN_OR_RETURN(size_t got, ReadAt(engine, file, 0, unit.span()));
  StatusOr<SegmentHeader> header = DecodeSegmentHeader(unit.span().first(got));
  if (header.ok()) {
    if (header->alignment % alignment != 0) {
      return Status::FailedPrecondition(
          "segment " + SegmentFileName(segment_id) + " was written with alignment " +
          std::to_string(header->alignment) + ", not a multiple of this Env's " +
          std::to_string(alignment));
    }
    unit_bytes = header->alignment;
    scan.header_ok = header->segment_id == segment_id;
  } else if (header.status().code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition(SegmentFileName(segment_id) + ": " +
                                      header.status().ToString());
  }
  scan.alignment = unit_bytes;
  if (unit_bytes != alignment) {
    KVF_ASSIGN_OR_RETURN(unit, AlignedBuffer::Allocate(unit_bytes, alignment));
  }

  AlignedBuffer record;  // grows to the largest record seen
  std::vector<BadRegion> bad;
  bool in_bad_region = false;
  uint64_t last_good_offset = 0;  // offset of the last intact block or tombstone
  bool any_good = false;
  uint64_t offset = unit_bytes;
  while (offset < scan.file_bytes) {
    KVF_ASSIGN_OR_RETURN(got, ReadAt(engine, file, offset, unit.span()));
    std::memset(unit.data() + got, 0, unit.size() - got);

    if (HasTombstoneMagic(unit.span())) {
      StatusOr<Tombstone> t = DecodeTombstone(unit.span(), unit_bytes);
      if (t.ok()) {
        ++scan.tombstones;
        in_bad_region = false;
        any_good = true;
        last_good_offset = offset;
        offset += t->record_bytes;
        continue;
      }
    }

    StatusOr<BlockHeader> block = DecodeBlockHeader(unit.span());
    if (!block.ok()) {
      // Not a record start: either inside a damaged record or an unwritten
      // hole. Step one unit at a time until something verifies again.
      if (!in_bad_region) bad.push_back({offset, AllZero(unit.span())});
      in_bad_region = true;
      offset += unit_bytes;
      continue;
    }
    in_bad_region = false;
    const uint64_t stored = BlockRecordBytes(*block);
    const uint64_t padded = AlignUp(stored, unit_bytes);
    if (offset + stored > scan.file_bytes) {
      ++scan.torn;  // cut by the end of the file
      break;
    }
    if (record.size() < padded) {
      KVF_ASSIGN_OR_RETURN(record, AlignedBuffer::Allocate(padded, alignment));
    }
    std::memcpy(record.data(), unit.data(), unit_bytes);
    if (padded > unit_bytes) {
      KVF_ASSIGN_OR_RETURN(got, ReadAt(engine, file, offset + unit_bytes,
                                       record.span().subspan(unit_bytes, padded - unit_bytes)));
      (void)got;  // at least `stored` bytes exist: checked against the file size above
    }
    // Payload and (format version 2) its layer CRC table.
    const std::span<const std::byte> body =
        record.span().subspan(kBlockHeaderBytes, stored - kBlockHeaderBytes);
    if (VerifyBlockBody(*block, body, {}).ok()) {
      blocks->push_back({NvmeLocation{segment_id, offset, stored}, *block});
      ++scan.blocks;
      scan.block_bytes += padded;
      any_good = true;
      last_good_offset = offset;
    } else {
      bad.push_back({offset, false});
    }
    offset += padded;  // the header verified, so its length can be trusted
  }

  // A damaged stretch after the last intact record is the unsynced tail of
  // the last group before a crash (torn); so is a stretch that starts with an
  // unwritten unit. Anything else had been written whole and is now damaged.
  for (const BadRegion& region : bad) {
    if (region.zero || !any_good || region.offset > last_good_offset) {
      ++scan.torn;
    } else {
      ++scan.corrupt;
    }
  }
  return scan;
}

}  // namespace kvfabric::cache_host
