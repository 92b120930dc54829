// Client::Impl's data movement: plan execution (fetch with fallbacks,
// recompute) on loader threads, and write-back on the saver thread.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>

#include "client/client_impl.h"
#include "core/crc32c.h"
#include "core/stream_copy.h"
#include "proto/grpc_status.h"

namespace kvfabric::client {
namespace {

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

std::string KeyBytes(const BlockKey& key) {
  return std::string(reinterpret_cast<const char*>(key.bytes().data()), BlockKey::kSize);
}

Status EntryError(const v1::EntryStatus& s, const std::string& what) {
  return Status(static_cast<StatusCode>(s.code()), what + ": " + s.message());
}

// A daemon that failed this way is gone or stuck for this load.
bool HostDown(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

template <typename Extents>
std::uint64_t ExtentBytes(const Extents& extents) {
  std::uint64_t n = 0;
  for (const v1::Extent& x : extents) n += x.length_bytes();
  return n;
}

// Appends one range per extent, mapping the block's bytes to the staging
// region from `staging_offset` on.
template <typename Extents>
void AppendRanges(const Extents& extents, std::uint64_t staging_offset,
                  std::vector<wire::TransferRange>* ranges) {
  for (const v1::Extent& x : extents) {
    ranges->push_back({x.offset_bytes(), x.length_bytes(), staging_offset});
    staging_offset += x.length_bytes();
  }
}

// The grant's 16-byte access token; Internal naming `what` if it is not 16 bytes.
StatusOr<std::array<std::uint8_t, 16>> GrantToken(const v1::TransportGrant& grant,
                                                  const char* what) {
  std::array<std::uint8_t, 16> token{};
  if (grant.access_token().size() != token.size()) {
    return Status::Internal(std::string(what) + " grant's access token has " +
                            std::to_string(grant.access_token().size()) + " bytes, not 16");
  }
  std::memcpy(token.data(), grant.access_token().data(), token.size());
  return token;
}

v1::TransferObservation Observation(v1::BusPath path, const std::string& host_id,
                                    std::uint64_t bytes, double us) {
  v1::TransferObservation o;
  o.set_path(path);
  o.set_host_id(host_id);
  o.set_bytes(bytes);
  o.set_observed_us(us);
  return o;
}

}  // namespace

// ---------------------------------------------------------------- daemons

StatusOr<Daemon*> Client::Impl::GetDaemon(const MatchResult::Host& host) {
  std::lock_guard<std::mutex> l(daemons_mu_);
  auto it = daemons_.find(host.grpc_address);
  if (it != daemons_.end()) {
    if (it->second->transport_address == host.transport_address) return it->second.get();
    data_->Disconnect(it->second->transport_address);  // the daemon restarted elsewhere
    daemons_.erase(it);
  }
  auto d = std::make_unique<Daemon>();
  d->host_id = host.host_id;
  d->grpc_address = host.grpc_address;
  d->transport_address = host.transport_address;
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(16 << 20);
  ch.SetMaxSendMessageSize(16 << 20);
  d->stub = v1::CacheHost::NewStub(
      grpc::CreateCustomChannel(host.grpc_address, grpc::InsecureChannelCredentials(), ch));
  auto conn = data_->Connect(host.transport_address, Clock::now() + o_.rpc_timeout);
  if (!conn.ok()) {
    data_->Disconnect(host.transport_address);
    return conn.status().WithContext("daemon " + host.host_id + " data plane");
  }
  d->conn = *conn;
  Status s = data_->ExportRegion(d->conn, kStagingRegionId, *staging_, Clock::now() + o_.rpc_timeout);
  if (!s.ok()) {
    data_->Disconnect(host.transport_address);
    return s.WithContext("daemon " + host.host_id + " staging export");
  }
  Daemon* raw = d.get();
  daemons_[host.grpc_address] = std::move(d);
  return raw;
}

void Client::Impl::DropDaemon(const std::string& grpc_address) {
  std::lock_guard<std::mutex> l(daemons_mu_);
  auto it = daemons_.find(grpc_address);
  if (it == daemons_.end()) return;
  data_->Disconnect(it->second->transport_address);
  daemons_.erase(it);
}

// ---------------------------------------------------------------- loading

void Client::Impl::WorkerDone(Context& c, const Status& status) {
  std::lock_guard<std::mutex> l(c.mu);
  if (!status.ok() && c.load_status.ok()) c.load_status = status;
  if (--c.load_workers == 0) {
    c.load_done = true;
    c.report.load_us = MicrosSince(c.load_start);
    for (RunOutcome& r : c.report.runs) {
      for (std::uint32_t b = r.first_block; b < r.first_block + r.block_count; ++b) {
        r.measured_end_us = std::max(r.measured_end_us, c.landed_us[b]);
      }
    }
  }
  c.cv.notify_all();
}

Status Client::Impl::Recompute(Context& c, std::uint32_t first, std::uint32_t count) {
  const std::uint64_t tpb = o_.model.tokens_per_block;
  RecomputeRequest req;
  req.context = c.id;
  req.first_block = first;
  req.block_count = count;
  req.first_token = first * tpb;
  req.prefix_tokens = req.first_token;
  req.tokens = std::min<std::uint64_t>((first + count) * tpb, c.tokens) - req.first_token;
  std::span<std::byte> out =
      c.history->bytes().subspan(std::uint64_t{first} * block_bytes_, count * block_bytes_);
  const auto start = Clock::now();
  Status s = o_.recompute(req, out);
  const double us = MicrosSince(start);
  if (!s.ok()) {
    return s.WithContext("client: recompute of blocks [" + std::to_string(first) + ", " +
                         std::to_string(first + count) + ")");
  }
  {
    std::lock_guard<std::mutex> l(c.mu);
    v1::RecomputeObservation o;
    o.set_tokens(req.tokens);
    o.set_prefix_tokens(req.prefix_tokens);
    o.set_observed_us(us);
    c.recomputes.push_back(o);
    c.report.blocks_recomputed += count;
    const double landed = MicrosSince(c.load_start);
    for (std::uint32_t b = first; b < first + count && b < c.landed_us.size(); ++b) {
      c.landed_us[b] = landed;
    }
  }
  std::lock_guard<std::mutex> l(metrics_mu_);
  m_.blocks_recomputed += count;
  m_.tokens_recomputed += req.tokens;
  m_.recompute_us += static_cast<std::uint64_t>(us);
  return Status::OK();
}

void Client::Impl::RecomputeRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs) {
  Status status;
  for (std::size_t ri : runs) {
    const MatchResult::Run& run = c->match.runs[ri];
    status = Recompute(*c, run.first_block, run.block_count);
    if (!status.ok()) break;
  }
  // The tokens after the chain: the partial tail (and any full blocks the
  // chain did not name) are always prefilled.
  const auto chain = static_cast<std::uint32_t>(c->match.chain.size());
  if (status.ok() && c->blocks > chain) status = Recompute(*c, chain, c->blocks - chain);
  WorkerDone(*c, status);
}

void Client::Impl::FetchRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs) {
  const MatchResult& m = c->match;
  // Placement spreads a chain over hosts block by block, so runs are short
  // and alternate: fetch every planned block of a host in full batches.
  std::vector<std::vector<std::uint32_t>> by_host(m.hosts.size());
  std::vector<std::size_t> run_of(m.chain.size(), 0);
  for (std::size_t ri : runs) {
    const MatchResult::Run& run = m.runs[ri];
    for (std::uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
      by_host[run.host].push_back(b);
      run_of[b] = ri;
    }
  }
  std::vector<bool> dead(m.hosts.size(), false);  // failed Unavailable in this load
  std::map<std::size_t, std::vector<std::uint32_t>> missing;  // run -> blocks
  std::map<std::size_t, std::string> failures;                // run -> first error
  for (std::size_t h = 0; h < by_host.size(); ++h) {
    if (by_host[h].empty()) continue;
    Status s = FetchFrom(*c, m.hosts[h], &by_host[h]);
    if (!s.ok()) {
      spdlog::warn("kvfabric client: context {}: {} of its blocks on {} not fetched: {}", c->id,
                   by_host[h].size(), m.hosts[h].host_id, s.ToString());
      dead[h] = HostDown(s);
    }
    for (std::uint32_t b : by_host[h]) {
      missing[run_of[b]].push_back(b);
      if (failures.find(run_of[b]) == failures.end()) failures[run_of[b]] = s.ToString();
    }
  }
  // Then each run's fallback hosts, then recompute, in contiguous pieces.
  Status status;
  for (auto& [ri, blocks] : missing) {
    std::sort(blocks.begin(), blocks.end());
    std::uint32_t from_fallback = 0;
    for (std::uint32_t h : m.runs[ri].fallback_hosts) {
      if (blocks.empty()) break;
      if (dead[h]) continue;
      const std::size_t before = blocks.size();
      Status s = FetchFrom(*c, m.hosts[h], &blocks);
      from_fallback += static_cast<std::uint32_t>(before - blocks.size());
      dead[h] = HostDown(s);
    }
    const auto recomputed = static_cast<std::uint32_t>(blocks.size());
    for (std::size_t i = 0; i < blocks.size() && status.ok();) {
      std::size_t j = i + 1;
      while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
      status = Recompute(*c, blocks[i], static_cast<std::uint32_t>(j - i));
      i = j;
    }
    {
      std::lock_guard<std::mutex> l(c->mu);
      RunOutcome& ro = c->report.runs[ri];
      ro.blocks_from_fallback_host = from_fallback;
      ro.blocks_recomputed_after_failure = recomputed;
      ro.failure = failures[ri];
      c->fallback_runs.push_back(static_cast<std::uint32_t>(ri));
    }
    std::lock_guard<std::mutex> l(metrics_mu_);
    if (from_fallback > 0) ++m_.fallbacks_to_replica;
    if (recomputed > 0) ++m_.fallbacks_to_recompute;
    m_.blocks_fallen_back += recomputed;
  }
  WorkerDone(*c, status);
}

