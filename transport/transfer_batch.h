// TransferBatch: the handle of one Endpoint::Submit() (transport/transport.h).
//
// Completion state lives in a BatchCompletion shared between the handle and
// the backend, so a backend may complete entries after the caller dropped the
// handle without touching freed memory. Each entry completes exactly once,
// with a Status and a byte count.
//
// Thread safety: every method may be called from any thread. Backends call
// BatchCompletion::Complete from their progress threads.
#ifndef KVFABRIC_TRANSPORT_TRANSFER_BATCH_H_
#define KVFABRIC_TRANSPORT_TRANSFER_BATCH_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"

namespace kvfabric::transport {

struct TransferResult {
  Status status = Status::Unknown("not completed");
  std::uint64_t bytes = 0;  // bytes moved by this entry (its length when OK)
  // For an OK entry submitted with Transfer::checksum, where the backend
  // copied the bytes itself: the CRC32C of the bytes it stored in the
  // destination range (transport.h, Transfer::checksum).
  // Empty where the backend did not compute it; the caller then checks.
  std::optional<std::uint32_t> landed_crc32c;
};

// The shared completion state of one batch.
class BatchCompletion {
 public:
  // `cancel` is called at most once, by the first Cancel(), without locks
  // held; the backend must then complete every unfinished entry (Cancelled).
  BatchCompletion(std::size_t entries, std::function<void()> cancel);

  BatchCompletion(const BatchCompletion&) = delete;
  BatchCompletion& operator=(const BatchCompletion&) = delete;

  // Records entry `index`'s outcome. A second completion of the same entry is
  // ignored (a backend racing cancellation against success keeps the first).
  // REQUIRES: index < size(). `landed_crc32c` is kept only with an OK status.
  void Complete(std::size_t index, Status status, std::uint64_t bytes,
                std::optional<std::uint32_t> landed_crc32c = std::nullopt);

  // Runs `fn` once every entry has completed (at once, on this thread, if
  // that is already so; otherwise on the thread of the last Complete()).
  void OnDone(std::function<void()> fn);

  void Cancel();
  bool Done() const;
  // OK when every entry completed by `deadline`, else DeadlineExceeded
  // (nothing is cancelled).
  Status Wait(std::chrono::steady_clock::time_point deadline) const;
  // Waits without a deadline (backends guarantee completion).
  void WaitForever() const;

  std::size_t size() const { return results_.size(); }
  // REQUIRES: Done().
  std::span<const TransferResult> results() const { return results_; }

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  // Written under mu_ until Done(), then read without it (results()): not
  // KVF_GUARDED_BY, which cannot say "until".
  std::vector<TransferResult> results_;
  std::vector<bool> completed_ KVF_GUARDED_BY(mu_);
  std::size_t remaining_ KVF_GUARDED_BY(mu_);
  std::function<void()> on_done_ KVF_GUARDED_BY(mu_);
  std::function<void()> cancel_ KVF_GUARDED_BY(mu_);  // taken by the first Cancel()
};

class TransferBatch {
 public:
  explicit TransferBatch(std::shared_ptr<BatchCompletion> completion)
      : completion_(std::move(completion)) {}

  TransferBatch(const TransferBatch&) = delete;
  TransferBatch& operator=(const TransferBatch&) = delete;

  // Cancels what is still in flight and waits until every entry completed:
  // the local ranges are the caller's again when the destructor returns.
  ~TransferBatch();

  std::size_t size() const { return completion_->size(); }

  // Non-blocking: have all entries completed?
  bool Done() const { return completion_->Done(); }

  // OK when every entry completed by `deadline` (each entry's own outcome is
  // in results()); DeadlineExceeded otherwise, with everything still running.
  Status Wait(std::chrono::steady_clock::time_point deadline) const {
    return completion_->Wait(deadline);
  }

  // Entries not yet complete complete with Cancelled (or with their real
  // outcome if it raced ahead). Does not wait.
  void Cancel() { completion_->Cancel(); }

  // REQUIRES: Done().
  std::span<const TransferResult> results() const { return completion_->results(); }

  // REQUIRES: Done(). The first failed entry's status, prefixed with its
  // index, or OK.
  Status FirstError() const;

  // REQUIRES: Done(). Sum of bytes over all entries.
  std::uint64_t TotalBytes() const;

  // See BatchCompletion::OnDone.
  void OnDone(std::function<void()> fn) { completion_->OnDone(std::move(fn)); }

 private:
  std::shared_ptr<BatchCompletion> completion_;
};

}  // namespace kvfabric::transport

#endif  // KVFABRIC_TRANSPORT_TRANSFER_BATCH_H_
