#include "server/cache_host/lease_table.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/block_format.h"
#include "core/crc32c.h"
#include "core/mutex.h"
#include "core/units.h"

namespace kvfabric::cache_host {
namespace {

std::string Hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

}  // namespace

LeaseTable::LeaseTable(HostPagePool* pool, MicrosClock clock, LeaseTableOptions options)
    : pool_(pool),
      clock_(std::move(clock)),
      options_(options),
      decisions_(options.decision_log_capacity),
      index_(options.index) {}

Status LeaseTable::CheckTtl(std::uint64_t ttl_us) const {
  if (ttl_us == 0 || ttl_us > options_.max_ttl_us) {
    return Status::InvalidArgument("TTL " + std::to_string(ttl_us) + " us: must be in (0, " +
                                   std::to_string(options_.max_ttl_us) + "] us (--max-lease-ttl)");
  }
  return Status::OK();
}

StatusOr<WriteReservation> LeaseTable::Reserve(const Namespace& ns, const BlockKey& key,
                                               const BlockMeta& meta, std::uint64_t ttl_us) {
  if (meta.bytes == 0 || meta.bytes > kMaxBlockPayloadBytes) {
    return Status::InvalidArgument("block of " + std::to_string(meta.bytes) +
                                   " bytes: must be in (0, " + FormatBytes(kMaxBlockPayloadBytes) +
                                   "]");
  }
  KVF_RETURN_IF_ERROR(CheckTtl(ttl_us));
  const std::uint64_t now = clock_();
  MutexLock lock(&mu_);
  if (reservations_.size() >= options_.max_reservations) {
    return Status::ResourceExhausted(std::to_string(reservations_.size()) +
                                     " reservations in flight, the limit (--max-reservations)");
  }
  KVF_ASSIGN_OR_RETURN(const NamespaceId id, index_.InternNamespace(ns));
  if (const BlockEntry* e = index_.Find(id, key); e != nullptr) {
    ++c_.already_exists;
    return Status::AlreadyExists("block " + key.ToHex() + " is already committed (tier " +
                                 BlockTierName(e->tier) + ")");
  }
  if (auto it = reserved_keys_.find({id, key}); it != reserved_keys_.end()) {
    ++c_.already_exists;
    const Reservation& r = reservations_.at(it->second);
    return Status::AlreadyExists("block " + key.ToHex() + " is reserved by another writer (until " +
                                 std::to_string(r.expires_at_us) + " us)");
  }
  const std::uint64_t pages = pool_->PagesFor(meta.bytes);
  const std::uint64_t resident = pages * pool_->page_bytes();
  const NamespaceUsage& usage = index_.Usage(id);
  if (usage.reservations >= options_.max_reservations_per_namespace) {
    ++c_.quota_refusals;
    const std::string tenant = usage.tenant;
    index_.ReclaimIfEmpty(id);
    return Status::ResourceExhausted(
        "namespace \"" + tenant + "\" holds " + std::to_string(options_.max_reservations_per_namespace) +
        " open reservations, the most one namespace may (--max-reservations-per-namespace): "
        "commit or abort some first");
  }
  if (options_.max_reserved_bytes_per_namespace != 0 &&
      usage.reserved_bytes + resident > options_.max_reserved_bytes_per_namespace) {
    ++c_.quota_refusals;
    return Status::ResourceExhausted(
        "namespace \"" + usage.tenant + "\": reserved " + FormatBytesExact(usage.reserved_bytes) +
        " + this block " + FormatBytesExact(resident) + " > " +
        FormatBytesExact(options_.max_reserved_bytes_per_namespace) +
        ", the most one namespace may hold reserved (--max-reserved-bytes-per-namespace)");
  }
  if (Status s = index_.CheckQuota(id, resident); !s.ok()) {
    ++c_.quota_refusals;
    index_.ReclaimIfEmpty(id);
    return s;
  }
  auto runs = pool_->Allocate(pages, PageState::kReserved);
  if (!runs.ok()) {
    ++c_.pool_refusals;
    index_.ReclaimIfEmpty(id);
    return runs.status().WithContext("reserve " + FormatBytesExact(meta.bytes) + " for block " +
                                     key.ToHex());
  }
  const std::uint64_t rid = next_id_++;
  const std::uint64_t expires = now + ttl_us;
  reservations_.emplace(rid, Reservation{id, key, meta, *runs, resident, expires, false, 0, {}});
  reserved_keys_.emplace(SlotKey{id, key}, rid);
  reservation_expiry_.emplace(expires, rid);
  index_.ChargeReserved(id, static_cast<std::int64_t>(resident));
  ++index_.MutableUsage(id).reservations;
  ++c_.reservations;
  return WriteReservation{rid, *runs, expires};
}

void LeaseTable::DropReservationLocked(std::uint64_t id, bool free_pages) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return;
  const Reservation& r = it->second;
  if (free_pages) {
    // Reserved pages are never pinned, so this cannot fail.
    pool_->Free(r.pages).IgnoreError();
  }
  const NamespaceId ns = r.ns;
  index_.ChargeReserved(ns, -static_cast<std::int64_t>(r.resident_bytes));
  --index_.MutableUsage(ns).reservations;
  reserved_keys_.erase({r.ns, r.key});
  reservation_expiry_.erase({r.expires_at_us, id});
  reservations_.erase(it);
  index_.ReclaimIfEmpty(ns);
}