Status Client::Impl::FetchFrom(Context& c, const MatchResult::Host& host,
                               std::vector<std::uint32_t>* blocks) {
  auto daemon = GetDaemon(host);
  if (!daemon.ok()) return daemon.status();
  const std::size_t per_batch = blocks_per_batch_;
  std::vector<std::uint32_t> left;
  Status first;
  for (std::size_t i = 0; i < blocks->size(); i += per_batch) {
    std::span<const std::uint32_t> batch(blocks->data() + i,
                                         std::min(per_batch, blocks->size() - i));
    std::vector<bool> arrived(batch.size(), false);
    Status s = FetchBatch(c, **daemon, batch, &arrived);
    for (std::size_t k = 0; k < batch.size(); ++k) {
      if (!arrived[k]) left.push_back(batch[k]);
    }
    if (s.ok()) continue;
    if (first.ok()) first = s.WithContext("daemon " + host.host_id);
    if (HostDown(s)) {
      // The daemon is gone or stuck: the rest of the run goes elsewhere.
      DropDaemon(host.grpc_address);
      left.insert(left.end(), blocks->begin() + static_cast<std::ptrdiff_t>(i + batch.size()),
                  blocks->end());
      break;
    }
  }
  *blocks = std::move(left);
  return first;
}

Status Client::Impl::FetchBatch(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                                std::vector<bool>* arrived) {
  std::lock_guard<std::mutex> fetch_lock(fetch_mu_);
  std::vector<std::size_t> on_nvme;
  Status first = FetchByKey(c, d, batch, arrived, &on_nvme);
  if (on_nvme.empty() || HostDown(first)) return first;
  // What the daemon holds on NVMe only: its control-plane Lease stages it.
  std::vector<std::uint32_t> rest;
  for (std::size_t k : on_nvme) rest.push_back(batch[k]);
  std::vector<bool> rest_arrived(rest.size(), false);
  Status s = LeaseAndGet(c, d, rest, &rest_arrived);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest_arrived[i]) (*arrived)[on_nvme[i]] = true;
  }
  return first.ok() ? s : first;
}

