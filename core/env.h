// Env: every operating-system service kvfabric uses (files, directories,
// clocks) goes through this interface, so that tests can swap in a
// fault-injecting or simulated implementation (core/testing/
// fault_injection_env.h). Modelled on LevelDB's include/leveldb/env.h.
//
// Ownership: Env::Default() returns a process-wide POSIX Env that is never
// destroyed. Other Envs are owned by whoever constructs them and must outlive
// every file they opened. Files are returned as std::unique_ptr; destroying a
// file closes it.
//
// Thread safety: an Env may be called from any number of threads at once.
// Distinct RandomRWFile objects may be used concurrently. One RandomRWFile may
// be used concurrently for Read and Write at distinct (non-overlapping)
// offsets, as pread/pwrite allow; Size, Sync and Truncate may run concurrently
// with those. Overlapping concurrent writes leave unspecified bytes in the
// overlap. Close (and destruction) must not race with any other call on the
// same file.
//
// Durability promise:
//  - Data written to a file is durable (survives a crash or power loss) once a
//    later Sync() on that file has returned OK. Before that, any subset of the
//    unsynced writes may be lost, and the file size may revert.
//  - A newly created file's name, a rename and a deletion are durable once
//    SyncDir() of the directory holding the name has returned OK afterwards.
//    Sync() of the file does not make its name durable.
//  - WriteStringToFileSync() is atomic: after a crash the file holds either
//    its previous contents or the new ones, never a mix.
//
// Errors: every errno is converted by StatusFromErrno (core/errno_status.h)
// with a context naming the operation and the path, e.g.
// "open /data/blk.0: No such file or directory (errno 2)".
#ifndef KVFABRIC_CORE_ENV_H_
#define KVFABRIC_CORE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// How Env::NewRandomRWFile opens a file.
struct FileOptions {
  // Open with O_DIRECT: reads and writes bypass the page cache and go to the
  // device. Every Read/Write must then use an offset, a length and a buffer
  // address that are multiples of Env::DirectIoAlignment() (use AlignedBuffer,
  // core/aligned_buffer.h); a misaligned call returns InvalidArgument without
  // touching the file. A filesystem that refuses O_DIRECT (e.g. tmpfs on older
  // kernels, procfs) makes the open fail with InvalidArgument.
  // Default false: the page cache absorbs small and unaligned I/O; the NVMe
  // tier sets it to avoid double-caching blocks already in the host pool.
  bool direct_io = false;

  // Create the file (mode 0644) if it does not exist. Default false: opening a
  // missing file returns NotFound, so a misspelt path never creates a file.
  bool create = false;

  // Truncate an existing file to zero bytes on open. Default false.
  bool truncate = false;

  // With `create`: fail with AlreadyExists if the file exists (O_EXCL).
  // Default false.
  bool exclusive = false;

  // Open for reading only; Write and Truncate then return FailedPrecondition.
  // Default false. Needed to read files this process may not write.
  // REQUIRES: !truncate.
  bool read_only = false;
};

// A file read and written at explicit offsets (pread/pwrite), never through a
// shared file position. See the Env comment for thread safety.
class RandomRWFile {
 public:
  RandomRWFile() = default;
  RandomRWFile(const RandomRWFile&) = delete;
  RandomRWFile& operator=(const RandomRWFile&) = delete;

  // Closes the file if Close() was not called; an error from that close is
  // dropped, so call Close() where the outcome matters.
  virtual ~RandomRWFile() = default;

  // Reads up to dst.size() bytes starting at `offset` into dst. Returns the
  // number of bytes read: dst.size() unless the file ends first (a short read
  // at end of file reports the count; 0 at or past the end). Retries EINTR.
  virtual StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> dst) = 0;

  // Writes all of `src` at `offset`, extending the file (with zeros before
  // `offset` if it lies past the end) as needed. Either every byte is written
  // or an error is returned; partial writes and EINTR are retried. The data is
  // not durable until Sync() returns OK.
  virtual Status Write(uint64_t offset, std::span<const std::byte> src) = 0;

  // Makes every write that returned before this call durable (fdatasync).
  virtual Status Sync() = 0;

  // The current size of the file in bytes.
  virtual StatusOr<uint64_t> Size() = 0;

  // Sets the file's size to `size`, dropping bytes past it or extending with
  // zeros. Not durable until Sync() returns OK.
  virtual Status Truncate(uint64_t size) = 0;

  // Closes the file. Every later call, Close included, returns
  // FailedPrecondition. Close does not sync.
  virtual Status Close() = 0;
};

