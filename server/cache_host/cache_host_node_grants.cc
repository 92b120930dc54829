// CacheHostNode's grants (cache_host_node.h, "Batches"): their ids and
// tokens, Renew and Release, and the brackets the data plane takes around
// every transfer under a grant. Split from cache_host_node.cc.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/secure_random.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/node_keys.h"

namespace kvfabric::cache_host {

using internal::TokensEqual;

AccessToken CacheHostNode::NewToken() {
  // Tokens are capabilities a peer must not guess: from the kernel's CSPRNG.
  AccessToken t;
  SecureRandomBytes(t);
  return t;
}

std::uint64_t CacheHostNode::NewGrantId() {
  // Random, not sequential: an id names a grant but does not let anyone use
  // it (that takes the token), and a sequential id would tell a client how
  // many grants others hold and which id is next.
  for (;;) {
    const std::uint64_t id = SecureRandomU64();
    if (id != 0 && !grants_.contains(id)) return id;
  }
}

namespace {

// What an unknown grant, one of another namespace, and a wrong token all
// answer: one message, so the answer tells a guesser nothing.
Status GrantNotFound(std::uint64_t lease_id) {
  return Status::NotFound("lease " + std::to_string(lease_id) +
                          " is unknown or ended, or the access token is not its");
}

}  // namespace

std::unordered_map<std::uint64_t, CacheHostNode::Grant>::iterator CacheHostNode::FindOwnedGrant(
    const Namespace& ns, const GrantRef& ref) {
  auto it = grants_.find(ref.lease_id);
  if (it == grants_.end() || it->second.tenant != ns.tenant ||
      !TokensEqual(it->second.token, ref.token)) {
    return grants_.end();
  }
  return it;
}

// ---------------------------------------------------------------- Renew / Release

std::vector<StatusOr<std::uint64_t>> CacheHostNode::Renew(const Namespace& ns,
                                                          std::span<const GrantRef> grants,
                                                          std::uint64_t ttl_us) {
  ttl_us = EffectiveTtl(ttl_us);
  std::vector<StatusOr<std::uint64_t>> out;
  out.reserve(grants.size());
  MutexLock lock(&mu_);
  for (const GrantRef& ref : grants) {
    const std::uint64_t id = ref.lease_id;
    auto it = FindOwnedGrant(ns, ref);
    if (it == grants_.end()) {
      out.emplace_back(GrantNotFound(id));
      continue;
    }
    Grant& g = it->second;
    Status s;
    if (g.write) {
      for (const GrantBlock& b : g.blocks) {
        if (b.committed || b.released) continue;
        auto r = table_->RenewReservation(b.sub_id, ttl_us);
        if (!r.ok()) s = r.status();
      }
    } else {
      for (std::uint64_t lid : g.read_leases) {
        auto r = table_->Renew(lid, ttl_us);
        if (!r.ok()) s = r.status();
      }
    }
    if (!s.ok()) {
      out.emplace_back(s.WithContext("renew lease " + std::to_string(id)));
      continue;
    }
    g.expires_at_us = NowUs() + ttl_us;
    out.emplace_back(ttl_us);
  }
  return out;
}

std::vector<Status> CacheHostNode::Release(const Namespace& ns,
                                           std::span<const ReleaseEntry> entries) {
  std::vector<Status> out(entries.size());
  std::vector<std::uint64_t> aborts, releases;
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const ReleaseEntry& e = entries[i];
      auto it = FindOwnedGrant(ns, GrantRef{e.lease_id, e.token});
      if (it == grants_.end()) {
        out[i] = GrantNotFound(e.lease_id);
        continue;
      }
      Grant& g = it->second;
      for (const BlockKey& k : e.keys) {
        auto b = std::find_if(g.blocks.begin(), g.blocks.end(),
                              [&](const GrantBlock& gb) { return gb.key == k; });
        if (b == g.blocks.end() || b->released) {
          out[i] = Status::NotFound("block " + k.ToHex() + " is not held by lease " +
                                    std::to_string(e.lease_id));
          continue;
        }
        b->released = true;
        if (g.write && !b->committed) aborts.push_back(b->sub_id);
      }
      bool all = true;
      for (GrantBlock& b : g.blocks) {
        if (e.keys.empty() && !b.released) {
          b.released = true;
          if (g.write && !b.committed) aborts.push_back(b.sub_id);
        }
        all = all && (b.released || (g.write && b.committed));
      }
      if (all) {
        if (!g.write) releases.insert(releases.end(), g.read_leases.begin(), g.read_leases.end());
        grants_.erase(it);
      }
    }
  }
  // A reservation with a write in flight cannot be aborted now; it expires
  // with its TTL once the write ends.
  for (std::uint64_t id : aborts) table_->Abort(id).IgnoreError();
  for (std::uint64_t id : releases) table_->Release(id).IgnoreError();
  return out;
}

