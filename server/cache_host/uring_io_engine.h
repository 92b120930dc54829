// The io_uring IoEngine (see server/cache_host/io_engine.h), built only where
// liburing is (the build defines KVF_HAVE_URING for code that may call it).
//
// Each batch takes one ring from a small pool for its whole duration, queues
// up to `queue_depth` requests at a time, submits them with one system call
// and reaps their completions; concurrent batches use distinct rings, and a
// batch waits for a free ring when all are busy. A completion that reports a
// short read or write, EINTR or EAGAIN is finished with plain
// pread/pwrite on the calling thread, so callers only ever see whole transfers
// (reads short only at end of file) or a real error.
//
// Files are opened with open(2) (O_DIRECT when asked), not through an Env:
// tests that inject faults use the thread-pool engine instead.
//
// Ownership: the engine owns its rings; files must not outlive the engine.
// Thread safety: as IoEngine (any thread).
#ifndef KVFABRIC_SERVER_CACHE_HOST_URING_IO_ENGINE_H_
#define KVFABRIC_SERVER_CACHE_HOST_URING_IO_ENGINE_H_

#include <memory>

#include "core/statusor.h"
#include "server/cache_host/io_engine.h"

namespace kvfabric::cache_host {

struct UringIoEngineOptions {
  // Submission queue entries per ring: the most requests one system call
  // submits. Default 64: a group commit of 64 blocks goes out at once; more
  // costs locked kernel memory per ring.
  unsigned queue_depth = 64;

  // Rings in the pool: the most batches in flight at once (e.g. the group
  // committer plus concurrent readers). Default 4.
  int rings = 4;
};

// Creates the engine and its rings. The errno-derived reason if io_uring
// cannot be set up (ENOSYS: no io_uring in this kernel; EPERM: disabled by
// sysctl or seccomp; ENOMEM: locked-memory limit). InvalidArgument if
// queue_depth or rings is zero.
StatusOr<std::unique_ptr<IoEngine>> NewUringIoEngine(const UringIoEngineOptions& options);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_URING_IO_ENGINE_H_
