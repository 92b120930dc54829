#include "client/cache_host_session.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "core/process_identity.h"
#include "proto/grpc_status.h"

namespace kvfabric::client {
namespace {

// Both admission windows start here (and adapt: AdmissionWindow).
constexpr std::uint32_t kInitialWindow = 4;

using Clock = std::chrono::steady_clock;

// The grant's 16-byte access token; Internal naming `rpc` if it is not 16 bytes.
StatusOr<std::array<std::uint8_t, 16>> GrantToken(const v1::TransportGrant& grant,
                                                  const char* rpc) {
  std::array<std::uint8_t, 16> token{};
  if (grant.access_token().size() != token.size()) {
    return Status::Internal(std::string(rpc) + " grant's access token has " +
                            std::to_string(grant.access_token().size()) + " bytes, not 16");
  }
  std::memcpy(token.data(), grant.access_token().data(), token.size());
  return token;
}

// The extents' total, or nullopt if it overflows.
template <typename Extents>
std::optional<std::uint64_t> ExtentBytes(const Extents& extents) {
  std::uint64_t n = 0;
  for (const v1::Extent& x : extents) {
    if (x.length_bytes() > ~std::uint64_t{0} - n) return std::nullopt;
    n += x.length_bytes();
  }
  return n;
}

// Appends one range per extent, mapping the block's bytes to the region from
// `region_offset` on.
template <typename Extents>
void AppendRanges(const Extents& extents, std::uint64_t region_offset,
                  std::vector<wire::TransferRange>* ranges) {
  for (const v1::Extent& x : extents) {
    ranges->push_back({x.offset_bytes(), x.length_bytes(), region_offset});
    region_offset += x.length_bytes();
  }
}

std::string Count(std::size_t n, const char* what) { return std::to_string(n) + " " + what; }

}  // namespace

StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& address,
                                                     const GrpcSecurityOptions& security) {
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(16 << 20);
  ch.SetMaxSendMessageSize(16 << 20);
  return OpenSecureChannel(address, security, ch);
}

CacheHostSession::CacheHostSession(DataPlaneClient* data, CacheHostSessionOptions options)
    : data_(data),
      o_(std::move(options)),
      fetches_(kInitialWindow, o_.max_fetches_in_flight),
      stores_(kInitialWindow, o_.max_stores_in_flight) {}

CacheHostSession::~CacheHostSession() = default;

StatusOr<std::shared_ptr<CacheHostSession>> CacheHostSession::Open(
    DataPlaneClient* data, const transport::MemoryRegion& region, CacheHostSessionOptions options) {
  if (options.grpc_address.empty()) {
    return Status::InvalidArgument("cache-host session: no gRPC address");
  }
  std::shared_ptr<CacheHostSession> s(new CacheHostSession(data, std::move(options)));
  s->region_ = &region;
  {
    MutexLock l(&s->conn_mu_);
    s->ns_ = s->o_.ns;
  }
  StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(s->o_.grpc_address, s->o_.security);
  if (!channel.ok()) return channel.status().WithContext("daemon " + s->o_.grpc_address);
  s->stub_ = v1::CacheHost::NewStub(*channel);
  if (!s->o_.admin_address.empty()) {
    StatusOr<std::shared_ptr<grpc::Channel>> admin =
        OpenChannel(s->o_.admin_address, s->o_.security);
    if (!admin.ok()) return admin.status().WithContext("daemon admin " + s->o_.admin_address);
    s->admin_stub_ = v1::CacheHost::NewStub(*admin);
  }
  if (s->o_.host_id.empty()) s->o_.host_id = s->o_.grpc_address;
  if (s->o_.check_shared_memory || s->o_.check_ucx_listener) {
    KVF_RETURN_IF_ERROR(s->CheckSharedMemory());
  }
  if (!s->o_.transport_address.empty()) {
    KVF_RETURN_IF_ERROR(s->Connection(s->o_.transport_address).status());
  }
  return s;
}

