#include "server/placement/path_load.h"

#include <algorithm>
#include <cmath>

#include "core/mutex.h"

namespace kvfabric {

SharedBacklog::SharedBacklog(std::vector<double> remaining, double gain)
    : gain_(std::isfinite(gain) && gain > 1 ? gain : 1), remaining_(std::move(remaining)) {
  std::erase_if(remaining_, [](double r) { return !(r > 0); });
  std::sort(remaining_.begin(), remaining_.end());
  const size_t n = remaining_.size();
  at_.resize(n);
  // Between the k-th and (k+1)-th smallest remainders, the new transfer and n - k plans move.
  double prev = 0, t = 0;
  for (size_t k = 0; k < n; ++k) {
    t += (remaining_[k] - prev) * Slowdown(n - k + 1);
    at_[k] = t;
    prev = remaining_[k];
    total_ += remaining_[k];
  }
}

double SharedBacklog::Slowdown(size_t n) const {
  return std::max(1.0, static_cast<double>(n) / gain_);
}

double SharedBacklog::Stretched(double bytes) const {
  if (!(bytes > 0)) return 0;
  // The plans with less than `bytes` left end before the new transfer does.
  const auto j = static_cast<size_t>(std::lower_bound(remaining_.begin(), remaining_.end(), bytes) -
                                     remaining_.begin());
  const size_t n = remaining_.size();
  if (j == 0) return bytes * Slowdown(n + 1);
  return at_[j - 1] + (bytes - remaining_[j - 1]) * Slowdown(n - j + 1);
}

namespace {

// When each of the transfers with `remaining` bytes (ascending) ends, in µs from now, at `beta`
// shared by `gain` (each moves at beta × min(1, gain / n) while n move), none arriving later.
std::vector<double> EndsUs(const std::vector<double>& remaining, double beta, double gain) {
  std::vector<double> ends(remaining.size());
  double prev = 0, t = 0;
  for (size_t k = 0; k < remaining.size(); ++k) {
    const double n = static_cast<double>(remaining.size() - k);
    t += (remaining[k] - prev) / (beta * std::min(1.0, gain / n)) * 1e6;
    ends[k] = t;
    prev = remaining[k];
  }
  return ends;
}

}  // namespace

uint64_t PathLoad::ClampLocked(uint64_t now_us) {
  latest_us_ = std::max(latest_us_, now_us);
  return latest_us_;
}

void PathLoad::AdvanceLocked(const Key& key, Resource* r, uint64_t now_us) {
  if (now_us <= r->clock_us) return;
  if (r->beta > 0) {
    double t = static_cast<double>(r->clock_us);
    const double now = static_cast<double>(now_us);
    while (!r->active.empty()) {
      const auto first = r->active.begin();
      const double n = static_cast<double>(r->active.size());
      // Every active plan receives beta × min(1, gain / n); the one nearest its end gets there
      // after this.
      const double rate = r->beta * std::min(1.0, r->gain / n);
      const double dt_us = (first->first - r->served) / rate * 1e6;
      if (t + dt_us > now) {
        r->served += (now - t) * rate / 1e6;
        break;
      }
      t += dt_us;
      r->served = first->first;
      const auto plan = plans_.find(first->second);
      if (plan != plans_.end()) {
        for (Charge& c : plan->second.charges) {
          if (c.active && c.key == key) c.active = false;
        }
      }
      r->active.erase(first);
    }
  }
  r->clock_us = now_us;
}

SharedBacklog PathLoad::Backlog(BusPath path, std::string_view resource, uint64_t now_us,
                                double gain) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  const auto it = resources_.find(Key(static_cast<int>(path), std::string(resource)));
  if (it == resources_.end()) return SharedBacklog({}, gain);
  AdvanceLocked(it->first, &it->second, now);
  std::vector<double> remaining;
  remaining.reserve(it->second.active.size());
  for (const auto& [end, ticket] : it->second.active) remaining.push_back(end - it->second.served);
  if (gain <= 0) gain = it->second.gain;
  if (it->second.active.empty()) resources_.erase(it);
  return SharedBacklog(std::move(remaining), gain);
}

uint64_t PathLoad::QueuedBytes(BusPath path, std::string_view resource, uint64_t now_us) {
  return static_cast<uint64_t>(std::ceil(Backlog(path, resource, now_us).Total()));
}