Status Client::Impl::FetchByKey(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                                std::vector<bool>* arrived, std::vector<std::size_t>* on_nvme) {
  std::vector<wire::FetchKey> keys;
  keys.reserve(batch.size());
  for (std::uint32_t b : batch) keys.push_back(c.match.chain[b].bytes());
  DataPlaneClient::FetchRequest req;
  req.ns = o_.namespace_name;
  req.expected_fingerprint.emplace();
  std::memcpy(req.expected_fingerprint->data(), fingerprint_digest_.data(),
              req.expected_fingerprint->size());
  req.keys = keys;
  req.region_id = kStagingRegionId;
  req.region_offset = 0;  // the fetch half of staging
  req.slot_bytes = block_bytes_;
  const auto start = Clock::now();
  auto got = data_->Fetch(d.conn, req, Clock::now() + o_.transfer_timeout);
  const double us = MicrosSince(start);
  if (!got.ok()) return got.status().WithContext("data-plane fetch");
  Status first;
  FetchTally tally;
  std::uint64_t moved = 0;
  std::span<std::byte> staging = staging_->bytes();
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const wire::FetchKeyResult& r = (*got)[k];
    const std::string what = "block " + std::to_string(batch[k]);
    Status s;
    switch (r.code) {
      case StatusCode::kOk:
        // Every size from the network is checked before the bytes are used.
        if (r.payload_bytes != block_bytes_) {
          s = Status::DataLoss(what + ": daemon placed " + std::to_string(r.payload_bytes) +
                               " bytes; blocks of this model are " + std::to_string(block_bytes_));
          break;
        }
        moved += block_bytes_;
        if (Land(c, batch[k], staging.subspan(k * block_bytes_, block_bytes_), r.crc32c,
                 /*from_nvme=*/false, &tally, &first)) {
          (*arrived)[k] = true;
        }
        break;
      case StatusCode::kUnavailable:
        on_nvme->push_back(k);  // not in the host pool now
        break;
      case StatusCode::kNotFound: {
        v1::StaleEntry e;
        e.set_host_id(d.host_id);
        e.set_key(KeyBytes(c.match.chain[batch[k]]));
        std::lock_guard<std::mutex> l(c.mu);
        c.stale.push_back(std::move(e));
        s = Status::NotFound(what + ": not cached on " + d.host_id);
        break;
      }
      default:
        s = Status(r.code, what + ": the cache host refused to fetch it");
        break;
    }
    if (first.ok() && !s.ok()) first = s;
  }
  RecordFetch(c, d, tally, moved, us);
  return first;
}

