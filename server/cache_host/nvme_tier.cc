#include "server/cache_host/nvme_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <utility>

#include "core/io_uring_probe.h"
#include "core/mutex.h"
#include "core/units.h"
#include "server/cache_host/segment_format.h"

#if defined(KVF_HAVE_URING)
#include "server/cache_host/uring_io_engine.h"
#endif

namespace kvfabric::cache_host {

// One segment file. Shared (shared_ptr) between the segment table, the
// committer and readers, so a file deleted while a Read is in flight stays
// open until that Read finishes.
struct NvmeTier::Segment {
  uint64_t id = 0;
  std::string path;
  std::unique_ptr<IoFile> file;  // immutable after construction; the engine is thread safe
  // Fields below are guarded by NvmeTier::mu_.
  uint64_t end = 0;          // bytes allocated: header plus every record placed
  uint64_t durable_end = 0;  // end of the last group whose sync returned
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;  // padded
  bool sealed = false;      // no longer appended to
  bool deleted = false;     // removed from the table; its file is (being) deleted
};

namespace {

StatusOr<std::unique_ptr<IoEngine>> NewIoEngine(const NvmeTierOptions& options) {
  IoEngineKind kind = options.io_engine;
#if defined(KVF_HAVE_URING)
  if (kind == IoEngineKind::kAuto)
    kind = ProbeIoUring().ok() ? IoEngineKind::kUring : IoEngineKind::kThreads;
  if (kind == IoEngineKind::kUring) {
    UringIoEngineOptions uring;
    uring.queue_depth = options.uring_queue_depth;
    uring.rings = options.uring_rings;
    StatusOr<std::unique_ptr<IoEngine>> engine = NewUringIoEngine(uring);
    if (!engine.ok()) {
      return engine.status().WithContext("NVMe tier io_engine=uring (use io_engine=threads)");
    }
    return engine;
  }
#else
  if (kind == IoEngineKind::kAuto) kind = IoEngineKind::kThreads;
  if (kind == IoEngineKind::kUring) {
    return Status::Unimplemented(
        "NVMe tier io_engine=uring: this build has no liburing (use io_engine=threads)");
  }
#endif
  return NewThreadPoolIoEngine(options.env, options.io_threads);
}

FileOptions SegmentFileOptions(bool create) {
  FileOptions f;
  f.direct_io = true;
  f.create = create;
  f.exclusive = create;
  return f;
}

std::string HexPrefix(const BlockDigest& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < 8; ++i) {
    out += kHex[key[i] >> 4];
    out += kHex[key[i] & 15];
  }
  return out;
}

}  // namespace

Status ValidateNvmeTierOptions(const NvmeTierOptions& o, size_t alignment) {
  if (o.dir.empty()) return Status::InvalidArgument("NVMe tier: dir is required");
  if (o.capacity_bytes == 0) {
    return Status::InvalidArgument("NVMe tier: capacity_bytes is required (> 0)");
  }
  if (o.max_group_bytes < alignment || o.max_group_bytes % alignment != 0) {
    return Status::InvalidArgument("NVMe tier: max_group_bytes " +
                                   std::to_string(o.max_group_bytes) +
                                   " must be a positive multiple of " + std::to_string(alignment));
  }
  if (o.segment_bytes < alignment + o.max_group_bytes) {
    return Status::InvalidArgument("NVMe tier: segment_bytes (--nvme-segment-bytes) " +
                                   std::to_string(o.segment_bytes) +
                                   " must be at least alignment + max_group_bytes = " +
                                   std::to_string(alignment + o.max_group_bytes));
  }
  if (o.io_threads < 0) return Status::InvalidArgument("NVMe tier: io_threads must be >= 0");
  return Status::OK();
}

NvmeTier::NvmeTier(const NvmeTierOptions& options, std::unique_ptr<IoEngine> engine,
                   AlignedBuffer staging, AlignedBuffer remove_unit)
    : options_(options),
      alignment_(options.env->DirectIoAlignment()),
      engine_(std::move(engine)),
      staging_(std::move(staging)),
      remove_unit_(std::move(remove_unit)) {}

