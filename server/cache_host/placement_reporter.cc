#include "server/cache_host/placement_reporter.h"

#include <grpcpp/grpcpp.h>

#include <random>
#include <utility>

#include "core/mutex.h"
#include "core/socket_address.h"
#include "proto/grpc_status.h"
#include "server/cache_host_convert.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {
namespace {

// Events per ReportBlocks call (Limits.max_keys_per_batch).
constexpr std::size_t kMaxEventsPerCall = 4096;

std::uint64_t RandomIncarnation() {
  std::random_device rd;
  std::uint64_t v = 0;
  while (v == 0) v = (std::uint64_t{rd()} << 32) ^ rd();
  return v;
}

}  // namespace

v1::BlockEvent ToProto(const BlockEventRecord& e) {
  v1::BlockEvent out;
  out.set_kind(static_cast<v1::BlockEventKind>(e.kind));
  out.set_namespace_(e.tenant);
  DescriptorFromMeta(e.key, e.meta, e.crc32c, out.mutable_block());
  out.set_tier(e.tier == BlockTier::kNvme ? v1::TIER_NVME : v1::TIER_HOST);
  out.set_hit_count(e.hit_count);
  out.set_event_unix_us(static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count()));
  return out;
}

PlacementReporter::PlacementReporter(CacheHostNode* node, PlacementReporterOptions options)
    : node_(node), options_(std::move(options)), incarnation_(RandomIncarnation()) {}

StatusOr<std::unique_ptr<PlacementReporter>> PlacementReporter::Start(
    CacheHostNode* node, PlacementReporterOptions options) {
  if (options.placement_address.empty()) {
    return Status::InvalidArgument("--placement-address is empty");
  }
  std::unique_ptr<PlacementReporter> r(new PlacementReporter(node, std::move(options)));
  KVF_ASSIGN_OR_RETURN(r->addresses_,
                       SplitAddressList(r->options_.placement_address, "--placement-address", 8));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  ApplyChannelSecurityArgs(r->options_.security, &args);
  for (const std::string& address : r->addresses_) {
    StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(r->options_.security, address);
    if (!creds.ok()) return creds.status().WithContext("placement " + address);
    r->stubs_.push_back(v1::Placement::NewStub(grpc::CreateCustomChannel(address, *creds, args)));
  }
  PlacementReporter* raw = r.get();
  node->set_block_event_sink([raw](std::vector<BlockEventRecord> events) {
    raw->OnEvents(std::move(events));
  });
  r->thread_ = std::thread([raw] { raw->Run(); });
  return r;
}

PlacementReporter::~PlacementReporter() { Stop(); }

void PlacementReporter::OnEvents(std::vector<BlockEventRecord> events) {
  {
    MutexLock lock(&mu_);
    if (queue_.size() + events.size() > options_.max_queued_events) {
      // Placement is unreachable for long: a full report replaces the queue.
      stats_.events_dropped += queue_.size() + events.size();
      queue_.clear();
      snapshot_owed_ = true;
      return;
    }
    for (BlockEventRecord& e : events) queue_.push_back(std::move(e));
  }
  cv_.NotifyOne();
}

void PlacementReporter::FillTiers(google::protobuf::RepeatedPtrField<v1::TierUsage>* tiers) const {
  v1::TierUsage* host = tiers->Add();
  host->set_tier(v1::TIER_HOST);
  host->set_capacity_bytes(node_->pool_bytes());
  host->set_free_bytes(node_->host_free_bytes());
  host->set_page_bytes(node_->page_bytes());
  if (node_->nvme_capacity_bytes() > 0) {
    v1::TierUsage* nvme = tiers->Add();
    nvme->set_tier(v1::TIER_NVME);
    nvme->set_capacity_bytes(node_->nvme_capacity_bytes());
    nvme->set_free_bytes(node_->nvme_free_bytes());
  }
}

Status PlacementReporter::Register() {
  v1::RegisterRequest req;
  req.set_host_id(options_.host_id);
  req.set_incarnation(incarnation_);
  req.set_grpc_address(options_.grpc_address);
  req.set_transport_address(options_.transport_address);
  req.set_node_name(options_.node_name);
  FillTiers(req.mutable_tiers());
  req.add_transfer_modes(v1::TRANSFER_MODE_OWNER_DRIVEN);
  req.set_ttl_ms(static_cast<std::uint32_t>(options_.ttl.count()));
  req.set_version(options_.version);
  req.set_previous_membership_token(token_);
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  grpc::Status g = stub()->Register(&ctx, req, &resp);
  if (!g.ok()) return FromGrpcStatus(g).WithContext("Register with placement");
  lease_id_ = resp.membership_lease_id();
  token_ = resp.membership_token();
  heartbeat_every_ = std::chrono::milliseconds(
      resp.heartbeat_interval_ms() > 0 ? resp.heartbeat_interval_ms() : options_.ttl.count() / 3);
  // Sequences are per incarnation and this one's numbering continues; a
  // re-registration is followed by a full report.
  MutexLock lock(&mu_);
  snapshot_owed_ = true;  // after every registration, whatever placement says
  ++stats_.registrations;
  stats_.registered = true;
  spdlog::info("placement: registered {} with {} (lease {}, heartbeat every {} ms)",
               options_.host_id, addresses_[current_], lease_id_, heartbeat_every_.count());
  return Status::OK();
}

