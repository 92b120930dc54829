#include "server/cache_host/data_plane.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_format.h"
#include "core/mutex.h"
#include "core/secure_random.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/cache_host_node.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {

using transport::Endpoint;
using transport::IncomingMessage;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;

namespace {

struct PartialImport {
  std::uint32_t total = 0;
  std::string bytes;
};

struct Peer {
  std::unique_ptr<Endpoint> endpoint;
  std::string host;  // peer_address() without its port
  std::unordered_map<std::uint32_t, std::unique_ptr<transport::RemoteRegion>> regions;
  std::unordered_map<std::uint32_t, PartialImport> imports;
  std::uint64_t in_flight = 0;        // transfer batches naming its regions
  std::uint64_t pending_replies = 0;  // replies sent but not yet delivered
  std::uint64_t last_activity_us = 0;
  // Why Sweep must close it (overloaded, idle, a transfer past its deadline);
  // kNone while it may stay.
  enum class Close : std::uint8_t {
    kNone,
    kOverloaded,
    kIdle,
    kTransferTimeout,
    kUnauthenticated
  } close = Close::kNone;
  // The kChallenge nonce sent at accept, and the session the peer proved.
  std::array<std::uint8_t, wire::kHelloBytes> nonce{};
  std::shared_ptr<const DataSessionTenant> tenant;  // null until kHello verified
  bool closed = false;  // Sweep closed it; removed once its peer is unhealthy and idle
};

// "host:port" -> "host" (IPv6 "[::1]:7441" -> "[::1]"); the whole string if
// there is no port.
std::string HostOf(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

struct InFlightBatch {
  std::unique_ptr<TransferBatch> batch;  // null until Submit returned
  Endpoint* ep = nullptr;
  std::uint64_t started_us = 0;
};

std::uint64_t NowMicros() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace

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

struct DataPlane::Impl : std::enable_shared_from_this<DataPlane::Impl> {
  CacheHostNode* node = nullptr;
  transport::Transport* transport = nullptr;
  DataPlaneOptions options;
  std::function<std::uint64_t()> clock;

  mutable Mutex mu;
  bool closed KVF_GUARDED_BY(mu) = false;
  std::unordered_map<Endpoint*, Peer> peers KVF_GUARDED_BY(mu);
  std::unordered_map<std::string, std::uint32_t> peers_per_host KVF_GUARDED_BY(mu);
  std::unordered_map<std::uint64_t, InFlightBatch> in_flight KVF_GUARDED_BY(mu);
  // Replies, and batches that are done, until Sweep frees them.
  std::vector<std::unique_ptr<TransferBatch>> finished KVF_GUARDED_BY(mu);
  std::uint64_t next_batch KVF_GUARDED_BY(mu) = 1;
  DataPlaneStats stats KVF_GUARDED_BY(mu);
  std::uint64_t next_refusal_log_us KVF_GUARDED_BY(mu) = 0;

  // kStore's workers (StoreLoop). Close stops them before it touches any
  // endpoint, so a job never runs on a closed one.
  Mutex store_mu;
  CondVar store_cv;
  std::deque<std::function<void()>> store_jobs KVF_GUARDED_BY(store_mu);
  bool store_stopping KVF_GUARDED_BY(store_mu) = false;
  std::vector<std::thread> store_threads;

  ~Impl() { StopStoreWorkers(); }

  // False once the workers stopped (the job is dropped).
  bool PostStore(std::function<void()> job) {
    {
      MutexLock lock(&store_mu);
      if (store_stopping) return false;
      store_jobs.push_back(std::move(job));
    }
    store_cv.NotifyOne();
    return true;
  }

  void StoreLoop() {
    for (;;) {
      std::function<void()> job;
      {
        MutexLock lock(&store_mu);
        store_cv.Wait(&store_mu, [&]() KVF_REQUIRES(store_mu) {
          return store_stopping || !store_jobs.empty();
        });
        if (store_stopping) return;
        job = std::move(store_jobs.front());
        store_jobs.pop_front();
      }
      job();
    }
  }

  void StopStoreWorkers() {
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

  void OnAccept(std::unique_ptr<Endpoint> ep) {
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
  bool Admit(Endpoint* ep) {
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

  void Reply(Endpoint* ep, std::uint64_t request_id, const Status& status, std::uint64_t bytes) {
    wire::TransferMessage m;
    m.op = wire::TransferOpCode::kReply;
    m.request_id = request_id;
    m.status = status;
    m.bytes_moved = bytes;
    SendToPeer(ep, m);
  }

  // Sends a reply message; a peer that is gone gets nothing (nobody waits).
  void SendToPeer(Endpoint* ep, const wire::TransferMessage& m) {
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

  void ReplyDone(Endpoint* ep) {
    MutexLock lock(&mu);
    auto pit = peers.find(ep);
    if (pit != peers.end() && pit->second.pending_replies > 0) --pit->second.pending_replies;
  }

  void OnMessage(IncomingMessage& msg) {
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
      Reply(ep, m.request_id,
            Status::InvalidArgument("messages to a cache host carry no payload"), 0);
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
  bool Authenticated(Endpoint* ep, std::shared_ptr<const DataSessionTenant>* tenant) {
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
  void Hello(Endpoint* ep, const wire::TransferMessage& m) {
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
      Reply(ep, m.request_id,
            Status::FailedPrecondition("this daemon binds no data-plane sessions"), 0);
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

  Status Import(Endpoint* ep, const wire::TransferMessage& m) {
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
        it = peer.imports.insert_or_assign(m.region_id, PartialImport{m.import_total_bytes, {}})
                 .first;
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
  const transport::RemoteRegion* FindRegion(Endpoint* ep, std::uint32_t region_id, bool* alive) {
    MutexLock lock(&mu);
    auto pit = closed ? peers.end() : peers.find(ep);
    *alive = pit != peers.end();
    if (!*alive) return nullptr;
    auto rit = pit->second.regions.find(region_id);
    return rit == pit->second.regions.end() ? nullptr : rit->second.get();
  }

  // The transport entries of `ranges` between the pool and `remote`, joined
  // where they continue each other: kRead (into the pool) for a put, kWrite
  // (into the client's region) for a get.
  std::vector<Transfer> Entries(std::span<const wire::TransferRange> ranges,
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

  void Move(Endpoint* ep, wire::TransferMessage m, const DataSessionTenant* tenant) {
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
           [self = shared_from_this(), ep, request = m.request_id](const Status& status,
                                                                    std::uint64_t bytes, bool peer) {
             if (peer) self->Reply(ep, request, status, bytes);
           });
  }

  // What a launched batch calls once: its status, the bytes moved, and whether
  // the endpoint is still there to answer.
  using Finish = std::function<void(const Status&, std::uint64_t bytes, bool peer)>;

  // Submits `entries` (bracketed in the lease table by `ticket`) on `ep`. Once
  // every entry completed, or nothing could be submitted, closes the brackets
  // and calls `finish` (on the transport's thread, or on this one).
  void Launch(Endpoint* ep, const std::vector<Transfer>& entries, TransferTicket ticket,
              bool write, Finish finish) {
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
      finish(Status::Unavailable("connection closed"), 0, false);
      return;
    }
    const std::uint64_t started = NowMicros();
    auto batch = ep->Submit(entries);
    if (!batch.ok()) {
      node->EndTransfer(ticket, /*landed=*/false);
      finish(batch.status(), 0, true);
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
      finish(status, bytes, true);
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

  void FetchReply(Endpoint* ep, std::uint64_t request_id, const Status& status,
                  std::vector<wire::FetchKeyResult> results, std::uint64_t bytes,
                  wire::TransferOpCode op = wire::TransferOpCode::kFetchReply) {
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
  void Fetch(Endpoint* ep, const wire::TransferMessage& m, const DataSessionTenant* tenant) {
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
                                     " bytes at offset " + std::to_string(o) +
                                     " runs past region " + std::to_string(m.region_id) + " of " +
                                     std::to_string(length) + " bytes"));
        return;
      }
    }
    if (tenant != nullptr && !tenant->MayUse(m.fetch_namespace)) {
      fail(Status::PermissionDenied("kFetch: this connection's session (tenant \"" + tenant->name +
                                    "\") may not use namespace \"" +
                                    m.fetch_namespace.substr(0, 64) + "\""));
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
    Launch(ep, Entries(ranges, remote, /*write=*/false), std::move(*ticket), /*write=*/false,
           [self = shared_from_this(), ep, release, request = m.request_id,
            results = std::move(results)](const Status& status, std::uint64_t bytes,
                                          bool peer) mutable {
             release();
             if (peer) self->FetchReply(ep, request, status, std::move(results), bytes);
           });
  }

  // ---- kStore ----

  // What one kStore carries from its reserve to its commit.
  struct StoreJob {
    Endpoint* ep = nullptr;
    wire::TransferMessage m;
    std::shared_ptr<const DataSessionTenant> tenant;
    std::vector<wire::FetchKeyResult> results;  // one per entry
    std::vector<BlockKey> keys;                 // one per entry
    std::vector<bool> reserved;                 // per entry: this request reserved it
    GrantInfo grant;
    // The reserving worker hands the job to the committing one through the
    // transport's completion, which a race detector cannot see through every
    // transport (UCX's shared memory): taken once after the reserve's writes
    // and once before the commit's reads, it orders them for it too.
    Mutex handoff;
  };

  // On the progress thread: counts the request against its connection (so
  // what waits for a worker is bounded) and hands it to a worker.
  void AcceptStore(Endpoint* ep, wire::TransferMessage m,
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

  void StoreDone(Endpoint* ep) {
    MutexLock lock(&mu);
    auto pit = peers.find(ep);
    if (pit != peers.end() && pit->second.in_flight > 0) --pit->second.in_flight;
  }

  // Answers a kStore (request-wide error: no per-key results) and ends it.
  void StoreReply(StoreJob& job, const Status& status, std::uint64_t bytes) {
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
  Status StoreMetas(const wire::TransferMessage& m, std::vector<BlockMeta>* metas,
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
  void StoreReserve(const std::shared_ptr<StoreJob>& job) {
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
        std::uint64_t pos = m.store_entries[i].region_offset;
        for (const ByteExtent& x : r.extents) {
          ranges.push_back({x.offset, x.length, pos});
          extents.push_back(x);
          pos += x.length;
        }
      }
    }
    if (ranges.empty()) {
      StoreReply(*job, Status::OK(), 0);
      return;
    }
    { MutexLock publish(&job->handoff); }
    auto ticket = node->BeginTransfer(job->grant.lease_id, job->grant.token, /*write=*/true,
                                      extents, job->tenant.get());
    if (!ticket.ok()) {
      StoreCommit(job, ticket.status(), 0, true);
      return;
    }
    Launch(ep, Entries(ranges, remote, /*write=*/true), std::move(*ticket), /*write=*/true,
           [self = shared_from_this(), job](const Status& status, std::uint64_t bytes, bool peer) {
             // The CRC check runs on a worker, not on this (progress) thread.
             if (!self->PostStore([self, job, status, bytes, peer] {
                   self->StoreCommit(job, status, bytes, peer);
                 })) {
               self->StoreDone(job->ep);  // stopping: the grant ends with its TTL
             }
           });
  }

  // On a worker: commit what arrived (the CRC check), release the rest, answer.
  void StoreCommit(const std::shared_ptr<StoreJob>& job, const Status& moved, std::uint64_t bytes,
                   bool peer) {
    { MutexLock acquire(&job->handoff); }
    const Namespace ns{job->m.fetch_namespace};
    std::vector<CommitEntry> commits;
    std::vector<std::size_t> index;
    if (moved.ok()) {
      for (std::size_t i = 0; i < job->reserved.size(); ++i) {
        if (!job->reserved[i]) continue;
        commits.push_back({job->keys[i], job->m.store_entries[i].crc32c});
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

  void Done(Endpoint* ep, std::uint64_t) {
    MutexLock lock(&mu);
    auto pit = peers.find(ep);
    if (pit != peers.end()) --pit->second.in_flight;
  }
};

StatusOr<std::unique_ptr<DataPlane>> DataPlane::Start(CacheHostNode* node,
                                                      transport::Transport* transport,
                                                      const std::string& address,
                                                      DataPlaneOptions options,
                                                      std::function<std::uint64_t()> clock) {
  if (options.max_connections == 0 || options.max_connections_per_host == 0 ||
      options.max_outstanding_per_connection == 0 || options.idle_timeout_us == 0 ||
      options.transfer_timeout_us == 0) {
    return Status::InvalidArgument(
        "data plane: --max-data-connections, --max-data-connections-per-host, "
        "--max-requests-per-connection, --data-idle-timeout and --transfer-timeout must be > 0");
  }
  auto impl = std::make_shared<Impl>();
  impl->node = node;
  impl->transport = transport;
  impl->options = options;
  impl->clock = clock ? std::move(clock) : [] { return NowMicros(); };
  if (options.store_threads == 0 || options.store_threads > 64) {
    return Status::InvalidArgument("data plane: --store-threads " +
                                   std::to_string(options.store_threads) + " must be 1..64");
  }

  std::weak_ptr<Impl> weak = impl;
  transport->SetMessageHandler([weak](IncomingMessage& msg) {
    if (auto self = weak.lock()) {
      self->OnMessage(msg);
    } else if (msg.payload_length() > 0) {
      msg.Drop();
    }
  });
  KVF_RETURN_IF_ERROR(transport->Listen(address, [weak](std::unique_ptr<Endpoint> ep) {
    if (auto self = weak.lock()) self->OnAccept(std::move(ep));
  }));
  // Started once listening (a kStore accepted before they run waits in the
  // queue); joined by Close.
  for (std::uint32_t t = 0; t < options.store_threads; ++t) {
    impl->store_threads.emplace_back([raw = impl.get()] { raw->StoreLoop(); });
  }
  return std::unique_ptr<DataPlane>(new DataPlane(std::move(impl)));
}

DataPlane::~DataPlane() { Close(); }

std::string DataPlane::address() const { return impl_->transport->listen_address(); }

std::uint64_t DataPlane::endpoints() const {
  MutexLock lock(&impl_->mu);
  return impl_->peers.size();
}

DataPlaneStats DataPlane::stats() const {
  MutexLock lock(&impl_->mu);
  DataPlaneStats s = impl_->stats;
  s.endpoints = impl_->peers.size();
  return s;
}

void DataPlane::Sweep() {
  std::vector<std::unique_ptr<TransferBatch>> finished;
  {
    MutexLock lock(&impl_->mu);
    if (impl_->closed) return;  // Close owns the endpoints now
    finished.swap(impl_->finished);
  }
  // Outside the lock, O(1) per batch: a peer that sent a flood of requests
  // and then vanished leaves many batches, and every handler needs the lock.
  std::vector<std::unique_ptr<TransferBatch>> pending;
  for (auto& b : finished) {
    if (!b->Done()) pending.push_back(std::move(b));
  }
  finished.clear();  // frees the done ones, outside the lock

  std::vector<Peer> dead;
  std::vector<Endpoint*> to_close;
  const std::uint64_t now = impl_->clock();
  {
    MutexLock lock(&impl_->mu);
    if (impl_->closed) return;
    for (auto& b : pending) impl_->finished.push_back(std::move(b));
    // A transfer past its deadline closes its endpoint (which completes it).
    for (auto& [id, f] : impl_->in_flight) {
      if (now - std::min(now, f.started_us) <= impl_->options.transfer_timeout_us) continue;
      auto pit = impl_->peers.find(f.ep);
      if (pit != impl_->peers.end() && pit->second.close == Peer::Close::kNone) {
        pit->second.close = Peer::Close::kTransferTimeout;
      }
    }
    for (auto it = impl_->peers.begin(); it != impl_->peers.end();) {
      Peer& peer = it->second;
      if (peer.in_flight == 0 && !peer.endpoint->health().ok()) {
        if (--impl_->peers_per_host[peer.host] == 0) impl_->peers_per_host.erase(peer.host);
        dead.push_back(std::move(peer));
        it = impl_->peers.erase(it);
        continue;
      }
      if (!peer.closed && peer.close == Peer::Close::kNone && peer.in_flight == 0 &&
          peer.pending_replies == 0 &&
          now - std::min(now, peer.last_activity_us) > impl_->options.idle_timeout_us) {
        peer.close = Peer::Close::kIdle;
      }
      if (!peer.closed && peer.close != Peer::Close::kNone) {
        peer.closed = true;
        switch (peer.close) {
          case Peer::Close::kOverloaded:
            ++impl_->stats.closed_overloaded;
            break;
          case Peer::Close::kIdle:
            ++impl_->stats.closed_idle;
            break;
          case Peer::Close::kTransferTimeout:
            ++impl_->stats.closed_transfer_timeout;
            break;
          case Peer::Close::kUnauthenticated:
            ++impl_->stats.closed_unauthenticated;
            break;
          case Peer::Close::kNone:
            break;
        }
        to_close.push_back(it->first);
      }
      ++it;
    }
  }
  // Force-closing completes the endpoint's entries (Cancelled): their
  // callbacks end the lease brackets and free the batches. The endpoint stays
  // in the map until a later Sweep finds it unhealthy and idle, so handlers
  // and callbacks never see it destroyed under them.
  for (Endpoint* ep : to_close) {
    ep->Close(transport::CloseMode::kForce, transport::Clock::now() + std::chrono::seconds(2))
        .IgnoreError();
  }
  // Outside the lock: an endpoint's destructor waits for its handlers, which
  // take the lock. Regions go before their endpoint.
  for (Peer& p : dead) {
    p.regions.clear();
    p.endpoint.reset();
  }
}

void DataPlane::Close() {
  // kStore's workers first: none runs on an endpoint once they are joined;
  // a transfer completing later finds them stopped and drops its commit (the
  // grant ends with its TTL).
  impl_->StopStoreWorkers();
  // Take the endpoints out of the map first: Sweep and handlers no longer see
  // them, and nothing destroys them before their callbacks have run.
  std::unordered_map<Endpoint*, Peer> peers;
  {
    MutexLock lock(&impl_->mu);
    if (impl_->closed) return;
    impl_->closed = true;
    peers.swap(impl_->peers);
  }
  // Force-closing completes every entry (Cancelled); their OnDone callbacks
  // close the lease brackets and move the batches to `finished`.
  for (auto& [raw, peer] : peers) {
    raw->Close(transport::CloseMode::kForce, transport::Clock::now() + std::chrono::seconds(2))
        .IgnoreError();
  }
  // Wait for the callbacks of force-closed batches (they use the endpoint and
  // the batch); bounded, since the close completed every entry.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    {
      MutexLock lock(&impl_->mu);
      if (impl_->in_flight.empty()) break;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      spdlog::error("data plane: transfer batches still running 5 s after close; leaking them");
      MutexLock lock(&impl_->mu);
      for (auto& [id, f] : impl_->in_flight) (void)f.batch.release();
      impl_->in_flight.clear();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::unique_ptr<TransferBatch>> finished;
  {
    MutexLock lock(&impl_->mu);
    finished.swap(impl_->finished);
  }
  finished.clear();  // replies: done or cancelled by the close
  for (auto& [raw, peer] : peers) {
    peer.regions.clear();
    peer.endpoint.reset();
  }
}

}  // namespace kvfabric::cache_host