bool Client::Impl::Land(Context& c, std::uint32_t block, std::span<const std::byte> got,
                        std::uint32_t crc, bool from_nvme, FetchTally* tally, Status* first) {
  if (crc32c::Value(got) != crc) {
    ++tally->crc_failures;
    if (first->ok()) {
      *first = Status::DataLoss("block " + std::to_string(block) +
                                ": bytes received do not match the committed CRC32C");
    }
    return false;
  }
  // The history is large and read later (by Attend), not now: streaming
  // stores skip reading its cold lines before overwriting them.
  StreamingCopy(c.history->bytes().data() + std::uint64_t{block} * block_bytes_, got.data(),
                block_bytes_);
  tally->landed.push_back(block);
  tally->bytes += block_bytes_;
  (from_nvme ? tally->nvme_tier : tally->host_tier) += block_bytes_;
  return true;
}

void Client::Impl::RecordFetch(Context& c, const Daemon& d, const FetchTally& tally,
                               std::uint64_t moved, double us) {
  if (moved == 0 && tally.crc_failures == 0) return;
  {
    std::lock_guard<std::mutex> l(c.mu);
    if (moved > 0) {
      c.transfers.push_back(
          Observation(v1::BUS_PATH_REMOTE_HOST_TO_LOCAL_HOST, d.host_id, moved, us));
    }
    c.report.blocks_fetched += static_cast<std::uint32_t>(tally.bytes / block_bytes_);
    c.report.bytes_fetched += tally.bytes;
    c.report.fetch_from_host_tier_bytes += tally.host_tier;
    c.report.fetch_from_nvme_tier_bytes += tally.nvme_tier;
    const double now_us = MicrosSince(c.load_start);
    for (std::uint32_t b : tally.landed) c.landed_us[b] = now_us;
  }
  std::lock_guard<std::mutex> l(metrics_mu_);
  m_.blocks_fetched += tally.bytes / block_bytes_;
  m_.bytes_fetched += tally.bytes;
  m_.fetch_us += static_cast<std::uint64_t>(us);
  m_.crc_failures += tally.crc_failures;
}