StatusOr<NvmeTier::OpenResult> NvmeTier::Open(const NvmeTierOptions& options) {
  if (options.env == nullptr) return Status::InvalidArgument("NVMe tier: env is required");
  const size_t alignment = options.env->DirectIoAlignment();
  KVF_RETURN_IF_ERROR(ValidateNvmeTierOptions(options, alignment));
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, NewIoEngine(options));
  KVF_ASSIGN_OR_RETURN(AlignedBuffer staging,
                       AlignedBuffer::Allocate(options.max_group_bytes, alignment));
  KVF_ASSIGN_OR_RETURN(AlignedBuffer unit, AlignedBuffer::Allocate(alignment, alignment));
  KVF_RETURN_IF_ERROR(options.env->CreateDirIfMissing(options.dir));

  OpenResult result;
  result.tier.reset(new NvmeTier(options, std::move(engine), std::move(staging), std::move(unit)));
  KVF_RETURN_IF_ERROR(result.tier->Recover(&result));
  NvmeTier* tier = result.tier.get();
  tier->committer_ = std::thread([tier] { tier->CommitterLoop(); });

  const NvmeRecoveryReport& r = result.report;
  spdlog::info(
      "NVMe tier {}: engine {}, capacity {}; recovered {} blocks ({}) from {} segments; dropped "
      "{} torn, {} corrupt, {} duplicate; {} removed blocks skipped; {} bad segment headers; {} "
      "empty segments deleted; {} other files ignored",
      options.dir, tier->engine_name(), FormatBytes(options.capacity_bytes), r.recovered,
      FormatBytes(r.recovered_bytes), r.segments, r.dropped_torn, r.dropped_corrupt,
      r.dropped_duplicate, r.tombstones, r.bad_segment_headers, r.segments_deleted,
      r.ignored_files);
  return result;
}

Status NvmeTier::Recover(OpenResult* result) {
  Env* env = options_.env;
  NvmeRecoveryReport& report = result->report;
  KVF_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(options_.dir));
  MutexLock lock(&mu_);                    // uncontended: no other thread yet
  for (const std::string& name : names) {  // sorted, so ids ascend
    std::optional<uint64_t> id = ParseSegmentFileName(name);
    if (!id.has_value()) {
      ++report.ignored_files;
      continue;
    }
    auto segment = std::make_shared<Segment>();
    segment->id = *id;
    segment->path = options_.dir + "/" + name;
    KVF_ASSIGN_OR_RETURN(segment->file, engine_->Open(segment->path, SegmentFileOptions(false)));
    KVF_ASSIGN_OR_RETURN(SegmentScan scan,
                         ScanSegment(*engine_, *segment->file, *id, alignment_, &result->blocks));
    // Make what recovery returns durable: after a process crash (not a power
    // failure) unacknowledged blocks may be intact but not yet synced, and the
    // index is about to count on them.
    IoRequest sync;
    sync.op = IoRequest::Op::kSync;
    sync.file = segment->file.get();
    engine_->Run({&sync, 1});
    KVF_RETURN_IF_ERROR(sync.status);
    ++report.segments;
    if (!scan.header_ok) ++report.bad_segment_headers;
    report.dropped_torn += scan.torn;
    report.dropped_corrupt += scan.corrupt;
    report.tombstones += scan.tombstones;
    segment->end = segment->durable_end = AlignUp(scan.file_bytes, alignment_);
    segment->live_blocks = scan.blocks;
    segment->live_bytes = scan.block_bytes;
    segment->sealed = true;  // recovered segments are never appended to
    stats_.used_bytes += segment->end;
    segments_[*id] = std::move(segment);
    next_segment_id_ = std::max(next_segment_id_, *id + 1);
  }

  // One copy per key: blocks are in (segment, offset) order, which is the
  // order they were written in, so the last copy is the newest.
  std::vector<RecoveredBlock>& blocks = result->blocks;
  std::map<BlockDigest, size_t> newest;
  std::vector<bool> keep(blocks.size(), true);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto [it, inserted] = newest.emplace(blocks[i].header.key, i);
    if (inserted) continue;
    const RecoveredBlock& old = blocks[it->second];
    Segment& segment = *segments_.at(old.location.segment_id);
    --segment.live_blocks;
    segment.live_bytes -= AlignUp(old.location.bytes, alignment_);
    keep[it->second] = false;
    ++report.dropped_duplicate;
    it->second = i;
  }
  size_t kept = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (keep[i]) blocks[kept++] = blocks[i];
  }
  blocks.resize(kept);

  bool deleted_any = false;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment& segment = *it->second;
    if (segment.live_blocks > 0) {
      stats_.live_blocks += segment.live_blocks;
      stats_.live_bytes += segment.live_bytes;
      ++it;
      continue;
    }
    segment.file.reset();
    KVF_RETURN_IF_ERROR(env->DeleteFile(segment.path));
    stats_.used_bytes -= segment.end;
    ++report.segments_deleted;
    deleted_any = true;
    it = segments_.erase(it);
  }
  if (deleted_any) KVF_RETURN_IF_ERROR(env->SyncDir(options_.dir));
  report.recovered = blocks.size();
  for (const RecoveredBlock& b : blocks)
    report.recovered_bytes += AlignUp(b.location.bytes, alignment_);
  stats_.segments = segments_.size();
  return Status::OK();
}