// ---------------------------------------------------------------- Data plane brackets

StatusOr<TransferTicket> CacheHostNode::BeginTransfer(std::uint64_t lease_id,
                                                      const AccessToken& token, bool write,
                                                      std::span<const ByteExtent> ranges,
                                                      const DataSessionTenant* tenant) {
  TransferTicket ticket;
  ticket.write = write;
  MutexLock lock(&mu_);
  auto it = grants_.find(lease_id);
  if (it == grants_.end() || !TokensEqual(it->second.token, token) || it->second.write != write ||
      (tenant != nullptr && !tenant->MayUse(it->second.tenant))) {
    ++transfers_refused_;
    return Status::NotFound(std::string(write ? "write" : "read") + " lease " +
                            std::to_string(lease_id) +
                            " is unknown, ended, or the access token does not match");
  }
  Grant& g = it->second;
  const std::uint64_t page = pool_->page_bytes();
  for (const ByteExtent& r : ranges) {
    const GrantBlock* found = nullptr;
    for (const GrantBlock& b : g.blocks) {
      if (b.released || (write && b.committed)) continue;
      for (const PageRun& run : b.pages) {
        const std::uint64_t start = std::uint64_t{run.first} * page;
        if (r.offset >= start && r.offset < start + std::uint64_t{run.count} * page) found = &b;
      }
      if (found != nullptr) break;
    }
    Status s;
    std::uint64_t sub = 0;
    if (found == nullptr) {
      s = Status::InvalidArgument("range [" + std::to_string(r.offset) + ", +" +
                                  std::to_string(r.length) + ") lies in no open block of lease " +
                                  std::to_string(lease_id));
    } else if (write) {
      sub = found->sub_id;
      s = table_->BeginWriteRange(sub, r.offset, r.length);
    } else {
      for (std::uint64_t lid : g.read_leases) {
        s = table_->BeginReadRange(lid, r.offset, r.length);
        sub = lid;
        if (s.ok()) break;
      }
    }
    if (!s.ok()) {
      EndTransfer(ticket, /*landed=*/false);
      ++transfers_refused_;
      return s;
    }
    ticket.sub_ids.push_back(sub);
    if (write) ticket.ranges.push_back(r);
  }
  return ticket;
}

void CacheHostNode::EndTransfer(const TransferTicket& ticket, bool landed) {
  for (std::size_t i = 0; i < ticket.sub_ids.size(); ++i) {
    const std::uint64_t id = ticket.sub_ids[i];
    if (!ticket.write) {
      table_->EndRead(id).IgnoreError();
      continue;
    }
    std::optional<PoolRange> range;
    if (landed) range = PoolRange{ticket.ranges[i].offset, ticket.ranges[i].length};
    // BeginWriteRange checked the range, so this only ends the bracket.
    table_->EndWrite(id, range).IgnoreError();
  }
}

}  // namespace kvfabric::cache_host