Status Client::Impl::LeaseAndGet(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                                 std::vector<bool>* arrived) {
  v1::LeaseRequest req;
  req.set_namespace_(o_.namespace_name);
  for (std::uint32_t b : batch) req.add_keys(KeyBytes(c.match.chain[b]));
  req.set_ttl_ms(o_.lease_ttl_ms);
  req.set_expected_fingerprint_digest(fingerprint_digest_);
  v1::LeaseResponse resp;
  auto release = [&] {
    if (resp.lease_id() == 0) return;
    v1::ReleaseRequest rel;
    rel.set_namespace_(o_.namespace_name);
    rel.add_entries()->set_lease_id(resp.lease_id());
    v1::ReleaseResponse rresp;
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline());
    d.stub->Release(&ctx, rel, &rresp);  // best effort: the lease expires anyway
  };
  // An entry answering UNAVAILABLE means "retry" (a block staged from NVMe
  // was evicted again before the lease pinned it).
  for (int attempt = 0;; ++attempt) {
    resp.Clear();
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline());
    grpc::Status g = d.stub->Lease(&ctx, req, &resp);
    if (!g.ok()) return FromGrpcStatus(g).WithContext("Lease");
    if (resp.results_size() != static_cast<int>(batch.size())) {
      release();
      return Status::Internal("Lease answered " + std::to_string(resp.results_size()) +
                              " results for " + std::to_string(batch.size()) + " keys");
    }
    bool retry = false;
    for (const v1::LeaseResult& r : resp.results()) {
      retry = retry || r.status().code() == static_cast<int>(StatusCode::kUnavailable);
    }
    if (!retry || attempt == 3) break;
    release();
  }
  Status first;
  std::vector<wire::TransferRange> ranges;
  std::vector<std::size_t> leased;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const v1::LeaseResult& r = resp.results(static_cast<int>(k));
    const std::string what = "block " + std::to_string(batch[k]);
    if (r.status().code() != 0) {
      if (r.status().code() == static_cast<int>(StatusCode::kNotFound)) {
        v1::StaleEntry e;
        e.set_host_id(d.host_id);
        e.set_key(KeyBytes(c.match.chain[batch[k]]));
        std::lock_guard<std::mutex> l(c.mu);
        c.stale.push_back(std::move(e));
      }
      if (first.ok()) first = EntryError(r.status(), what);
      continue;
    }
    // Every size from the network is checked before bytes move.
    const std::uint64_t extent_bytes = ExtentBytes(r.extents());
    if (r.block().payload_bytes() != block_bytes_ || extent_bytes != block_bytes_) {
      if (first.ok()) {
        first = Status::DataLoss(what + ": daemon offers " +
                                 std::to_string(r.block().payload_bytes()) + " bytes in " +
                                 std::to_string(extent_bytes) + " bytes of extents; blocks of "
                                 "this model are " + std::to_string(block_bytes_));
      }
      continue;
    }
    AppendRanges(r.extents(), leased.size() * block_bytes_, &ranges);
    leased.push_back(k);
  }
  if (leased.empty()) {
    release();
    return first;
  }
  const StatusOr<std::array<std::uint8_t, 16>> token = GrantToken(resp.grant(), "Lease");
  if (!token.ok()) {
    release();
    return token.status();
  }
  const auto start = Clock::now();
  Status s = data_->Transfer(d.conn, DataOp::kGet, resp.lease_id(), *token, kStagingRegionId,
                             ranges, Clock::now() + o_.transfer_timeout);
  const double us = MicrosSince(start);
  if (!s.ok()) {
    release();
    return s.WithContext("data-plane get");
  }
  FetchTally tally;
  std::span<std::byte> staging = staging_->bytes();
  for (std::size_t i = 0; i < leased.size(); ++i) {
    const std::size_t k = leased[i];
    const v1::LeaseResult& r = resp.results(static_cast<int>(k));
    if (Land(c, batch[k], staging.subspan(i * block_bytes_, block_bytes_), r.block().crc32c(),
             r.tier() == v1::TIER_NVME, &tally, &first)) {
      (*arrived)[k] = true;
    }
  }
  release();
  RecordFetch(c, d, tally, leased.size() * block_bytes_, us);
  return first;
}

// ---------------------------------------------------------------- write-back

void Client::Impl::SaverLoop() {
  const std::size_t per_batch = blocks_per_batch_;
  for (;;) {
    std::vector<SaveJob> jobs;
    {
      std::unique_lock<std::mutex> l(save_mu_);
      save_cv_.wait(l, [&] { return save_stop_ || !save_queue_.empty(); });
      if (save_queue_.empty()) return;  // stopping, nothing left
      while (!save_queue_.empty() && jobs.size() < per_batch) {
        jobs.push_back(std::move(save_queue_.front()));
        save_queue_.pop_front();
      }
    }
    SaveBatch(jobs);
  }
}

