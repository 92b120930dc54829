// DataPlane's connection handling: accepting (and refusing) endpoints,
// admitting each message against its connection's bounds, sending replies,
// dispatching requests by op code, the session proof (kHello) and region
// imports (kImportRegion).
#include <string>
#include <utility>

#include "core/mutex.h"
#include "core/secure_random.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane_internal.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {

using internal::PartialImport;
using internal::Peer;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::Transfer;
using transport::TransferOp;

namespace {

// "host:port" -> "host" (IPv6 "[::1]:7441" -> "[::1]"); the whole string if
// there is no port.
std::string HostOf(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

void DataPlane::Impl::OnAccept(std::unique_ptr<Endpoint> ep) {
  std::unique_ptr<Endpoint> refused;
  Endpoint* challenged = nullptr;
  wire::TransferMessage challenge;
  challenge.op = wire::TransferOpCode::kChallenge;
  if (options.sessions != nullptr) SecureRandomBytes(challenge.hello);
  {
    MutexLock lock(&mu);
    const std::string host = HostOf(ep->peer_address());
    const std::uint32_t from_host = peers_per_host.count(host) ? peers_per_host[host] : 0;
    if (closed) {
      refused = std::move(ep);
    } else if (peers.size() >= options.max_connections ||
               from_host >= options.max_connections_per_host) {
      ++stats.connections_refused;
      const std::uint64_t now = clock();
      if (now >= next_refusal_log_us) {
        spdlog::warn(
            "data plane: refused a connection from {} ({} connections, {} from that host; "
            "limits --max-data-connections {}, --max-data-connections-per-host {}; {} refused "
            "so far)",
            host, peers.size(), from_host, options.max_connections,
            options.max_connections_per_host, stats.connections_refused);
        next_refusal_log_us = now + 10'000'000;
      }
      refused = std::move(ep);
    } else {
      Endpoint* raw = ep.get();
      Peer& peer = peers[raw];
      peer.endpoint = std::move(ep);
      peer.host = host;
      peer.last_activity_us = clock();
      peer.nonce = challenge.hello;
      ++peers_per_host[host];
      if (options.sessions != nullptr) challenged = raw;
    }
  }
  if (challenged != nullptr) SendToPeer(challenged, challenge);
  // Destroyed outside the lock: destroying an endpoint waits for its handlers.
}

// Counts a message from `ep` and says whether to serve it: false for a peer
// already marked for closing, or one that now has more requests and
// undelivered replies outstanding than allowed (it is marked: Sweep
// closes it).
bool DataPlane::Impl::Admit(Endpoint* ep) {
  MutexLock lock(&mu);
  auto pit = closed ? peers.end() : peers.find(ep);
  if (pit == peers.end()) return false;
  Peer& peer = pit->second;
  if (peer.close != Peer::Close::kNone || peer.closed) return false;
  peer.last_activity_us = clock();
  if (peer.in_flight + peer.pending_replies >= options.max_outstanding_per_connection) {
    peer.close = Peer::Close::kOverloaded;
    return false;
  }
  return true;
}

void DataPlane::Impl::Reply(Endpoint* ep, std::uint64_t request_id, const Status& status,
                            std::uint64_t bytes) {
  wire::TransferMessage m;
  m.op = wire::TransferOpCode::kReply;
  m.request_id = request_id;
  m.status = status;
  m.bytes_moved = bytes;
  SendToPeer(ep, m);
}

// Sends a reply message; a peer that is gone gets nothing (nobody waits).
void DataPlane::Impl::SendToPeer(Endpoint* ep, const wire::TransferMessage& m) {
  auto encoded = wire::EncodeTransferMessage(m);
  if (!encoded.ok()) return;  // cannot happen for a reply
  transport::Transfer t;
  t.op = TransferOp::kSend;
  t.header = std::as_bytes(std::span<const char>(encoded->data(), encoded->size()));
  {
    MutexLock lock(&mu);
    auto pit = closed ? peers.end() : peers.find(ep);
    if (pit == peers.end()) return;  // gone: nobody waits for the reply
    ++pit->second.pending_replies;   // until delivered (or failed)
  }
  auto batch = ep->Submit(std::span<const Transfer>(&t, 1));
  if (!batch.ok()) {
    ReplyDone(ep);
    return;  // the peer is gone; nobody waits for the reply
  }
  (*batch)->OnDone([self = shared_from_this(), ep] { self->ReplyDone(ep); });
  MutexLock lock(&mu);
  finished.push_back(std::move(*batch));  // Sweep frees it once it is done
}

void DataPlane::Impl::ReplyDone(Endpoint* ep) {
  MutexLock lock(&mu);
  auto pit = peers.find(ep);
  if (pit != peers.end() && pit->second.pending_replies > 0) --pit->second.pending_replies;
}

void DataPlane::Impl::OnMessage(IncomingMessage& msg) {
  if (msg.payload_length() > 0) msg.Drop();
  Endpoint* ep = msg.endpoint();
  if (ep == nullptr) return;
  auto decoded = wire::DecodeTransferMessage(msg.header());
  if (!decoded.ok()) {
    spdlog::debug("data plane: dropped a message from {}: {}", ep->peer_address(),
                  decoded.status().ToString());
    return;
  }
  wire::TransferMessage& m = *decoded;
  if (!Admit(ep)) return;  // overloaded or closing: no reply (it would not be read)
  if (msg.payload_length() > 0) {
    Reply(ep, m.request_id, Status::InvalidArgument("messages to a cache host carry no payload"),
          0);
    return;
  }
  if (m.op == wire::TransferOpCode::kHello) {
    Hello(ep, m);
    return;
  }
  std::shared_ptr<const DataSessionTenant> tenant;
  if (!Authenticated(ep, &tenant)) return;  // closed before the request is read
  switch (m.op) {
    case wire::TransferOpCode::kImportRegion:
      Reply(ep, m.request_id, Import(ep, m), 0);
      return;
    case wire::TransferOpCode::kPut:
    case wire::TransferOpCode::kGet:
      Move(ep, std::move(m), tenant.get());
      return;
    case wire::TransferOpCode::kFetch:
      Fetch(ep, m, tenant.get());
      return;
    case wire::TransferOpCode::kStore:
      AcceptStore(ep, std::move(m), std::move(tenant));
      return;
    case wire::TransferOpCode::kReply:
    case wire::TransferOpCode::kFetchReply:
    case wire::TransferOpCode::kStoreReply:
    case wire::TransferOpCode::kChallenge:
    case wire::TransferOpCode::kHello:
      return;  // a daemon asks nothing of its clients
  }
}

// Whether `ep` may be served: it proved a session, or none is required.
// *tenant is its session's tenant (null without one). A peer that must
// prove one and has not is marked for closing (Sweep closes it) and gets
// no reply.
bool DataPlane::Impl::Authenticated(Endpoint* ep,
                                    std::shared_ptr<const DataSessionTenant>* tenant) {
  MutexLock lock(&mu);
  auto pit = closed ? peers.end() : peers.find(ep);
  if (pit == peers.end()) return false;
  *tenant = pit->second.tenant;
  if (*tenant != nullptr || !options.require_session) return true;
  if (pit->second.close == Peer::Close::kNone) pit->second.close = Peer::Close::kUnauthenticated;
  return false;
}

// kHello: verifies the proof against this connection's nonce. A bad one
// closes the connection (no reply); a good one is answered OK.
void DataPlane::Impl::Hello(Endpoint* ep, const wire::TransferMessage& m) {
  std::array<std::uint8_t, wire::kHelloBytes> nonce{};
  {
    MutexLock lock(&mu);
    auto pit = closed ? peers.end() : peers.find(ep);
    if (pit == peers.end()) return;
    if (options.sessions == nullptr || pit->second.tenant != nullptr) {
      // Not expected here: answered, not fatal (the peer may retry a hello
      // whose reply it lost, or talk to a daemon without sessions).
    } else {
      nonce = pit->second.nonce;
    }
  }
  if (options.sessions == nullptr) {
    Reply(ep, m.request_id, Status::FailedPrecondition("this daemon binds no data-plane sessions"),
          0);
    return;
  }
  StatusOr<DataSessionTenant> t = options.sessions->Verify(m.lease_id, nonce, m.hello, clock());
  MutexLock lock(&mu);
  auto pit = closed ? peers.end() : peers.find(ep);
  if (pit == peers.end()) return;
  Peer& peer = pit->second;
  if (peer.tenant != nullptr) {
    // Already verified: a second hello changes nothing.
  } else if (!t.ok()) {
    if (peer.close == Peer::Close::kNone) peer.close = Peer::Close::kUnauthenticated;
    return;
  } else {
    peer.tenant = std::make_shared<const DataSessionTenant>(std::move(*t));
    ++stats.sessions_verified;
  }
  lock.Unlock();
  Reply(ep, m.request_id, Status::OK(), 0);
}

Status DataPlane::Impl::Import(Endpoint* ep, const wire::TransferMessage& m) {
  std::string complete;
  {
    MutexLock lock(&mu);
    if (closed) return Status::Unavailable("cache host is shutting down");
    auto pit = peers.find(ep);
    if (pit == peers.end()) return Status::Unavailable("unknown endpoint");
    Peer& peer = pit->second;
    if (peer.regions.count(m.region_id) != 0) {
      return Status::AlreadyExists("region " + std::to_string(m.region_id) +
                                   " is already imported on this connection");
    }
    auto it = peer.imports.find(m.region_id);
    if (m.import_chunk_offset == 0) {
      if (it == peer.imports.end() && peer.imports.size() >= kMaxImportsInProgress) {
        return Status::ResourceExhausted(std::to_string(peer.imports.size()) +
                                         " region imports already in progress");
      }
      if (peer.regions.size() >= kMaxRegionsPerPeer) {
        return Status::ResourceExhausted(std::to_string(peer.regions.size()) +
                                         " regions imported on this connection, the limit");
      }
      it =
          peer.imports.insert_or_assign(m.region_id, PartialImport{m.import_total_bytes, {}}).first;
    }
    if (it == peer.imports.end() || it->second.total != m.import_total_bytes ||
        it->second.bytes.size() != m.import_chunk_offset) {
      if (it != peer.imports.end()) peer.imports.erase(it);
      return Status::InvalidArgument("import chunk of region " + std::to_string(m.region_id) +
                                     " at " + std::to_string(m.import_chunk_offset) +
                                     " out of order; start the import again");
    }
    it->second.bytes += m.import_chunk;
    if (it->second.bytes.size() < it->second.total) return Status::OK();
    complete = std::move(it->second.bytes);
    peer.imports.erase(it);
  }
  // ImportRegion unpacks on this (the progress) thread without blocking.
  auto region = ep->ImportRegion(complete);
  if (!region.ok()) return region.status().WithContext("import region");
  MutexLock lock(&mu);
  auto pit = peers.find(ep);
  if (closed || pit == peers.end()) return Status::Unavailable("connection closed");
  pit->second.regions.emplace(m.region_id, std::move(*region));
  return Status::OK();
}

// The region `region_id` imported on `ep`, or nullptr. *alive is false when
// the endpoint is gone (nobody to answer).
const transport::RemoteRegion* DataPlane::Impl::FindRegion(Endpoint* ep, std::uint32_t region_id,
                                                           bool* alive) {
  MutexLock lock(&mu);
  auto pit = closed ? peers.end() : peers.find(ep);
  *alive = pit != peers.end();
  if (!*alive) return nullptr;
  auto rit = pit->second.regions.find(region_id);
  return rit == pit->second.regions.end() ? nullptr : rit->second.get();
}

}  // namespace kvfabric::cache_host
