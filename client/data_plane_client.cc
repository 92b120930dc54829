#include "client/data_plane_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/sha256.h"

namespace kvfabric::client {

class DaemonConnection {
 public:
  DaemonConnection(std::string addr, std::unique_ptr<transport::Endpoint> ep)
      : address(std::move(addr)), endpoint(std::move(ep)) {}
  const std::string address;
  const std::unique_ptr<transport::Endpoint> endpoint;
};

// Connecting to one address is serialised by its slot's lock (held while the
// transport connects, up to the caller's deadline); other addresses and
// every other method only take mu_, briefly.
struct DataPlaneClient::Slot {
  Mutex connect_mu;
  std::shared_ptr<DaemonConnection> conn;  // under DataPlaneClient::mu_
};

struct DataPlaneClient::Pending {
  bool done = false;
  Status status;
  wire::TransferOpCode reply_op = wire::TransferOpCode::kReply;  // what answered
  std::vector<wire::FetchKeyResult> fetch_results;
  std::unique_ptr<transport::TransferBatch> send;  // the request's kSend
};

DataPlaneClient::DataPlaneClient(transport::Transport* transport) : transport_(transport) {}

StatusOr<std::unique_ptr<DataPlaneClient>> DataPlaneClient::Create(
    transport::Transport* transport) {
  std::unique_ptr<DataPlaneClient> c(new DataPlaneClient(transport));
  c->alive_ = std::make_shared<bool>(true);
  // The handler holds a weak reference: after the client is destroyed a late
  // message (a reply racing the close) is ignored.
  std::weak_ptr<bool> alive = c->alive_;
  DataPlaneClient* raw = c.get();
  transport->SetMessageHandler([alive, raw](transport::IncomingMessage& msg) {
    if (msg.payload_length() > 0) msg.Drop();
    if (auto a = alive.lock(); a && *a) raw->OnMessage(msg);
  });
  return c;
}

DataPlaneClient::~DataPlaneClient() {
  std::map<std::string, std::shared_ptr<Slot>> conns;
  {
    MutexLock lock(&mu_);
    conns.swap(connections_);
  }
  for (auto& [addr, slot] : conns) {
    if (slot->conn == nullptr) continue;
    slot->conn->endpoint->Close(transport::CloseMode::kForce, transport::Clock::now())
        .IgnoreError();
  }
  {
    MutexLock lock(&mu_);
    *alive_ = false;
    pending_.clear();  // their sends completed with the close
  }
  conns.clear();
}

void DataPlaneClient::OnMessage(transport::IncomingMessage& msg) {
  auto m = wire::DecodeTransferMessage(msg.header());
  if (!m.ok()) return;
  if (m->op == wire::TransferOpCode::kChallenge) {
    MutexLock lock(&mu_);
    // At most one per connection, and connections are bounded by the
    // daemons this client talks to.
    challenges_[msg.endpoint()] = m->hello;
    cv_.NotifyAll();
    return;
  }
  if (m->op != wire::TransferOpCode::kReply && m->op != wire::TransferOpCode::kFetchReply &&
      m->op != wire::TransferOpCode::kStoreReply) {
    return;
  }
  MutexLock lock(&mu_);
  auto it = pending_.find(m->request_id);
  if (it == pending_.end()) return;  // abandoned (deadline) or unknown
  it->second->done = true;
  it->second->status = m->status;
  it->second->reply_op = m->op;
  it->second->fetch_results = std::move(m->fetch_results);
  cv_.NotifyAll();
}

StatusOr<std::shared_ptr<DaemonConnection>> DataPlaneClient::Connect(
    const std::string& address, transport::Deadline deadline,
    const DataSessionCredentials* session) {
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(&mu_);
    std::shared_ptr<Slot>& s = connections_[address];
    if (s == nullptr) s = std::make_shared<Slot>();
    if (s->conn != nullptr && s->conn->endpoint->health().ok()) return s->conn;
    slot = s;
  }
  MutexLock serial(&slot->connect_mu);
  {
    MutexLock lock(&mu_);  // another thread may have connected meanwhile
    if (slot->conn != nullptr && slot->conn->endpoint->health().ok()) return slot->conn;
  }
  KVF_ASSIGN_OR_RETURN(
      auto ep, transport_->Connect(address, transport::PeerFailureMode::kFailInFlight, deadline));
  auto conn = std::make_shared<DaemonConnection>(address, std::move(ep));
  if (session != nullptr) {
    if (Status s = Hello(conn.get(), *session, deadline); !s.ok()) {
      conn->endpoint->Close(transport::CloseMode::kForce, transport::Clock::now()).IgnoreError();
      MutexLock lock(&mu_);
      challenges_.erase(conn->endpoint.get());
      return s.WithContext("data-plane session with " + address);
    }
  }
  MutexLock lock(&mu_);
  // A failed connection is replaced; whoever still holds it sees it fail.
  if (slot->conn != nullptr) challenges_.erase(slot->conn->endpoint.get());
  slot->conn = conn;
  auto it = connections_.find(address);
  if (it == connections_.end() || it->second != slot) connections_[address] = slot;
  return conn;
}