Status LeaseTable::Commit(std::uint64_t reservation_id, std::uint32_t crc32c,
                          std::span<const std::uint32_t> landed_slice_crcs) {
  PageRuns pages;
  std::uint64_t bytes = 0;
  std::uint32_t layers = 0;
  BlockKey key;
  BlockRepresentation representation = BlockRepresentation::kExact;
  {
    MutexLock lock(&mu_);
    auto it = reservations_.find(reservation_id);
    if (it == reservations_.end()) {
      return Status::NotFound("reservation " + std::to_string(reservation_id) +
                              " is unknown or expired");
    }
    if (it->second.committing) {
      return Status::FailedPrecondition("reservation " + std::to_string(reservation_id) +
                                        " is being committed already");
    }
    if (it->second.writes_in_flight > 0) {
      return Status::FailedPrecondition("reservation " + std::to_string(reservation_id) +
                                        " still has a write in flight; commit after it lands");
    }
    KVF_RETURN_IF_ERROR(CheckWritten(reservation_id, it->second));
    it->second.committing = true;  // ExpireUntil leaves it alone from here on
    pages = it->second.pages;
    bytes = it->second.meta.bytes;
    layers = it->second.meta.layers;
    key = it->second.key;
    representation = it->second.meta.representation;
  }
  // The CRC of up to 64 MiB runs without the mutex; the pages stay reserved.
  // Per layer slice when the payload splits into its layers (the CRCs a
  // layer-range fetch is checked against), folded to the whole CRC the
  // writer declared, so they name the writer's bytes.
  // With the slices' CRCs from the transfer that wrote the pages (kStore),
  // folded without reading the pages again.
  std::vector<std::uint32_t> layer_crcs;
  const bool sliced = layers >= 1 && layers <= kMaxBlockLayers && bytes % layers == 0;
  std::uint32_t computed = 0;
  if (sliced && landed_slice_crcs.size() == layers) {
    layer_crcs.assign(landed_slice_crcs.begin(), landed_slice_crcs.end());
    const std::uint32_t shift = crc32c::ShiftFor(bytes / layers);
    computed = layer_crcs[0];
    for (std::uint32_t l = 1; l < layers; ++l) {
      computed = crc32c::CombineShifted(computed, layer_crcs[l], shift);
    }
  } else if (!sliced && landed_slice_crcs.size() == 1) {
    computed = landed_slice_crcs[0];
  } else {
    computed = sliced ? pool_->SliceCrc32c(pages, bytes, layers, &layer_crcs)
                      : pool_->Crc32c(pages, bytes);
  }
  const std::optional<BlockKey> compact_key = CompactKeyOf(key, representation);

  MutexLock lock(&mu_);
  Reservation& r = reservations_.at(reservation_id);
  if (computed != crc32c) {
    ++c_.crc_failures;
    const std::string key = r.key.ToHex();
    DropReservationLocked(reservation_id, /*free_pages=*/true);
    // The CRC computed here is not in the answer: over pages the caller may
    // not have written it is a checksum of their previous owner's bytes.
    return Status::DataLoss("commit of block " + key + " (reservation " +
                            std::to_string(reservation_id) + "): payload CRC mismatch: declared " +
                            Hex32(crc32c) + " does not match the " + std::to_string(bytes) +
                            " bytes written; pages returned, nothing published");
  }
  KVF_RETURN_IF_ERROR(pool_->Transition(r.pages, PageState::kReserved, PageState::kCommitted));
  BlockEntry e;
  e.ns = r.ns;
  e.key = r.key;
  e.meta = r.meta;
  e.crc32c = computed;
  e.layer_crc32c = std::move(layer_crcs);
  e.tier = BlockTier::kHost;
  e.host_pages = r.pages;
  e.host_resident_bytes = r.resident_bytes;
  e.committed_us = clock_();
  e.last_access_us = e.committed_us;
  e.compact_key = compact_key;
  const NamespaceId ns = e.ns;
  // Cannot collide: reserved_keys_ kept every other writer of this key out.
  KVF_RETURN_IF_ERROR(index_.Publish(std::move(e)));
  HoldCopyLocked(ns, compact_key);  // an exact block written again after eviction took it
  DropReservationLocked(reservation_id, /*free_pages=*/false);
  ++c_.commits;
  return Status::OK();
}

