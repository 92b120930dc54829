#include "server/cache_host/uring_io_engine.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "core/errno_status.h"
#include "core/mutex.h"

namespace kvfabric::cache_host {
namespace {

constexpr size_t kAlignment = Env::kDefaultDirectIoAlignment;

class UringIoFile final : public IoFile {
 public:
  UringIoFile(int fd, std::string path, bool direct)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~UringIoFile() override { ::close(fd_); }

  StatusOr<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return StatusFromErrno(errno, "fstat " + path_);
    return static_cast<uint64_t>(st.st_size);
  }

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

 private:
  const int fd_;
  const std::string path_;
  const bool direct_;
};

// An io_uring instance; RAII. Used by one batch at a time.
class Ring {
 public:
  static StatusOr<std::unique_ptr<Ring>> Create(unsigned entries) {
    auto ring = std::unique_ptr<Ring>(new Ring());
    ring->queued.assign(entries, 0);
    const int rc = io_uring_queue_init(entries, &ring->ring_, 0);
    if (rc < 0) return StatusFromErrno(-rc, "io_uring_queue_init(" + std::to_string(entries) + ")");
    ring->initialised_ = true;
    return ring;
  }
  ~Ring() {
    if (initialised_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }

  // Owned by the batch holding the ring (UringIoEngine::Acquire/Release).
  std::vector<uint8_t> queued;  // per chunk index: submitted and not yet reaped
  bool broken = false;          // a failed submission left entries behind: use plain calls

 private:
  Ring() = default;
  io_uring ring_{};
  bool initialised_ = false;
};

std::string Describe(const IoRequest& r, const UringIoFile& f) {
  switch (r.op) {
    case IoRequest::Op::kRead:
      return "read " + f.path() + " at " + std::to_string(r.offset);
    case IoRequest::Op::kWrite:
      return "write " + f.path() + " at " + std::to_string(r.offset);
    case IoRequest::Op::kSync:
      return "fdatasync " + f.path();
  }
  return "io " + f.path();
}

// Finishes `r` with plain system calls from `done` bytes on (after a short
// transfer or a retryable error from the ring).
void FinishSynchronously(IoRequest& r, const UringIoFile& f, size_t done) {
  if (r.op == IoRequest::Op::kSync) {
    int rc;
    do rc = ::fdatasync(f.fd());
    while (rc != 0 && errno == EINTR);
    r.status = rc == 0 ? Status::OK() : StatusFromErrno(errno, Describe(r, f));
    return;
  }
  while (done < r.buffer.size()) {
    std::byte* p = r.buffer.data() + done;
    const size_t n = r.buffer.size() - done;
    const off_t off = static_cast<off_t>(r.offset + done);
    const ssize_t rc =
        r.op == IoRequest::Op::kRead ? ::pread(f.fd(), p, n, off) : ::pwrite(f.fd(), p, n, off);
    if (rc < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      r.bytes_done = done;
      r.status = StatusFromErrno(errno, Describe(r, f));
      return;
    }
    if (rc == 0) {
      if (r.op == IoRequest::Op::kRead) break;  // end of file
      r.bytes_done = done;
      r.status = Status::Internal(Describe(r, f) + ": pwrite wrote 0 bytes");
      return;
    }
    done += static_cast<size_t>(rc);
  }
  r.bytes_done = done;
  r.status = Status::OK();
}

bool Misaligned(const IoRequest& r) {
  return r.offset % kAlignment != 0 || r.buffer.size() % kAlignment != 0 ||
         reinterpret_cast<uintptr_t>(r.buffer.data()) % kAlignment != 0;
}

class UringIoEngine final : public IoEngine {
 public:
  UringIoEngine(std::vector<std::unique_ptr<Ring>> rings, unsigned queue_depth)
      : rings_(std::move(rings)), queue_depth_(queue_depth) {
    for (auto& r : rings_) free_.push_back(r.get());
  }

  std::string_view name() const override { return "io_uring"; }

  StatusOr<std::unique_ptr<IoFile>> Open(const std::string& path,
                                         const FileOptions& options) override {
    int flags = O_CLOEXEC | (options.read_only ? O_RDONLY : O_RDWR);
    if (options.direct_io) flags |= O_DIRECT;
    if (options.create) flags |= O_CREAT;
    if (options.create && options.exclusive) flags |= O_EXCL;
    if (options.truncate) flags |= O_TRUNC;
    int fd;
    do fd = ::open(path.c_str(), flags, 0644);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      if (err == EINVAL && options.direct_io) {
        return Status::InvalidArgument("open " + path +
                                       ": the filesystem refuses O_DIRECT (errno 22)");
      }
      return StatusFromErrno(err, "open " + path);
    }
    return std::unique_ptr<IoFile>(std::make_unique<UringIoFile>(fd, path, options.direct_io));
  }

  void Run(std::span<IoRequest> requests) override {
    if (requests.empty()) return;
    Ring* ring = Acquire();
    for (size_t begin = 0; begin < requests.size(); begin += queue_depth_) {
      const size_t end = std::min(requests.size(), begin + queue_depth_);
      if (ring->broken) {
        for (size_t i = begin; i < end; ++i) {
          FinishSynchronously(requests[i], *static_cast<UringIoFile*>(requests[i].file), 0);
        }
      } else {
        RunChunk(ring, requests.subspan(begin, end - begin));
      }
    }
    Release(ring);
  }

