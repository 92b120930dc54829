// ProcessIdentity: who a process runs as and where, for deciding whether two
// processes can share memory directly (UCX's shared-memory transports: SysV
// and POSIX segments, CMA's process_vm_readv).
//
// Two processes on one host can attach each other's segments only when their
// IPC namespaces are one and the segments' permissions admit the other
// (UCX creates them 0660, owner and group), and CMA needs ptrace permission:
// the same user, or CAP_SYS_PTRACE. kvfabric asks for one user: a daemon and
// an engine running as different users are told to use TCP instead of
// failing on every transfer.
//
// Thread safety: plain values; LocalProcessIdentity() may be called from any
// thread.
#ifndef KVFABRIC_CORE_PROCESS_IDENTITY_H_
#define KVFABRIC_CORE_PROCESS_IDENTITY_H_

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kvfabric {

struct ProcessIdentity {
  // /proc/sys/kernel/random/boot_id: one value per booted kernel, so equal
  // ids mean one host ("" if unreadable: nothing is concluded).
  std::string boot_id;
  // The effective user and group id.
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  // The inode of /proc/self/ns/ipc (0 if unreadable): one IPC namespace.
  std::uint64_t ipc_namespace = 0;
  // A daemon whose UCX listener admits only its own user from its host
  // (ucx::SharedMemoryPeers::kSameUser with shared memory in its list).
  // LocalProcessIdentity() leaves it false; the daemon sets it.
  bool ucx_same_user_only = false;
};

ProcessIdentity LocalProcessIdentity();

// Whether `self` can use shared memory with `peer`: OK when they are on
// different hosts (shared memory is not offered there, nothing to decide) or
// when nothing is known of the peer (an empty boot_id: an older daemon), and
// when they are on one host as one user in one IPC namespace. Otherwise
// FailedPrecondition saying which of these differs, e.g. "it runs as uid 0,
// this process as uid 65534".
Status SharedMemoryReachable(const ProcessIdentity& self, const ProcessIdentity& peer);

// Whether `peer`'s UCX listener admits `self` at all: OK unless they are on
// one host under different users and the peer admits only its own user
// (ucx_same_user_only); then FailedPrecondition naming both uids.
Status UcxListenerAdmits(const ProcessIdentity& self, const ProcessIdentity& peer);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_PROCESS_IDENTITY_H_