Status LeaseTable::Abort(std::uint64_t reservation_id) {
  MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return Status::NotFound("reservation " + std::to_string(reservation_id) +
                            " is unknown or expired");
  }
  if (it->second.committing || it->second.writes_in_flight > 0) {
    return Status::FailedPrecondition("reservation " + std::to_string(reservation_id) +
                                      " has a write or commit in flight");
  }
  DropReservationLocked(reservation_id, /*free_pages=*/true);
  ++c_.aborts;
  return Status::OK();
}

StatusOr<LeaseTable::Reservation*> LeaseTable::WritableLocked(std::uint64_t reservation_id) {
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return Status::NotFound("reservation " + std::to_string(reservation_id) +
                            " is unknown or expired");
  }
  if (it->second.committing) {
    return Status::FailedPrecondition("reservation " + std::to_string(reservation_id) +
                                      " is being committed");
  }
  return &it->second;
}

Status LeaseTable::BeginWrite(std::uint64_t reservation_id) {
  MutexLock lock(&mu_);
  KVF_ASSIGN_OR_RETURN(Reservation * r, WritableLocked(reservation_id));
  ++r->writes_in_flight;
  return Status::OK();
}

Status LeaseTable::EndWrite(std::uint64_t reservation_id, std::optional<PoolRange> landed) {
  MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return Status::NotFound("reservation " + std::to_string(reservation_id) + " is unknown");
  }
  Reservation& r = it->second;
  if (r.writes_in_flight == 0) {
    return Status::FailedPrecondition("EndWrite without BeginWrite on reservation " +
                                      std::to_string(reservation_id));
  }
  --r.writes_in_flight;
  if (!landed.has_value() || landed->length == 0) return Status::OK();
  KVF_RETURN_IF_ERROR(CheckRange(r.pages, r.meta.bytes, landed->offset, landed->length));
  RecordWritten(r, landed->offset, landed->length);
  return Status::OK();
}

Status LeaseTable::CopyIn(std::uint64_t reservation_id, std::span<const std::byte> payload) {
  PageRuns pages;
  {
    MutexLock lock(&mu_);
    KVF_ASSIGN_OR_RETURN(Reservation * r, WritableLocked(reservation_id));
    if (payload.size() > r->meta.bytes) {
      return Status::InvalidArgument(std::to_string(payload.size()) + " bytes for a " +
                                     std::to_string(r->meta.bytes) + "-byte block");
    }
    ++r->writes_in_flight;
    pages = r->pages;
  }
  pool_->CopyIn(pages, payload);  // outside the mutex; the bracket keeps the pages
  MutexLock lock(&mu_);
  Reservation& r = reservations_.at(reservation_id);
  --r.writes_in_flight;
  const std::uint64_t page = pool_->page_bytes();
  std::uint64_t left = payload.size();
  for (const PageRun& run : pages) {
    if (left == 0) break;
    const std::uint64_t n = std::min<std::uint64_t>(left, std::uint64_t{run.count} * page);
    RecordWritten(r, std::uint64_t{run.first} * page, n);
    left -= n;
  }
  return Status::OK();
}

