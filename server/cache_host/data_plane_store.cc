// DataPlane's kStore: reserve, pull the bytes from the client's region, commit
// (the CRC check) and answer, with the reserve and the commit on the store
// worker threads, never on the transport's progress thread.
#include <algorithm>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "core/block_format.h"
#include "core/crc32c.h"
#include "core/mutex.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane_internal.h"

namespace kvfabric::cache_host {

using transport::Endpoint;
using transport::Transfer;
using transport::TransferOp;

namespace {

// Per entry of `job`, its slices' CRCs folded from the pull's landed CRCs;
// empty for an entry any slice of which has none.
std::vector<std::vector<std::uint32_t>> LandedSliceCrcs(
    const DataPlane::Impl::StoreJob& job, std::span<const transport::TransferResult> moved) {
  const std::vector<std::optional<std::uint32_t>> landed =
      internal::FoldLandedCrcs(moved, job.pulled, job.total_slices);
  std::vector<std::vector<std::uint32_t>> out(job.slices.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t s = job.first_slice[i]; s < job.first_slice[i] + job.slices[i]; ++s) {
      if (!landed[s].has_value()) {
        out[i].clear();
        break;
      }
      out[i].push_back(*landed[s]);
    }
  }
  return out;
}

}  // namespace

// False once the workers stopped (the job is dropped).
bool DataPlane::Impl::PostStore(std::function<void()> job) {
  {
    MutexLock lock(&store_mu);
    if (store_stopping) return false;
    store_jobs.push_back(std::move(job));
  }
  store_cv.NotifyOne();
  return true;
}

void DataPlane::Impl::StoreLoop() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&store_mu);
      store_cv.Wait(&store_mu,
                    [&]() KVF_REQUIRES(store_mu) { return store_stopping || !store_jobs.empty(); });
      if (store_stopping) return;
      job = std::move(store_jobs.front());
      store_jobs.pop_front();
    }
    job();
  }
}

void DataPlane::Impl::StopStoreWorkers() {
  std::deque<std::function<void()>> dropped;
  {
    MutexLock lock(&store_mu);
    store_stopping = true;
    dropped.swap(store_jobs);
  }
  store_cv.NotifyAll();
  for (std::thread& t : store_threads) {
    if (!t.joinable()) continue;
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // the last reference was dropped by a job on this worker
    } else {
      t.join();
    }
  }
  dropped.clear();  // outside the lock: a job may hold the last reference to something
}

// On the progress thread: counts the request against its connection (so
// what waits for a worker is bounded) and hands it to a worker.
void DataPlane::Impl::AcceptStore(Endpoint* ep, wire::TransferMessage m,
                                  std::shared_ptr<const DataSessionTenant> tenant) {
  {
    MutexLock lock(&mu);
    auto pit = closed ? peers.end() : peers.find(ep);
    if (pit == peers.end()) return;
    ++pit->second.in_flight;  // until StoreDone; keeps the endpoint and its regions
  }
  auto job = std::make_shared<StoreJob>();
  job->ep = ep;
  job->m = std::move(m);
  job->tenant = std::move(tenant);
  if (!PostStore([self = shared_from_this(), job] { self->StoreReserve(job); })) {
    StoreDone(ep);
  }
}

void DataPlane::Impl::StoreDone(Endpoint* ep) {
  MutexLock lock(&mu);
  auto pit = peers.find(ep);
  if (pit != peers.end() && pit->second.in_flight > 0) --pit->second.in_flight;
}

// Answers a kStore (request-wide error: no per-key results) and ends it.
void DataPlane::Impl::StoreReply(StoreJob& job, const Status& status, std::uint64_t bytes) {
  {
    MutexLock lock(&mu);
    ++stats.stores;
    if (status.ok()) {
      for (const wire::FetchKeyResult& r : job.results) {
        if (r.code == StatusCode::kOk) ++stats.stored_blocks;
      }
    }
  }
  FetchReply(job.ep, job.m.request_id, status, std::move(job.results), bytes,
             wire::TransferOpCode::kStoreReply);
  StoreDone(job.ep);
}

