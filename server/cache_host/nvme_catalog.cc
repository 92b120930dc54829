#include "server/cache_host/nvme_catalog.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "core/crc32c.h"
#include "core/mutex.h"
#include "core/units.h"

namespace kvfabric::cache_host {
namespace {

// Bytes read from the log at a time during recovery, and written at a time
// during a rewrite. Recovery and compaction memory stays at this much however
// large the log is.
constexpr size_t kIoChunkBytes = size_t{1} << 20;

// Field offsets inside a record (from its first byte).
constexpr size_t kOffRecordCrc = 0;
constexpr size_t kOffBodyBytes = 4;
constexpr size_t kOffKey = kCatalogRecordPrefixBytes;
constexpr size_t kOffBlockKey = kOffKey + 32;
constexpr size_t kOffTokenOffset = kOffBlockKey + 32;
constexpr size_t kOffTenantBytes = kOffTokenOffset + 8;
constexpr size_t kOffTenant = kOffTenantBytes + 2;
static_assert(kOffTenant == kCatalogRecordPrefixBytes + kCatalogRecordFixedBodyBytes);
static_assert(kMaxNamespaceBytes <= 0xffff, "tenant length is stored in 16 bits");

void PutU16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void PutU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t GetU16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) |
                               (std::to_integer<uint16_t>(p[1]) << 8));
}
uint32_t GetU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::to_integer<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::array<std::byte, kCatalogFileHeaderBytes> EncodeFileHeader() {
  std::array<std::byte, kCatalogFileHeaderBytes> h{};
  for (size_t i = 0; i < kCatalogMagic.size(); ++i) h[i] = static_cast<std::byte>(kCatalogMagic[i]);
  PutU16(h.data() + 4, kCatalogFormatVersion);
  PutU16(h.data() + 6, 0);
  PutU32(h.data() + 8, crc32c::Mask(crc32c::Value(h.data(), 8)));
  return h;
}

// The version written before NVMe keys were per namespace; Recover replaces
// such a log (see the header comment).
constexpr uint16_t kCatalogFormatVersionWithoutNvmeKeys = 1;

// What to do about a catalog.log whose header is not this build's; the file is
// never touched, so the operator decides.
constexpr std::string_view kBadHeaderAdvice =
    "; the file was left as it is: move it aside to start with an empty catalog (blocks already "
    "on NVMe then cannot be given back their namespace)";

Status CheckFileHeader(const std::string& path, std::span<const std::byte> h, uint64_t size) {
  if (size < kCatalogFileHeaderBytes) {
    return Status::FailedPrecondition(
        "NVMe catalog " + path + " is " + std::to_string(size) + " bytes, shorter than its " +
        std::to_string(kCatalogFileHeaderBytes) + "-byte header" + std::string(kBadHeaderAdvice));
  }
  for (size_t i = 0; i < kCatalogMagic.size(); ++i) {
    if (std::to_integer<uint8_t>(h[i]) != kCatalogMagic[i]) {
      return Status::FailedPrecondition("NVMe catalog " + path +
                                        ": bad magic (not a catalog file)" +
                                        std::string(kBadHeaderAdvice));
    }
  }
  const uint32_t stored = crc32c::Unmask(GetU32(h.data() + 8));
  const uint32_t computed = crc32c::Value(h.data(), 8);
  if (stored != computed) {
    return Status::FailedPrecondition("NVMe catalog " + path + ": header CRC mismatch" +
                                      std::string(kBadHeaderAdvice));
  }
  const uint16_t version = GetU16(h.data() + 4);
  if (version != kCatalogFormatVersion && version != kCatalogFormatVersionWithoutNvmeKeys) {
    return Status::FailedPrecondition("NVMe catalog " + path + ": format version " +
                                      std::to_string(version) + ", this build reads only " +
                                      std::to_string(kCatalogFormatVersion) +
                                      std::string(kBadHeaderAdvice));
  }
  if (GetU16(h.data() + 6) != 0) {
    return Status::FailedPrecondition("NVMe catalog " + path + ": nonzero reserved header bytes" +
                                      std::string(kBadHeaderAdvice));
  }
  return Status::OK();
}