Status CacheHostSession::CheckSharedMemory() {
  v1::HealthResponse health;
  KVF_RETURN_IF_ERROR(
      Call("Health", stub_->Health(RpcContext().get(), v1::HealthRequest{}, &health)));
  ProcessIdentity peer;
  peer.boot_id = health.process().boot_id();
  peer.uid = health.process().uid();
  peer.gid = health.process().gid();
  peer.ipc_namespace = health.process().ipc_namespace();
  peer.ucx_same_user_only = health.process().ucx_same_user_only();
  const ProcessIdentity self = LocalProcessIdentity();
  const Status admits = UcxListenerAdmits(self, peer);
  if (o_.check_ucx_listener && !admits.ok()) {
    return Status::FailedPrecondition(
        "cache host " + o_.host_id + " (" + o_.grpc_address +
        "): " + std::string(admits.message()) +
        ". Use the kernel-TCP data plane on both sides (data_transport \"tcp\" here, "
        "kvfabric-cached --data-transport=tcp), or run the engine and the daemon as one user");
  }
  if (!o_.check_shared_memory) return Status::OK();
  const Status reachable = SharedMemoryReachable(self, peer);
  if (reachable.ok()) return reachable;
  return Status::FailedPrecondition(
      "cache host " + o_.host_id + " (" + o_.grpc_address +
      "): " + std::string(reachable.message()) +
      "; UCX would connect and then fail every transfer over shared memory (" + o_.ucx_tls_setting +
      "=\"" + o_.ucx_tls + "\"). Set " + o_.ucx_tls_setting +
      " to \"tcp\" (or leave sm, sysv, posix and cma out of it), or run the engine and the "
      "daemon as one user");
}

StatusOr<DaemonConnection*> CacheHostSession::Connection(const std::string& grant_address) {
  MutexLock l(&conn_mu_);
  if (conn_ != nullptr) return conn_.get();
  const std::string& address = o_.transport_address.empty() ? grant_address : o_.transport_address;
  if (address.empty()) {
    return Status::FailedPrecondition("cache host " + o_.host_id +
                                      ": no data-plane address known yet (none was configured "
                                      "and no grant named one)");
  }
  const auto deadline = Clock::now() + o_.rpc_timeout;
  // A fresh data-plane session for each new connection (sessions expire; a
  // daemon that binds none answers UNIMPLEMENTED and takes the connection
  // as it is).
  std::optional<DataSessionCredentials> session;
  {
    v1::OpenDataSessionResponse r;
    grpc::Status g;
    // A connection that just died (a daemon restarted on its address) fails
    // the first call on it with UNAVAILABLE; the next reconnects. Opening a
    // session twice is harmless (the unused one expires).
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::unique_ptr<grpc::ClientContext> ctx = RpcContext();
      ctx->set_wait_for_ready(true);
      g = stub_->OpenDataSession(ctx.get(), v1::OpenDataSessionRequest{}, &r);
      if (g.error_code() != grpc::StatusCode::UNAVAILABLE || Clock::now() >= deadline) break;
    }
    if (g.ok()) {
      if (r.secret().size() != 32 || r.session_id() == 0) {
        return Status::Internal("cache host " + o_.host_id +
                                ": OpenDataSession answered a malformed session");
      }
      session.emplace();
      session->id = r.session_id();
      std::memcpy(session->secret.data(), r.secret().data(), 32);
    } else if (g.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      return Call("OpenDataSession", g);
    }
  }
  auto conn = data_->Connect(address, deadline, session ? &*session : nullptr);
  if (!conn.ok()) {
    return conn.status().WithContext("cache host " + o_.host_id + " data plane at " + address);
  }
  Status e = data_->ExportRegion(conn->get(), o_.region_id, *region_, deadline);
  for (const auto& [id, region] : o_.extra_regions) {
    if (e.ok()) e = data_->ExportRegion(conn->get(), id, *region, deadline);
  }
  if (!e.ok()) {
    data_->Disconnect(conn->get());
    return e.WithContext("cache host " + o_.host_id + ": exporting the client's region");
  }
  conn_ = std::move(*conn);
  return conn_.get();
}

void CacheHostSession::SetNamespace(const std::string& ns) {
  MutexLock l(&conn_mu_);
  ns_ = ns;
}

std::string CacheHostSession::Namespace() const {
  MutexLock l(&conn_mu_);
  return ns_;
}

void CacheHostSession::Close() {
  MutexLock l(&conn_mu_);
  closed_ = true;
  if (conn_ != nullptr) data_->Disconnect(conn_.get());
}

Status CacheHostSession::health() const {
  MutexLock l(&conn_mu_);
  if (closed_) return Status::Unavailable("cache host " + o_.host_id + ": session closed");
  if (conn_ == nullptr) return Status::OK();  // not connected yet
  return data_->Health(conn_.get());
}

