// FaultInjectionEnv: an Env for tests that wraps a real one, remembers what has
// been made durable, and can throw the rest away, fail calls, or corrupt bytes.
// Modelled on RocksDB's utilities/fault_injection_fs.h.
//
// Simulating a crash:
//   env.SetFilesystemActive(false);   // the "process" dies: writes now fail
//   ... destroy the objects under test ...
//   ASSERT_TRUE(env.DropUnsyncedData().ok());  // the "power" fails
//   env.SetFilesystemActive(true);    // "reboot": reopen and check
//
// What is remembered, per file written through this Env:
//  - its synced state: the size at its last successful Sync() (or when this
//    Env first opened it, for a file that already existed), and an undo log of
//    the bytes below that size that unsynced writes and truncations replaced.
//    Sync() clears the log. DropUnsyncedData() applies the log in reverse and
//    truncates to the synced size, restoring the file exactly as it was synced.
//  - whether its name is durable: a file created through this Env is "new"
//    until SyncDir() of its directory; DropUnsyncedData() deletes new files.
//  - renames: a rename carries the file's state to the new name. Renaming a
//    durable file onto a name that held no durable file is undone by
//    DropUnsyncedData() unless SyncDir() of the target's directory ran since;
//    renaming onto a durable file is treated as having reached the disk (the
//    other outcome a real crash allows, and the one that keeps both names'
//    contents well defined).
// Deletions and directory creation/removal are treated as durable at once.
// Files written behind this Env's back (through the base Env) are not tracked.
// Paths are compared as strings: spell each file's path the same way in every
// call (trailing slashes on directory names are ignored).
//
// Injected faults (each stream has its own seeded generator, so a failing run
// replays exactly for the same seed and the same sequence of calls):
//  - SetWriteFailureOneIn(n, seed): each Write, Truncate and Sync fails with
//    probability 1/n with Unavailable("injected write failure: ..."); a failed
//    call changes nothing.
//  - SetReadFailureOneIn(n, seed): each Read fails with probability 1/n with
//    DataLoss("injected read failure: ..."), as EIO from a failing medium.
//  - SetReadCorruptionOneIn(n, seed): each Read that returns at least one byte
//    has, with probability 1/n, one bit of the returned bytes flipped (the file
//    is not changed).
//  - CorruptBytes(path, offset, count, seed): flips one bit in each of the
//    given bytes on disk, so CRC-protected formats must detect them.
// Counters of calls and of injected faults are available through counters().
//
// Thread safety: every method may be called from any thread. One mutex
// serialises all file operations and state changes (this Env is for
// correctness tests, not for benchmarks). DropUnsyncedData() must not run
// while other threads use this Env or its files.
// Ownership: `base` is borrowed and must outlive this Env; files opened
// through this Env must not outlive it.
#ifndef KVFABRIC_CORE_TESTING_FAULT_INJECTION_ENV_H_
#define KVFABRIC_CORE_TESTING_FAULT_INJECTION_ENV_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Counts since construction (or the last ResetCounters()).
struct FaultInjectionCounters {
  uint64_t reads = 0;                      // Read calls, including failed ones
  uint64_t writes = 0;                     // Write calls, including failed ones
  uint64_t syncs = 0;                      // file Sync calls, including failed ones
  uint64_t injected_write_failures = 0;    // Write/Truncate/Sync failed on purpose
  uint64_t injected_read_failures = 0;     // Read failed on purpose
  uint64_t injected_read_corruptions = 0;  // Read returned a flipped bit
  uint64_t files_restored = 0;             // files rewound by DropUnsyncedData
  uint64_t files_dropped = 0;              // new files deleted by DropUnsyncedData
};

class FaultInjectionEnv final : public Env {
 public:
  // REQUIRES: base != nullptr and outlives this Env.
  explicit FaultInjectionEnv(Env* base);
  ~FaultInjectionEnv() override;

  // While inactive, every call that would change the filesystem (Write,
  // Truncate, Sync, opening with create or truncate, DeleteFile, RenameFile,
  // CreateDirIfMissing, DeleteDir, SyncDir) returns
  // Unavailable("filesystem inactive (simulated crash): ..."). Reads still
  // work. Active at construction.
  void SetFilesystemActive(bool active);
  bool IsFilesystemActive() const;

  // Restores every tracked file to its state at its last Sync(), deletes the
  // files whose creation was not made durable by SyncDir(), and undoes renames
  // that were not. Afterwards the current state counts as synced. Works
  // whether or not the filesystem is active. Files still open through this
  // Env may be used afterwards (as handles of a dead process would not be),
  // but tests should reopen.
  // REQUIRES: no concurrent use of this Env or its files.
  Status DropUnsyncedData();