NvmeTier::~NvmeTier() {
  Close().IgnoreError();  // Close always returns OK today
  // Segments (and their files) go before engine_, which is declared first.
  segments_.clear();
  active_.reset();
}

Status NvmeTier::Close() {
  MutexLock close_lock(&close_mu_);
  {
    MutexLock lock(&mu_);
    closing_ = true;
  }
  pending_cv_.NotifyAll();
  if (committer_.joinable()) committer_.join();
  return Status::OK();
}

void NvmeTier::Demote(const BlockHeader& header, std::span<const std::byte> payload,
                      DemoteCallback done) {
  Status invalid = ValidateBlockHeader(header);
  if (invalid.ok() && payload.size() != header.payload_bytes) {
    invalid =
        Status::InvalidArgument("demote: payload of " + std::to_string(payload.size()) +
                                " bytes, header says " + std::to_string(header.payload_bytes));
  }
  if (invalid.ok() && AlignUp(BlockRecordBytes(header), alignment_) > staging_.size()) {
    invalid = Status::InvalidArgument(
        "demote: record of " + std::to_string(BlockRecordBytes(header)) +
        " bytes is larger than max_group_bytes " + std::to_string(staging_.size()));
  }
  if (!invalid.ok()) {
    done(std::move(invalid));
    return;
  }
  {
    MutexLock lock(&mu_);
    if (closing_) {
      lock.Unlock();
      done(Status::Unavailable("demote: NVMe tier " + options_.dir + " is closed"));
      return;
    }
    pending_.push_back(Pending{header, payload, std::move(done)});
  }
  pending_cv_.NotifyOne();
}

StatusOr<NvmeLocation> NvmeTier::DemoteAndWait(const BlockHeader& header,
                                               std::span<const std::byte> payload) {
  std::promise<StatusOr<NvmeLocation>> promise;
  std::future<StatusOr<NvmeLocation>> future = promise.get_future();
  Demote(header, payload,
         [&promise](StatusOr<NvmeLocation> outcome) { promise.set_value(std::move(outcome)); });
  return future.get();
}

void NvmeTier::CommitterLoop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      pending_cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return closing_ || !pending_.empty(); });
      if (pending_.empty()) return;  // closing, and everything queued is committed
      std::swap(pending_, group_);
    }
    // Split what was queued into groups that fit the staging buffer.
    for (size_t begin = 0; begin < group_.size();) {
      size_t end = begin;
      uint64_t bytes = 0;
      while (end < group_.size()) {
        const uint64_t padded = AlignUp(BlockRecordBytes(group_[end].header), alignment_);
        if (end > begin && bytes + padded > staging_.size()) break;
        bytes += padded;
        ++end;
      }
      CommitGroup(begin, end);
      begin = end;
    }
    group_.clear();  // keeps its capacity: no allocation once warmed up
  }
}