Status DataPlaneClient::Hello(DaemonConnection* conn, const DataSessionCredentials& session,
                              transport::Deadline deadline) {
  std::array<std::uint8_t, wire::kHelloBytes> nonce{};
  {
    MutexLock lock(&mu_);
    for (;;) {
      auto it = challenges_.find(conn->endpoint.get());
      if (it != challenges_.end()) {
        nonce = it->second;
        challenges_.erase(it);
        break;
      }
      Status health = conn->endpoint->health();
      if (!health.ok()) return health.WithContext("waiting for the daemon's challenge");
      if (transport::Clock::now() >= deadline) {
        return Status::DeadlineExceeded(
            "the daemon sent no data-plane challenge in time (does it bind sessions?)");
      }
      cv_.WaitFor(&mu_, std::chrono::milliseconds(10));
    }
  }
  StatusOr<Sha256Digest> proof =
      HmacSha256(session.secret, wire::HelloProofInput(nonce, session.id));
  if (!proof.ok()) return proof.status();
  wire::TransferMessage m;
  m.op = wire::TransferOpCode::kHello;
  m.lease_id = session.id;
  m.hello = *proof;
  KVF_ASSIGN_OR_RETURN(const std::uint64_t id, Send(conn, m));
  Status s = Wait(conn, id, deadline);
  // A daemon that refuses the proof closes the connection without a reply.
  if (s.IsUnavailable()) {
    return Status::PermissionDenied(
        "the daemon closed the connection: it refused the session "
        "proof (" +
        std::string(s.message()) + ")");
  }
  return s;
}

void DataPlaneClient::Disconnect(DaemonConnection* conn) {
  if (conn == nullptr) return;
  std::shared_ptr<DaemonConnection> keep;  // closed outside the lock
  {
    MutexLock lock(&mu_);
    challenges_.erase(conn->endpoint.get());
    auto it = connections_.find(conn->address);
    if (it != connections_.end() && it->second->conn.get() == conn) {
      keep = std::move(it->second->conn);
      connections_.erase(it);
    }
  }
  conn->endpoint->Close(transport::CloseMode::kForce, transport::Clock::now()).IgnoreError();
}

Status DataPlaneClient::Health(DaemonConnection* conn) const { return conn->endpoint->health(); }

std::size_t DataPlaneClient::connection_count() const {
  MutexLock lock(&mu_);
  std::size_t n = 0;
  for (const auto& [addr, slot] : connections_) n += slot->conn != nullptr ? 1 : 0;
  return n;
}

StatusOr<std::uint64_t> DataPlaneClient::Send(DaemonConnection* conn,
                                              const wire::TransferMessage& message) {
  wire::TransferMessage m = message;
  auto pending = std::make_shared<Pending>();
  {
    MutexLock lock(&mu_);
    m.request_id = next_request_++;
    pending_.emplace(m.request_id, pending);
  }
  auto encoded = wire::EncodeTransferMessage(m);
  if (!encoded.ok()) {
    MutexLock lock(&mu_);
    pending_.erase(m.request_id);
    return encoded.status();
  }
  transport::Transfer t;
  t.op = transport::TransferOp::kSend;
  t.header = std::as_bytes(std::span<const char>(encoded->data(), encoded->size()));
  auto batch = conn->endpoint->Submit(std::span<const transport::Transfer>(&t, 1));
  if (!batch.ok()) {
    MutexLock lock(&mu_);
    pending_.erase(m.request_id);
    return batch.status();
  }
  MutexLock lock(&mu_);
  pending->send = std::move(*batch);
  return m.request_id;
}