void LeaseTable::RecordWritten(Reservation& r, std::uint64_t offset, std::uint64_t length) {
  auto& w = r.written;
  std::uint64_t begin = offset;
  std::uint64_t end = offset + length;  // CheckRange bounded it by the pool
  // First range that ends at or after `begin` (it may touch or overlap).
  auto first = std::lower_bound(w.begin(), w.end(), begin,
                                [](const auto& x, std::uint64_t b) { return x.second < b; });
  auto last = first;
  while (last != w.end() && last->first <= end) {
    begin = std::min(begin, last->first);
    end = std::max(end, last->second);
    ++last;
  }
  if (first == last) {
    w.insert(first, {begin, end});
  } else {
    *first = {begin, end};
    w.erase(first + 1, last);
  }
}

Status LeaseTable::CheckWritten(std::uint64_t id, const Reservation& r) const {
  const std::uint64_t page = pool_->page_bytes();
  std::uint64_t block_pos = 0;  // payload bytes before this run
  std::uint64_t missing = 0;
  std::optional<std::uint64_t> first_gap;  // payload offset
  for (const PageRun& run : r.pages) {
    if (block_pos >= r.meta.bytes) break;
    const std::uint64_t start = std::uint64_t{run.first} * page;
    const std::uint64_t usable =
        std::min<std::uint64_t>(std::uint64_t{run.count} * page, r.meta.bytes - block_pos);
    // Walk the written ranges that meet [start, start + usable).
    std::uint64_t pos = start;
    const std::uint64_t stop = start + usable;
    auto w = std::lower_bound(r.written.begin(), r.written.end(), start,
                              [](const auto& x, std::uint64_t b) { return x.second <= b; });
    for (; pos < stop; ++w) {
      const std::uint64_t next = (w == r.written.end()) ? stop : std::min(w->first, stop);
      if (next > pos) {
        missing += next - pos;
        if (!first_gap) first_gap = block_pos + (pos - start);
      }
      if (w == r.written.end()) break;
      pos = std::max(pos, std::min(w->second, stop));
    }
    block_pos += usable;
  }
  if (missing == 0) return Status::OK();
  return Status::FailedPrecondition(
      "commit of block " + r.key.ToHex() + " (reservation " + std::to_string(id) + "): " +
      std::to_string(missing) + " of its " + std::to_string(r.meta.bytes) +
      " payload bytes were never written (first gap at byte " + std::to_string(*first_gap) +
      "); write them, then commit again");
}