// Appends the record of (key, block_key, tenant, token_offset) to *out.
// REQUIRES: tenant.size() <= kMaxNamespaceBytes.
void EncodeRecord(const BlockDigest& key, const BlockDigest& block_key, std::string_view tenant,
                  uint64_t token_offset, std::vector<std::byte>* out) {
  const size_t start = out->size();
  const size_t body = kCatalogRecordFixedBodyBytes + tenant.size();
  out->resize(start + kCatalogRecordPrefixBytes + body);
  std::byte* p = out->data() + start;
  PutU32(p + kOffBodyBytes, static_cast<uint32_t>(body));
  std::memcpy(p + kOffKey, key.data(), key.size());
  std::memcpy(p + kOffBlockKey, block_key.data(), block_key.size());
  PutU64(p + kOffTokenOffset, token_offset);
  PutU16(p + kOffTenantBytes, static_cast<uint16_t>(tenant.size()));
  if (!tenant.empty()) std::memcpy(p + kOffTenant, tenant.data(), tenant.size());
  const uint32_t crc = crc32c::Value(p + kOffBodyBytes, 4 + body);
  PutU32(p + kOffRecordCrc, crc32c::Mask(crc));
}

// Reads a file front to back through a window of kIoChunkBytes.
class ChunkReader {
 public:
  ChunkReader(RandomRWFile* file, uint64_t size) : file_(file), size_(size) {}

  // The `n` bytes at `offset`, valid until the next call.
  // REQUIRES: offset + n <= size; n <= kIoChunkBytes.
  StatusOr<const std::byte*> Get(uint64_t offset, size_t n) {
    if (offset >= window_offset_ && offset + n <= window_offset_ + window_.size()) {
      return window_.data() + (offset - window_offset_);
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kIoChunkBytes, size_ - offset));
    window_.resize(want);
    window_offset_ = offset;
    size_t got = 0;
    while (got < want) {
      KVF_ASSIGN_OR_RETURN(size_t r, file_->Read(offset + got, std::span(window_).subspan(got)));
      if (r == 0) break;
      got += r;
    }
    window_.resize(got);
    if (got < n) {
      return Status::DataLoss("file ended at " + std::to_string(offset + got) +
                              " bytes while reading it, though its size was " +
                              std::to_string(size_));
    }
    return window_.data();
  }

 private:
  RandomRWFile* const file_;
  const uint64_t size_;
  std::vector<std::byte> window_;
  uint64_t window_offset_ = 0;
};

std::string JoinPath(const std::string& dir, const char* name) {
  return dir == "/" ? dir + name : dir + "/" + name;
}

// `dir` without trailing slashes, so that the paths built from it are spelt
// the same way in every call (FaultInjectionEnv compares them as strings).
std::string TrimDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

}  // namespace

std::size_t NvmeCatalog::DigestHash::operator()(const BlockDigest& key) const noexcept {
  // Keys are SHA-256 outputs: their first 8 bytes are uniformly distributed.
  uint64_t h;
  std::memcpy(&h, key.data(), sizeof(h));
  return static_cast<std::size_t>(h);
}

NvmeCatalog::NvmeCatalog(Env* env, std::string dir)
    : env_(env),
      dir_(std::move(dir)),
      path_(JoinPath(dir_, kCatalogFileName)),
      temp_path_(JoinPath(dir_, kCatalogTempFileName)) {}

NvmeCatalog::~NvmeCatalog() {
  MutexLock lock(&mu_);
  // Every acknowledged append was synced; closing can lose nothing that was
  // promised, so its error does not matter.
  if (file_ != nullptr) file_->Close().IgnoreError();
}