void Client::Impl::FinishSaves(std::vector<SaveJob*>& jobs, bool ok) {
  for (SaveJob* j : jobs) {
    std::lock_guard<std::mutex> l(j->context->mu);
    (ok ? j->context->report.blocks_saved : j->context->report.save_failures) += 1;
    --j->context->pending_saves;
    j->context->cv.notify_all();
  }
  std::lock_guard<std::mutex> l(metrics_mu_);
  if (ok) {
    m_.blocks_saved += jobs.size();
    m_.bytes_saved += jobs.size() * block_bytes_;
  } else {
    m_.save_failures += jobs.size();
  }
}

void Client::Impl::SaveBatch(std::vector<SaveJob>& jobs) {
  v1::PlaceRequest req;
  req.set_namespace_(o_.namespace_name);
  *req.mutable_fingerprint() = fingerprint_;
  for (const SaveJob& j : jobs) req.add_keys(KeyBytes(j.key));
  req.set_payload_bytes(block_bytes_);
  req.set_replicas(1);
  req.set_client_node(client_node_);
  v1::PlaceResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(RpcDeadline());
  grpc::Status g = placement_->Place(&ctx, req, &resp);
  std::vector<SaveJob*> all;
  for (SaveJob& j : jobs) all.push_back(&j);
  if (!g.ok() || resp.results_size() != static_cast<int>(jobs.size())) {
    spdlog::warn("kvfabric client: Place for {} blocks failed: {}; not written back", jobs.size(),
                 g.ok() ? "wrong result count" : g.error_message());
    FinishSaves(all, false);
    return;
  }
  std::map<std::uint32_t, std::vector<SaveJob*>> by_host;
  std::vector<SaveJob*> present, refused;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const v1::PlaceResult& r = resp.results(static_cast<int>(k));
    if (r.existing_host_indices_size() > 0) {
      present.push_back(&jobs[k]);  // already cached: nothing to write
    } else if (r.status().code() != 0 || r.host_indices_size() == 0 ||
               r.host_indices(0) >= static_cast<std::uint32_t>(resp.hosts_size())) {
      refused.push_back(&jobs[k]);
    } else {
      by_host[r.host_indices(0)].push_back(&jobs[k]);
    }
  }
  FinishSaves(present, true);
  if (!refused.empty()) {
    spdlog::warn("kvfabric client: placement found no host for {} blocks; not written back",
                 refused.size());
    FinishSaves(refused, false);
  }
  for (auto& [index, group] : by_host) {
    std::vector<bool> saved(group.size(), false);
    Status s = SaveTo(resp.hosts(static_cast<int>(index)), group, &saved);
    if (!s.ok()) {
      spdlog::warn("kvfabric client: write-back to {}: {}", resp.hosts(static_cast<int>(index)).host_id(),
                   s.ToString());
    }
    std::vector<SaveJob*> ok, failed;
    for (std::size_t k = 0; k < group.size(); ++k) (saved[k] ? ok : failed).push_back(group[k]);
    FinishSaves(ok, true);
    FinishSaves(failed, false);
  }
}