class Env {
 public:
  // The alignment O_DIRECT I/O needs on every filesystem and device kvfabric
  // supports: 4096 bytes, the page size and the largest common logical block
  // size of NVMe namespaces (512 would do on some devices, 4096 does on all).
  static constexpr size_t kDefaultDirectIoAlignment = 4096;

  Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  virtual ~Env() = default;

  // The process-wide POSIX Env. Never destroyed; safe to use from static
  // destructors and from any thread.
  static Env* Default();

  // Offset, length and buffer address alignment required for files opened
  // with FileOptions::direct_io. Always a power of two.
  virtual size_t DirectIoAlignment() const { return kDefaultDirectIoAlignment; }

  // ---- Files ----

  // Opens (and per `options`, creates or truncates) the file at `path`.
  // NotFound if it is missing and !options.create; InvalidArgument if
  // options.direct_io and the filesystem refuses O_DIRECT (the message says
  // so and names the path).
  virtual StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                                  const FileOptions& options) = 0;

  // ---- Filesystem ----

  // True if something (file, directory, ...) exists at `path`. An error while
  // checking (e.g. permission denied on a parent) reads as false.
  virtual bool FileExists(const std::string& path) = 0;

  // The names (not paths) of the entries of `dir`, without "." and "..",
  // sorted bytewise.
  virtual StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;

  // Creates `dir` (mode 0755) unless a directory exists there already. The
  // parent must exist. AlreadyExists if a non-directory is in the way.
  virtual Status CreateDirIfMissing(const std::string& dir) = 0;

  // Removes the file at `path`. NotFound if there is none.
  virtual Status DeleteFile(const std::string& path) = 0;

  // Removes the empty directory `dir`.
  virtual Status DeleteDir(const std::string& dir) = 0;

  // Atomically renames `src` to `target`, replacing `target` if it exists.
  // Durable once the directories of both names are synced (SyncDir).
  virtual Status RenameFile(const std::string& src, const std::string& target) = 0;

  // The size in bytes of the file at `path`.
  virtual StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;

  // Makes the creations, renames and deletions of names in `dir` durable:
  // opens the directory and fsyncs it.
  virtual Status SyncDir(const std::string& dir) = 0;

  // ---- Clock ----

  // Microseconds on a monotonic clock with an arbitrary origin: use for
  // durations, deadlines and rates. Never goes backwards.
  virtual uint64_t NowMicros() = 0;

  // Microseconds since the Unix epoch on the real-time clock. It can jump
  // (NTP, an operator): use only for display and log timestamps, never for
  // durations.
  virtual uint64_t WallMicros() = 0;

  // Blocks the calling thread for at least `micros` microseconds.
  virtual void SleepForMicros(uint64_t micros) = 0;
};

// An Env that forwards every call to another (LevelDB's and RocksDB's
// EnvWrapper): subclasses override only what they change, e.g. a test's
// clock or one file operation.
class EnvWrapper : public Env {
 public:
  // `target` is borrowed and must outlive the wrapper.
  explicit EnvWrapper(Env* target) : target_(target) {}

  Env* target() const { return target_; }

  size_t DirectIoAlignment() const override { return target_->DirectIoAlignment(); }
  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override {
    return target_->NewRandomRWFile(path, options);
  }
  bool FileExists(const std::string& path) override { return target_->FileExists(path); }
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return target_->GetChildren(dir);
  }
  Status CreateDirIfMissing(const std::string& dir) override {
    return target_->CreateDirIfMissing(dir);
  }
  Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  Status DeleteDir(const std::string& dir) override { return target_->DeleteDir(dir); }
  Status RenameFile(const std::string& src, const std::string& target) override {
    return target_->RenameFile(src, target);
  }
  StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    return target_->GetFileSize(path);
  }
  Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  uint64_t NowMicros() override { return target_->NowMicros(); }
  uint64_t WallMicros() override { return target_->WallMicros(); }
  void SleepForMicros(uint64_t micros) override { target_->SleepForMicros(micros); }

 private:
  Env* const target_;
};

// The directory part of `path`: "a/b" for "a/b/c", "." for "c", "/" for "/c".
std::string DirName(std::string_view path);

// Atomically replaces the contents of `path` with `data`: writes
// "<path>.tmp", syncs it, renames it over `path` and syncs the directory.
// Returns OK only once the new contents and the name are durable. If it fails
// before the rename, `path` is unchanged and the temporary file is removed
// (best effort); if only the final SyncDir fails, the new contents are in
// place but may revert to the old ones after a crash.
// REQUIRES: no other writer uses `path` (or "<path>.tmp") at the same time.
Status WriteStringToFileSync(Env* env, std::string_view data, const std::string& path);

// The whole contents of the file at `path`.
StatusOr<std::string> ReadFileToString(Env* env, const std::string& path);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_ENV_H_