Status DataPlaneClient::Wait(DaemonConnection* conn, std::uint64_t request_id,
                             transport::Deadline deadline,
                             std::vector<wire::FetchKeyResult>* fetch_results,
                             wire::TransferOpCode expect) {
  std::shared_ptr<Pending> p;
  MutexLock lock(&mu_);
  auto it = pending_.find(request_id);
  if (it == pending_.end()) return Status::Internal("unknown request");
  p = it->second;
  for (;;) {
    if (p->done) break;
    // Wake up now and then to notice a dead daemon (its reply never comes).
    cv_.WaitFor(&mu_, std::chrono::milliseconds(10));
    if (p->done) break;
    Status health = conn->endpoint->health();
    if (!health.ok()) {
      p->status = health.WithContext("daemon connection failed");
      break;
    }
    if (transport::Clock::now() >= deadline) {
      p->status = Status::DeadlineExceeded("no reply from the cache host in time");
      break;
    }
  }
  Status out = p->status;
  if (out.ok() && p->done && p->reply_op != expect) {
    out = Status::Internal("the cache host answered a request expecting reply op " +
                           std::to_string(static_cast<int>(expect)) + " with op " +
                           std::to_string(static_cast<int>(p->reply_op)));
  }
  if (fetch_results != nullptr) *fetch_results = std::move(p->fetch_results);
  pending_.erase(request_id);
  std::unique_ptr<transport::TransferBatch> send = std::move(p->send);
  lock.Unlock();
  send.reset();  // done (the reply came after it) or completed by the failure
  return out;
}

Status DataPlaneClient::ExportRegion(DaemonConnection* conn, std::uint32_t region_id,
                                     const transport::MemoryRegion& region,
                                     transport::Deadline deadline) {
  KVF_ASSIGN_OR_RETURN(std::string blob, region.Export(0, region.bytes().size()));
  if (blob.size() > wire::kMaxExportBytes) {
    return Status::InvalidArgument("exported region of " + std::to_string(blob.size()) +
                                   " bytes exceeds the " + std::to_string(wire::kMaxExportBytes) +
                                   "-byte limit a cache host imports");
  }
  wire::TransferMessage m;
  m.op = wire::TransferOpCode::kImportRegion;
  m.region_id = region_id;
  m.import_total_bytes = static_cast<std::uint32_t>(blob.size());
  for (std::size_t off = 0; off < blob.size(); off += wire::kMaxImportChunkBytes) {
    m.import_chunk_offset = static_cast<std::uint32_t>(off);
    m.import_chunk = blob.substr(off, wire::kMaxImportChunkBytes);
    KVF_ASSIGN_OR_RETURN(std::uint64_t id, Send(conn, m));
    KVF_RETURN_IF_ERROR(Wait(conn, id, deadline).WithContext("export region"));
  }
  return Status::OK();
}