StatusOr<ReadLease> LeaseTable::Lease(const Namespace& ns, std::span<const BlockKey> keys,
                                      std::uint64_t ttl_us, const FingerprintDigest* expected,
                                      bool with_layer_crcs, bool count_access) {
  KVF_RETURN_IF_ERROR(CheckTtl(ttl_us));
  if (keys.size() > options_.max_keys_per_lease) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys in one lease, more than " +
                                   std::to_string(options_.max_keys_per_lease) +
                                   " (--max-keys-per-lease)");
  }
  const std::uint64_t now = clock_();
  ReadLease out;
  out.blocks.resize(keys.size());
  MutexLock lock(&mu_);
  if (leases_.size() >= options_.max_leases) {
    return Status::ResourceExhausted(std::to_string(leases_.size()) +
                                     " leases held, the limit (--max-leases)");
  }
  const std::optional<NamespaceId> id = index_.FindNamespace(ns);
  if (id.has_value() && index_.Usage(*id).leases >= options_.max_leases_per_namespace) {
    return Status::ResourceExhausted(
        "namespace \"" + ns.tenant + "\" holds " + std::to_string(options_.max_leases_per_namespace) +
        " leases, the most one namespace may (--max-leases-per-namespace): release some first");
  }
  LeaseState state;
  // Undoes this call's pins (on a refusal after some were taken).
  auto unpin_all = [&]() KVF_REQUIRES(mu_) {
    for (const PinnedBlock& p : state.blocks) {
      pool_->Unpin(p.pages).IgnoreError();  // pinned below
      --index_.FindMutable(*id, p.key)->read_pins;
    }
  };
  for (std::size_t i = 0; i < keys.size(); ++i) {
    LeasedBlock& b = out.blocks[i];
    b.key = keys[i];
    BlockEntry* e = id.has_value() ? index_.FindMutable(*id, keys[i]) : nullptr;
    if (e == nullptr) {
      b.outcome = LeaseOutcome::kMissing;
      if (count_access) {
        ++c_.misses;
        if (id.has_value()) index_.CountAccess(*id, false);
      }
      continue;
    }
    b.meta = e->meta;
    b.tier = e->tier;
    b.bytes = e->meta.bytes;
    b.crc32c = e->crc32c;
    b.representation = e->meta.representation;
    if (expected != nullptr && e->meta.fingerprint != *expected) {
      b.outcome = LeaseOutcome::kFingerprintMismatch;
      continue;
    }
    if (!InHost(e->tier)) {
      b.outcome = e->promoting ? LeaseOutcome::kBusy : LeaseOutcome::kNvmeOnly;
      ++c_.nvme_only;
      continue;
    }
    // Committed pages of an indexed block are never free, so Pin succeeds; if
    // it did not, undo this call's pins rather than leak them.
    if (Status s = pool_->Pin(e->host_pages); !s.ok()) {
      unpin_all();
      return Status::Internal("lease of " + keys[i].ToHex() + ": " + s.ToString());
    }
    ++e->read_pins;
    if (count_access) {
      ++e->hit_count;
      e->last_access_us = now;
      ++c_.hits;
      index_.CountAccess(*id, true);
    }
    b.outcome = LeaseOutcome::kLeased;
    b.pages = e->host_pages;
    if (with_layer_crcs) b.layer_crc32c = e->layer_crc32c;
    state.blocks.push_back({keys[i], e->host_pages, e->meta.bytes});
    state.page_bytes += e->host_resident_bytes;
  }
  if (!state.blocks.empty() && options_.max_leased_bytes_per_namespace != 0 &&
      index_.Usage(*id).leased_bytes + state.page_bytes > options_.max_leased_bytes_per_namespace) {
    const std::uint64_t held = index_.Usage(*id).leased_bytes;
    unpin_all();
    return Status::ResourceExhausted(
        "namespace \"" + ns.tenant + "\": its leases pin " + FormatBytesExact(held) + " + this one " +
        FormatBytesExact(state.page_bytes) + " > " +
        FormatBytesExact(options_.max_leased_bytes_per_namespace) +
        ", the most one namespace may pin (--max-leased-bytes-per-namespace): release leases or "
        "lease fewer keys");
  }
  if (!state.blocks.empty()) {
    NamespaceUsage& u = index_.MutableUsage(*id);
    ++u.leases;
    u.leased_bytes += state.page_bytes;
    out.id = next_id_++;
    out.expires_at_us = now + ttl_us;
    state.ns = *id;
    state.expires_at_us = out.expires_at_us;
    leases_.emplace(out.id, std::move(state));
    lease_expiry_.emplace(out.expires_at_us, out.id);
    ++c_.leases;
  }
  return out;
}

void LeaseTable::ReleaseLocked(std::uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  LeaseState& l = it->second;
  for (const PinnedBlock& b : l.blocks) {
    // Pinned blocks cannot be deleted, evicted or demoted away, so the entry
    // and its pins are still there.
    pool_->Unpin(b.pages).IgnoreError();
    if (BlockEntry* e = index_.FindMutable(l.ns, b.key); e != nullptr && e->read_pins > 0) {
      --e->read_pins;
    }
  }
  NamespaceUsage& u = index_.MutableUsage(l.ns);
  --u.leases;
  u.leased_bytes -= std::min(u.leased_bytes, l.page_bytes);
  const NamespaceId ns = l.ns;
  lease_expiry_.erase({l.expires_at_us, id});
  leases_.erase(it);
  index_.ReclaimIfEmpty(ns);
}

Status LeaseTable::Release(std::uint64_t lease_id) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.released) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is unknown or expired");
  }
  ++c_.releases;
  if (it->second.reads_in_flight > 0) {
    it->second.released = true;  // EndRead releases it
    return Status::OK();
  }
  ReleaseLocked(lease_id);
  return Status::OK();
}

Status LeaseTable::BeginRead(std::uint64_t lease_id) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.released) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is unknown or expired");
  }
  ++it->second.reads_in_flight;
  return Status::OK();
}

Status LeaseTable::EndRead(std::uint64_t lease_id) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is unknown");
  }
  if (it->second.reads_in_flight == 0) {
    return Status::FailedPrecondition("EndRead without BeginRead on lease " +
                                      std::to_string(lease_id));
  }
  if (--it->second.reads_in_flight == 0 && it->second.released) ReleaseLocked(lease_id);
  return Status::OK();
}

