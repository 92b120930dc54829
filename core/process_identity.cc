#include "core/process_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace kvfabric {

ProcessIdentity LocalProcessIdentity() {
  ProcessIdentity id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  if (boot) std::getline(boot, id.boot_id);
  id.uid = static_cast<std::uint32_t>(geteuid());
  id.gid = static_cast<std::uint32_t>(getegid());
  struct stat st {};
  if (stat("/proc/self/ns/ipc", &st) == 0) id.ipc_namespace = static_cast<std::uint64_t>(st.st_ino);
  return id;
}

Status SharedMemoryReachable(const ProcessIdentity& self, const ProcessIdentity& peer) {
  if (peer.boot_id.empty() || self.boot_id.empty() || peer.boot_id != self.boot_id) {
    return Status::OK();
  }
  if (peer.uid != self.uid) {
    return Status::FailedPrecondition(
        "it runs as uid " + std::to_string(peer.uid) + " on this host, this process as uid " +
        std::to_string(self.uid) +
        ": shared memory cannot be attached across users (shmat and process_vm_readv are "
        "refused)");
  }
  if (peer.ipc_namespace != 0 && self.ipc_namespace != 0 &&
      peer.ipc_namespace != self.ipc_namespace) {
    return Status::FailedPrecondition(
        "it runs in another IPC namespace on this host (ipc:[" +
        std::to_string(peer.ipc_namespace) + "], this process ipc:[" +
        std::to_string(self.ipc_namespace) + "]): its shared-memory segments cannot be attached");
  }
  return Status::OK();
}

Status UcxListenerAdmits(const ProcessIdentity& self, const ProcessIdentity& peer) {
  if (!peer.ucx_same_user_only || peer.boot_id.empty() || peer.boot_id != self.boot_id ||
      peer.uid == self.uid) {
    return Status::OK();
  }
  return Status::FailedPrecondition(
      "it runs as uid " + std::to_string(peer.uid) + " on this host, this process as uid " +
      std::to_string(self.uid) +
      ", and its UCX data plane admits only its own user from its host (its transport list "
      "uses shared memory; kvfabric-cached --shared-memory-peers same-user)");
}

}  // namespace kvfabric
