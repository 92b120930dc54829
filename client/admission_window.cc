#include "client/admission_window.h"

#include <algorithm>

namespace kvfabric::client {

AdmissionWindow::AdmissionWindow(std::uint32_t initial, std::uint32_t max)
    : max_(std::max<std::uint32_t>(1, max)),
      size_(std::clamp<std::uint32_t>(initial, 1, std::max<std::uint32_t>(1, max))) {}

bool AdmissionWindow::Acquire(std::uint32_t rank, Clock::time_point deadline) {
  MutexLock l(&mu_);
  Waiter me;
  me.rank = rank;
  // Behind every waiter of a lower or equal rank (equal ranks: first come).
  Waiter** at = &head_;
  while (*at != nullptr && (*at)->rank <= rank) at = &(*at)->next;
  me.next = *at;
  *at = &me;
  ++waiting_;
  const bool admitted = cv_.WaitUntil(
      &mu_, deadline, [&]() KVF_REQUIRES(mu_) { return head_ == &me && in_flight_ < size_; });
  Unlink(&me);
  if (admitted) ++in_flight_;
  // The next head may fit too (the window grew, or this one gave up).
  cv_.NotifyAll();
  return admitted;
}

bool AdmissionWindow::TryAcquire() {
  MutexLock l(&mu_);
  if (head_ != nullptr || in_flight_ >= size_) return false;
  ++in_flight_;
  return true;
}

void AdmissionWindow::Release(bool refused, bool answered) {
  MutexLock l(&mu_);
  if (in_flight_ > 0) --in_flight_;
  if (refused) {
    size_ = std::max<std::uint32_t>(1, size_ / 2);
    accepted_ = 0;
  } else if (answered && ++accepted_ >= size_) {
    size_ = std::min(size_ + 1, max_);
    accepted_ = 0;
  }
  cv_.NotifyAll();
}

void AdmissionWindow::Unlink(Waiter* w) {
  for (Waiter** at = &head_; *at != nullptr; at = &(*at)->next) {
    if (*at == w) {
      *at = w->next;
      --waiting_;
      return;
    }
  }
}

std::uint32_t AdmissionWindow::size() const {
  MutexLock l(&mu_);
  return size_;
}

std::uint32_t AdmissionWindow::in_flight() const {
  MutexLock l(&mu_);
  return in_flight_;
}

std::uint32_t AdmissionWindow::waiting() const {
  MutexLock l(&mu_);
  return waiting_;
}

}  // namespace kvfabric::client