Status Client::Impl::SaveTo(const v1::HostRef& host, std::vector<SaveJob*>& jobs,
                            std::vector<bool>* saved) {
  MatchResult::Host h{host.host_id(), host.grpc_address(), host.transport_address()};
  KVF_ASSIGN_OR_RETURN(Daemon * d, GetDaemon(h));
  const std::uint64_t tpb = o_.model.tokens_per_block;
  v1::ReserveRequest req;
  req.set_namespace_(o_.namespace_name);
  *req.mutable_fingerprint() = fingerprint_;
  for (const SaveJob* j : jobs) {
    v1::BlockDescriptor* b = req.add_blocks();
    b->set_key(KeyBytes(j->key));
    b->set_payload_bytes(block_bytes_);
    b->set_representation(v1::REPRESENTATION_EXACT);
    b->set_format_version(1);
    b->set_fingerprint_digest(fingerprint_digest_);
    b->set_token_count(static_cast<std::uint32_t>(tpb));
    b->set_prefix_tokens(tpb * j->block);
  }
  v1::ReserveResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(RpcDeadline());
    grpc::Status g = d->stub->Reserve(&ctx, req, &resp);
    if (!g.ok()) {
      if (g.error_code() == grpc::StatusCode::UNAVAILABLE) DropDaemon(h.grpc_address);
      return FromGrpcStatus(g).WithContext("Reserve");
    }
  }
  if (resp.results_size() != static_cast<int>(jobs.size())) {
    return Status::Internal("Reserve answered " + std::to_string(resp.results_size()) +
                            " results for " + std::to_string(jobs.size()) + " blocks");
  }
  const std::uint64_t base = o_.staging_bytes / 2;
  std::span<std::byte> staging = staging_->bytes();
  std::vector<wire::TransferRange> ranges;
  v1::CommitRequest commit;
  commit.set_namespace_(o_.namespace_name);
  commit.set_lease_id(resp.lease_id());
  commit.set_release_uncommitted(true);
  std::vector<std::size_t> reserved;
  Status first;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const v1::ReserveResult& r = resp.results(static_cast<int>(k));
    if (r.status().code() == static_cast<int>(StatusCode::kAlreadyExists)) {
      (*saved)[k] = true;  // someone wrote it first: it is cached
      continue;
    }
    const std::uint64_t extent_bytes = ExtentBytes(r.extents());
    if (r.status().code() != 0 || extent_bytes != block_bytes_) {
      if (first.ok()) {
        first = r.status().code() != 0
                    ? EntryError(r.status(), "block " + std::to_string(jobs[k]->block))
                    : Status::Internal("Reserve extents of " + std::to_string(extent_bytes) +
                                       " bytes for a block of " + std::to_string(block_bytes_));
      }
      continue;
    }
    const std::uint64_t off = base + reserved.size() * block_bytes_;
    std::span<const std::byte> src =
        jobs[k]->context->history->bytes().subspan(jobs[k]->block * block_bytes_, block_bytes_);
    std::memcpy(staging.data() + off, src.data(), block_bytes_);
    AppendRanges(r.extents(), off, &ranges);
    v1::CommitEntry* e = commit.add_entries();
    e->set_key(KeyBytes(jobs[k]->key));
    e->set_crc32c(crc32c::Value(staging.subspan(off, block_bytes_)));
    reserved.push_back(k);
  }
  if (reserved.empty()) return first;
  KVF_ASSIGN_OR_RETURN(const auto token, GrantToken(resp.grant(), "Reserve"));
  const auto start = Clock::now();
  Status s = data_->Transfer(d->conn, DataOp::kPut, resp.lease_id(), token, kStagingRegionId,
                             ranges, Clock::now() + o_.transfer_timeout);
  if (!s.ok()) {
    if (s.code() == StatusCode::kUnavailable) DropDaemon(h.grpc_address);
    return s.WithContext("data-plane put");  // the reservation expires on the daemon
  }
  v1::CommitResponse cresp;
  grpc::ClientContext ctx;
  ctx.set_deadline(RpcDeadline());
  grpc::Status g = d->stub->Commit(&ctx, commit, &cresp);
  if (!g.ok()) return FromGrpcStatus(g).WithContext("Commit");
  const double us = MicrosSince(start);
  for (std::size_t i = 0; i < reserved.size() && i < static_cast<std::size_t>(cresp.results_size());
       ++i) {
    const v1::CommitResult& r = cresp.results(static_cast<int>(i));
    const bool ok = r.status().code() == 0 ||
                    r.status().code() == static_cast<int>(StatusCode::kAlreadyExists);
    (*saved)[reserved[i]] = ok;
    if (!ok && first.ok()) first = EntryError(r.status(), "Commit");
  }
  Context& c = *jobs[reserved.front()]->context;
  std::lock_guard<std::mutex> l(c.mu);
  c.transfers.push_back(Observation(v1::BUS_PATH_LOCAL_HOST_TO_REMOTE_HOST, h.host_id,
                                    reserved.size() * block_bytes_, us));
  std::lock_guard<std::mutex> ml(metrics_mu_);
  m_.save_us += static_cast<std::uint64_t>(us);
  return first;
}

}  // namespace kvfabric::client