std::unique_ptr<grpc::ClientContext> CacheHostSession::RpcContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + o_.rpc_timeout);
  return ctx;
}

transport::Deadline CacheHostSession::TransferDeadline() const {
  return Clock::now() + o_.transfer_timeout;
}

Status CacheHostSession::Call(const char* rpc, const grpc::Status& g) const {
  if (g.ok()) return Status::OK();
  return FromGrpcStatus(g).WithContext(std::string(rpc) + " on cache host " + o_.host_id + " (" +
                                       o_.grpc_address + ")");
}

// ---------------------------------------------------------------- Store

StatusOr<std::vector<Status>> CacheHostSession::Store(const v1::ModelFingerprint& fingerprint,
                                                      std::span<const StoreBlock> blocks,
                                                      SlotLayout slots, std::uint32_t ttl_ms) {
  std::vector<Status> out(blocks.size());
  if (blocks.empty()) return out;
  KVF_RETURN_IF_ERROR(health());
  v1::ReserveRequest req;
  req.set_namespace_(Namespace());
  *req.mutable_fingerprint() = fingerprint;
  if (ttl_ms != 0) req.set_ttl_ms(ttl_ms);
  for (const StoreBlock& b : blocks) {
    if (b.descriptor.payload_bytes() > slots.bytes) {
      return Status::InvalidArgument("Store of a " + std::to_string(b.descriptor.payload_bytes()) +
                                     "-byte block from a " + std::to_string(slots.bytes) +
                                     "-byte slot");
    }
    *req.add_blocks() = b.descriptor;
  }
  v1::ReserveResponse resp;
  KVF_RETURN_IF_ERROR(Call("Reserve", stub_->Reserve(RpcContext().get(), req, &resp)));
  if (resp.results_size() != static_cast<int>(blocks.size())) {
    return Status::Internal("Reserve on " + o_.host_id + " answered " +
                            Count(resp.results_size(), "results") + " for " +
                            Count(blocks.size(), "blocks"));
  }
  std::vector<wire::TransferRange> ranges;
  v1::CommitRequest commit;
  commit.set_namespace_(Namespace());
  commit.set_lease_id(resp.lease_id());
  commit.set_access_token(resp.grant().access_token());
  commit.set_release_uncommitted(true);
  std::vector<std::size_t> reserved;  // commit entry i is blocks[reserved[i]]
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const v1::ReserveResult& r = resp.results(static_cast<int>(k));
    out[k] = StatusFromEntry(r.status());
    if (!out[k].ok()) continue;  // AlreadyExists: cached; else refused
    // Every size from the network is checked before bytes move.
    const std::optional<std::uint64_t> extent_bytes = ExtentBytes(r.extents());
    if (extent_bytes != blocks[k].descriptor.payload_bytes()) {
      out[k] = Status::Internal("Reserve on " + o_.host_id + " granted extents of " +
                                (extent_bytes ? std::to_string(*extent_bytes) : "overflowing") +
                                " bytes for a block of " +
                                std::to_string(blocks[k].descriptor.payload_bytes()));
      continue;
    }
    AppendRanges(r.extents(), slots.at(k), &ranges);
    v1::CommitEntry* e = commit.add_entries();
    e->set_key(blocks[k].descriptor.key());
    e->set_crc32c(blocks[k].crc32c);
    reserved.push_back(k);
  }
  if (reserved.empty()) return out;
  KVF_ASSIGN_OR_RETURN(const auto token, GrantToken(resp.grant(), "Reserve"));
  KVF_ASSIGN_OR_RETURN(DaemonConnection* const conn, Connection(resp.grant().transport_address()));
  KVF_RETURN_IF_ERROR(data_
                          ->Transfer(conn, DataOp::kPut, resp.lease_id(), token, o_.region_id,
                                     ranges, TransferDeadline())
                          .WithContext("kPut to cache host " + o_.host_id));
  v1::CommitResponse cresp;
  KVF_RETURN_IF_ERROR(Call("Commit", stub_->Commit(RpcContext().get(), commit, &cresp)));
  if (cresp.results_size() != static_cast<int>(reserved.size())) {
    return Status::Internal("Commit on " + o_.host_id + " answered " +
                            Count(cresp.results_size(), "results") + " for " +
                            Count(reserved.size(), "entries"));
  }
  for (std::size_t i = 0; i < reserved.size(); ++i) {
    out[reserved[i]] = StatusFromEntry(cresp.results(static_cast<int>(i)).status());
  }
  return out;
}

