#include "core/copy_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/crc32c.h"
#include "core/guarded_copy.h"
#include "core/mutex.h"

namespace kvfabric {
namespace {

// Shares are cut inside a range only at multiples of this (a page: whole
// cache lines, and no two threads write one line).
constexpr std::size_t kCutAlign = 4096;

// Copies every range (guarded: core/guarded_copy.h); the first fault's
// status, after trying the rest.
Status CopyAll(std::span<const CopyRange> ranges, bool streaming) {
  Status first;
  for (const CopyRange& r : ranges) {
    Status s = r.crc != nullptr ? GuardedCopyChecked(r.dst, r.src, r.bytes, streaming, r.crc)
                                : GuardedCopy(r.dst, r.src, r.bytes, streaming);
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

// Splits `ranges` into at most `parts` lists of about equal bytes. Appends
// to `origin`, per piece in order (share after share), its range's index.
std::vector<std::vector<CopyRange>> Split(std::span<const CopyRange> ranges, std::size_t parts,
                                          std::vector<std::size_t>* origin) {
  std::size_t total = 0;
  for (const CopyRange& r : ranges) total += r.bytes;
  const std::size_t target = std::max<std::size_t>(kCutAlign, (total + parts - 1) / parts);
  std::vector<std::vector<CopyRange>> out(1);
  std::size_t in_part = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    CopyRange r = ranges[k];
    while (r.bytes > 0) {
      if (in_part >= target && out.size() < parts) {
        out.emplace_back();
        in_part = 0;
      }
      std::size_t take = r.bytes;
      if (out.size() < parts && in_part + take > target) {
        // Cut at the first page boundary of the destination past the target.
        const std::size_t want = target - in_part;
        const auto dst = reinterpret_cast<std::uintptr_t>(r.dst);
        const std::size_t aligned = ((dst + want + kCutAlign - 1) / kCutAlign) * kCutAlign - dst;
        take = std::min(r.bytes, std::max<std::size_t>(aligned, 1));
      }
      out.back().push_back({r.dst, r.src, take, r.crc});
      origin->push_back(k);
      in_part += take;
      r.dst = static_cast<char*>(r.dst) + take;
      r.src = static_cast<const char*>(r.src) + take;
      r.bytes -= take;
    }
  }
  return out;
}

}  // namespace

CopyPool::CopyPool(int threads, std::size_t min_split_bytes) : min_split_bytes_(min_split_bytes) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

CopyPool::~CopyPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (std::thread& t : workers_) t.join();
}

void CopyPool::Work() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

namespace {

// Points every piece of a checked range (CopyRange::crc) at its own slot of
// `piece_crcs` (one per piece, in Split's order), for FoldPieces.
void AimPieces(std::vector<std::vector<CopyRange>>* shares,
               std::vector<std::uint32_t>* piece_crcs) {
  std::size_t slot = 0;
  for (auto& share : *shares) {
    for (CopyRange& piece : share) {
      if (piece.crc != nullptr) piece.crc = &(*piece_crcs)[slot];
      ++slot;
    }
  }
}

// Sets each checked range's CRC from its pieces' (after every copy succeeded).
void FoldPieces(std::span<const CopyRange> ranges,
                const std::vector<std::vector<CopyRange>>& shares,
                const std::vector<std::uint32_t>& piece_crcs,
                const std::vector<std::size_t>& origin) {
  std::vector<std::uint32_t> folded(ranges.size(), 0);
  std::size_t slot = 0;
  for (const auto& share : shares) {
    for (const CopyRange& piece : share) {
      const std::size_t k = origin[slot];
      if (ranges[k].crc != nullptr) {
        folded[k] = crc32c::Combine(folded[k], piece_crcs[slot], piece.bytes);
      }
      ++slot;
    }
  }
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    if (ranges[k].crc != nullptr) *ranges[k].crc = folded[k];
  }
}

}  // namespace

Status CopyPool::Copy(std::span<const CopyRange> ranges, bool streaming) {
  if (workers_.empty() || ranges.empty()) return CopyAll(ranges, streaming);
  std::size_t total = 0;
  for (const CopyRange& r : ranges) total += r.bytes;
  if (total < min_split_bytes_) return CopyAll(ranges, streaming);
  split_copies_.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::size_t> origin;
  std::vector<std::vector<CopyRange>> shares = Split(ranges, workers_.size() + 1, &origin);
  bool checked = false;
  for (const CopyRange& r : ranges) checked = checked || r.crc != nullptr;
  std::vector<std::uint32_t> piece_crcs(checked ? origin.size() : 0, 0);
  if (checked) AimPieces(&shares, &piece_crcs);
  // Completion of the helpers' shares; lives on this stack frame, which
  // outlives every job (Copy waits for all of them).
  Mutex done_mu;
  CondVar done_cv;
  std::size_t left = shares.size() - 1;
  Status failed;  // the first share's fault, guarded by done_mu
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 1; i < shares.size(); ++i) {
      jobs_.push_back([&, i] {
        Status s = CopyAll(shares[i], streaming);
        MutexLock l(&done_mu);
        if (!s.ok() && failed.ok()) failed = std::move(s);
        if (--left == 0) done_cv.NotifyOne();
      });
    }
  }
  cv_.NotifyAll();
  Status mine = CopyAll(shares[0], streaming);
  MutexLock lock(&done_mu);
  done_cv.Wait(&done_mu, [&] { return left == 0; });
  Status result = mine.ok() ? failed : mine;
  if (checked && result.ok()) FoldPieces(ranges, shares, piece_crcs, origin);
  return result;
}

}  // namespace kvfabric
