#include "core/testing/fault_injection_env.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/mutex.h"

namespace kvfabric {

namespace {

// "a/b/" and "a/b" name the same directory.
std::string NormalizeDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string DirOf(const std::string& path) { return NormalizeDir(DirName(path)); }

std::string AtOffset(std::string_view op, const std::string& path, uint64_t offset) {
  return std::string(op) + " " + path + " at offset " + std::to_string(offset);
}

// A plain (page-cache) read-write handle on an existing file, for the undo
// log and restores: they need neither O_DIRECT alignment nor the caller's
// handle.
StatusOr<std::unique_ptr<RandomRWFile>> OpenBuffered(Env* env, const std::string& path) {
  return env->NewRandomRWFile(path, FileOptions{});
}

}  // namespace

// A handle opened through FaultInjectionEnv: every call goes to the Env,
// which does the bookkeeping under its mutex and then calls `base_`.
class FaultInjectionEnv::File final : public RandomRWFile {
 public:
  File(FaultInjectionEnv* env, std::unique_ptr<RandomRWFile> base, std::shared_ptr<FileState> state,
       bool direct_io)
      : env_(env), base_(std::move(base)), state_(std::move(state)), direct_io_(direct_io) {}

  StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> dst) override {
    return env_->FileRead(*this, offset, dst);
  }
  Status Write(uint64_t offset, std::span<const std::byte> src) override {
    return env_->FileWrite(*this, offset, src);
  }
  Status Sync() override { return env_->FileSync(*this); }
  StatusOr<uint64_t> Size() override { return base_->Size(); }
  Status Truncate(uint64_t size) override { return env_->FileTruncate(*this, size); }
  // Closing loses nothing (writes went straight to the base file), so it
  // works even while the filesystem is inactive.
  Status Close() override { return base_->Close(); }

 private:
  friend class FaultInjectionEnv;

  FaultInjectionEnv* const env_;
  const std::unique_ptr<RandomRWFile> base_;
  // Its fields are guarded by env_->mu_ (not KVF_PT_GUARDED_BY: clang 14 takes
  // raw pointers only).
  const std::shared_ptr<FileState> state_;
  const bool direct_io_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base) : base_(base) {}

FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::SetFilesystemActive(bool active) {
  MutexLock lock(&mu_);
  active_ = active;
}

bool FaultInjectionEnv::IsFilesystemActive() const {
  MutexLock lock(&mu_);
  return active_;
}

void FaultInjectionEnv::SetWriteFailureOneIn(uint32_t n, uint64_t seed) {
  MutexLock lock(&mu_);
  write_failure_.one_in = n;
  write_failure_.rng.seed(seed);
}

void FaultInjectionEnv::SetReadFailureOneIn(uint32_t n, uint64_t seed) {
  MutexLock lock(&mu_);
  read_failure_.one_in = n;
  read_failure_.rng.seed(seed);
}

void FaultInjectionEnv::SetReadCorruptionOneIn(uint32_t n, uint64_t seed) {
  MutexLock lock(&mu_);
  read_corruption_.one_in = n;
  read_corruption_.rng.seed(seed);
}

FaultInjectionCounters FaultInjectionEnv::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

void FaultInjectionEnv::ResetCounters() {
  MutexLock lock(&mu_);
  counters_ = FaultInjectionCounters();
}

Status FaultInjectionEnv::CheckActiveLocked(std::string_view op, const std::string& path) const {
  if (active_) return Status::OK();
  return Status::Unavailable("filesystem inactive (simulated crash): " + std::string(op) + " " +
                             path);
}

bool FaultInjectionEnv::InjectWriteFailureLocked() {
  if (!write_failure_.Next()) return false;
  ++counters_.injected_write_failures;
  return true;
}

bool FaultInjectionEnv::IsNewLocked(const std::string& path) const {
  auto it = new_files_.find(DirOf(path));
  return it != new_files_.end() && it->second.count(path) != 0;
}

