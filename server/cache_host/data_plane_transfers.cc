// DataPlane's transfers between the pool and a client's region: kPut and kGet
// (Move), kFetch (lease, push, release in one round trip), and Launch, which
// submits a batch bracketed in the lease table and answers once it is done.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "core/block_format.h"
#include "core/crc32c.h"
#include "core/mutex.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane.h"
#include "server/cache_host/data_plane_internal.h"

namespace kvfabric::cache_host {

using internal::InFlightBatch;
using internal::NowMicros;
using transport::Endpoint;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;

std::vector<wire::TransferRange> JoinAdjacentRanges(std::span<const wire::TransferRange> ranges,
                                                    std::uint64_t max_bytes) {
  std::vector<wire::TransferRange> out;
  out.reserve(ranges.size());
  for (const wire::TransferRange& r : ranges) {
    if (!out.empty()) {
      wire::TransferRange& last = out.back();
      // Offsets come from the network (the pool's are checked by the lease
      // only afterwards, range by range): a sum that wraps never joins.
      const bool continues = last.pool_offset + last.length >= last.pool_offset &&
                             last.pool_offset + last.length == r.pool_offset &&
                             last.region_offset + last.length >= last.region_offset &&
                             last.region_offset + last.length == r.region_offset;
      if (continues && r.length <= max_bytes && last.length <= max_bytes - r.length) {
        last.length += r.length;
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

// The transport entries of `ranges` between the pool and `remote`, joined
// where they continue each other: kRead (into the pool) for a put, kWrite
// (into the client's region) for a get.
std::vector<Transfer> DataPlane::Impl::Entries(std::span<const wire::TransferRange> ranges,
                                               const transport::RemoteRegion* remote, bool write) {
  std::vector<Transfer> entries;
  for (const wire::TransferRange& r : JoinAdjacentRanges(ranges, kMaxJoinedRangeBytes)) {
    Transfer t;
    t.op = write ? TransferOp::kRead : TransferOp::kWrite;
    t.local = node->pool_region();
    t.local_offset = r.pool_offset;
    t.length = r.length;
    t.remote = remote;
    t.remote_offset = r.region_offset;
    entries.push_back(t);
  }
  return entries;
}

void DataPlane::Impl::Move(Endpoint* ep, wire::TransferMessage m, const DataSessionTenant* tenant) {
  const bool write = m.op == wire::TransferOpCode::kPut;
  std::vector<ByteExtent> ranges;
  ranges.reserve(m.ranges.size());
  bool alive = false;
  const transport::RemoteRegion* remote = FindRegion(ep, m.region_id, &alive);
  if (!alive) return;
  if (remote == nullptr) {
    Reply(ep, m.request_id,
          Status::NotFound("region " + std::to_string(m.region_id) +
                           " is not imported on this connection"),
          0);
    return;
  }
  for (const wire::TransferRange& r : m.ranges) {
    if (r.region_offset > remote->length() || r.length > remote->length() - r.region_offset) {
      Reply(ep, m.request_id,
            Status::InvalidArgument("range [" + std::to_string(r.region_offset) + ", +" +
                                    std::to_string(r.length) + ") is outside region " +
                                    std::to_string(m.region_id) + " of " +
                                    std::to_string(remote->length()) + " bytes"),
            0);
      return;
    }
    ranges.push_back({r.pool_offset, r.length});
  }
  // The lease checks every range on its own (BeginTransfer, below); the
  // transport moves the joined ones.
  auto ticket = node->BeginTransfer(m.lease_id, m.token, write, ranges, tenant);
  if (!ticket.ok()) {
    Reply(ep, m.request_id, ticket.status(), 0);
    return;
  }
  Launch(ep, Entries(m.ranges, remote, write), std::move(*ticket), write,
         [self = shared_from_this(), ep, request = m.request_id](
             const Status& status, std::uint64_t bytes, bool peer,
             std::span<const transport::TransferResult>) {
           if (peer) self->Reply(ep, request, status, bytes);
         });
}

// Submits `entries` (bracketed in the lease table by `ticket`) on `ep`. Once
// every entry completed, or nothing could be submitted, closes the brackets
// and calls `finish` (on the transport's thread, or on this one).
void DataPlane::Impl::Launch(Endpoint* ep, const std::vector<Transfer>& entries,
                             TransferTicket ticket, bool write, Finish finish) {
  std::uint64_t id = 0;
  {
    MutexLock lock(&mu);
    auto pit = closed ? peers.end() : peers.find(ep);
    if (pit != peers.end()) {
      ++pit->second.in_flight;  // keeps the region and endpoint alive
      id = next_batch++;
      // The slot exists before Submit, so Close waits for this batch's
      // callback (which uses the endpoint) before destroying endpoints.
      in_flight.emplace(id, InFlightBatch{nullptr, ep, clock()});
    }
  }
  if (id == 0) {
    node->EndTransfer(ticket, /*landed=*/false);
    finish(Status::Unavailable("connection closed"), 0, false, {});
    return;
  }
  const std::uint64_t started = NowMicros();
  auto batch = ep->Submit(entries);
  if (!batch.ok()) {
    node->EndTransfer(ticket, /*landed=*/false);
    finish(batch.status(), 0, true, {});
    Done(ep, 0);
    MutexLock lock(&mu);
    in_flight.erase(id);
    return;
  }
  TransferBatch* raw = batch->get();
  {
    MutexLock lock(&mu);
    in_flight[id].batch = std::move(*batch);
  }
  auto self = shared_from_this();
  raw->OnDone([self, raw, ep, id, ticket = std::move(ticket), write, started,
               finish = std::move(finish)]() {
    const Status status = raw->FirstError();
    const std::uint64_t bytes = raw->TotalBytes();
    self->node->EndTransfer(ticket, /*landed=*/status.ok());
    self->node->ObserveTransfer(write, bytes, NowMicros() - started, status);
    finish(status, bytes, true, raw->results());
    MutexLock lock(&self->mu);
    auto it = self->in_flight.find(id);
    if (it != self->in_flight.end()) {
      self->finished.push_back(std::move(it->second.batch));
      self->in_flight.erase(it);
    }
    auto pit = self->peers.find(ep);
    if (pit != self->peers.end()) --pit->second.in_flight;
  });
}

void DataPlane::Impl::Done(Endpoint* ep, std::uint64_t) {
  MutexLock lock(&mu);
  auto pit = peers.find(ep);
  if (pit != peers.end()) --pit->second.in_flight;
}

namespace internal {

std::vector<std::optional<std::uint32_t>> FoldLandedCrcs(
    std::span<const transport::TransferResult> moved, std::span<const std::size_t> group_of,
    std::size_t groups) {
  std::vector<std::optional<std::uint32_t>> out(groups);
  if (moved.size() != group_of.size()) return out;
  std::vector<bool> bad(groups, false);
  for (std::size_t j = 0; j < moved.size(); ++j) {
    const std::size_t g = group_of[j];
    if (g >= groups || bad[g]) continue;
    const transport::TransferResult& r = moved[j];
    if (!r.status.ok() || !r.landed_crc32c.has_value()) {
      bad[g] = true;
      out[g].reset();
      continue;
    }
    out[g] = crc32c::Combine(out[g].value_or(0), *r.landed_crc32c, r.bytes);
  }
  return out;
}

}  // namespace internal

void DataPlane::Impl::FetchReply(Endpoint* ep, std::uint64_t request_id, const Status& status,
                                 std::vector<wire::FetchKeyResult> results, std::uint64_t bytes,
                                 wire::TransferOpCode op) {
  wire::TransferMessage m;
  m.op = op;
  m.request_id = request_id;
  m.status = status;
  m.bytes_moved = bytes;
  if (status.ok()) m.fetch_results = std::move(results);
  SendToPeer(ep, m);
}

// kFetch: lease the keys (host pool only: no I/O on this thread), push each
// into its slot of the client's region, release, answer. The grant is the
// same a gRPC Lease makes (quotas, fingerprint check, hit counts, lease-table
// brackets); it lives only for this request and is released before the
// reply, or by its TTL if the daemon stops first.
void DataPlane::Impl::Fetch(Endpoint* ep, const wire::TransferMessage& m,
                            const DataSessionTenant* tenant) {
  bool alive = false;
  const transport::RemoteRegion* remote = FindRegion(ep, m.region_id, &alive);
  if (!alive) return;
  auto fail = [&](const Status& s) { FetchReply(ep, m.request_id, s, {}, 0); };
  if (remote == nullptr) {
    fail(Status::NotFound("region " + std::to_string(m.region_id) +
                          " is not imported on this connection"));
    return;
  }
  // The decoder checked that the slots neither are empty nor wrap.
  const std::uint64_t n = m.fetch_keys.size();
  const std::uint64_t length = remote->length();
  // Key i's slot: scattered (the client's history pages) or contiguous.
  auto slot = [&m](std::size_t i) {
    return m.fetch_slot_offsets.empty() ? m.fetch_region_offset + i * m.fetch_slot_bytes
                                        : m.fetch_slot_offsets[i];
  };
  if (m.fetch_slot_offsets.empty() ? m.fetch_region_offset > length ||
                                         m.fetch_slot_bytes > (length - m.fetch_region_offset) / n
                                   : m.fetch_slot_bytes > length) {
    fail(Status::InvalidArgument(
        std::to_string(n) + " slots of " + std::to_string(m.fetch_slot_bytes) +
        " bytes from offset " + std::to_string(m.fetch_region_offset) + " run past region " +
        std::to_string(m.region_id) + " of " + std::to_string(length) + " bytes"));
    return;
  }
  for (std::uint64_t o : m.fetch_slot_offsets) {
    if (o > length - m.fetch_slot_bytes) {
      fail(Status::InvalidArgument("a slot of " + std::to_string(m.fetch_slot_bytes) +
                                   " bytes at offset " + std::to_string(o) + " runs past region " +
                                   std::to_string(m.region_id) + " of " + std::to_string(length) +
                                   " bytes"));
      return;
    }
  }
  if (tenant != nullptr && !tenant->MayUse(m.fetch_namespace)) {
    fail(Status::PermissionDenied("kFetch: this connection's session (tenant \"" + tenant->name +
                                  "\") may not use namespace \"" + m.fetch_namespace.substr(0, 64) +
                                  "\""));
    return;
  }
  const Namespace ns{m.fetch_namespace};
  if (Status s = ns.Validate(); !s.ok()) {
    fail(s);
    return;
  }
  std::vector<BlockKey> keys;
  keys.reserve(n);
  for (const wire::FetchKey& k : m.fetch_keys) keys.emplace_back(k);
  LeaseRequestOptions options;
  options.host_only = true;
  options.expected_fingerprint = m.fetch_fingerprint;
  options.layer_crcs = m.fetch_layer_count != 0;
  auto leased = node->Lease(ns, keys, options);
  if (!leased.ok()) {
    fail(leased.status());
    return;
  }
  std::vector<wire::FetchKeyResult> results(n);
  std::vector<wire::TransferRange> ranges;
  std::vector<ByteExtent> extents;
  std::vector<std::size_t> range_key;  // ranges[j] holds bytes of key range_key[j]
  for (std::size_t i = 0; i < n; ++i) {
    const LeaseEntryResult& r = leased->results[i];
    wire::FetchKeyResult& out = results[i];
    out.code = r.status.code();
    out.crc32c = r.crc32c;
    out.payload_bytes = r.meta.bytes;
    if (!r.status.ok()) continue;
    // The payload bytes to move: the whole block, or its layer range.
    std::uint64_t skip = 0;
    std::uint64_t bytes = r.meta.bytes;
    if (m.fetch_layer_count != 0) {
      const std::uint32_t layers = r.meta.layers;
      if (r.layer_crc32c.size() != layers || layers == 0) {
        // No layer CRCs (not yet promoted from NVMe): lease it whole
        // through the control plane, like a block on NVMe only.
        out.code = StatusCode::kUnavailable;
        continue;
      }
      const std::uint64_t layer_bytes = r.meta.bytes / layers;
      auto crc =
          LayerRangeCrc(r.layer_crc32c, layer_bytes, m.fetch_first_layer, m.fetch_layer_count);
      if (!crc.ok()) {
        out.code = StatusCode::kOutOfRange;
        continue;
      }
      out.crc32c = *crc;
      skip = m.fetch_first_layer * layer_bytes;
      bytes = m.fetch_layer_count * layer_bytes;
      out.payload_bytes = bytes;
    }
    if (bytes > m.fetch_slot_bytes) {
      out.code = StatusCode::kResourceExhausted;  // its pages are released with the grant
      continue;
    }
    std::uint64_t pos = slot(i);
    std::uint64_t left = bytes;
    for (const ByteExtent& x : r.extents) {
      if (left == 0) break;
      if (skip >= x.length) {
        skip -= x.length;
        continue;
      }
      const ByteExtent part{x.offset + skip, std::min(x.length - skip, left)};
      skip = 0;
      ranges.push_back({part.offset, part.length, pos});
      range_key.push_back(i);
      extents.push_back(part);
      pos += part.length;
      left -= part.length;
    }
  }
  const std::uint64_t lease_id = leased->grant.lease_id;
  auto release = [node = node, ns, lease_id, token = leased->grant.token] {
    if (lease_id == 0) return;
    ReleaseEntry e{lease_id, token, {}};
    node->Release(ns, std::span<const ReleaseEntry>(&e, 1));
  };
  if (ranges.empty()) {
    release();
    FetchReply(ep, m.request_id, Status::OK(), std::move(results), 0);
    return;
  }
  auto ticket = node->BeginTransfer(lease_id, leased->grant.token, /*write=*/false, extents);
  if (!ticket.ok()) {
    release();
    fail(ticket.status());
    return;
  }
  // Checking landings (flag bit 3): one entry per key's run of ranges (a
  // key's ranges are joined only with each other), each asking the
  // transport for the CRC of the bytes where they landed.
  std::vector<Transfer> entries;
  std::vector<std::size_t> entry_key;
  if (m.fetch_check_landing) {
    for (std::size_t j = 0; j < ranges.size();) {
      std::size_t end = j;
      while (end < ranges.size() && range_key[end] == range_key[j]) ++end;
      for (Transfer t : Entries(std::span(ranges).subspan(j, end - j), remote, /*write=*/false)) {
        t.checksum = true;
        entries.push_back(t);
        entry_key.push_back(range_key[j]);
      }
      j = end;
    }
  } else {
    entries = Entries(ranges, remote, /*write=*/false);
  }
  // Ranked by the first layer it moves (transport::Transfer::rank): another
  // load's layer 0 that arrives while this daemon's queue holds later layers
  // starts before them (a whole block, or layer 0: rank 0, never deferred).
  const std::uint32_t rank = m.fetch_layer_count != 0 ? m.fetch_first_layer : 0;
  for (Transfer& t : entries) t.rank = rank;
  Launch(
      ep, entries, std::move(*ticket), /*write=*/false,
      [self = shared_from_this(), ep, release, request = m.request_id, results = std::move(results),
       entry_key = std::move(entry_key)](const Status& status, std::uint64_t bytes, bool peer,
                                         std::span<const transport::TransferResult> moved) mutable {
        release();
        if (!peer) return;
        if (status.ok()) {
          // A key is checked where its pieces' landed CRCs fold to the CRC
          // it answers.
          const std::vector<std::optional<std::uint32_t>> landed =
              internal::FoldLandedCrcs(moved, entry_key, results.size());
          for (std::size_t k = 0; k < results.size(); ++k) {
            wire::FetchKeyResult& out = results[k];
            out.landing_checked = out.code == StatusCode::kOk && landed[k] == out.crc32c;
          }
        }
        self->FetchReply(ep, request, status, std::move(results), bytes);
      });
}

}  // namespace kvfabric::cache_host