// The block meta of every entry, from the request's shape: the checks the
// gRPC Reserve makes of a descriptor (cache_host_convert.cc), here on the
// compact form. Request-wide: the shape; per entry: its size and position.
Status DataPlane::Impl::StoreMetas(const wire::TransferMessage& m, std::vector<BlockMeta>* metas,
                                   std::vector<wire::FetchKeyResult>* results) const {
  const wire::StoreShape& sh = m.store_shape;
  if (sh.format_version < kOldestReadableBlockFormatVersion ||
      sh.format_version > kBlockFormatVersion) {
    return Status::InvalidArgument("kStore: format_version " + std::to_string(sh.format_version) +
                                   "; this daemon accepts " +
                                   std::to_string(kOldestReadableBlockFormatVersion) + " to " +
                                   std::to_string(kBlockFormatVersion));
  }
  if (sh.representation != static_cast<std::uint8_t>(BlockRepresentation::kExact) &&
      sh.representation != static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8)) {
    return Status::InvalidArgument("kStore: representation " + std::to_string(sh.representation) +
                                   " is not 1 or 2");
  }
  if (sh.tokens_per_block == 0) {
    return Status::InvalidArgument("kStore: tokens_per_block 0");
  }
  if (m.store_ttl_ms > options.max_ttl_ms) {
    return Status::InvalidArgument("kStore: ttl_ms " + std::to_string(m.store_ttl_ms) +
                                   " above max_ttl_ms " + std::to_string(options.max_ttl_ms));
  }
  const std::uint64_t max_prefix = std::uint64_t{options.max_chain_blocks} * sh.tokens_per_block;
  metas->assign(m.store_entries.size(), BlockMeta{});
  for (std::size_t i = 0; i < m.store_entries.size(); ++i) {
    const wire::StoreEntry& e = m.store_entries[i];
    BlockHeader header;
    header.format_version = kBlockFormatVersion;
    header.representation = static_cast<BlockRepresentation>(sh.representation);
    header.dtype = static_cast<KvDtype>(sh.dtype);
    header.layers = sh.layers;
    header.tokens = sh.tokens_per_block;
    header.kv_heads = sh.kv_heads;
    header.head_dim = sh.head_dim;
    header.payload_bytes = e.payload_bytes;
    Status shape = ValidateBlockHeader(header);
    if (shape.ok() &&
        (e.prefix_tokens % sh.tokens_per_block != 0 || e.prefix_tokens >= max_prefix)) {
      shape = Status::InvalidArgument("prefix_tokens " + std::to_string(e.prefix_tokens) +
                                      " must be a multiple of tokens_per_block below " +
                                      std::to_string(max_prefix));
    }
    if (!shape.ok()) {
      (*results)[i].code = StatusCode::kInvalidArgument;
      continue;
    }
    BlockMeta& meta = (*metas)[i];
    meta.bytes = e.payload_bytes;
    meta.representation = header.representation;
    std::copy(sh.fingerprint.begin(), sh.fingerprint.end(), meta.fingerprint.begin());
    meta.tokens = sh.tokens_per_block;
    meta.token_offset = e.prefix_tokens;
    meta.dtype = header.dtype;
    meta.layers = sh.layers;
    meta.kv_heads = sh.kv_heads;
    meta.head_dim = sh.head_dim;
  }
  return Status::OK();
}