 private:
  void RunChunk(Ring* ring, std::span<IoRequest> chunk) {
    size_t queued = 0;
    std::fill(ring->queued.begin(), ring->queued.end(), 0);
    for (size_t i = 0; i < chunk.size(); ++i) {
      IoRequest& r = chunk[i];
      auto& f = *static_cast<UringIoFile*>(r.file);
      r.bytes_done = 0;
      if (r.op != IoRequest::Op::kSync && f.direct() && Misaligned(r)) {
        r.status = Status::InvalidArgument(Describe(r, f) +
                                           ": O_DIRECT needs offset, length and "
                                           "address aligned to " +
                                           std::to_string(kAlignment));
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring->get());
      if (sqe == nullptr) {  // cannot happen: chunks never exceed the ring
        FinishSynchronously(r, f, 0);
        continue;
      }
      switch (r.op) {
        case IoRequest::Op::kRead:
          io_uring_prep_read(sqe, f.fd(), r.buffer.data(), static_cast<unsigned>(r.buffer.size()),
                             r.offset);
          break;
        case IoRequest::Op::kWrite:
          io_uring_prep_write(sqe, f.fd(), r.buffer.data(), static_cast<unsigned>(r.buffer.size()),
                              r.offset);
          break;
        case IoRequest::Op::kSync:
          io_uring_prep_fsync(sqe, f.fd(), IORING_FSYNC_DATASYNC);
          break;
      }
      io_uring_sqe_set_data64(sqe, i);
      ring->queued[i] = 1;
      ++queued;
    }
    if (queued == 0) return;
    int rc;
    do rc = io_uring_submit(ring->get());
    while (rc == -EINTR);
    if (rc < 0 || static_cast<size_t>(rc) != queued) {
      // The ring refused the submission (it never does with a chunk that fits
      // its queues). Its queued entries must never be submitted later, so the
      // ring is retired and the chunk done with plain calls.
      ring->broken = true;
      for (size_t i = 0; i < chunk.size(); ++i) {
        if (ring->queued[i])
          FinishSynchronously(chunk[i], *static_cast<UringIoFile*>(chunk[i].file), 0);
      }
      return;
    }
    for (size_t reaped = 0; reaped < queued;) {
      io_uring_cqe* cqe = nullptr;
      const int wrc = io_uring_wait_cqe(ring->get(), &cqe);
      if (wrc == -EINTR) continue;
      if (wrc < 0) {
        // The ring itself failed and the outcome of the unreaped requests is
        // unknown; should never happen with a ring that accepted them.
        ring->broken = true;
        for (size_t i = 0; i < chunk.size(); ++i) {
          if (ring->queued[i]) chunk[i].status = StatusFromErrno(-wrc, "io_uring_wait_cqe");
        }
        return;
      }
      const uint64_t index = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(ring->get(), cqe);
      ring->queued[index] = 0;
      IoRequest& r = chunk[index];
      ++reaped;
      auto& f = *static_cast<UringIoFile*>(r.file);
      if (res == -EINTR || res == -EAGAIN) {
        FinishSynchronously(r, f, 0);
      } else if (res < 0) {
        r.status = StatusFromErrno(-res, Describe(r, f));
      } else if (r.op != IoRequest::Op::kSync && static_cast<size_t>(res) < r.buffer.size() &&
                 !(r.op == IoRequest::Op::kRead && res == 0)) {
        FinishSynchronously(r, f, static_cast<size_t>(res));
      } else {
        r.bytes_done = static_cast<size_t>(res);
        r.status = Status::OK();
      }
    }
  }

  Ring* Acquire() {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return !free_.empty(); });
    Ring* ring = free_.back();
    free_.pop_back();
    return ring;
  }
  void Release(Ring* ring) {
    {
      MutexLock lock(&mu_);
      free_.push_back(ring);
    }
    cv_.NotifyOne();
  }

  const std::vector<std::unique_ptr<Ring>> rings_;
  const unsigned queue_depth_;
  Mutex mu_;
  CondVar cv_;
  std::vector<Ring*> free_ KVF_GUARDED_BY(mu_);  // capacity == rings_.size(), never reallocates
};

}  // namespace

StatusOr<std::unique_ptr<IoEngine>> NewUringIoEngine(const UringIoEngineOptions& options) {
  if (options.queue_depth == 0 || options.rings <= 0) {
    return Status::InvalidArgument("io_uring engine: queue_depth and rings must be positive");
  }
  std::vector<std::unique_ptr<Ring>> rings;
  for (int i = 0; i < options.rings; ++i) {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<Ring> ring, Ring::Create(options.queue_depth));
    rings.push_back(std::move(ring));
  }
  return std::unique_ptr<IoEngine>(
      std::make_unique<UringIoEngine>(std::move(rings), options.queue_depth));
}

}  // namespace kvfabric::cache_host