Status DataPlaneClient::Transfer(DaemonConnection* conn, DataOp op, std::uint64_t lease_id,
                                 const std::array<std::uint8_t, 16>& token,
                                 std::uint32_t region_id,
                                 std::span<const wire::TransferRange> ranges,
                                 transport::Deadline deadline) {
  wire::TransferMessage m;
  m.op = op == DataOp::kPut ? wire::TransferOpCode::kPut : wire::TransferOpCode::kGet;
  m.lease_id = lease_id;
  m.token = token;
  m.region_id = region_id;
  std::vector<std::uint64_t> ids;
  Status first;
  for (std::size_t i = 0; i < ranges.size(); i += wire::kMaxRangesPerRequest) {
    const std::size_t n = std::min<std::size_t>(wire::kMaxRangesPerRequest, ranges.size() - i);
    m.ranges.assign(ranges.begin() + i, ranges.begin() + i + n);
    auto id = Send(conn, m);
    if (!id.ok()) {
      first = id.status();
      break;
    }
    ids.push_back(*id);
  }
  for (std::uint64_t id : ids) {
    Status s = Wait(conn, id, deadline);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

StatusOr<std::vector<wire::FetchKeyResult>> DataPlaneClient::Fetch(DaemonConnection* conn,
                                                                   const FetchRequest& request,
                                                                   transport::Deadline deadline) {
  const std::size_t n = request.keys.size();
  if (n == 0) return std::vector<wire::FetchKeyResult>{};
  wire::TransferMessage m;
  m.op = wire::TransferOpCode::kFetch;
  m.region_id = request.region_id;
  m.fetch_slot_bytes = request.slot_bytes;
  m.fetch_namespace = request.ns;
  m.fetch_fingerprint = request.expected_fingerprint;
  // Each message's slots follow the previous message's; the encoder refuses
  // slots that wrap.
  std::vector<std::pair<std::uint64_t, std::size_t>> sent;  // request id, first key
  Status first;
  for (std::size_t i = 0; i < n; i += wire::kMaxFetchKeys) {
    const std::size_t k = std::min<std::size_t>(wire::kMaxFetchKeys, n - i);
    m.fetch_first_layer = request.first_layer;
    m.fetch_layer_count = request.layer_count;
    m.fetch_check_landing = request.check_landing;
    if (!request.slot_offsets.empty()) {
      if (request.slot_offsets.size() != n) {
        first =
            Status::InvalidArgument("fetch of " + std::to_string(n) + " keys with " +
                                    std::to_string(request.slot_offsets.size()) + " slot offsets");
        break;
      }
      m.fetch_region_offset = 0;
      m.fetch_slot_offsets.assign(
          request.slot_offsets.begin() + static_cast<std::ptrdiff_t>(i),
          request.slot_offsets.begin() + static_cast<std::ptrdiff_t>(i + k));
    } else {
      if (i != 0 && request.slot_bytes > (~std::uint64_t{0} - request.region_offset) / i) {
        first = Status::InvalidArgument("fetch of " + std::to_string(n) + " slots of " +
                                        std::to_string(request.slot_bytes) + " bytes wraps");
        break;
      }
      m.fetch_region_offset = request.region_offset + i * request.slot_bytes;
    }
    m.fetch_keys.assign(request.keys.begin() + static_cast<std::ptrdiff_t>(i),
                        request.keys.begin() + static_cast<std::ptrdiff_t>(i + k));
    auto id = Send(conn, m);
    if (!id.ok()) {
      first = id.status();
      break;
    }
    sent.emplace_back(*id, i);
  }
  std::vector<wire::FetchKeyResult> out(n);
  for (std::size_t s = 0; s < sent.size(); ++s) {
    const std::size_t begin = sent[s].second;
    const std::size_t k = std::min<std::size_t>(wire::kMaxFetchKeys, n - begin);
    std::vector<wire::FetchKeyResult> got;
    Status st = Wait(conn, sent[s].first, deadline, &got, wire::TransferOpCode::kFetchReply);
    // Every count from the network is checked: one result per key asked.
    if (st.ok() && got.size() != k) {
      st = Status::DataLoss("the cache host answered " + std::to_string(got.size()) +
                            " results for " + std::to_string(k) + " keys");
    }
    if (!st.ok()) {
      if (first.ok()) first = st;
      continue;
    }
    std::copy(got.begin(), got.end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
  }
  if (!first.ok()) return first;
  return out;
}

StatusOr<std::uint64_t> DataPlaneClient::StartStore(DaemonConnection* conn,
                                                    const StoreRequest& request) {
  if (request.entries.empty() || request.entries.size() > wire::kMaxStoreKeys) {
    return Status::InvalidArgument("a kStore carries 1 to " + std::to_string(wire::kMaxStoreKeys) +
                                   " entries, not " + std::to_string(request.entries.size()));
  }
  wire::TransferMessage m;
  m.op = wire::TransferOpCode::kStore;
  m.region_id = request.region_id;
  m.fetch_namespace = request.ns;
  m.store_ttl_ms = request.ttl_ms;
  m.store_shape = request.shape;
  m.store_entries.assign(request.entries.begin(), request.entries.end());
  return Send(conn, m);
}

StatusOr<std::vector<StatusCode>> DataPlaneClient::FinishStore(DaemonConnection* conn,
                                                               std::uint64_t request_id,
                                                               std::size_t entries,
                                                               transport::Deadline deadline) {
  std::vector<wire::FetchKeyResult> got;
  KVF_RETURN_IF_ERROR(Wait(conn, request_id, deadline, &got, wire::TransferOpCode::kStoreReply));
  // Every count from the network is checked: one result per entry sent.
  if (got.size() != entries) {
    return Status::DataLoss("the cache host answered " + std::to_string(got.size()) +
                            " store results for " + std::to_string(entries) + " entries");
  }
  std::vector<StatusCode> out(entries);
  for (std::size_t j = 0; j < entries; ++j) out[j] = got[j].code;
  return out;
}

StatusOr<std::vector<StatusCode>> DataPlaneClient::Store(DaemonConnection* conn,
                                                         const StoreRequest& request,
                                                         transport::Deadline deadline) {
  const std::size_t n = request.entries.size();
  std::vector<std::pair<std::uint64_t, std::size_t>> sent;  // request id, first entry
  Status first;
  for (std::size_t i = 0; i < n; i += wire::kMaxStoreKeys) {
    StoreRequest one = request;
    one.entries = request.entries.subspan(i, std::min<std::size_t>(wire::kMaxStoreKeys, n - i));
    auto id = StartStore(conn, one);
    if (!id.ok()) {
      first = id.status();
      break;
    }
    sent.emplace_back(*id, i);
  }
  std::vector<StatusCode> out(n, StatusCode::kUnavailable);
  for (const auto& [id, begin] : sent) {
    const std::size_t k = std::min<std::size_t>(wire::kMaxStoreKeys, n - begin);
    auto got = FinishStore(conn, id, k, deadline);
    if (!got.ok()) {
      if (first.ok()) first = got.status();
      continue;
    }
    std::copy(got->begin(), got->end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
  }
  if (!first.ok()) return first;
  return out;
}

}  // namespace kvfabric::client