StatusOr<std::uint64_t> LeaseTable::Renew(std::uint64_t lease_id, std::uint64_t ttl_us) {
  KVF_RETURN_IF_ERROR(CheckTtl(ttl_us));
  const std::uint64_t now = clock_();
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.released) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is unknown or expired");
  }
  lease_expiry_.erase({it->second.expires_at_us, lease_id});
  it->second.expires_at_us = now + ttl_us;
  lease_expiry_.emplace(it->second.expires_at_us, lease_id);
  ++c_.renewals;
  return it->second.expires_at_us;
}

ExpiryCounts LeaseTable::ExpireUntil(std::uint64_t now_us) {
  ExpiryCounts out;
  MutexLock lock(&mu_);
  std::vector<std::uint64_t> ids;
  for (const auto& [expires, id] : reservation_expiry_) {
    if (expires > now_us) break;
    const Reservation& r = reservations_.at(id);
    // In use: expired once the write or commit ends (see "Transfers").
    if (!r.committing && r.writes_in_flight == 0) ids.push_back(id);
  }
  for (std::uint64_t id : ids) DropReservationLocked(id, /*free_pages=*/true);
  out.reservations = ids.size();
  ids.clear();
  for (const auto& [expires, id] : lease_expiry_) {
    if (expires > now_us) break;
    if (leases_.at(id).reads_in_flight == 0) ids.push_back(id);
  }
  for (std::uint64_t id : ids) ReleaseLocked(id);
  out.leases = ids.size();
  c_.reservations_expired += out.reservations;
  c_.leases_expired += out.leases;
  return out;
}

StatusOr<BlockEntry> LeaseTable::Lookup(const Namespace& ns, const BlockKey& key) const {
  MutexLock lock(&mu_);
  const std::optional<NamespaceId> id = index_.FindNamespace(ns);
  const BlockEntry* e = id.has_value() ? index_.Find(*id, key) : nullptr;
  if (e == nullptr) return Status::NotFound("block " + key.ToHex() + " is not cached");
  return *e;
}

StatusOr<BlockEntry> LeaseTable::Delete(const Namespace& ns, const BlockKey& key) {
  MutexLock lock(&mu_);
  const std::optional<NamespaceId> id = index_.FindNamespace(ns);
  const BlockEntry* e = id.has_value() ? index_.Find(*id, key) : nullptr;
  if (e == nullptr) return Status::NotFound("block " + key.ToHex() + " is not cached");
  if (e->read_pins > 0 || e->demoting || e->promoting) {
    return Status::FailedPrecondition(
        "block " + key.ToHex() + " is " +
        (e->demoting    ? std::string("being demoted")
         : e->promoting ? std::string("being staged from NVMe")
                     : "leased by " + std::to_string(e->read_pins) + " leases") +
        "; delete it after they are released or expire");
  }
  if (InHost(e->tier)) KVF_RETURN_IF_ERROR(pool_->Free(e->host_pages));
  ++c_.deletes;
  StatusOr<BlockEntry> removed = index_.Remove(*id, key);
  index_.ReclaimIfEmpty(*id);
  return removed;
}

Status LeaseTable::SetQuota(const Namespace& ns, std::uint64_t quota_bytes) {
  MutexLock lock(&mu_);
  return index_.SetQuota(ns, quota_bytes);
}

StatusOr<NamespaceUsage> LeaseTable::Usage(const Namespace& ns) const {
  MutexLock lock(&mu_);
  const std::optional<NamespaceId> id = index_.FindNamespace(ns);
  if (!id.has_value()) return Status::NotFound("namespace \"" + ns.tenant + "\" is unknown");
  return index_.Usage(*id);
}

Status LeaseTable::CheckRange(const PageRuns& pages, std::uint64_t bytes, std::uint64_t offset,
                              std::uint64_t length) const {
  if (RangeInside(pages, bytes, offset, length)) return Status::OK();
  return Status::InvalidArgument("range [" + std::to_string(offset) + ", +" +
                                 std::to_string(length) + ") is outside the granted " +
                                 pages.ToString() + " of a " + std::to_string(bytes) +
                                 "-byte block");
}