StatusOr<std::shared_ptr<NvmeTier::Segment>> NvmeTier::NewSegment() {
  const uint64_t id = next_segment_id_++;
  const std::string path = options_.dir + "/" + SegmentFileName(id);
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<IoFile> file, engine_->Open(path, SegmentFileOptions(true)));
  KVF_ASSIGN_OR_RETURN(AlignedBuffer unit, AlignedBuffer::Allocate(alignment_, alignment_));
  SegmentHeader header;
  header.segment_id = id;
  header.alignment = static_cast<uint32_t>(alignment_);
  header.created_wall_micros = options_.env->WallMicros();
  EncodeSegmentHeader(header, unit.span());
  IoRequest requests[2];
  requests[0].op = IoRequest::Op::kWrite;
  requests[0].file = file.get();
  requests[0].buffer = unit.span();
  requests[1].op = IoRequest::Op::kSync;
  requests[1].file = file.get();
  engine_->Run({&requests[0], 1});
  Status status = requests[0].status;
  if (status.ok()) {
    engine_->Run({&requests[1], 1});
    status = requests[1].status;
  }
  if (status.ok()) status = options_.env->SyncDir(options_.dir);
  if (!status.ok()) {
    file.reset();
    // Best effort: a leftover file holds no block and recovery deletes it.
    options_.env->DeleteFile(path).IgnoreError();
    return status.WithContext("creating NVMe segment " + path);
  }
  auto segment = std::make_shared<Segment>();
  segment->id = id;
  segment->path = path;
  segment->file = std::move(file);
  MutexLock lock(&mu_);
  segment->end = segment->durable_end = alignment_;
  segments_[id] = segment;
  stats_.used_bytes += alignment_;
  ++stats_.segments;
  ++stats_.segments_created;
  return segment;
}