Status PlacementReporter::Heartbeat() {
  v1::HeartbeatRequest req;
  req.set_host_id(options_.host_id);
  req.set_incarnation(incarnation_);
  req.set_membership_lease_id(lease_id_);
  req.set_membership_token(token_);
  FillTiers(req.mutable_tiers());
  req.set_status(node_->state() == ServingState::kServing ? v1::SERVING_STATUS_SERVING
                                                          : v1::SERVING_STATUS_DRAINING);
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  grpc::Status g = stub()->Heartbeat(&ctx, req, &resp);
  if (!g.ok()) return FromGrpcStatus(g).WithContext("Heartbeat");
  MutexLock lock(&mu_);
  ++stats_.heartbeats;
  if (resp.full_report_requested()) snapshot_owed_ = true;
  return Status::OK();
}

Status PlacementReporter::SendEvents(std::vector<BlockEventRecord> events,
                                     std::uint64_t snapshot_id, bool snapshot_last) {
  v1::ReportBlocksRequest req;
  req.set_host_id(options_.host_id);
  req.set_incarnation(incarnation_);
  req.set_membership_lease_id(lease_id_);
  req.set_membership_token(token_);
  req.set_sequence(++sequence_);
  req.set_snapshot_id(snapshot_id);
  req.set_snapshot_last(snapshot_last);
  for (const BlockEventRecord& e : events) *req.add_events() = ToProto(e);
  // Retries keep the sequence (placement acknowledges a repeat and ignores it).
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::ReportBlocksResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
    grpc::Status g = stub()->ReportBlocks(&ctx, req, &resp);
    if (g.ok()) {
      MutexLock lock(&mu_);
      ++stats_.reports;
      stats_.events_sent += events.size();
      if (resp.full_report_requested() && snapshot_id == 0) snapshot_owed_ = true;
      return Status::OK();
    }
    last = FromGrpcStatus(g);
    if (last.code() == StatusCode::kNotFound || last.code() == StatusCode::kInvalidArgument) break;
  }
  return last.WithContext("ReportBlocks");
}

Status PlacementReporter::SendSnapshot() {
  {
    MutexLock lock(&mu_);
    snapshot_owed_ = false;
    queue_.clear();  // the snapshot covers them
  }
  std::vector<BlockEventRecord> all = node_->SnapshotBlocks();
  const std::uint64_t id = next_snapshot_id_++;
  std::size_t pos = 0;
  do {
    const std::size_t n = std::min(kMaxEventsPerCall, all.size() - pos);
    std::vector<BlockEventRecord> chunk(all.begin() + pos, all.begin() + pos + n);
    pos += n;
    Status s = SendEvents(std::move(chunk), id, pos == all.size());
    if (!s.ok()) {
      MutexLock lock(&mu_);
      snapshot_owed_ = true;
      return s;
    }
  } while (pos < all.size());
  MutexLock lock(&mu_);
  ++stats_.snapshots;
  return Status::OK();
}

void PlacementReporter::Run() {
  auto next_heartbeat = std::chrono::steady_clock::now();
  for (;;) {
    bool stopping = false;
    bool snapshot = false;
    std::vector<BlockEventRecord> batch;
    {
      MutexLock lock(&mu_);
      cv_.WaitUntil(&mu_, next_heartbeat,
                    [&]() KVF_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      stopping = stopping_;
      snapshot = snapshot_owed_;
      if (!snapshot) {
        const std::size_t n = std::min(kMaxEventsPerCall, queue_.size());
        batch.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      }
    }
    Status s;
    if (lease_id_ == 0) s = Register();
    if (s.ok() && snapshot) {
      s = SendSnapshot();
    } else if (s.ok() && !batch.empty()) {
      s = SendEvents(batch, 0, false);
      if (!s.ok()) {
        MutexLock lock(&mu_);
        snapshot_owed_ = true;  // the batch is lost; a full report replaces it
      }
    }
    if (s.ok() && std::chrono::steady_clock::now() >= next_heartbeat) {
      s = Heartbeat();
      next_heartbeat = std::chrono::steady_clock::now() + heartbeat_every_;
    }
    if (!s.ok()) {
      MutexLock lock(&mu_);
      ++stats_.failures;
      if (s.code() == StatusCode::kNotFound) {
        lease_id_ = 0;  // placement forgot us: register again, then report in full
        stats_.registered = false;
        snapshot_owed_ = true;
      }
      // Back off a little while placement is unreachable; say so once, then
      // at most every 30 s. With replicas, the next one gets the retry (the
      // membership lease lives in the shared store; a replica that does not
      // know its token answers NotFound, and the reporter registers again).
      const auto now = std::chrono::steady_clock::now();
      next_heartbeat = now + std::chrono::milliseconds(500);
      const std::string& tried = addresses_[current_];
      const bool silent =
          s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
      ++failures_in_a_row_;
      if (silent && stubs_.size() > 1) {
        current_ = (current_ + 1) % stubs_.size();
        // The next replica at once, unless every one failed since the last answer.
        if (failures_in_a_row_ % stubs_.size() != 0) next_heartbeat = now;
      }
      if (now >= next_warning_) {
        spdlog::warn("placement {}: {} ({})", tried, s.ToString(),
                     silent && stubs_.size() > 1 ? "trying " + addresses_[current_]
                                                 : std::string("retrying every 500 ms"));
        next_warning_ = now + std::chrono::seconds(30);
      }
    } else {
      next_warning_ = {};
      failures_in_a_row_ = 0;
    }
    if (stopping) break;
  }
  if (lease_id_ != 0) {
    v1::DeregisterRequest req;
    req.set_host_id(options_.host_id);
    req.set_incarnation(incarnation_);
    req.set_membership_lease_id(lease_id_);
    req.set_membership_token(token_);
    v1::DeregisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
    stub()->Deregister(&ctx, req, &resp);
  }
}

void PlacementReporter::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  node_->set_block_event_sink(nullptr);
}

PlacementReporterStats PlacementReporter::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvfabric::cache_host
