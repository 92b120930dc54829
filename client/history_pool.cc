#include "client/history_pool.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "client/client_log.h"
#include "core/units.h"

namespace kvfabric::client {
namespace {

std::uint64_t CeilDiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

}  // namespace

HistoryPool::HistoryPool(const HistoryPoolOptions& options, std::uint32_t pages,
                         std::unique_ptr<gpu::PinnedHostBuffer> buffer)
    : o_(options),
      pages_(pages),
      buffer_(std::move(buffer)),
      used_(CeilDiv(pages, 64), 0),
      quarantine_(std::max<std::uint32_t>(pages, 1)) {}

StatusOr<std::unique_ptr<HistoryPool>> HistoryPool::Create(
    gpu::Device& device, const HistoryPoolOptions& o,
    std::unique_ptr<gpu::PinnedHostBuffer> memory) {
  if (o.block_bytes == 0 || o.tokens_per_block == 0) {
    return Status::InvalidArgument("history pool: no block geometry");
  }
  const std::uint64_t pages = o.pool_bytes / o.block_bytes;
  const std::uint64_t per_history =
      o.max_context_tokens == 0 ? 1 : CeilDiv(o.max_context_tokens, o.tokens_per_block);
  if (pages < per_history || pages > 0xffffffffull) {
    return Status::InvalidArgument(
        "history pool: " + o.setting + " = " + FormatBytes(o.pool_bytes) + " holds " +
        std::to_string(pages) + " pages of one " + FormatBytes(o.block_bytes) + " block; " +
        (o.max_context_tokens == 0
             ? std::string("it must hold at least one block")
             : "one history of " + std::to_string(o.max_context_tokens) + " tokens needs " +
                   std::to_string(per_history) + " pages = " +
                   FormatBytes(per_history * o.block_bytes)) +
        (pages > 0xffffffffull ? " (and at most 2^32 - 1 pages)" : "") + ": raise " + o.setting +
        (o.max_context_tokens == 0 ? "" : " or lower max_context_tokens"));
  }
  std::unique_ptr<gpu::PinnedHostBuffer> buffer = std::move(memory);
  if (buffer == nullptr) {
    KVF_ASSIGN_OR_RETURN(buffer, device.AllocatePinnedHost(pages * o.block_bytes));
  } else if (buffer->bytes().size() < pages * o.block_bytes) {
    return Status::InvalidArgument("history pool: " + FormatBytes(buffer->bytes().size()) +
                                   " of memory given for " + std::to_string(pages) + " pages of " +
                                   FormatBytes(o.block_bytes));
  }
  // Pre-fault: the first touch of fresh memory is paid here, never on a request.
  const auto start = std::chrono::steady_clock::now();
  std::memset(buffer->bytes().data(), 0, pages * o.block_bytes);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::unique_ptr<HistoryPool> pool(
      new HistoryPool(o, static_cast<std::uint32_t>(pages), std::move(buffer)));
  Log().info("history pool: {}; pre-faulted in {:.1f} ms", pool->DescribeLayout(), secs * 1e3);
  return pool;
}

std::string HistoryPool::DescribeLayout() const {
  std::string s = FormatBytes(o_.pool_bytes) + " (" + o_.setting + ") = " +
                  std::to_string(pages_) + " pages x " + FormatBytes(o_.block_bytes) +
                  " (one block of " + std::to_string(o_.tokens_per_block) + " tokens) = " +
                  std::to_string(std::uint64_t{pages_} * o_.tokens_per_block) + " tokens";
  if (o_.max_context_tokens != 0) {
    const std::uint64_t per = CeilDiv(o_.max_context_tokens, o_.tokens_per_block);
    s += "; histories of " + std::to_string(o_.max_context_tokens) + " tokens: " +
         std::to_string(per) + " pages each, " + std::to_string(pages_ / per) +
         " at once (floor(" + std::to_string(pages_) + " / " + std::to_string(per) + "))";
  }
  return s;
}

Status HistoryPool::Take(std::uint32_t n, std::vector<std::uint32_t>* pages,
                         const std::string& who) {
  MutexLock l(&mu_);
  if (quarantined_ != 0) ReleaseExpired();
  if (n > pages_ - in_use_) {
    return Status::ResourceExhausted(
        "history pool: " + who + " needs " + std::to_string(n) + " pages of " +
        FormatBytes(o_.block_bytes) + ", " + std::to_string(pages_ - in_use_) + " of " +
        std::to_string(pages_) + " are free (" + std::to_string(in_use_) +
        " held by open contexts); finish a context or raise " + o_.setting);
  }
  pages->resize(n);
  std::uint32_t got = 0;
  for (std::size_t w = 0; w < used_.size() && got < n; ++w) {
    std::uint64_t free = ~used_[w];
    while (free != 0 && got < n) {
      const int bit = __builtin_ctzll(free);
      const std::uint64_t p = w * 64 + static_cast<std::uint64_t>(bit);
      if (p >= pages_) break;
      used_[w] |= std::uint64_t{1} << bit;
      free &= free - 1;
      (*pages)[got++] = static_cast<std::uint32_t>(p);
    }
  }
  in_use_ += n;
  peak_ = std::max(peak_, in_use_);
  return Status::OK();
}

void HistoryPool::Return(std::span<const std::uint32_t> pages) {
  MutexLock l(&mu_);
  for (std::uint32_t p : pages) used_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
  in_use_ -= static_cast<std::uint32_t>(pages.size());
}

void HistoryPool::Quarantine(std::uint32_t page, std::chrono::steady_clock::time_point until) {
  MutexLock l(&mu_);
  // A later deadline than every queued one keeps the ring in time order.
  if (quarantined_ != 0) {
    const Held& last = quarantine_[(quarantine_head_ + quarantined_ - 1) % quarantine_.size()];
    until = std::max(until, last.until);
  }
  quarantine_[(quarantine_head_ + quarantined_) % quarantine_.size()] = Held{page, until};
  ++quarantined_;
}

void HistoryPool::ReleaseExpired() {
  const auto now = std::chrono::steady_clock::now();
  while (quarantined_ != 0 && quarantine_[quarantine_head_].until <= now) {
    const std::uint32_t p = quarantine_[quarantine_head_].page;
    used_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
    --in_use_;
    quarantine_head_ = (quarantine_head_ + 1) % quarantine_.size();
    --quarantined_;
  }
}

std::uint32_t HistoryPool::pages_quarantined() const {
  MutexLock l(&mu_);
  return static_cast<std::uint32_t>(quarantined_);
}

std::uint32_t HistoryPool::pages_in_use() const {
  MutexLock l(&mu_);
  return in_use_;
}

std::uint32_t HistoryPool::peak_pages_in_use() const {
  MutexLock l(&mu_);
  return peak_;
}

}  // namespace kvfabric::client
