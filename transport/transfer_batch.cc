#include "transport/transfer_batch.h"

#include <string>
#include <utility>

#include "core/mutex.h"

namespace kvfabric::transport {

BatchCompletion::BatchCompletion(std::size_t entries, std::function<void()> cancel)
    : results_(entries),
      completed_(entries, false),
      remaining_(entries),
      cancel_(std::move(cancel)) {}

void BatchCompletion::Complete(std::size_t index, Status status, std::uint64_t bytes,
                               std::optional<std::uint32_t> landed_crc32c) {
  std::function<void()> done;
  {
    MutexLock lock(&mu_);
    if (completed_[index]) return;
    completed_[index] = true;
    results_[index].landed_crc32c = status.ok() ? landed_crc32c : std::nullopt;
    results_[index].status = std::move(status);
    results_[index].bytes = bytes;
    if (--remaining_ != 0) return;
    done = std::move(on_done_);
    cancel_ = nullptr;  // nothing left to cancel
    cv_.NotifyAll();
  }
  if (done) done();
}

void BatchCompletion::OnDone(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (remaining_ != 0) {
      on_done_ = std::move(fn);
      return;
    }
  }
  fn();
}

void BatchCompletion::Cancel() {
  std::function<void()> cancel;
  {
    MutexLock lock(&mu_);
    cancel = std::move(cancel_);
    cancel_ = nullptr;
  }
  if (cancel) cancel();
}

bool BatchCompletion::Done() const {
  MutexLock lock(&mu_);
  return remaining_ == 0;
}

Status BatchCompletion::Wait(std::chrono::steady_clock::time_point deadline) const {
  MutexLock lock(&mu_);
  if (!cv_.WaitUntil(&mu_, deadline, [this]() KVF_REQUIRES(mu_) { return remaining_ == 0; })) {
    return Status::DeadlineExceeded(std::to_string(remaining_) + " of " +
                                    std::to_string(results_.size()) +
                                    " transfers still in flight at the deadline");
  }
  return Status::OK();
}

void BatchCompletion::WaitForever() const {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return remaining_ == 0; });
}

TransferBatch::~TransferBatch() {
  if (!completion_) return;
  completion_->Cancel();
  completion_->WaitForever();
}

Status TransferBatch::FirstError() const {
  std::span<const TransferResult> r = results();
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (!r[i].status.ok()) return r[i].status.WithContext("transfer " + std::to_string(i));
  }
  return Status::OK();
}

std::uint64_t TransferBatch::TotalBytes() const {
  std::uint64_t total = 0;
  for (const TransferResult& r : results()) total += r.bytes;
  return total;
}

}  // namespace kvfabric::transport