StatusOr<std::unique_ptr<NvmeCatalog>> NvmeCatalog::Open(Env* env, const std::string& dir,
                                                         CatalogRecovery* report) {
  if (dir.empty()) return Status::InvalidArgument("NVMe catalog: dir is required");
  CatalogRecovery local_report;
  CatalogRecovery& r = report != nullptr ? *report : local_report;
  r = CatalogRecovery{};

  std::unique_ptr<NvmeCatalog> catalog(new NvmeCatalog(env, TrimDir(dir)));
  KVF_RETURN_IF_ERROR(env->CreateDirIfMissing(catalog->dir_));
  // A temporary file means a Compact died before its rename (after the rename
  // the name is gone), so catalog.log is the old, complete log.
  if (env->FileExists(catalog->temp_path_)) {
    KVF_RETURN_IF_ERROR(env->DeleteFile(catalog->temp_path_));
    r.deleted_temp = true;
  }
  if (!env->FileExists(catalog->path_)) {
    const auto header = EncodeFileHeader();
    KVF_RETURN_IF_ERROR(WriteStringToFileSync(
        env, std::string_view(reinterpret_cast<const char*>(header.data()), header.size()),
        catalog->path_));
    r.created = true;
  }
  std::size_t tenants = 0;
  {
    MutexLock lock(&catalog->mu_);  // uncontended: not shared yet
    KVF_ASSIGN_OR_RETURN(catalog->file_, env->NewRandomRWFile(catalog->path_, FileOptions{}));
    KVF_RETURN_IF_ERROR(catalog->Recover(&r));
    tenants = catalog->tenants_.size();
  }

  spdlog::info(
      "NVMe catalog {}: {} records, {} keys, {} tenants, {}{}; {} corrupt records skipped; {} "
      "torn tail ({} bytes) truncated{}",
      catalog->path_, r.records, r.entries, tenants, FormatBytes(r.file_bytes),
      r.created ? " (new)" : "", r.corrupt_records, r.torn_records, r.truncated_bytes,
      r.deleted_temp ? "; leftover " + std::string(kCatalogTempFileName) + " deleted" : "");
  return catalog;
}

namespace {

// What one position of the log holds.
enum class RecordCheck {
  kIntact,        // a complete record whose CRC and fields hold
  kInconsistent,  // complete, CRC holds, but its fields disagree (a foreign or buggy writer)
  kBad,           // not a record: incomplete, a length out of bounds, or a CRC mismatch
};

struct ParsedRecord {
  RecordCheck check = RecordCheck::kBad;
  uint64_t bytes = 0;  // record size; set unless kBad
  const std::byte* p = nullptr;
};

// Parses the record at `offset` of a file of `size` bytes. Never trusts a
// length beyond kCatalogMaxRecordBodyBytes.
StatusOr<ParsedRecord> ParseRecordAt(ChunkReader& reader, uint64_t offset, uint64_t size) {
  ParsedRecord out;
  const uint64_t remaining = size - offset;
  if (remaining < kCatalogRecordPrefixBytes) return out;
  KVF_ASSIGN_OR_RETURN(const std::byte* prefix, reader.Get(offset, kCatalogRecordPrefixBytes));
  const uint32_t body_bytes = GetU32(prefix + kOffBodyBytes);
  if (body_bytes < kCatalogRecordFixedBodyBytes || body_bytes > kCatalogMaxRecordBodyBytes) {
    return out;
  }
  const uint64_t record_bytes = kCatalogRecordPrefixBytes + body_bytes;
  if (record_bytes > remaining) return out;
  KVF_ASSIGN_OR_RETURN(const std::byte* p, reader.Get(offset, record_bytes));
  const uint32_t stored = crc32c::Unmask(GetU32(p + kOffRecordCrc));
  if (stored != crc32c::Value(p + kOffBodyBytes, 4 + body_bytes)) return out;
  out.bytes = record_bytes;
  out.p = p;
  out.check = GetU16(p + kOffTenantBytes) == body_bytes - kCatalogRecordFixedBodyBytes
                  ? RecordCheck::kIntact
                  : RecordCheck::kInconsistent;
  return out;
}

}  // namespace

