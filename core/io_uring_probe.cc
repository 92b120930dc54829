#include "core/io_uring_probe.h"

#include <liburing.h>

#include "core/errno_status.h"

namespace kvfabric {

Status ProbeIoUring() {
  io_uring ring;
  const int rc = io_uring_queue_init(8, &ring, 0);
  if (rc < 0) return StatusFromErrno(-rc, "io_uring_queue_init(8)");
  io_uring_queue_exit(&ring);
  return Status::OK();
}

}  // namespace kvfabric