// ---------------------------------------------------------------- reads

StatusOr<std::vector<Status>> CacheHostSession::StoreByKey(const v1::ModelFingerprint& fingerprint,
                                                           std::span<const StoreBlock> blocks,
                                                           SlotLayout slots, std::uint32_t ttl_ms,
                                                           std::uint64_t* throttled) {
  std::vector<Status> out(blocks.size());
  if (blocks.empty()) return out;
  KVF_RETURN_IF_ERROR(health());
  DataPlaneClient::StoreRequest req;
  req.ns = Namespace();
  req.ttl_ms = ttl_ms;
  req.region_id = slots.region_id != 0 ? slots.region_id : o_.region_id;
  wire::StoreShape& sh = req.shape;
  // Proto DType and Representation values equal core's (common.proto).
  sh.dtype = static_cast<std::uint8_t>(fingerprint.dtype());
  sh.tokens_per_block = fingerprint.tokens_per_block();
  sh.layers = fingerprint.layer_count();
  sh.kv_heads = fingerprint.kv_heads();
  sh.head_dim = fingerprint.head_dim();
  std::vector<wire::StoreEntry> entries(blocks.size());
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const v1::BlockDescriptor& d = blocks[k].descriptor;
    if (d.key().size() != wire::kFetchKeyBytes ||
        d.fingerprint_digest().size() != sh.fingerprint.size()) {
      return Status::InvalidArgument("StoreByKey: block " + std::to_string(k) + " has a key of " +
                                     std::to_string(d.key().size()) + " bytes and a digest of " +
                                     std::to_string(d.fingerprint_digest().size()) +
                                     " (32 each required)");
    }
    if (d.payload_bytes() > slots.bytes) {
      return Status::InvalidArgument("StoreByKey of a " + std::to_string(d.payload_bytes()) +
                                     "-byte block from a " + std::to_string(slots.bytes) +
                                     "-byte slot");
    }
    if (k == 0) {
      std::memcpy(sh.fingerprint.data(), d.fingerprint_digest().data(), sh.fingerprint.size());
      sh.representation = static_cast<std::uint8_t>(d.representation());
      sh.format_version = static_cast<std::uint8_t>(d.format_version());
    } else if (std::memcmp(sh.fingerprint.data(), d.fingerprint_digest().data(),
                           sh.fingerprint.size()) != 0 ||
               sh.representation != static_cast<std::uint8_t>(d.representation()) ||
               sh.format_version != d.format_version()) {
      return Status::InvalidArgument(
          "StoreByKey: every block of one call shares its fingerprint, representation and "
          "format version");
    }
    wire::StoreEntry& e = entries[k];
    std::memcpy(e.key.data(), d.key().data(), e.key.size());
    e.region_offset = slots.at(k);
    e.payload_bytes = d.payload_bytes();
    e.prefix_tokens = d.prefix_tokens();
    e.crc32c = blocks[k].crc32c;
  }
  KVF_ASSIGN_OR_RETURN(DaemonConnection* const conn, Connection(""));
  // Blocks refused for room go again, through a narrower window, until
  // transfer_timeout has passed.
  const auto give_up = Clock::now() + o_.transfer_timeout;
  std::vector<std::size_t> todo(blocks.size());
  for (std::size_t k = 0; k < todo.size(); ++k) todo[k] = k;
  std::vector<wire::StoreEntry> round;
  std::vector<StatusCode> codes;
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(64))) {
    round.clear();
    for (std::size_t k : todo) round.push_back(entries[k]);
    KVF_RETURN_IF_ERROR(StoreRound(conn, req, round, give_up, &codes));
    std::vector<std::size_t> refused;
    for (std::size_t j = 0; j < todo.size(); ++j) {
      const std::size_t k = todo[j];
      if (codes[j] == StatusCode::kResourceExhausted) refused.push_back(k);
      if (codes[j] == StatusCode::kOk) {
        out[k] = Status::OK();
      } else if (codes[j] == StatusCode::kResourceExhausted) {
        out[k] = Status::ResourceExhausted(
            "cache host " + o_.host_id +
            " had no room for it within transfer_timeout (its namespace's reservations at "
            "--max-reserved-bytes-per-namespace, or its pool full)");
      } else {
        out[k] = Status(codes[j], "cache host " + o_.host_id + " did not store it");
      }
    }
    if (refused.empty() || Clock::now() + pause >= give_up) return out;
    if (throttled != nullptr) *throttled += refused.size();
    std::this_thread::sleep_for(pause);
    todo = std::move(refused);
  }
}

