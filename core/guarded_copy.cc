#include "core/guarded_copy.h"

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/crc32c.h"
#include "core/stream_copy.h"

namespace kvfabric {
namespace {

// The guarded copy running on this thread, if any.
struct Guard {
  sigjmp_buf jump;
  const void* fault_address = nullptr;
  int signal = 0;
};
thread_local Guard* volatile t_guard = nullptr;

struct sigaction g_previous_bus;
struct sigaction g_previous_segv;

void Chain(const struct sigaction& previous, int sig, siginfo_t* info, void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(sig, info, context);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
             previous.sa_handler != nullptr) {
    previous.sa_handler(sig);
    return;
  }
  // The default action: restore it and let the fault happen again on return.
  signal(sig, SIG_DFL);
}

void OnFault(int sig, siginfo_t* info, void* context) {
  Guard* guard = t_guard;
  if (guard != nullptr) {
    guard->fault_address = info != nullptr ? info->si_addr : nullptr;
    guard->signal = sig;
    siglongjmp(guard->jump, 1);
  }
  Chain(sig == SIGBUS ? g_previous_bus : g_previous_segv, sig, info, context);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnFault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous_bus);
    sigaction(SIGSEGV, &action, &g_previous_segv);
  });
}

}  // namespace

namespace {

// Runs `copy` guarded: DataLoss naming the fault if the memory faulted.
template <typename Fn>
Status Guarded(std::size_t n, Fn&& copy) {
  InstallOnce();
  Guard guard;
  if (sigsetjmp(guard.jump, /*savemask=*/1) != 0) {
    t_guard = nullptr;
    char where[32];
    std::snprintf(where, sizeof(where), "%p", guard.fault_address);
    return Status::DataLoss(std::string(guard.signal == SIGBUS ? "SIGBUS" : "SIGSEGV") +
                            " at " + where + " while copying " + std::to_string(n) +
                            " bytes: the memory's owner shrank or unmapped it");
  }
  t_guard = &guard;
  copy();
  t_guard = nullptr;
  return Status::OK();
}

}  // namespace

Status GuardedCopy(void* dst, const void* src, std::size_t n, bool streaming) {
  if (n == 0) return Status::OK();
  return Guarded(n, [&] {
    if (streaming) {
      StreamingCopy(dst, src, n);
    } else {
      std::memcpy(dst, src, n);
    }
  });
}

Status GuardedCopyChecked(void* dst, const void* src, std::size_t n, bool streaming,
                          std::uint32_t* crc) {
  std::uint32_t value = 0;
  if (n != 0) {
    Status s = Guarded(n, [&] { value = crc32c::ExtendCopy(0, dst, src, n, streaming); });
    if (!s.ok()) return s;
  }
  *crc = value;
  return Status::OK();
}

}  // namespace kvfabric
