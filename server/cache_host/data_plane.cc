// DataPlane's lifecycle: Start, Sweep (the maintenance thread's pass over the
// connections), Close and the accessors. The handlers are in
// data_plane_connections.cc, data_plane_transfers.cc and data_plane_store.cc.
#include "server/cache_host/data_plane.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "server/cache_host/data_plane_internal.h"
#include "spdlog/spdlog.h"

namespace kvfabric::cache_host {

using internal::NowMicros;
using internal::Peer;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::TransferBatch;

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