Status CacheHostSession::StoreRound(DaemonConnection* conn,
                                    const DataPlaneClient::StoreRequest& base,
                                    std::span<const wire::StoreEntry> entries,
                                    Clock::time_point give_up, std::vector<StatusCode>* codes) {
  codes->assign(entries.size(), StatusCode::kUnavailable);
  const transport::Deadline deadline = TransferDeadline();
  std::deque<std::pair<std::uint64_t, std::size_t>> mine;  // request id, first entry
  Status first;
  // Waits for this call's oldest message, gives its slot back and adjusts
  // the window by what it answered.
  auto finish_oldest = [&] {
    const auto [id, begin] = mine.front();
    mine.pop_front();
    const std::size_t k = std::min<std::size_t>(wire::kMaxStoreKeys, entries.size() - begin);
    auto got = data_->FinishStore(conn, id, k, deadline);
    bool refused = false;
    if (got.ok()) {
      std::copy(got->begin(), got->end(), codes->begin() + static_cast<std::ptrdiff_t>(begin));
      refused = std::find(got->begin(), got->end(), StatusCode::kResourceExhausted) != got->end();
    } else if (first.ok()) {
      first = got.status();
    }
    stores_.Release(refused, got.ok());
  };
  for (std::size_t i = 0; i < entries.size() && first.ok(); i += wire::kMaxStoreKeys) {
    for (;;) {
      if (stores_.TryAcquire()) break;
      // Others' messages hold the window: wait for a slot (ours come back
      // only when we wait for them, below).
      if (mine.empty()) {
        if (!stores_.Acquire(0, give_up)) {
          first = Status::ResourceExhausted(
              "cache host " + o_.host_id + ": no store admitted within transfer_timeout (" +
              std::to_string(stores_.in_flight()) + " in flight, window " +
              std::to_string(stores_.size()) + ")");
        }
        break;
      }
      finish_oldest();
    }
    if (!first.ok()) break;
    DataPlaneClient::StoreRequest one = base;
    one.entries =
        entries.subspan(i, std::min<std::size_t>(wire::kMaxStoreKeys, entries.size() - i));
    auto id = data_->StartStore(conn, one);
    if (!id.ok()) {
      stores_.Release(/*refused=*/false, /*answered=*/false);
      first = id.status();
      break;
    }
    mine.emplace_back(*id, i);
  }
  while (!mine.empty()) finish_oldest();
  return first;
}

std::uint32_t CacheHostSession::store_window() const { return stores_.size(); }

StatusOr<std::vector<CacheHostSession::ReadResult>> CacheHostSession::Fetch(
    std::span<const wire::FetchKey> keys, std::string_view expected_digest, SlotLayout slots) {
  DataPlaneClient::FetchRequest req;
  req.ns = Namespace();
  if (!expected_digest.empty()) {
    req.expected_fingerprint.emplace();
    if (expected_digest.size() != req.expected_fingerprint->size()) {
      return Status::InvalidArgument("Fetch: a fingerprint digest of " +
                                     std::to_string(expected_digest.size()) + " bytes, not " +
                                     std::to_string(req.expected_fingerprint->size()));
    }
    std::memcpy(req.expected_fingerprint->data(), expected_digest.data(), expected_digest.size());
  }
  req.keys = keys;
  req.region_id = slots.region_id != 0 ? slots.region_id : o_.region_id;
  req.region_offset = slots.offset;
  req.slot_bytes = slots.bytes;
  req.slot_offsets = slots.offsets;
  req.first_layer = slots.first_layer;
  req.layer_count = slots.layer_count;
  req.check_landing = slots.check_landing;
  KVF_RETURN_IF_ERROR(health());
  KVF_ASSIGN_OR_RETURN(DaemonConnection* const conn, Connection(""));
  KVF_ASSIGN_OR_RETURN(std::vector<wire::FetchKeyResult> got,
                       data_->Fetch(conn, req, TransferDeadline()));
  std::vector<ReadResult> out(got.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    out[k].status = got[k].code == StatusCode::kOk
                        ? Status::OK()
                        : Status(got[k].code, "cache host " + o_.host_id + " did not fetch it");
    out[k].crc32c = got[k].crc32c;
    out[k].payload_bytes = got[k].payload_bytes;
    out[k].landing_checked = slots.check_landing && got[k].landing_checked;
    if (out[k].status.ok() && got[k].payload_bytes > slots.bytes) {
      out[k].status = Status::DataLoss("cache host " + o_.host_id + " reports " +
                                       std::to_string(got[k].payload_bytes) + " bytes in a " +
                                       std::to_string(slots.bytes) + "-byte slot");
    }
  }
  return out;
}

