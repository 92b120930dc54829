// Whether this kernel lets us use io_uring (for `kvfabric version` and the
// NVMe tier's choice between io_uring and a pread/pwrite thread pool).
#ifndef KVFABRIC_CORE_IO_URING_PROBE_H_
#define KVFABRIC_CORE_IO_URING_PROBE_H_

#include "core/status.h"

namespace kvfabric {

// Sets up and tears down a small ring. OK when io_uring works; otherwise the
// errno-derived reason (ENOSYS: kernel without io_uring; EPERM: disabled by
// sysctl or seccomp).
Status ProbeIoUring();

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_IO_URING_PROBE_H_