// On a worker: check, reserve, start pulling the bytes.
void DataPlane::Impl::StoreReserve(const std::shared_ptr<StoreJob>& job) {
  const wire::TransferMessage& m = job->m;
  Endpoint* ep = job->ep;
  const std::size_t n = m.store_entries.size();
  job->results.assign(n, wire::FetchKeyResult{});
  job->reserved.assign(n, false);
  bool alive = false;
  const transport::RemoteRegion* remote = FindRegion(ep, m.region_id, &alive);
  if (!alive) {
    StoreDone(ep);
    return;
  }
  if (remote == nullptr) {
    StoreReply(*job,
               Status::NotFound("region " + std::to_string(m.region_id) +
                                " is not imported on this connection"),
               0);
    return;
  }
  for (const wire::StoreEntry& e : m.store_entries) {
    if (e.region_offset > remote->length() ||
        e.payload_bytes > remote->length() - e.region_offset) {
      StoreReply(*job,
                 Status::InvalidArgument("kStore: " + std::to_string(e.payload_bytes) +
                                         " bytes at offset " + std::to_string(e.region_offset) +
                                         " run past region " + std::to_string(m.region_id) +
                                         " of " + std::to_string(remote->length()) + " bytes"),
                 0);
      return;
    }
  }
  if (job->tenant != nullptr && !job->tenant->MayUse(m.fetch_namespace)) {
    StoreReply(*job,
               Status::PermissionDenied("kStore: this connection's session (tenant \"" +
                                        job->tenant->name + "\") may not use namespace \"" +
                                        m.fetch_namespace.substr(0, 64) + "\""),
               0);
    return;
  }
  const Namespace ns{m.fetch_namespace};
  if (Status s = ns.Validate(); !s.ok()) {
    StoreReply(*job, s, 0);
    return;
  }
  std::vector<BlockMeta> metas;
  if (Status s = StoreMetas(m, &metas, &job->results); !s.ok()) {
    StoreReply(*job, s, 0);
    return;
  }
  std::vector<ReserveEntry> entries;
  std::vector<std::size_t> index;  // entries[j] is request entry index[j]
  job->slices.assign(n, 0);
  job->first_slice.assign(n, 0);
  job->keys.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    job->keys.emplace_back(m.store_entries[i].key);
    if (job->results[i].code != StatusCode::kOk) continue;
    entries.push_back({job->keys[i], metas[i]});
    index.push_back(i);
  }
  std::vector<wire::TransferRange> ranges;
  std::vector<ByteExtent> extents;
  if (!entries.empty()) {
    auto reserved = node->Reserve(ns, entries, std::uint64_t{m.store_ttl_ms} * 1000);
    if (!reserved.ok()) {
      StoreReply(*job, reserved.status(), 0);
      return;
    }
    job->grant = reserved->grant;
    for (std::size_t j = 0; j < entries.size(); ++j) {
      const ReserveEntryResult& r = reserved->results[j];
      const std::size_t i = index[j];
      job->results[i].code = r.status.code();
      if (!r.status.ok()) continue;
      job->reserved[i] = true;
      // Cut at layer-slice boundaries (the commit's per-layer CRCs): each
      // piece of the pull reports the CRC of its bytes where they landed.
      const BlockMeta& meta = metas[i];
      const bool sliced =
          meta.layers >= 1 && meta.layers <= kMaxBlockLayers && meta.bytes % meta.layers == 0;
      const std::uint64_t slice_bytes = sliced ? meta.bytes / meta.layers : meta.bytes;
      job->slices[i] = sliced ? meta.layers : 1;
      job->first_slice[i] = job->total_slices;
      job->total_slices += job->slices[i];
      std::uint64_t pos = m.store_entries[i].region_offset;
      std::uint64_t done = 0;  // payload bytes before this extent
      for (const ByteExtent& x : r.extents) {
        extents.push_back(x);
        for (std::uint64_t at = 0; at < x.length;) {
          const std::uint64_t into = (done + at) % slice_bytes;
          const std::uint64_t n = std::min(x.length - at, slice_bytes - into);
          ranges.push_back({x.offset + at, n, pos + at});
          job->pulled.push_back(job->first_slice[i] + (done + at) / slice_bytes);
          at += n;
        }
        pos += x.length;
        done += x.length;
      }
    }
  }
  if (ranges.empty()) {
    StoreReply(*job, Status::OK(), 0);
    return;
  }
  { MutexLock publish(&job->handoff); }
  auto ticket = node->BeginTransfer(job->grant.lease_id, job->grant.token, /*write=*/true, extents,
                                    job->tenant.get());
  if (!ticket.ok()) {
    StoreCommit(job, ticket.status(), 0, {}, true);
    return;
  }
  // One entry per piece (not joined), each asking for its landed CRC.
  std::vector<Transfer> pulls;
  pulls.reserve(ranges.size());
  for (const wire::TransferRange& r : ranges) {
    Transfer t;
    t.op = TransferOp::kRead;
    t.local = node->pool_region();
    t.local_offset = r.pool_offset;
    t.length = r.length;
    t.remote = remote;
    t.remote_offset = r.region_offset;
    t.checksum = true;
    pulls.push_back(t);
  }
  Launch(ep, pulls, std::move(*ticket), /*write=*/true,
         [self = shared_from_this(), job](const Status& status, std::uint64_t bytes, bool peer,
                                          std::span<const transport::TransferResult> moved) {
           std::vector<std::vector<std::uint32_t>> landed = LandedSliceCrcs(*job, moved);
           // The commit runs on a worker, not on this (progress) thread.
           if (!self->PostStore([self, job, status, bytes, peer, landed = std::move(landed)] {
                 self->StoreCommit(job, status, bytes, landed, peer);
               })) {
             self->StoreDone(job->ep);  // stopping: the grant ends with its TTL
           }
         });
}

// On a worker: commit what arrived (the CRC check), release the rest, answer.
void DataPlane::Impl::StoreCommit(const std::shared_ptr<StoreJob>& job, const Status& moved,
                                  std::uint64_t bytes,
                                  std::vector<std::vector<std::uint32_t>> landed, bool peer) {
  { MutexLock acquire(&job->handoff); }
  const Namespace ns{job->m.fetch_namespace};
  std::vector<CommitEntry> commits;
  std::vector<std::size_t> index;
  if (moved.ok()) {
    for (std::size_t i = 0; i < job->reserved.size(); ++i) {
      if (!job->reserved[i]) continue;
      commits.push_back({job->keys[i], job->m.store_entries[i].crc32c,
                         i < landed.size() ? std::move(landed[i]) : std::vector<std::uint32_t>()});
      index.push_back(i);
    }
  }
  const GrantRef grant{job->grant.lease_id, job->grant.token};
  auto committed = node->Commit(ns, grant, commits, /*release_uncommitted=*/true);
  Status status = moved;
  if (status.ok() && !committed.ok()) status = committed.status();
  if (status.ok()) {
    for (std::size_t j = 0; j < index.size(); ++j) {
      job->results[index[j]].code = (*committed)[j].code();
    }
  }
  if (!peer) {
    StoreDone(job->ep);
    return;
  }
  StoreReply(*job, status, bytes);
}

}  // namespace kvfabric::cache_host
