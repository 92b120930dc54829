#include "transport/ucx/ucx_populate.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "transport/ucx/ucx_core.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvfabric::ucx::internal {

MappingPopulator::~MappingPopulator() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void MappingPopulator::Enqueue(std::weak_ptr<RkeyHolder> holder) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || stats_.unsupported) return;
    if (queue_.size() >= kMaxQueued) {
      ++stats_.regions_dropped;
      return;
    }
    queue_.push_back(std::move(holder));
    if (!started_) {
      started_ = true;
      thread_ = std::thread([this] { Run(); });
    }
  }
  cv_.NotifyOne();
}

MappingPopulator::Stats MappingPopulator::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void MappingPopulator::Run() {
  for (;;) {
    std::weak_ptr<RkeyHolder> next;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&]() KVF_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      if (stats_.unsupported) {
        queue_.clear();
        continue;
      }
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::uint64_t offset = 0;
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
        if (stats_.unsupported) break;
      }
      // Held for one chunk only: the last reference may then be the endpoint's, whose
      // progress thread destroys the key (RkeyHolder::Reset).
      std::shared_ptr<RkeyHolder> h = next.lock();
      if (h == nullptr || !PopulateChunk(*h, &offset)) break;
    }
  }
}

bool MappingPopulator::PopulateChunk(RkeyHolder& h, std::uint64_t* offset) {
  static const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  std::shared_lock<std::shared_mutex> mapping(h.map_mu);
  if (h.mapped == nullptr || *offset >= h.length) {
    if (h.mapped != nullptr) {
      MutexLock lock(&mu_);
      ++stats_.regions;
    }
    return false;
  }
  const std::uint64_t end_offset = std::min(h.length, *offset + kChunkBytes);
  const auto base = reinterpret_cast<std::uintptr_t>(h.mapped);
  // Whole pages inside [offset, end_offset) of the range only.
  const std::uintptr_t begin = (base + *offset + page - 1) / page * page;
  const std::uintptr_t end = (base + end_offset) / page * page;
  *offset = end_offset;
  if (end <= begin) return true;
  std::vector<unsigned char> resident((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()) != 0) return false;
  int advice;
  {
    MutexLock lock(&mu_);
    advice = advice_ == 0 ? MADV_POPULATE_WRITE : advice_;
  }
  std::uint64_t populated = 0, skipped = 0;
  for (std::size_t i = 0; i < resident.size();) {
    if ((resident[i] & 1) == 0) {
      ++i;
      skipped += page;
      continue;
    }
    std::size_t j = i + 1;
    while (j < resident.size() && (resident[j] & 1) != 0) ++j;
    void* const run = reinterpret_cast<void*>(begin + i * page);
    const std::size_t bytes = (j - i) * page;
    int rc = madvise(run, bytes, advice);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err == EINVAL && advice == MADV_POPULATE_WRITE) {
      advice = MADV_POPULATE_READ;  // a kernel or mapping without the write advice
      rc = madvise(run, bytes, advice);
      err = rc == 0 ? 0 : errno;
    }
    if (rc != 0) {
      MutexLock lock(&mu_);
      // EINVAL for both advices: the kernel has neither (before Linux 5.14). Anything else
      // (the peer shrank its segment: EFAULT; out of memory for page tables: ENOMEM) ends
      // this region only.
      if (err == EINVAL) stats_.unsupported = true;
      stats_.bytes_populated += populated;
      stats_.bytes_not_resident += skipped;
      return false;
    }
    populated += bytes;
    i = j;
  }
  MutexLock lock(&mu_);
  advice_ = advice;
  stats_.bytes_populated += populated;
  stats_.bytes_not_resident += skipped;
  return true;
}

}  // namespace kvfabric::ucx::internal
