#include "server/placement/path_load.h"

#include <algorithm>
#include <cmath>

#include "core/mutex.h"

namespace kvfabric {

SharedBacklog::SharedBacklog(std::vector<double> remaining) : remaining_(std::move(remaining)) {
  std::erase_if(remaining_, [](double r) { return !(r > 0); });
  std::sort(remaining_.begin(), remaining_.end());
  prefix_.resize(remaining_.size());
  double sum = 0;
  for (size_t i = 0; i < remaining_.size(); ++i) prefix_[i] = sum += remaining_[i];
}

double SharedBacklog::Taken(double bytes) const {
  if (bytes <= 0 || remaining_.empty()) return 0;
  // The plans with less than `bytes` left give all of it; the rest give `bytes` each.
  const auto below = static_cast<size_t>(
      std::lower_bound(remaining_.begin(), remaining_.end(), bytes) - remaining_.begin());
  const double whole = below == 0 ? 0 : prefix_[below - 1];
  return whole + bytes * static_cast<double>(remaining_.size() - below);
}

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
      // Every active plan receives beta / n; the one nearest its end gets there after this.
      const double dt_us = (first->first - r->served) * n / r->beta * 1e6;
      if (t + dt_us > now) {
        r->served += (now - t) * r->beta / n / 1e6;
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

SharedBacklog PathLoad::Backlog(BusPath path, std::string_view resource, uint64_t now_us) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  const auto it = resources_.find(Key(static_cast<int>(path), std::string(resource)));
  if (it == resources_.end()) return SharedBacklog();
  AdvanceLocked(it->first, &it->second, now);
  std::vector<double> remaining;
  remaining.reserve(it->second.active.size());
  for (const auto& [end, ticket] : it->second.active) remaining.push_back(end - it->second.served);
  if (it->second.active.empty()) resources_.erase(it);
  return SharedBacklog(std::move(remaining));
}

uint64_t PathLoad::QueuedBytes(BusPath path, std::string_view resource, uint64_t now_us) {
  return static_cast<uint64_t>(std::ceil(Backlog(path, resource, now_us).Total()));
}

uint64_t PathLoad::Admit(const std::vector<PathCharge>& charges, uint64_t now_us,
                         uint64_t deadline_us) {
  MutexLock lock(&mu_);
  const uint64_t now = ClampLocked(now_us);
  const uint64_t ticket = next_ticket_++;
  // Charges naming one resource move as one share of it.
  std::map<Key, std::pair<uint64_t, double>> merged;
  for (const PathCharge& c : charges) {
    if (c.bytes == 0) continue;
    auto& m = merged[Key(static_cast<int>(c.path), c.resource)];
    m.first += c.bytes;
    m.second = c.beta_bytes_per_s;
  }
  Admitted& admitted = plans_[ticket];
  admitted.deadline_us = deadline_us;
  for (const auto& [key, charge] : merged) {
    const auto [bytes, beta] = charge;
    auto [it, inserted] = resources_.try_emplace(key);
    Resource& r = it->second;
    if (inserted) {
      r.clock_us = now;
    } else {
      AdvanceLocked(key, &r, now);
    }
    r.beta = std::isfinite(beta) && beta > 0 ? beta : 0;
    // Each plan still moving bytes here is delayed by what the new one takes from it.
    if (r.beta > 0) {
      for (const auto& [end, other] : r.active) {
        const auto o = plans_.find(other);
        if (o == plans_.end()) continue;
        const double taken = std::min(end - r.served, static_cast<double>(bytes));
        for (Charge& c : o->second.charges) {
          if (c.active && c.key == key) c.delay_us += taken / r.beta * 1e6;
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
  if (added_delay_us != nullptr) {
    *added_delay_us = 0;
    for (const Charge& c : it->second.charges) {
      *added_delay_us = std::max(*added_delay_us, c.delay_us);
    }
  }
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
  if (it == plans_.end()) return 0;
  double delay = 0;
  for (const Charge& c : it->second.charges) delay = std::max(delay, c.delay_us);
  return delay;
}

size_t PathLoad::admitted_plans() const {
  MutexLock lock(&mu_);
  return plans_.size();
}

}  // namespace kvfabric
