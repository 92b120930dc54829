// Client::Impl's write-back: the saver threads take batches of completed
// blocks, ask placement where they go and store them (kStore, or Reserve /
// kPut / Commit through staging); loading is client_io.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "core/block_format.h"
#include "core/crc32c.h"
#include "proto/grpc_status.h"

namespace kvfabric::client {

using internal::HostDown;
using internal::KeyBytes;
using internal::MicrosSince;
using internal::Observation;

// ---------------------------------------------------------------- write-back

void Client::Impl::SaverLoop() {
  const std::size_t per_batch = save_batch_;
  for (;;) {
    std::vector<SaveJob> jobs;
    {
      MutexLock l(&save_mu_);
      save_cv_.Wait(&save_mu_,
                    [&]() KVF_REQUIRES(save_mu_) { return save_stop_ || !save_queue_.empty(); });
      if (save_queue_.empty()) return;  // stopping, nothing left
      while (!save_queue_.empty() && jobs.size() < per_batch) {
        jobs.push_back(std::move(save_queue_.front()));
        save_queue_.pop_front();
      }
    }
    SaveBatch(jobs);
  }
}

void Client::Impl::FinishSaves(std::vector<SaveJob*>& jobs, SaveOutcome outcome,
                               const Status& why) {
  if (jobs.empty()) return;
  for (SaveJob* j : jobs) {
    // The write-back lets go of the context before the count Finish waits on
    // reaches it: once pending_saves is 0 nothing here holds the context, so
    // Finish recycles it (Recycle) instead of freeing it, and the engine's
    // next request of no more blocks reuses its memory. Until then the
    // context is kept alive by contexts_ or by the Finish waiting for it.
    Context& c = *j->context;
    j->context.reset();
    MutexLock l(&c.mu);
    switch (outcome) {
      case SaveOutcome::kWritten:
        ++c.report.blocks_written;
        break;
      case SaveOutcome::kCached:
        ++c.report.blocks_already_cached;
        break;
      case SaveOutcome::kFailed:
        ++c.report.save_failures;
        if (c.save_status.ok()) {
          c.save_status = why.ok() ? Status::Internal("write-back failed") : why;
        }
        break;
    }
    --c.pending_saves;
    c.cv.NotifyAll();
  }
  MutexLock l(&metrics_mu_);
  switch (outcome) {
    case SaveOutcome::kWritten:
      m_.blocks_saved += jobs.size();
      m_.bytes_saved += jobs.size() * block_bytes_;
      break;
    case SaveOutcome::kCached:
      m_.blocks_already_cached += jobs.size();
      break;
    case SaveOutcome::kFailed:
      m_.save_failures += jobs.size();
      break;
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
  const grpc::Status g = CallPlacement([&](v1::Placement::Stub* stub, grpc::ClientContext* ctx) {
    return stub->Place(ctx, req, &resp);
  });
  std::vector<SaveJob*> all;
  for (SaveJob& j : jobs) all.push_back(&j);
  if (!g.ok() || resp.results_size() != static_cast<int>(jobs.size())) {
    const Status why =
        !g.ok()
            ? FromGrpcStatus(g).WithContext("placement Place")
            : Status::Internal("placement Place answered " + std::to_string(resp.results_size()) +
                               " results for " + std::to_string(jobs.size()) + " blocks");
    Log().warn("kvfabric client: {} blocks not written back: {}", jobs.size(), why.ToString());
    FinishSaves(all, SaveOutcome::kFailed, why);
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
  FinishSaves(present, SaveOutcome::kCached);
  if (!refused.empty()) {
    Log().warn("kvfabric client: placement found no host for {} blocks; not written back",
               refused.size());
    FinishSaves(refused, SaveOutcome::kFailed,
                Status::Unavailable("placement found no cache host for the block"));
  }
  auto save_to = [&](std::uint32_t index, std::vector<SaveJob*>& group) {
    std::vector<Status> outcome(group.size());
    Status s = SaveTo(resp.hosts(static_cast<int>(index)), group, &outcome);
    if (!s.ok()) {
      Log().warn("kvfabric client: write-back of {} blocks to {}: {}", group.size(),
                 resp.hosts(static_cast<int>(index)).host_id(), s.ToString());
    }
    std::vector<SaveJob*> written, cached, failed;
    Status first_failure;
    for (std::size_t k = 0; k < group.size(); ++k) {
      const Status& o = s.ok() ? outcome[k] : s;
      if (o.ok()) {
        written.push_back(group[k]);
      } else if (o.code() == StatusCode::kAlreadyExists) {
        cached.push_back(group[k]);
      } else {
        failed.push_back(group[k]);
        if (first_failure.ok()) first_failure = o;
      }
    }
    FinishSaves(written, SaveOutcome::kWritten);
    FinishSaves(cached, SaveOutcome::kCached);
    FinishSaves(failed, SaveOutcome::kFailed,
                first_failure.WithContext("write-back to " +
                                          resp.hosts(static_cast<int>(index)).host_id()));
  };
  // kStore reads each block from its own page, so the daemons of a batch are
  // written at once (a thread per further daemon); the Reserve/kPut/Commit
  // path shares one staging region and goes a daemon at a time.
  if (!o_.store_by_key || by_host.size() < 2) {
    for (auto& [index, group] : by_host) save_to(index, group);
    return;
  }
  TaskGroup others;
  for (auto it = std::next(by_host.begin()); it != by_host.end(); ++it) {
    others.Run(&loaders_, [&save_to, it] { save_to(it->first, it->second); });
  }
  save_to(by_host.begin()->first, by_host.begin()->second);
  others.Wait();
}

Status Client::Impl::SaveTo(const v1::HostRef& host, std::vector<SaveJob*>& jobs,
                            std::vector<Status>* outcome) {
  MatchResult::Host h{host.host_id(), host.grpc_address(), host.transport_address()};
  KVF_ASSIGN_OR_RETURN(const std::shared_ptr<Daemon> d, GetDaemon(h));
  const std::uint64_t tpb = o_.model.tokens_per_block;
  std::vector<CacheHostSession::StoreBlock> blocks(jobs.size());
  // kStore: the daemon pulls each block straight from its page of the
  // history (saved blocks are final, and Finish waits for their saves), so
  // write-back copies nothing on the client. The Reserve/kPut/Commit path
  // copies each block into staging first.
  std::vector<std::uint64_t> pages(jobs.size());
  std::span<std::byte> staging = staging_->bytes();
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const SaveJob& j = *jobs[k];
    v1::BlockDescriptor& b = blocks[k].descriptor;
    b.set_key(KeyBytes(j.key));
    b.set_payload_bytes(block_bytes_);
    b.set_representation(v1::REPRESENTATION_EXACT);
    b.set_format_version(kBlockFormatVersion);
    b.set_fingerprint_digest(fingerprint_digest_);
    b.set_token_count(static_cast<std::uint32_t>(tpb));
    b.set_prefix_tokens(tpb * j.block);
    std::span<const std::byte> bytes = BlockBytes(*j.context, j.block);
    if (o_.store_by_key) {
      pages[k] = static_cast<std::uint64_t>(bytes.data() - history_pool_->base());
    } else {
      std::byte* slot = staging.data() + k * block_bytes_;
      std::memcpy(slot, bytes.data(), block_bytes_);
      bytes = std::span<const std::byte>(slot, block_bytes_);
    }
    blocks[k].crc32c = crc32c::Value(bytes);
  }
  const auto start = Clock::now();
  std::uint64_t throttled = 0;
  StatusOr<std::vector<Status>> stored =
      o_.store_by_key
          ? d->StoreByKey(fingerprint_, blocks, SlotLayout(pages, block_bytes_, kHistoryRegionId),
                          /*ttl_ms=*/0, &throttled)
          : d->Store(fingerprint_, blocks, SlotLayout(0, block_bytes_));
  const double us = MicrosSince(start);
  if (throttled != 0) {
    MutexLock l(&metrics_mu_);
    m_.store_blocks_throttled += throttled;
  }
  if (!stored.ok()) {
    if (HostDown(stored.status())) DropDaemon(d);  // uncommitted reservations expire there
    return stored.status();
  }
  *outcome = std::move(*stored);
  std::uint64_t written = 0;
  for (const Status& o : *outcome) written += o.ok() ? block_bytes_ : 0;
  if (written == 0) return Status::OK();
  Context& c = *jobs.front()->context;
  MutexLock l(&c.mu);
  c.transfers.push_back(
      Observation(v1::BUS_PATH_LOCAL_HOST_TO_REMOTE_HOST, h.host_id, written, us));
  prom_->ObserveTransfer(/*save=*/true, written, us);
  MutexLock ml(&metrics_mu_);
  m_.save_us += static_cast<std::uint64_t>(us);
  return Status::OK();
}

}  // namespace kvfabric::client
