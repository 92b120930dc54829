// Internal state of the loopback transport (transport/loopback_transport.h):
// the records a LoopbackTransport's Core shares with its regions, endpoints,
// queued operations and peers, and the per-network registry of listen names.
// Included only by transport/loopback_transport.cc.
#ifndef KVFABRIC_TRANSPORT_LOOPBACK_STATE_H_
#define KVFABRIC_TRANSPORT_LOOPBACK_STATE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "transport/transfer_batch.h"
#include "transport/transport.h"

namespace kvfabric::transport::loopback_internal {

class Core;

// A registered range, shared by the region object and the owner's registry.
// `alive` turns false (under mu) when the region is destroyed, so a peer's
// copy, which holds mu, never touches freed memory.
struct RegionState {
  explicit RegionState(std::span<std::byte> b) : bytes(b) {}
  const std::span<std::byte> bytes;
  Mutex mu;
  bool alive KVF_GUARDED_BY(mu) = true;
};

struct EndpointState;

// One entry in flight. `state` decides who completes it: the peer's worker
// moves it kPending -> kRunning -> kFinished; Cancel, Close and peer failure
// move it kPending -> kFinished. Whoever makes the move to kFinished completes
// the entry, so it completes exactly once and never after its range was freed.
struct Op {
  enum : int { kPending = 0, kRunning = 1, kFinished = 2 };

  bool TryStart() {
    int expected = kPending;
    return state.compare_exchange_strong(expected, kRunning);
  }
  bool TryAbort() {
    int expected = kPending;
    return state.compare_exchange_strong(expected, kFinished);
  }

  std::atomic<int> state{kPending};
  std::shared_ptr<BatchCompletion> completion;
  std::size_t index = 0;
  TransferOp op = TransferOp::kRead;
  std::span<std::byte> local;           // the local range (empty for a bare kSend)
  std::uint64_t region_id = 0;          // kRead/kWrite: the peer's region
  std::uint64_t region_offset = 0;      // kRead/kWrite: offset within that region
  bool checksum = false;                // kRead/kWrite: Transfer::checksum
  std::vector<std::byte> header;        // kSend: copied at Submit
  std::weak_ptr<EndpointState> origin;  // where it was submitted
  std::weak_ptr<EndpointState> target;  // the peer's end of the connection
};

// One end of a connection.
struct EndpointState {
  EndpointState(std::uint64_t i, std::string peer) : id(i), peer_address(std::move(peer)) {}

  const std::uint64_t id;
  const std::string peer_address;
  Mutex mu;
  Status failure KVF_GUARDED_BY(mu);                     // OK while usable
  std::weak_ptr<EndpointState> peer KVF_GUARDED_BY(mu);  // set once at connect
  std::weak_ptr<Core> peer_core KVF_GUARDED_BY(mu);      // set once at connect
  std::uint64_t peer_core_id KVF_GUARDED_BY(mu) = 0;     // set once at connect
  Endpoint* owner KVF_GUARDED_BY(mu) = nullptr;          // the user's object, if any
  std::set<std::shared_ptr<Op>> pending KVF_GUARDED_BY(mu);
  std::vector<std::weak_ptr<BatchCompletion>> batches KVF_GUARDED_BY(mu);
};

// Removes a finished op from its endpoint and completes its entry.
// REQUIRES: the caller moved op->state to kFinished.
void CompleteOp(const std::shared_ptr<Op>& op, Status status, std::uint64_t bytes,
                std::optional<std::uint32_t> landed_crc32c = std::nullopt) {
  if (std::shared_ptr<EndpointState> origin = op->origin.lock()) {
    MutexLock lock(&origin->mu);
    origin->pending.erase(op);
  }
  op->completion->Complete(op->index, std::move(status), bytes, landed_crc32c);
}

// Marks `ep` failed with `failure` (if not already) and completes its pending
// entries with `entry_status`.
void FailEndpoint(EndpointState& ep, const Status& failure, const Status& entry_status) {
  std::vector<std::shared_ptr<Op>> ops;
  {
    MutexLock lock(&ep.mu);
    if (ep.failure.ok()) ep.failure = failure;
    ops.assign(ep.pending.begin(), ep.pending.end());
  }
  for (const std::shared_ptr<Op>& op : ops) {
    if (op->TryAbort()) CompleteOp(op, entry_status, 0);
  }
}

// Closes `ep`: its pending entries complete with `entry_status`, and the peer
// end fails (Unavailable) with its pending entries.
void Disconnect(EndpointState& ep, const Status& entry_status) {
  FailEndpoint(ep, Status::Unavailable("endpoint closed"), entry_status);
  std::shared_ptr<EndpointState> peer;
  {
    MutexLock lock(&ep.mu);
    peer = ep.peer.lock();
  }
  if (peer) {
    Status gone = Status::Unavailable("peer closed the connection");
    FailEndpoint(*peer, gone, gone);
  }
}

inline std::vector<std::shared_ptr<BatchCompletion>> LiveBatches(EndpointState& ep) {
  std::vector<std::shared_ptr<BatchCompletion>> live;
  MutexLock lock(&ep.mu);
  for (const std::weak_ptr<BatchCompletion>& w : ep.batches) {
    if (std::shared_ptr<BatchCompletion> b = w.lock()) live.push_back(std::move(b));
  }
  return live;
}

// Listen names on one LoopbackNetwork.
class Registry {
 public:
  std::uint64_t NewCoreId() { return next_core_id_.fetch_add(1) + 1; }
  std::uint64_t NewEndpointId() { return next_endpoint_id_.fetch_add(1) + 1; }

  // Binds `name` ("0" picks one) and returns the bound name.
  StatusOr<std::string> Bind(std::string name, std::weak_ptr<Core> core) {
    MutexLock lock(&mu_);
    if (name == "0") {
      do {
        name = "auto-" + std::to_string(++next_name_);
      } while (listeners_.count(name) != 0);
    }
    auto [it, inserted] = listeners_.emplace(name, std::move(core));
    if (!inserted) {
      if (!it->second.expired()) {
        return Status::AlreadyExists("loopback name \"" + name + "\" is already bound");
      }
      it->second = std::move(core);
    }
    return name;
  }

  void Unbind(const std::string& name) {
    MutexLock lock(&mu_);
    listeners_.erase(name);
  }

  std::shared_ptr<Core> Find(const std::string& name) {
    MutexLock lock(&mu_);
    auto it = listeners_.find(name);
    return it == listeners_.end() ? nullptr : it->second.lock();
  }

 private:
  std::atomic<std::uint64_t> next_core_id_{0};
  std::atomic<std::uint64_t> next_endpoint_id_{0};
  Mutex mu_;
  std::map<std::string, std::weak_ptr<Core>> listeners_ KVF_GUARDED_BY(mu_);
  std::uint64_t next_name_ KVF_GUARDED_BY(mu_) = 0;
};

}  // namespace kvfabric::transport::loopback_internal

#endif  // KVFABRIC_TRANSPORT_LOOPBACK_STATE_H_
