#include "server/placement/path_load.h"

#include "core/mutex.h"

namespace kvfabric {

uint64_t PathLoad::QueuedBytes(BusPath path, std::string_view resource) const {
  MutexLock lock(&mu_);
  const auto it = queued_.find(Key(static_cast<int>(path), std::string(resource)));
  return it == queued_.end() ? 0 : it->second;
}

uint64_t PathLoad::Admit(const std::vector<PathCharge>& charges, uint64_t deadline_us) {
  MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  for (const PathCharge& c : charges) {
    if (c.bytes > 0) queued_[Key(static_cast<int>(c.path), c.resource)] += c.bytes;
  }
  plans_.emplace(ticket, Admitted{charges, deadline_us});
  return ticket;
}

void PathLoad::RemoveLocked(const Admitted& a) {
  for (const PathCharge& c : a.charges) {
    if (c.bytes == 0) continue;
    const auto it = queued_.find(Key(static_cast<int>(c.path), c.resource));
    if (it == queued_.end()) continue;  // cannot happen: Admit added it
    if (it->second <= c.bytes) {
      queued_.erase(it);
    } else {
      it->second -= c.bytes;
    }
  }
}

bool PathLoad::Release(uint64_t ticket) {
  MutexLock lock(&mu_);
  const auto it = plans_.find(ticket);
  if (it == plans_.end()) return false;
  RemoveLocked(it->second);
  plans_.erase(it);
  return true;
}

size_t PathLoad::ReleaseExpired(uint64_t now_us) {
  MutexLock lock(&mu_);
  size_t released = 0;
  for (auto it = plans_.begin(); it != plans_.end();) {
    if (it->second.deadline_us <= now_us) {
      RemoveLocked(it->second);
      it = plans_.erase(it);
      ++released;
    } else {
      ++it;
    }
  }
  return released;
}

size_t PathLoad::admitted_plans() const {
  MutexLock lock(&mu_);
  return plans_.size();
}

}  // namespace kvfabric