Status NvmeCatalog::Recover(CatalogRecovery* report) {
  KVF_ASSIGN_OR_RETURN(const uint64_t size, file_->Size());
  ChunkReader reader(file_.get(), size);
  {
    std::array<std::byte, kCatalogFileHeaderBytes> header{};
    if (size >= kCatalogFileHeaderBytes) {
      KVF_ASSIGN_OR_RETURN(const std::byte* h, reader.Get(0, kCatalogFileHeaderBytes));
      std::memcpy(header.data(), h, header.size());
    }
    KVF_RETURN_IF_ERROR(CheckFileHeader(path_, header, size));
    if (GetU16(header.data() + 4) == kCatalogFormatVersionWithoutNvmeKeys) {
      // Its records name block keys without their namespace: start empty.
      const auto fresh = EncodeFileHeader();
      KVF_RETURN_IF_ERROR(file_->Truncate(0));
      KVF_RETURN_IF_ERROR(file_->Write(0, fresh));
      KVF_RETURN_IF_ERROR(file_->Sync());
      report->dropped_v1_bytes = size;
      spdlog::warn(
          "NVMe catalog {}: format version 1 (NVMe keys not per namespace): replaced by an "
          "empty version-{} log ({} dropped); the blocks it described are dropped as blocks "
          "without a catalog record",
          path_, kCatalogFormatVersion, FormatBytes(size));
      end_ = kCatalogFileHeaderBytes;
      report->file_bytes = end_;
      stats_.file_bytes = end_;
      return Status::OK();
    }
  }

  uint64_t offset = kCatalogFileHeaderBytes;
  bool torn = false;
  while (offset < size) {
    KVF_ASSIGN_OR_RETURN(ParsedRecord record, ParseRecordAt(reader, offset, size));
    if (record.check == RecordCheck::kBad) {
      // Damaged bytes: their length field cannot be trusted, so look for the
      // next position holding a record whose CRC holds. If there is one, the
      // bytes in between are a corrupt region (counted as one record);
      // otherwise they are the torn tail of the last, interrupted append.
      uint64_t next = offset + 1;
      for (; next + kCatalogRecordPrefixBytes + kCatalogRecordFixedBodyBytes <= size; ++next) {
        KVF_ASSIGN_OR_RETURN(ParsedRecord candidate, ParseRecordAt(reader, next, size));
        if (candidate.check != RecordCheck::kBad) break;
      }
      if (next + kCatalogRecordPrefixBytes + kCatalogRecordFixedBodyBytes > size) {
        torn = true;
        break;
      }
      ++report->corrupt_records;
      offset = next;
      continue;
    }
    if (record.check == RecordCheck::kInconsistent) {
      ++report->corrupt_records;  // its CRC holds, so its length can be trusted to skip it
      offset += record.bytes;
      continue;
    }
    const std::byte* p = record.p;
    BlockDigest key;
    std::memcpy(key.data(), p + kOffKey, key.size());
    Slot slot;
    std::memcpy(slot.block_key.data(), p + kOffBlockKey, slot.block_key.size());
    const std::string tenant(reinterpret_cast<const char*>(p + kOffTenant),
                             record.bytes - kOffTenant);
    slot.tenant = InternTenantLocked(tenant);
    slot.token_offset = GetU64(p + kOffTokenOffset);
    entries_[key] = slot;
    ++report->records;
    offset += record.bytes;
  }

  if (torn) {
    report->torn_records = 1;
    report->truncated_bytes = size - offset;
    KVF_RETURN_IF_ERROR(
        file_->Truncate(offset).WithContext("NVMe catalog " + path_ + ": truncating a torn tail"));
  }
  // Make what recovery returns durable: after a process crash (not a power
  // failure) an unsynced batch may read back intact without being on disk,
  // and the tier may recover (and sync) the blocks it describes.
  KVF_RETURN_IF_ERROR(file_->Sync().WithContext("NVMe catalog " + path_));
  end_ = offset;
  report->entries = entries_.size();
  report->file_bytes = end_;
  stats_.records = report->records;
  stats_.file_bytes = end_;
  return Status::OK();
}

uint32_t NvmeCatalog::InternTenantLocked(const std::string& tenant) {
  auto [it, inserted] = tenant_ids_.try_emplace(tenant, static_cast<uint32_t>(tenants_.size()));
  if (inserted) tenants_.push_back(tenant);
  return it->second;
}

CatalogEntry NvmeCatalog::EntryLocked(const BlockDigest& key, const Slot& slot) const {
  CatalogEntry entry;
  entry.key = key;
  entry.block_key = slot.block_key;
  entry.tenant = tenants_[slot.tenant];
  entry.token_offset = slot.token_offset;
  return entry;
}