void FaultInjectionEnv::EraseNewLocked(const std::string& path) {
  auto it = new_files_.find(DirOf(path));
  if (it == new_files_.end()) return;
  it->second.erase(path);
  if (it->second.empty()) new_files_.erase(it);
}

void FaultInjectionEnv::ForgetFileLocked(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return;
  it->second->path.clear();
  files_.erase(it);
}

Status FaultInjectionEnv::SaveUndoLocked(FileState& state, RandomRWFile* file, bool direct_io,
                                         uint64_t begin, uint64_t end) {
  if (state.path.empty()) return Status::OK();  // deleted or replaced: not tracked
  KVF_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  // Bytes at or past the synced size are cut off by the restore anyway; bytes
  // between the current size and the synced size were saved when the file
  // shrank.
  const uint64_t hi = std::min({end, state.synced_size, size});
  if (begin >= hi) return Status::OK();
  std::vector<std::byte> old_bytes(hi - begin);
  std::unique_ptr<RandomRWFile> buffered;
  RandomRWFile* reader = file;
  if (direct_io) {
    KVF_ASSIGN_OR_RETURN(buffered, OpenBuffered(base_, state.path));
    reader = buffered.get();
  }
  KVF_ASSIGN_OR_RETURN(size_t n, reader->Read(begin, old_bytes));
  old_bytes.resize(n);
  state.undo.push_back(UndoRecord{begin, std::move(old_bytes)});
  return Status::OK();
}

Status FaultInjectionEnv::RestoreFileLocked(FileState& state) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, OpenBuffered(base_, state.path));
  for (auto it = state.undo.rbegin(); it != state.undo.rend(); ++it) {
    KVF_RETURN_IF_ERROR(file->Write(it->offset, it->old_bytes));
  }
  KVF_RETURN_IF_ERROR(file->Truncate(state.synced_size));
  KVF_RETURN_IF_ERROR(file->Sync());
  KVF_RETURN_IF_ERROR(file->Close());
  state.undo.clear();
  state.dirty = false;
  return Status::OK();
}

