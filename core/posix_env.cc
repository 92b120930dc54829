// The POSIX (Linux) implementation of Env, returned by Env::Default().
//
// Every failing system call converts its errno through StatusFromErrno with a
// context "<syscall> <path>[ at offset <n>]"; nothing else in this file invents
// error codes except the O_DIRECT alignment and support checks, which return
// InvalidArgument with the numbers that explain them.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/errno_status.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

namespace {

constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<off_t>::max());

std::string AtOffset(std::string_view op, const std::string& path, uint64_t offset) {
  std::string s(op);
  s += ' ';
  s += path;
  s += " at offset ";
  s += std::to_string(offset);
  return s;
}

class PosixRandomRWFile final : public RandomRWFile {
 public:
  PosixRandomRWFile(int fd, std::string path, bool direct_io, bool read_only, size_t alignment)
      : fd_(fd),
        path_(std::move(path)),
        direct_io_(direct_io),
        read_only_(read_only),
        alignment_(alignment) {}

  ~PosixRandomRWFile() override {
    if (fd_ >= 0) {
      // The destructor cannot report; Close() is the way to see this error.
      ::close(fd_);
    }
  }

  StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> dst) override {
    if (fd_ < 0) return Closed("pread");
    if (dst.empty()) return size_t{0};
    KVF_RETURN_IF_ERROR(CheckRange("pread", offset, dst.size()));
    if (direct_io_) KVF_RETURN_IF_ERROR(CheckAlignment("pread", offset, dst.size(), dst.data()));
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n =
          ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return StatusFromErrno(errno, AtOffset("pread", path_, offset + done));
      }
      if (n == 0) break;  // end of file
      done += static_cast<size_t>(n);
      // With O_DIRECT a short read only happens at end of file, and asking for
      // more at the unaligned offset would fail with EINVAL.
      if (direct_io_ && done % alignment_ != 0) break;
    }
    return done;
  }

  Status Write(uint64_t offset, std::span<const std::byte> src) override {
    if (fd_ < 0) return Closed("pwrite");
    if (read_only_) return ReadOnly("pwrite");
    if (src.empty()) return Status::OK();
    KVF_RETURN_IF_ERROR(CheckRange("pwrite", offset, src.size()));
    if (direct_io_) KVF_RETURN_IF_ERROR(CheckAlignment("pwrite", offset, src.size(), src.data()));
    size_t done = 0;
    while (done < src.size()) {
      ssize_t n =
          ::pwrite(fd_, src.data() + done, src.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return StatusFromErrno(errno, AtOffset("pwrite", path_, offset + done));
      }
      if (n == 0) {
        // POSIX allows this only for a zero-length request; never loop on it.
        return Status::Internal(AtOffset("pwrite", path_, offset + done) + ": wrote 0 of " +
                                std::to_string(src.size() - done) + " bytes");
      }
      done += static_cast<size_t>(n);
    }
    return Status::OK();
  }

  Status Sync() override {
    if (fd_ < 0) return Closed("fdatasync");
    if (::fdatasync(fd_) != 0) return StatusFromErrno(errno, "fdatasync " + path_);
    return Status::OK();
  }

  StatusOr<uint64_t> Size() override {
    if (fd_ < 0) return Closed("fstat");
    struct stat st;
    if (::fstat(fd_, &st) != 0) return StatusFromErrno(errno, "fstat " + path_);
    return static_cast<uint64_t>(st.st_size);
  }

  Status Truncate(uint64_t size) override {
    if (fd_ < 0) return Closed("ftruncate");
    if (read_only_) return ReadOnly("ftruncate");
    if (size > kMaxOffset) {
      return Status::InvalidArgument("ftruncate " + path_ + ": size " + std::to_string(size) +
                                     " exceeds the largest file offset");
    }
    int rc;
    do {
      rc = ::ftruncate(fd_, static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      return StatusFromErrno(errno, "ftruncate " + path_ + " to " + std::to_string(size));
    }
    return Status::OK();
  }

  Status Close() override {
    if (fd_ < 0) return Closed("close");
    int fd = fd_;
    fd_ = -1;
    // Never retry close() on EINTR: on Linux the descriptor is already gone
    // and a retry could close one another thread just opened.
    if (::close(fd) != 0) return StatusFromErrno(errno, "close " + path_);
    return Status::OK();
  }

 private:
  Status Closed(std::string_view op) const {
    return Status::FailedPrecondition(std::string(op) + " " + path_ + ": file is closed");
  }
  Status ReadOnly(std::string_view op) const {
    return Status::FailedPrecondition(std::string(op) + " " + path_ +
                                      ": file was opened read-only");
  }

  Status CheckRange(std::string_view op, uint64_t offset, size_t length) const {
    if (offset > kMaxOffset || length > kMaxOffset - offset) {
      return Status::InvalidArgument(AtOffset(op, path_, offset) + ": " + std::to_string(length) +
                                     " bytes would pass the largest file offset");
    }
    return Status::OK();
  }

  Status CheckAlignment(std::string_view op, uint64_t offset, size_t length,
                        const void* address) const {
    std::string what;
    if (offset % alignment_ != 0) {
      what = "offset " + std::to_string(offset);
    } else if (length % alignment_ != 0) {
      what = "length " + std::to_string(length);
    } else if (reinterpret_cast<uintptr_t>(address) % alignment_ != 0) {
      what = "buffer address " + std::to_string(reinterpret_cast<uintptr_t>(address));
    } else {
      return Status::OK();
    }
    return Status::InvalidArgument(
        AtOffset(op, path_, offset) + ": O_DIRECT needs offset, length and buffer address " +
        "aligned to " + std::to_string(alignment_) + " bytes, but " + what + " is not a " +
        "multiple of " + std::to_string(alignment_) + " (use AlignedBuffer)");
  }

  int fd_;  // -1 once closed
  const std::string path_;
  const bool direct_io_;
  const bool read_only_;
  const size_t alignment_;
};