Status NvmeCatalog::AppendBatch(std::span<const CatalogEntry> entries) {
  MutexLock lock(&mu_);
  return AppendLocked(entries, /*sync=*/true);
}

Status NvmeCatalog::TEST_AppendBatchWithoutSync(std::span<const CatalogEntry> entries) {
  MutexLock lock(&mu_);
  return AppendLocked(entries, /*sync=*/false);
}

Status NvmeCatalog::AppendLocked(std::span<const CatalogEntry> entries, bool sync) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].tenant.size() > kMaxNamespaceBytes) {
      return Status::InvalidArgument(
          "NVMe catalog: entry " + std::to_string(i) + " of the batch has a tenant of " +
          std::to_string(entries[i].tenant.size()) +
          " bytes, more than kMaxNamespaceBytes = " + std::to_string(kMaxNamespaceBytes));
    }
  }
  if (!broken_.ok()) return broken_;
  if (entries.empty()) return Status::OK();
  if (dir_sync_pending_) {
    Status s = env_->SyncDir(dir_);
    if (!s.ok()) {
      ++stats_.failed_batches;
      return s.WithContext("NVMe catalog " + path_ +
                           ": directory sync after compaction (retried before appending)");
    }
    dir_sync_pending_ = false;
  }

  std::vector<std::byte> buffer;
  uint64_t bytes = 0;
  for (const CatalogEntry& e : entries) bytes += CatalogRecordBytes(e);
  buffer.reserve(bytes);
  for (const CatalogEntry& e : entries) {
    EncodeRecord(e.key, e.block_key, e.tenant, e.token_offset, &buffer);
  }

  Status s = file_->Write(end_, buffer);
  if (s.ok() && sync) s = file_->Sync();
  if (!s.ok()) {
    ++stats_.failed_batches;
    // Put the file back where the last acknowledged batch left it, so the
    // next batch does not land after records of unknown durability.
    Status rollback = file_->Truncate(end_);
    if (rollback.ok()) rollback = file_->Sync();
    if (!rollback.ok()) {
      broken_ = Status::FailedPrecondition(
          "NVMe catalog " + path_ + ": an append failed (" + s.ToString() +
          ") and rolling it back failed too (" + rollback.ToString() +
          "); the file is in an unknown state: reopen the catalog");
    }
    return s.WithContext("NVMe catalog " + path_ + ": appending " + std::to_string(entries.size()) +
                         " records");
  }
  end_ += buffer.size();
  for (const CatalogEntry& e : entries) {
    entries_[e.key] = Slot{InternTenantLocked(e.tenant), e.token_offset, e.block_key};
  }
  stats_.records += entries.size();
  stats_.file_bytes = end_;
  ++stats_.batches;
  stats_.appended_records += entries.size();
  return Status::OK();
}

std::optional<CatalogEntry> NvmeCatalog::Find(const BlockDigest& key) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return EntryLocked(key, it->second);
}

bool NvmeCatalog::Forget(const BlockDigest& key) {
  MutexLock lock(&mu_);
  return entries_.erase(key) > 0;
}

Status NvmeCatalog::Compact(std::span<const BlockDigest> live_keys) {
  MutexLock lock(&mu_);
  SlotMap keep;
  keep.reserve(std::min(live_keys.size(), entries_.size()));
  uint64_t unknown = 0;
  for (const BlockDigest& key : live_keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      ++unknown;
    } else {
      keep.emplace(key, it->second);
    }
  }
  const uint64_t old_records = stats_.records;
  const uint64_t old_bytes = end_;
  KVF_RETURN_IF_ERROR(RewriteLocked(std::move(keep)));
  spdlog::info(
      "NVMe catalog {}: compacted {} records ({}) to {} ({}); {} live keys given had no record",
      path_, old_records, FormatBytes(old_bytes), stats_.records, FormatBytes(end_), unknown);
  return Status::OK();
}