StatusOr<size_t> FaultInjectionEnv::FileRead(File& file, uint64_t offset,
                                             std::span<std::byte> dst) {
  MutexLock lock(&mu_);
  ++counters_.reads;
  if (read_failure_.Next()) {
    ++counters_.injected_read_failures;
    return Status::DataLoss("injected read failure: " +
                            AtOffset("pread", file.state_->path, offset));
  }
  const bool corrupt = read_corruption_.Next();
  const uint64_t which_bit = corrupt ? read_corruption_.rng() : 0;
  KVF_ASSIGN_OR_RETURN(size_t n, file.base_->Read(offset, dst));
  if (corrupt && n > 0) {
    const uint64_t bit = which_bit % (static_cast<uint64_t>(n) * 8);
    dst[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    ++counters_.injected_read_corruptions;
  }
  return n;
}

Status FaultInjectionEnv::FileWrite(File& file, uint64_t offset, std::span<const std::byte> src) {
  MutexLock lock(&mu_);
  ++counters_.writes;
  FileState& state = *file.state_;
  KVF_RETURN_IF_ERROR(CheckActiveLocked("pwrite", state.path));
  if (InjectWriteFailureLocked()) {
    return Status::Unavailable("injected write failure: " + AtOffset("pwrite", state.path, offset));
  }
  if (!state.path.empty()) {
    const uint64_t end =
        offset + std::min<uint64_t>(src.size(), std::numeric_limits<uint64_t>::max() - offset);
    KVF_RETURN_IF_ERROR(SaveUndoLocked(state, file.base_.get(), file.direct_io_, offset, end));
    state.dirty = true;
  }
  return file.base_->Write(offset, src);
}

Status FaultInjectionEnv::FileTruncate(File& file, uint64_t size) {
  MutexLock lock(&mu_);
  FileState& state = *file.state_;
  KVF_RETURN_IF_ERROR(CheckActiveLocked("ftruncate", state.path));
  if (InjectWriteFailureLocked()) {
    return Status::Unavailable("injected write failure: ftruncate " + state.path + " to " +
                               std::to_string(size));
  }
  if (!state.path.empty()) {
    KVF_RETURN_IF_ERROR(SaveUndoLocked(state, file.base_.get(), file.direct_io_, size,
                                       std::numeric_limits<uint64_t>::max()));
    state.dirty = true;
  }
  return file.base_->Truncate(size);
}

Status FaultInjectionEnv::FileSync(File& file) {
  MutexLock lock(&mu_);
  ++counters_.syncs;
  FileState& state = *file.state_;
  KVF_RETURN_IF_ERROR(CheckActiveLocked("fdatasync", state.path));
  if (InjectWriteFailureLocked()) {
    return Status::Unavailable("injected write failure: fdatasync " + state.path);
  }
  KVF_RETURN_IF_ERROR(file.base_->Sync());
  if (!state.path.empty()) {
    KVF_ASSIGN_OR_RETURN(state.synced_size, file.base_->Size());
    state.undo.clear();
    state.dirty = false;
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<RandomRWFile>> FaultInjectionEnv::NewRandomRWFile(
    const std::string& path, const FileOptions& options) {
  MutexLock lock(&mu_);
  const bool existed = base_->FileExists(path);
  if ((options.create && !existed) || options.truncate) {
    KVF_RETURN_IF_ERROR(CheckActiveLocked("open", path));
  }
  // Truncation on open goes through the undo log below, not through O_TRUNC.
  FileOptions base_options = options;
  base_options.truncate = false;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> base_file,
                       base_->NewRandomRWFile(path, base_options));
  const bool created = options.create && !existed;
  if (created) {
    ForgetFileLocked(path);  // whatever we knew of an earlier file by this name
    new_files_[DirOf(path)].insert(path);
  }

  std::shared_ptr<FileState>& slot = files_[path];
  if (slot == nullptr) {
    slot = std::make_shared<FileState>();
    slot->path = path;
    if (created) {
      slot->synced_size = 0;
    } else {
      // A file this Env has not written counts as durable as it stands.
      auto size = base_file->Size();
      if (!size.ok()) {
        files_.erase(path);
        return std::move(size).status();
      }
      slot->synced_size = *size;
    }
  }
  std::shared_ptr<FileState> state = slot;
  if (options.truncate) {
    KVF_RETURN_IF_ERROR(SaveUndoLocked(*state, base_file.get(), options.direct_io, 0,
                                       std::numeric_limits<uint64_t>::max()));
    state->dirty = true;
    KVF_RETURN_IF_ERROR(base_file->Truncate(0));
  }
  return std::unique_ptr<RandomRWFile>(
      std::make_unique<File>(this, std::move(base_file), std::move(state), options.direct_io));
}

bool FaultInjectionEnv::FileExists(const std::string& path) { return base_->FileExists(path); }

StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return base_->GetChildren(dir);
}

StatusOr<uint64_t> FaultInjectionEnv::GetFileSize(const std::string& path) {
  return base_->GetFileSize(path);
}

Status FaultInjectionEnv::CreateDirIfMissing(const std::string& dir) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckActiveLocked("mkdir", dir));
  return base_->CreateDirIfMissing(dir);
}

Status FaultInjectionEnv::DeleteDir(const std::string& dir) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckActiveLocked("rmdir", dir));
  return base_->DeleteDir(dir);
}

Status FaultInjectionEnv::DeleteFile(const std::string& path) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckActiveLocked("unlink", path));
  KVF_RETURN_IF_ERROR(base_->DeleteFile(path));
  ForgetFileLocked(path);
  EraseNewLocked(path);
  std::erase_if(pending_renames_, [&](const PendingRename& r) { return r.target == path; });
  return Status::OK();
}