void NvmeTier::CommitGroup(size_t begin, size_t end) {
  std::vector<Slot>& slots = slots_;
  slots.assign(end - begin, Slot{});
  std::vector<std::shared_ptr<Segment>>& touched = touched_;  // segments this group wrote to
  std::vector<std::shared_ptr<Segment>>& retired = retired_;  // rolled over: sealed at the end
  touched.clear();
  retired.clear();
  uint64_t records_placed = 0;  // padded bytes of every record given a place

  uint64_t used;
  {
    MutexLock lock(&mu_);
    used = stats_.used_bytes;
  }
  uint64_t active_end = 0;
  if (active_ != nullptr) {
    MutexLock lock(&mu_);
    active_end = active_->end;
  }
  Status segment_error;  // once creating a segment failed, the rest of the group fails too
  requests_.clear();
  size_t staged = 0;
  for (size_t i = begin; i < end; ++i) {
    Pending& p = group_[i];
    Slot& slot = slots[i - begin];
    const uint64_t stored = BlockRecordBytes(p.header);
    const uint64_t padded = AlignUp(stored, alignment_);
    std::span<std::byte> record = staging_.span().subspan(staged, padded);
    slot.status = EncodeBlockHeader(p.header, record.first<kBlockHeaderBytes>());
    if (!slot.status.ok()) continue;
    std::memcpy(record.data() + kBlockHeaderBytes, p.payload.data(), p.payload.size());
    std::memset(record.data() + stored, 0, padded - stored);
    // Verify the copy we are about to write, so a block damaged in host
    // memory is refused here rather than found bad after a restart; the same
    // pass computes the layer CRCs (format version 2's table after the
    // payload), which must fold to the header's CRC.
    layer_crcs_.resize(p.header.layers);
    const std::span<const std::byte> written = record.subspan(kBlockHeaderBytes, p.payload.size());
    slot.status = ComputeLayerCrcs(p.header, written, layer_crcs_);
    if (!slot.status.ok()) continue;
    if (LayerCrcTableBytes(p.header) != 0) {
      slot.status = EncodeLayerCrcTable(
          p.header, layer_crcs_,
          record.subspan(kBlockHeaderBytes + p.payload.size(), LayerCrcTableBytes(p.header)));
      if (!slot.status.ok()) continue;
    }

    const bool roll = active_ == nullptr || active_end + padded > options_.segment_bytes;
    const uint64_t needed = padded + (roll ? alignment_ : 0);
    if (used + needed > options_.capacity_bytes) {
      slot.status = Status::ResourceExhausted("NVMe tier full: " + std::to_string(used) + " + " +
                                              std::to_string(needed) + " bytes > capacity_bytes " +
                                              std::to_string(options_.capacity_bytes) +
                                              " (remove blocks or raise capacity_bytes)");
      continue;
    }
    if (roll) {
      if (!segment_error.ok()) {
        slot.status = segment_error;
        continue;
      }
      if (active_ != nullptr) {
        {
          MutexLock lock(&mu_);
          active_->end = active_end;
        }
        retired.push_back(std::move(active_));
      }
      StatusOr<std::shared_ptr<Segment>> segment = NewSegment();
      if (!segment.ok()) {
        segment_error = slot.status = segment.status();
        continue;
      }
      active_ = std::move(*segment);
      active_end = alignment_;
      used += alignment_;
    }
    if (touched.empty() || touched.back() != active_) touched.push_back(active_);
    slot.segment = active_.get();
    slot.location = NvmeLocation{active_->id, active_end, stored};
    slot.request = requests_.size();
    IoRequest& w = requests_.emplace_back();
    w.op = IoRequest::Op::kWrite;
    w.file = active_->file.get();
    w.offset = active_end;
    w.buffer = record;
    active_end += padded;
    used += padded;
    records_placed += padded;
    staged += padded;
  }

  engine_->Run(requests_);
  for (Slot& slot : slots) {
    if (slot.request != SIZE_MAX && !requests_[slot.request].status.ok()) {
      slot.status = requests_[slot.request].status;
    }
  }

  // One fdatasync per segment this group wrote a block to.
  requests_.clear();
  for (const auto& segment : touched) {
    IoRequest& s = requests_.emplace_back();
    s.op = IoRequest::Op::kSync;
    s.file = segment->file.get();
  }
  engine_->Run(requests_);
  bool active_sync_failed = false;
  for (size_t t = 0; t < touched.size(); ++t) {
    if (requests_[t].status.ok()) continue;
    for (Slot& slot : slots) {
      if (slot.segment == touched[t].get() && slot.status.ok()) slot.status = requests_[t].status;
    }
    // After a failed fdatasync the state of the file's unsynced pages is
    // unknown (Linux may have dropped them): never append to it again.
    if (touched[t] == active_) active_sync_failed = true;
  }
  if (active_sync_failed) retired.push_back(std::move(active_));

  {
    MutexLock lock(&mu_);
    if (active_ != nullptr) active_->end = active_end;
    if (active_sync_failed) retired.back()->end = active_end;
    for (const auto& segment : touched) segment->durable_end = segment->end;
    stats_.used_bytes += records_placed;
    ++stats_.groups;
    stats_.group_syncs += touched.size();
    for (Slot& slot : slots) {
      if (!slot.status.ok()) {
        ++stats_.demotions_failed;
        continue;
      }
      const uint64_t padded = AlignUp(slot.location.bytes, alignment_);
      ++slot.segment->live_blocks;
      slot.segment->live_bytes += padded;
      ++stats_.demotions_ok;
      ++stats_.live_blocks;
      stats_.live_bytes += padded;
      stats_.bytes_written += padded;
    }
    for (const auto& segment : retired) segment->sealed = true;
  }
  for (const auto& segment : retired) MaybeDeleteSegment(segment);
  touched.clear();
  retired.clear();

  for (size_t i = begin; i < end; ++i) {
    Slot& slot = slots[i - begin];
    if (slot.status.ok()) {
      group_[i].done(slot.location);
    } else {
      group_[i].done(std::move(slot.status));
    }
  }
}