template <typename Request>
StatusOr<std::vector<CacheHostSession::ReadResult>> CacheHostSession::WithinWindow(
    std::uint32_t rank, std::chrono::milliseconds patience, std::uint64_t* throttled,
    const Request& request) {
  const auto give_up = Clock::now() + patience;
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(64))) {
    if (!fetches_.Acquire(rank, give_up)) {
      return Status::ResourceExhausted(
          "cache host " + o_.host_id + ": no fetch admitted within " +
          std::to_string(patience.count()) + " ms (" + std::to_string(fetches_.in_flight()) +
          " in flight, window " + std::to_string(fetches_.size()) + ")");
    }
    StatusOr<std::vector<ReadResult>> got = request();
    const bool refused = !got.ok() && got.status().code() == StatusCode::kResourceExhausted;
    fetches_.Release(refused, got.ok());
    if (got.ok()) {
      std::uint64_t moved = 0;
      for (const ReadResult& r : *got) moved += r.status.ok() ? r.payload_bytes : 0;
      bytes_moved_.fetch_add(moved, std::memory_order_relaxed);
    }
    if (!refused || Clock::now() + pause >= give_up) return got;
    if (throttled != nullptr) ++*throttled;
    std::this_thread::sleep_for(pause);
  }
}

StatusOr<std::vector<CacheHostSession::ReadResult>> CacheHostSession::FetchWithin(
    std::span<const wire::FetchKey> keys, std::string_view expected_digest, SlotLayout slots,
    std::chrono::milliseconds patience, std::uint64_t* throttled) {
  // Ranked by the first layer it moves (a whole block: 0).
  const std::uint32_t rank = slots.layer_count == 0 ? 0 : slots.first_layer;
  return WithinWindow(rank, patience, throttled,
                      [&] { return Fetch(keys, expected_digest, slots); });
}

StatusOr<std::vector<CacheHostSession::ReadResult>> CacheHostSession::LeaseGetWithin(
    std::span<const std::string> keys, std::string_view expected_digest, std::uint32_t ttl_ms,
    SlotLayout slots, std::chrono::milliseconds patience, std::uint64_t* throttled) {
  // Whole blocks, layer 0 included: the first rank.
  return WithinWindow(0, patience, throttled,
                      [&] { return LeaseGet(keys, expected_digest, ttl_ms, slots); });
}

std::uint32_t CacheHostSession::fetch_window() const { return fetches_.size(); }