Status NvmeCatalog::Compact() {
  MutexLock lock(&mu_);
  const uint64_t old_records = stats_.records;
  const uint64_t old_bytes = end_;
  KVF_RETURN_IF_ERROR(RewriteLocked(entries_));
  spdlog::info("NVMe catalog {}: compacted {} records ({}) to {} ({})", path_, old_records,
               FormatBytes(old_bytes), stats_.records, FormatBytes(end_));
  return Status::OK();
}

Status NvmeCatalog::RewriteLocked(SlotMap keep) {
  // Re-intern the tenants that are still used, so the table shrinks too.
  std::vector<std::string> tenants;
  std::unordered_map<std::string, uint32_t> tenant_ids;
  for (auto& [key, slot] : keep) {
    const std::string& name = tenants_[slot.tenant];
    auto [it, inserted] = tenant_ids.try_emplace(name, static_cast<uint32_t>(tenants.size()));
    if (inserted) tenants.push_back(name);
    slot.tenant = it->second;
  }

  // Step 1: the new log, complete and synced, under the temporary name.
  uint64_t written = 0;
  Status s = [&]() -> Status {
    FileOptions options;
    options.create = true;
    options.truncate = true;
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> tmp,
                         env_->NewRandomRWFile(temp_path_, options));
    std::vector<std::byte> buffer;
    buffer.reserve(kIoChunkBytes);
    const auto header = EncodeFileHeader();
    buffer.insert(buffer.end(), header.begin(), header.end());
    for (const auto& [key, slot] : keep) {
      EncodeRecord(key, slot.block_key, tenants[slot.tenant], slot.token_offset, &buffer);
      if (buffer.size() + kCatalogRecordPrefixBytes + kCatalogMaxRecordBodyBytes > kIoChunkBytes) {
        KVF_RETURN_IF_ERROR(tmp->Write(written, buffer));
        written += buffer.size();
        buffer.clear();
      }
    }
    KVF_RETURN_IF_ERROR(tmp->Write(written, buffer));
    written += buffer.size();
    KVF_RETURN_IF_ERROR(tmp->Sync());
    return tmp->Close();
  }();
  // Step 2: the rename makes it the log (atomically: the old one or the new).
  if (s.ok()) s = env_->RenameFile(temp_path_, path_);
  if (!s.ok()) {
    // Best effort: the error that matters is `s`, and Open deletes a leftover.
    env_->DeleteFile(temp_path_).IgnoreError();
    return s.WithContext("NVMe catalog " + path_ + ": compacting (the old log is unchanged)");
  }

  // The new log is in place: memory follows it whatever happens next.
  entries_ = std::move(keep);
  tenants_ = std::move(tenants);
  tenant_ids_ = std::move(tenant_ids);
  end_ = written;
  stats_.records = entries_.size();
  stats_.file_bytes = end_;
  ++stats_.compactions;
  if (file_ != nullptr) file_->Close().IgnoreError();  // the old log's inode, now unlinked
  file_.reset();
  StatusOr<std::unique_ptr<RandomRWFile>> reopened = env_->NewRandomRWFile(path_, FileOptions{});
  if (!reopened.ok()) {
    broken_ = Status::FailedPrecondition("NVMe catalog " + path_ +
                                         ": reopening the log after compaction failed (" +
                                         reopened.status().ToString() + "): reopen the catalog");
    return broken_;
  }
  file_ = std::move(reopened).value();
  broken_ = Status::OK();  // the file is now exactly what memory says

  // Step 3: make the rename durable. Until then a crash may bring back the old
  // log, which holds a superset of these records; but appends must not go to
  // the new file while its name could still revert.
  s = env_->SyncDir(dir_);
  if (!s.ok()) {
    dir_sync_pending_ = true;
    return s.WithContext("NVMe catalog " + path_ +
                         ": directory sync after compaction (the new log is in place; the next "
                         "append retries the sync)");
  }
  dir_sync_pending_ = false;
  return Status::OK();
}

bool NvmeCatalog::healthy() const {
  MutexLock lock(&mu_);
  return broken_.ok();
}

CatalogStats NvmeCatalog::stats() const {
  MutexLock lock(&mu_);
  CatalogStats s = stats_;
  s.live_entries = entries_.size();
  s.tenants = tenants_.size();
  return s;
}

}  // namespace kvfabric::cache_host