uint64_t NvmeTier::ReadBufferBytes(const NvmeLocation& location) const {
  return AlignUp(location.bytes, alignment_);
}

std::shared_ptr<NvmeTier::Segment> NvmeTier::FindSegment(const NvmeLocation& location,
                                                         Status* error) const {
  const uint64_t padded = AlignUp(location.bytes, alignment_);
  if (location.bytes <= kBlockHeaderBytes ||
      location.bytes > kBlockHeaderBytes + kMaxBlockPayloadBytes + 4 * kMaxBlockLayers ||
      location.offset % alignment_ != 0 || location.offset < alignment_) {
    *error =
        Status::InvalidArgument("NVMe location segment " + std::to_string(location.segment_id) +
                                " offset " + std::to_string(location.offset) + " bytes " +
                                std::to_string(location.bytes) + " is not a block record");
    return nullptr;
  }
  MutexLock lock(&mu_);
  auto it = segments_.find(location.segment_id);
  if (it == segments_.end() || location.offset + padded > it->second->durable_end) {
    *error = Status::NotFound("no NVMe block at segment " + std::to_string(location.segment_id) +
                              " offset " + std::to_string(location.offset));
    return nullptr;
  }
  return it->second;
}

StatusOr<BlockHeader> NvmeTier::Read(const NvmeLocation& location, const BlockDigest& expected_key,
                                     std::span<std::byte> dst,
                                     std::vector<std::uint32_t>* layer_crcs) {
  const uint64_t padded = AlignUp(location.bytes, alignment_);
  if (dst.size() < padded || reinterpret_cast<uintptr_t>(dst.data()) % alignment_ != 0) {
    return Status::InvalidArgument("NVMe read: buffer of " + std::to_string(dst.size()) +
                                   " bytes (needs " + std::to_string(padded) + ", aligned to " +
                                   std::to_string(alignment_) + ")");
  }
  Status error;
  std::shared_ptr<Segment> segment = FindSegment(location, &error);
  if (segment == nullptr) return error;

  IoRequest r;
  r.op = IoRequest::Op::kRead;
  r.file = segment->file.get();
  r.offset = location.offset;
  r.buffer = dst.first(padded);
  engine_->Run({&r, 1});
  if (!r.status.ok()) {
    MutexLock lock(&mu_);
    ++stats_.read_errors;
    return r.status;
  }
  const std::span<const std::byte> block =
      dst.first(std::min<uint64_t>(r.bytes_done, location.bytes));
  if (HasTombstoneMagic(block) && DecodeTombstone(block, alignment_).ok()) {
    return Status::NotFound("NVMe block at segment " + std::to_string(location.segment_id) +
                            " offset " + std::to_string(location.offset) + " was removed");
  }
  Status damage;
  StatusOr<BlockHeader> header = DecodeBlockHeader(block);
  if (!header.ok()) {
    damage = header.status();
  } else if (header->key != expected_key || BlockRecordBytes(*header) != location.bytes) {
    return Status::FailedPrecondition(
        "NVMe location segment " + std::to_string(location.segment_id) + " offset " +
        std::to_string(location.offset) + " holds block " + HexPrefix(header->key) + "..., not " +
        HexPrefix(expected_key) + "... of that size");
  } else if (block.size() < location.bytes) {
    damage = Status::DataLoss("segment file ends inside the block");
  } else {
    // Payload and (version 2) its layer CRC table; version 1 blocks get
    // their layer CRCs computed in the same pass.
    if (layer_crcs != nullptr) layer_crcs->resize(header->layers);
    damage = VerifyBlockBody(
        *header, block.subspan(kBlockHeaderBytes, location.bytes - kBlockHeaderBytes),
        layer_crcs != nullptr ? std::span<std::uint32_t>(*layer_crcs) : std::span<std::uint32_t>());
  }
  if (damage.ok()) {
    MutexLock lock(&mu_);
    ++stats_.reads_ok;
    return header;
  }
  {
    MutexLock lock(&mu_);
    ++stats_.crc_failures;
  }
  // Never served, and removed so that no later read or recovery serves it.
  Status removed = RemoveRecord(location, nullptr);
  return Status::DataLoss("NVMe block " + HexPrefix(expected_key) + "... at segment " +
                          std::to_string(location.segment_id) + " offset " +
                          std::to_string(location.offset) + " failed verification (" +
                          std::string(damage.message()) + "); " +
                          (removed.ok() ? "removed" : "removal failed: " + removed.ToString()));
}