class PosixEnv final : public Env {
 public:
  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override {
    if (options.read_only && options.truncate) {
      return Status::InvalidArgument("open " + path + ": read_only and truncate together");
    }
    if (options.exclusive && !options.create) {
      return Status::InvalidArgument("open " + path + ": exclusive without create");
    }
    int flags = O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
    if (options.create) flags |= O_CREAT;
    if (options.exclusive) flags |= O_EXCL;
    if (options.truncate) flags |= O_TRUNC;
    if (options.direct_io) flags |= O_DIRECT;

    bool existed_before = true;
    if (options.direct_io && options.create) {
      struct stat st;
      existed_before = ::stat(path.c_str(), &st) == 0;
    }
    int fd;
    do {
      fd = ::open(path.c_str(), flags, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      int err = errno;
      if (err == EINVAL && options.direct_io) {
        // Linux creates the file before it checks that the filesystem supports
        // O_DIRECT (do_dentry_open), so a refused open leaves an empty file
        // behind; remove it if we made it. (A file some other process created
        // in that window would be removed too; the NVMe tier owns its dir.)
        if (!existed_before) ::unlink(path.c_str());
        return Status::InvalidArgument(
            std::string(StatusFromErrno(err, "open " + path + " with O_DIRECT").message()) +
            ": O_DIRECT is not supported on this path (its filesystem refuses it, as procfs "
            "and tmpfs on older kernels do); put the file on a block-device filesystem such "
            "as ext4 or xfs, or open it without FileOptions::direct_io");
      }
      return StatusFromErrno(err, "open " + path);
    }
    return std::unique_ptr<RandomRWFile>(std::make_unique<PosixRandomRWFile>(
        fd, path, options.direct_io, options.read_only, DirectIoAlignment()));
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return StatusFromErrno(errno, "opendir " + dir);
    std::vector<std::string> names;
    while (true) {
      errno = 0;
      struct dirent* entry = ::readdir(d);
      if (entry == nullptr) {
        int err = errno;
        ::closedir(d);
        if (err != 0) return StatusFromErrno(err, "readdir " + dir);
        break;
      }
      std::string_view name(entry->d_name);
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDirIfMissing(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0755) == 0) return Status::OK();
    int err = errno;
    if (err == EEXIST) {
      struct stat st;
      if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::OK();
      return StatusFromErrno(EEXIST, "mkdir " + dir + " (a non-directory is in the way)");
    }
    return StatusFromErrno(err, "mkdir " + dir);
  }

  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return StatusFromErrno(errno, "unlink " + path);
    return Status::OK();
  }

  Status DeleteDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return StatusFromErrno(errno, "rmdir " + dir);
    return Status::OK();
  }

  Status RenameFile(const std::string& src, const std::string& target) override {
    if (::rename(src.c_str(), target.c_str()) != 0) {
      return StatusFromErrno(errno, "rename " + src + " to " + target);
    }
    return Status::OK();
  }

  StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return StatusFromErrno(errno, "stat " + path);
    return static_cast<uint64_t>(st.st_size);
  }

  Status SyncDir(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return StatusFromErrno(errno, "open directory " + dir);
    Status s;
    if (::fsync(fd) != 0) s = StatusFromErrno(errno, "fsync directory " + dir);
    ::close(fd);  // read-only descriptor: nothing to lose if close fails
    return s;
  }

  uint64_t NowMicros() override { return ClockMicros(CLOCK_MONOTONIC); }

  uint64_t WallMicros() override { return ClockMicros(CLOCK_REALTIME); }

  void SleepForMicros(uint64_t micros) override {
    struct timespec req;
    req.tv_sec = static_cast<time_t>(micros / 1000000);
    req.tv_nsec = static_cast<long>(micros % 1000000) * 1000;  // NOLINT(runtime/int)
    struct timespec rem;
    while (::nanosleep(&req, &rem) != 0 && errno == EINTR) req = rem;
  }

 private:
  static uint64_t ClockMicros(clockid_t clock) {
    struct timespec ts;
    // Cannot fail for these clocks on Linux.
    ::clock_gettime(clock, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
  }
};

}  // namespace

Env* Env::Default() {
  // Leaked on purpose: usable from static destructors and detached threads.
  static Env* const env = new PosixEnv();
  return env;
}

}  // namespace kvfabric