Status FaultInjectionEnv::RenameFile(const std::string& src, const std::string& target) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckActiveLocked("rename", src + " to " + target));
  const bool target_durable = base_->FileExists(target) && !IsNewLocked(target);
  const bool src_new = IsNewLocked(src);
  KVF_RETURN_IF_ERROR(base_->RenameFile(src, target));
  if (src == target) return Status::OK();

  ForgetFileLocked(target);
  auto it = files_.find(src);
  if (it != files_.end()) {
    std::shared_ptr<FileState> state = std::move(it->second);
    files_.erase(it);
    state->path = target;
    files_[target] = std::move(state);
  }
  EraseNewLocked(src);
  EraseNewLocked(target);
  // Whatever rename put the old file at `target` is superseded.
  std::erase_if(pending_renames_, [&](const PendingRename& r) { return r.target == target; });
  if (target_durable) {
    // Treated as having reached the disk: `target` holds the renamed file.
  } else if (src_new) {
    new_files_[DirOf(target)].insert(target);
  } else {
    pending_renames_.push_back(PendingRename{src, target, DirOf(target)});
  }
  return Status::OK();
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckActiveLocked("fsync directory", dir));
  KVF_RETURN_IF_ERROR(base_->SyncDir(dir));
  const std::string key = NormalizeDir(dir);
  new_files_.erase(key);
  std::erase_if(pending_renames_, [&](const PendingRename& r) { return r.target_dir == key; });
  return Status::OK();
}

Status FaultInjectionEnv::DropUnsyncedData() {
  MutexLock lock(&mu_);
  Status first_error;
  auto note = [&first_error](Status s) {
    if (first_error.ok() && !s.ok()) first_error = std::move(s);
  };

  // 1. Names never made durable disappear.
  for (const auto& [dir, paths] : new_files_) {
    for (const std::string& path : paths) {
      Status s = base_->DeleteFile(path);
      if (s.ok()) {
        ++counters_.files_dropped;
      } else if (!s.IsNotFound()) {
        note(std::move(s));
      }
      ForgetFileLocked(path);
    }
  }
  new_files_.clear();

  // 2. Surviving files rewind to their last Sync.
  for (auto& [path, state] : files_) {
    if (!state->dirty) continue;
    Status s = RestoreFileLocked(*state);
    if (s.ok()) {
      ++counters_.files_restored;
    } else {
      note(std::move(s));
    }
  }

  // 3. Renames that were not made durable are undone, newest first.
  for (auto it = pending_renames_.rbegin(); it != pending_renames_.rend(); ++it) {
    if (!base_->FileExists(it->target) || base_->FileExists(it->src)) continue;
    Status s = base_->RenameFile(it->target, it->src);
    if (!s.ok()) {
      note(std::move(s));
      continue;
    }
    ForgetFileLocked(it->src);
    auto state_it = files_.find(it->target);
    if (state_it != files_.end()) {
      std::shared_ptr<FileState> state = std::move(state_it->second);
      files_.erase(state_it);
      state->path = it->src;
      files_[it->src] = std::move(state);
    }
  }
  pending_renames_.clear();
  return first_error;
}

Status FaultInjectionEnv::CorruptBytes(const std::string& path, uint64_t offset, uint64_t count,
                                       uint64_t seed) {
  MutexLock lock(&mu_);
  if (count > std::numeric_limits<uint64_t>::max() - offset) {
    return Status::InvalidArgument("CorruptBytes " + path + ": offset + count overflows");
  }
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, OpenBuffered(base_, path));
  KVF_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (offset + count > size) {
    return Status::OutOfRange("CorruptBytes " + path + ": bytes [" + std::to_string(offset) + ", " +
                              std::to_string(offset + count) + ") pass the end of the " +
                              std::to_string(size) + "-byte file");
  }
  std::vector<std::byte> bytes(count);
  KVF_ASSIGN_OR_RETURN(size_t n, file->Read(offset, bytes));
  if (n != count) {
    return Status::Internal("CorruptBytes " + path + ": read " + std::to_string(n) + " of " +
                            std::to_string(count) + " bytes");
  }
  std::mt19937_64 rng(seed);
  for (std::byte& b : bytes) b ^= static_cast<std::byte>(1u << (rng() % 8));
  KVF_RETURN_IF_ERROR(file->Write(offset, bytes));
  KVF_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace kvfabric