uint64_t PathLoad::Admit(const std::vector<PathCharge>& charges, uint64_t now_us,
                         uint64_t deadline_us) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  if (plans_.size() >= max_plans_) return 0;
  const uint64_t ticket = next_ticket_++;
  // Charges naming one resource move as one share of it.
  struct Merged {
    uint64_t bytes = 0;
    double beta = 0, gain = 1;
  };
  std::map<Key, Merged> merged;
  for (const PathCharge& c : charges) {
    if (c.bytes == 0) continue;
    Merged& m = merged[Key(static_cast<int>(c.path), c.resource)];
    m.bytes += c.bytes;
    m.beta = c.beta_bytes_per_s;
    m.gain = c.concurrency_gain;
  }
  Admitted& admitted = plans_[ticket];
  admitted.deadline_us = deadline_us;
  for (const auto& [key, charge] : merged) {
    const uint64_t bytes = charge.bytes;
    auto [it, inserted] = resources_.try_emplace(key);
    Resource& r = it->second;
    if (inserted) {
      r.clock_us = now;
    } else {
      AdvanceLocked(key, &r, now);
    }
    r.beta = std::isfinite(charge.beta) && charge.beta > 0 ? charge.beta : 0;
    r.gain = std::isfinite(charge.gain) && charge.gain > 1 ? charge.gain : 1;
    // Each plan still moving bytes here ends later by the new one: its end with it less its
    // end without (`active` is in order of bytes left; the new plan goes after its equals).
    if (r.beta > 0 && !r.active.empty()) {
      std::vector<double> left;
      left.reserve(r.active.size() + 1);
      for (const auto& entry : r.active) left.push_back(entry.first - r.served);
      const std::vector<double> before = EndsUs(left, r.beta, r.gain);
      const auto at = std::upper_bound(left.begin(), left.end(), static_cast<double>(bytes));
      const auto pos = static_cast<size_t>(at - left.begin());
      left.insert(at, static_cast<double>(bytes));
      const std::vector<double> after = EndsUs(left, r.beta, r.gain);
      size_t i = 0;
      for (const auto& [end, other] : r.active) {
        const double delay = after[i < pos ? i : i + 1] - before[i];
        ++i;
        const auto o = plans_.find(other);
        if (o == plans_.end()) continue;
        for (Charge& c : o->second.charges) {
          if (c.active && c.key == key) c.delay_us += delay;
        }
      }
    }
    const double end = r.served + static_cast<double>(bytes);
    r.active.emplace(end, ticket);
    admitted.charges.push_back({key, end, 0, true});
  }
  return ticket;
}

void PathLoad::RemoveLocked(uint64_t ticket, Admitted* a, uint64_t now_us) {
  for (Charge& c : a->charges) {
    if (!c.active) continue;
    const auto it = resources_.find(c.key);
    if (it == resources_.end()) continue;  // cannot happen: an active charge has its resource
    AdvanceLocked(it->first, &it->second, now_us);  // may end this charge too
    if (c.active) it->second.active.erase({c.virtual_end, ticket});
    c.active = false;
    if (it->second.active.empty()) resources_.erase(it);
  }
}

bool PathLoad::Release(uint64_t ticket, uint64_t now_us, double* added_delay_us) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  const auto it = plans_.find(ticket);
  if (it == plans_.end()) return false;
  if (added_delay_us != nullptr) *added_delay_us = it->second.AddedDelayUs();
  RemoveLocked(ticket, &it->second, now);
  plans_.erase(it);
  return true;
}

size_t PathLoad::ReleaseExpired(uint64_t now_us) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  size_t released = 0;
  for (auto it = plans_.begin(); it != plans_.end();) {
    if (it->second.deadline_us <= now) {
      RemoveLocked(it->first, &it->second, now);
      it = plans_.erase(it);
      ++released;
    } else {
      ++it;
    }
  }
  return released;
}

double PathLoad::AddedDelayUs(uint64_t ticket) const {
  MutexLock lock(&mu_);
  const auto it = plans_.find(ticket);
  return it == plans_.end() ? 0 : it->second.AddedDelayUs();
}

size_t PathLoad::admitted_plans() const {
  MutexLock lock(&mu_);
  return plans_.size();
}

}  // namespace kvfabric