  // n == 0 turns the fault off. The seed replays the same choices.
  void SetWriteFailureOneIn(uint32_t n, uint64_t seed);
  void SetReadFailureOneIn(uint32_t n, uint64_t seed);
  void SetReadCorruptionOneIn(uint32_t n, uint64_t seed);

  // Flips one bit (chosen by `seed`) in each of the `count` bytes at `offset`
  // of the file at `path`, on disk and synced. Bypasses the undo log: if the
  // range was overwritten since the last Sync(), DropUnsyncedData() restores
  // the synced bytes over the corruption. Works while inactive.
  // OutOfRange if the range passes the end of the file.
  Status CorruptBytes(const std::string& path, uint64_t offset, uint64_t count, uint64_t seed);

  FaultInjectionCounters counters() const;
  void ResetCounters();

  // Env.
  size_t DirectIoAlignment() const override { return base_->DirectIoAlignment(); }
  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override;
  bool FileExists(const std::string& path) override;
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  Status CreateDirIfMissing(const std::string& dir) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteDir(const std::string& dir) override;
  Status RenameFile(const std::string& src, const std::string& target) override;
  StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  uint64_t NowMicros() override { return base_->NowMicros(); }
  uint64_t WallMicros() override { return base_->WallMicros(); }
  void SleepForMicros(uint64_t micros) override { base_->SleepForMicros(micros); }

 private:
  class File;

  // Old bytes that an unsynced write or truncation replaced.
  struct UndoRecord {
    uint64_t offset;
    std::vector<std::byte> old_bytes;
  };

  // What this Env knows of one file (shared by every open handle on it).
  struct FileState {
    std::string path;              // current name; empty once deleted
    uint64_t synced_size = 0;      // size at the last Sync
    bool dirty = false;            // written or truncated since the last Sync
    std::vector<UndoRecord> undo;  // in the order the changes happened
  };

  // A rename to undo: move `target` back to `src`, unless SyncDir(target_dir)
  // runs first.
  struct PendingRename {
    std::string src;
    std::string target;
    std::string target_dir;
  };

  // A seeded one-in-n choice.
  struct FaultStream {
    uint32_t one_in = 0;
    std::mt19937_64 rng;
    bool Next() { return one_in != 0 && rng() % one_in == 0; }
  };

  Status CheckActiveLocked(std::string_view op, const std::string& path) const KVF_REQUIRES(mu_);
  bool InjectWriteFailureLocked() KVF_REQUIRES(mu_);
  // Saves the bytes of [begin, end) below the synced size that are about to
  // change, reading them through `file` (or a buffered handle when `file`
  // uses O_DIRECT).
  Status SaveUndoLocked(FileState& state, RandomRWFile* file, bool direct_io, uint64_t begin,
                        uint64_t end) KVF_REQUIRES(mu_);
  Status RestoreFileLocked(FileState& state) KVF_REQUIRES(mu_);
  bool IsNewLocked(const std::string& path) const KVF_REQUIRES(mu_);
  void EraseNewLocked(const std::string& path) KVF_REQUIRES(mu_);
  // Forgets the state of `path` (its name now refers to nothing, or to
  // another file); open handles on it stop being tracked.
  void ForgetFileLocked(const std::string& path) KVF_REQUIRES(mu_);

  // File operations, called by File with mu_ not held.
  StatusOr<size_t> FileRead(File& file, uint64_t offset, std::span<std::byte> dst);
  Status FileWrite(File& file, uint64_t offset, std::span<const std::byte> src);
  Status FileSync(File& file);
  Status FileTruncate(File& file, uint64_t size);

  Env* const base_;

  mutable Mutex mu_;
  bool active_ KVF_GUARDED_BY(mu_) = true;
  std::map<std::string, std::shared_ptr<FileState>> files_ KVF_GUARDED_BY(mu_);
  // Files created since their directory's last SyncDir: dir -> paths.
  std::map<std::string, std::set<std::string>> new_files_ KVF_GUARDED_BY(mu_);
  std::vector<PendingRename> pending_renames_ KVF_GUARDED_BY(mu_);  // oldest first
  FaultStream write_failure_ KVF_GUARDED_BY(mu_);
  FaultStream read_failure_ KVF_GUARDED_BY(mu_);
  FaultStream read_corruption_ KVF_GUARDED_BY(mu_);
  FaultInjectionCounters counters_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_TESTING_FAULT_INJECTION_ENV_H_