Status NvmeTier::Remove(const NvmeLocation& location, const BlockDigest& expected_key) {
  return RemoveRecord(location, &expected_key);
}

Status NvmeTier::RemoveRecord(const NvmeLocation& location, const BlockDigest* expected_key) {
  Status error;
  std::shared_ptr<Segment> segment = FindSegment(location, &error);
  if (segment == nullptr) return error;
  MutexLock remove_lock(&remove_mu_);
  IoRequest r;
  r.op = IoRequest::Op::kRead;
  r.file = segment->file.get();
  r.offset = location.offset;
  r.buffer = remove_unit_.span();
  engine_->Run({&r, 1});
  if (!r.status.ok()) return r.status;
  std::memset(remove_unit_.data() + r.bytes_done, 0, remove_unit_.size() - r.bytes_done);
  if (HasTombstoneMagic(remove_unit_.span()) &&
      DecodeTombstone(remove_unit_.span(), alignment_).ok()) {
    return Status::NotFound("NVMe block at segment " + std::to_string(location.segment_id) +
                            " offset " + std::to_string(location.offset) + " was already removed");
  }
  StatusOr<BlockHeader> header = DecodeBlockHeader(remove_unit_.span());
  if (expected_key != nullptr && header.ok() &&
      (header->key != *expected_key || BlockRecordBytes(*header) != location.bytes)) {
    return Status::FailedPrecondition("NVMe location holds block " + HexPrefix(header->key) +
                                      "... of " + std::to_string(BlockRecordBytes(*header)) +
                                      " bytes, not " + HexPrefix(*expected_key) + "... of " +
                                      std::to_string(location.bytes));
  }
  Tombstone tombstone;
  tombstone.record_bytes = AlignUp(location.bytes, alignment_);
  if (expected_key != nullptr) tombstone.key = *expected_key;
  std::memset(remove_unit_.data(), 0, remove_unit_.size());
  EncodeTombstone(tombstone, remove_unit_.span());
  r.op = IoRequest::Op::kWrite;
  engine_->Run({&r, 1});
  if (!r.status.ok()) return r.status;
  r.op = IoRequest::Op::kSync;
  engine_->Run({&r, 1});
  if (!r.status.ok()) return r.status;
  {
    MutexLock lock(&mu_);
    if (segment->live_blocks > 0) {
      const uint64_t padded = AlignUp(location.bytes, alignment_);
      --segment->live_blocks;
      segment->live_bytes -= std::min(segment->live_bytes, padded);
      --stats_.live_blocks;
      stats_.live_bytes -= std::min(stats_.live_bytes, padded);
    }
    ++stats_.removes;
  }
  MaybeDeleteSegment(segment);
  return Status::OK();
}

void NvmeTier::MaybeDeleteSegment(const std::shared_ptr<Segment>& segment) {
  {
    MutexLock lock(&mu_);
    if (!segment->sealed || segment->live_blocks > 0 || segment->deleted) return;
    segment->deleted = true;
    segments_.erase(segment->id);
    stats_.used_bytes -= std::min(stats_.used_bytes, segment->end);
    --stats_.segments;
    ++stats_.segments_deleted;
  }
  // A failure leaves a file with no live block, which the next recovery
  // deletes; its space is not counted meanwhile.
  Status status = options_.env->DeleteFile(segment->path);
  if (status.ok()) status = options_.env->SyncDir(options_.dir);
  if (!status.ok()) {
    spdlog::warn("NVMe tier: deleting empty segment {} failed: {}", segment->path,
                 status.ToString());
  }
}

NvmeTierStats NvmeTier::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvfabric::cache_host
