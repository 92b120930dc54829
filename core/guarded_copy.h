// GuardedCopy: a copy that survives the source or destination disappearing
// under it, for copies to and from memory another process owns.
//
// Why: over UCX's shared-memory data plane the daemon maps memory a client
// exported (its staging region). A client can shrink the object behind that
// mapping (ftruncate of its POSIX shared-memory fd) and the daemon's next
// copy touches pages with no backing: SIGBUS, and every tenant's cache is
// lost with the process (issue 17). GuardedCopy turns such a fault into an
// error for that one copy: a SIGBUS or SIGSEGV raised on a thread while it is
// inside GuardedCopy jumps back out of the copy (siglongjmp) and the call
// returns DataLoss naming the address; the caller fails the transfer of that
// peer only.
//
// The handler is installed on first use and chains to whatever handler was
// there before (UCX installs its own to print backtraces), so a fault outside
// a guarded copy behaves exactly as it did without this file. The copy
// itself (memcpy or StreamingCopy) holds no lock and allocates nothing, so
// leaving it by siglongjmp is safe; what had been copied is left in place
// (the caller must not trust the destination).
//
// Thread safety: any thread; guards are per thread and do not nest.
#ifndef KVFABRIC_CORE_GUARDED_COPY_H_
#define KVFABRIC_CORE_GUARDED_COPY_H_

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace kvfabric {

// Copies n bytes from src to dst (std::memcpy, or StreamingCopy when
// `streaming`). DataLoss if the memory faulted (SIGBUS / SIGSEGV) meanwhile.
Status GuardedCopy(void* dst, const void* src, std::size_t n, bool streaming);

// Bytes GuardedCopyChecked copies before reading them back: well inside a
// core's L2 (and near its L1), so the read-back hits cache.
inline constexpr std::size_t kCheckedPieceBytes = std::size_t{64} << 10;

// As GuardedCopy with std::memcpy, and sets *crc to the CRC32C of the
// destination's bytes after the copy: copied and read back kCheckedPieceBytes
// at a time, each piece read while it is still in this core's cache. The
// bytes checked are the bytes landed, for a fraction of what a second pass
// over memory costs (on the development VM: copy and check at 0.82x a
// streaming copy's rate, where a streaming copy and a later cold CRC pass
// run at 0.6x). *crc is left alone on error.
Status GuardedCopyChecked(void* dst, const void* src, std::size_t n, std::uint32_t* crc);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_GUARDED_COPY_H_