bool LeaseTable::RangeInside(const PageRuns& pages, std::uint64_t bytes, std::uint64_t offset,
                             std::uint64_t length) const {
  const std::uint64_t page = pool_->page_bytes();
  std::uint64_t block_pos = 0;  // payload bytes before this run
  for (const PageRun& r : pages) {
    const std::uint64_t start = std::uint64_t{r.first} * page;
    const std::uint64_t run_bytes = std::uint64_t{r.count} * page;
    const std::uint64_t usable = std::min(run_bytes, bytes > block_pos ? bytes - block_pos : 0);
    if (offset >= start && length <= usable && offset - start <= usable - length) return true;
    block_pos += run_bytes;
  }
  return false;
}

Status LeaseTable::BeginWriteRange(std::uint64_t reservation_id, std::uint64_t offset,
                                   std::uint64_t length) {
  MutexLock lock(&mu_);
  KVF_ASSIGN_OR_RETURN(Reservation * r, WritableLocked(reservation_id));
  KVF_RETURN_IF_ERROR(CheckRange(r->pages, r->meta.bytes, offset, length));
  if (r->written.size() + r->writes_in_flight >= kMaxWrittenRanges) {
    return Status::ResourceExhausted(
        "reservation " + std::to_string(reservation_id) + " already has " +
        std::to_string(r->written.size()) + " disjoint written ranges and " +
        std::to_string(r->writes_in_flight) + " writes in flight, the most one block may (" +
        std::to_string(kMaxWrittenRanges) + "); write it in larger ranges");
  }
  ++r->writes_in_flight;
  return Status::OK();
}

Status LeaseTable::BeginReadRange(std::uint64_t lease_id, std::uint64_t offset,
                                  std::uint64_t length) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.released) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is unknown or expired");
  }
  // Every range of a batch searches the lease's blocks: no status (and no
  // message string) is built for the blocks it is not in.
  for (const PinnedBlock& b : it->second.blocks) {
    if (RangeInside(b.pages, b.bytes, offset, length)) {
      ++it->second.reads_in_flight;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("lease " + std::to_string(lease_id) + ": range [" +
                                 std::to_string(offset) + ", +" + std::to_string(length) +
                                 ") lies inside none of its " +
                                 std::to_string(it->second.blocks.size()) + " blocks");
}

StatusOr<std::uint64_t> LeaseTable::RenewReservation(std::uint64_t reservation_id,
                                                     std::uint64_t ttl_us) {
  KVF_RETURN_IF_ERROR(CheckTtl(ttl_us));
  const std::uint64_t now = clock_();
  MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return Status::NotFound("reservation " + std::to_string(reservation_id) +
                            " is unknown or expired");
  }
  reservation_expiry_.erase({it->second.expires_at_us, reservation_id});
  it->second.expires_at_us = now + ttl_us;
  reservation_expiry_.emplace(it->second.expires_at_us, reservation_id);
  ++c_.renewals;
  return it->second.expires_at_us;
}

std::optional<NamespaceId> LeaseTable::FindNamespace(const Namespace& ns) const {
  MutexLock lock(&mu_);
  return index_.FindNamespace(ns);
}

std::string LeaseTable::TenantName(NamespaceId id) const {
  MutexLock lock(&mu_);
  return index_.live(id) ? index_.Usage(id).tenant : std::string();
}

std::vector<BlockEntry> LeaseTable::Entries() const {
  MutexLock lock(&mu_);
  std::vector<BlockEntry> out;
  out.reserve(index_.size());
  index_.ForEach(std::nullopt, [&](const BlockEntry& e) { out.push_back(e); });
  return out;
}

std::vector<NamespaceUsage> LeaseTable::Usages() const {
  MutexLock lock(&mu_);
  std::vector<NamespaceUsage> out;
  out.reserve(index_.live_namespaces());
  for (NamespaceId id = 0; id < index_.namespace_count(); ++id) {
    if (index_.live(id)) out.push_back(index_.Usage(id));
  }
  return out;
}

LeaseTableCounters LeaseTable::Counters() const {
  MutexLock lock(&mu_);
  LeaseTableCounters c = c_;
  c.active_reservations = reservations_.size();
  c.active_leases = leases_.size();
  c.compact_kept_bytes = index_.compact_kept_bytes();
  c.compact_kept_blocks = index_.compact_kept_blocks();
  return c;
}

}  // namespace kvfabric::cache_host