StatusOr<std::vector<CacheHostSession::ReadResult>> CacheHostSession::LeaseGet(
    std::span<const std::string> keys, std::string_view expected_digest, std::uint32_t ttl_ms,
    SlotLayout slots, HeldLease* kept) {
  std::vector<ReadResult> out(keys.size());
  if (keys.empty()) return out;
  KVF_RETURN_IF_ERROR(health());
  v1::LeaseRequest req;
  req.set_namespace_(Namespace());
  for (const std::string& k : keys) req.add_keys(k);
  if (ttl_ms != 0) req.set_ttl_ms(ttl_ms);
  if (!expected_digest.empty()) req.set_expected_fingerprint_digest(std::string(expected_digest));
  v1::LeaseResponse resp;
  // Releases the lease unless the caller keeps it.
  auto release = [&](bool keep) {
    if (resp.lease_id() == 0) return;
    HeldLease held{resp.lease_id(), resp.grant().access_token()};
    if (keep && kept != nullptr) {
      *kept = std::move(held);
      return;
    }
    Release(held).IgnoreError();  // best effort: the lease expires anyway
  };
  // An entry answering Unavailable means "retry" (a block staged from NVMe
  // was evicted again before the lease pinned it).
  for (int attempt = 0;; ++attempt) {
    resp.Clear();
    KVF_RETURN_IF_ERROR(Call("Lease", stub_->Lease(RpcContext().get(), req, &resp)));
    if (resp.results_size() != static_cast<int>(keys.size())) {
      release(false);
      return Status::Internal("Lease on " + o_.host_id + " answered " +
                              Count(resp.results_size(), "results") + " for " +
                              Count(keys.size(), "keys"));
    }
    bool retry = false;
    for (const v1::LeaseResult& r : resp.results()) {
      retry = retry || r.status().code() == static_cast<int>(StatusCode::kUnavailable);
    }
    if (!retry || attempt >= o_.lease_retries) break;
    release(false);
  }
  std::vector<wire::TransferRange> ranges;
  bool any = false;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const v1::LeaseResult& r = resp.results(static_cast<int>(k));
    ReadResult& x = out[k];
    x.status = StatusFromEntry(r.status());
    x.crc32c = r.block().crc32c();
    x.payload_bytes = r.block().payload_bytes();
    x.tier = r.tier();
    if (!x.status.ok()) continue;
    // Every size from the network is checked before bytes move.
    const std::optional<std::uint64_t> extent_bytes = ExtentBytes(r.extents());
    if (extent_bytes != x.payload_bytes || x.payload_bytes > slots.bytes) {
      x.status = Status::DataLoss(
          "cache host " + o_.host_id + " offers " + std::to_string(x.payload_bytes) + " bytes in " +
          (extent_bytes ? std::to_string(*extent_bytes) : "overflowing") +
          " bytes of extents for a " + std::to_string(slots.bytes) + "-byte slot");
      continue;
    }
    AppendRanges(r.extents(), slots.at(k), &ranges);
    any = true;
  }
  if (!any) {
    release(false);
    return out;
  }
  StatusOr<std::array<std::uint8_t, 16>> token = GrantToken(resp.grant(), "Lease");
  StatusOr<DaemonConnection*> conn = Connection(resp.grant().transport_address());
  Status moved = token.ok() ? conn.status() : token.status();
  if (moved.ok()) {
    moved = data_
                ->Transfer(*conn, DataOp::kGet, resp.lease_id(), *token,
                           slots.region_id != 0 ? slots.region_id : o_.region_id, ranges,
                           TransferDeadline())
                .WithContext("kGet from cache host " + o_.host_id);
  }
  release(moved.ok());
  if (!moved.ok()) return moved;
  return out;
}

Status CacheHostSession::Release(const HeldLease& lease) {
  v1::ReleaseRequest rel;
  rel.set_namespace_(Namespace());
  v1::ReleaseEntry* e = rel.add_entries();
  e->set_lease_id(lease.lease_id);
  e->set_access_token(lease.access_token);
  v1::ReleaseResponse resp;
  KVF_RETURN_IF_ERROR(Call("Release", stub_->Release(RpcContext().get(), rel, &resp)));
  for (const v1::ReleaseResult& r : resp.results()) {
    KVF_RETURN_IF_ERROR(StatusFromEntry(r.status()).WithContext("Release"));
  }
  return Status::OK();
}

StatusOr<std::vector<Status>> CacheHostSession::Delete(std::span<const std::string> keys) {
  v1::DeleteRequest req;
  req.set_namespace_(Namespace());
  for (const std::string& k : keys) req.add_keys(k);
  v1::DeleteResponse resp;
  v1::CacheHost::Stub* stub = admin_stub_ != nullptr ? admin_stub_.get() : stub_.get();
  KVF_RETURN_IF_ERROR(Call("Delete", stub->Delete(RpcContext().get(), req, &resp)));
  if (resp.results_size() != static_cast<int>(keys.size())) {
    return Status::Internal("Delete on " + o_.host_id + " answered " +
                            Count(resp.results_size(), "results") + " for " +
                            Count(keys.size(), "keys"));
  }
  std::vector<Status> out;
  out.reserve(keys.size());
  for (const v1::DeleteResult& r : resp.results()) out.push_back(StatusFromEntry(r.status()));
  return out;
}

}  // namespace kvfabric::client
