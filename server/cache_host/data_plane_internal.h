// DataPlane::Impl and the per-connection records it keeps, shared by the files
// of DataPlane (data_plane.h explains the protocol, bounds and threads):
//
//   data_plane.cc              Start, Sweep, Close and the accessors
//   data_plane_connections.cc  accept, admission, replies, kHello, kImportRegion
//   data_plane_transfers.cc    kPut and kGet (Move), kFetch, Launch of a batch
//   data_plane_store.cc        kStore and its worker threads
//
// Internal: included only by those files.
#ifndef KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_INTERNAL_H_
#define KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_INTERNAL_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane.h"
#include "server/cache_host/data_sessions.h"
#include "transport/transport.h"

namespace kvfabric::cache_host {
namespace internal {

struct PartialImport {
  std::uint32_t total = 0;
  std::string bytes;
};

struct Peer {
  std::unique_ptr<transport::Endpoint> endpoint;
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

struct InFlightBatch {
  std::unique_ptr<transport::TransferBatch> batch;  // null until Submit returned
  transport::Endpoint* ep = nullptr;
  std::uint64_t started_us = 0;
};

inline std::uint64_t NowMicros() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// Folds the landed CRCs (Transfer::checksum) of a batch's results into
// `groups` groups: result j belongs to group_of[j], and a group's results are
// adjacent and in byte order. Per group its CRC, or none where the group has
// no result, or one that failed or reported no CRC. All none when the counts
// disagree (nothing was submitted).
std::vector<std::optional<std::uint32_t>> FoldLandedCrcs(
    std::span<const transport::TransferResult> moved, std::span<const std::size_t> group_of,
    std::size_t groups);

}  // namespace internal

// The data plane's state and handlers. Each method is documented where it is
// defined (the file named above its group).
struct DataPlane::Impl : std::enable_shared_from_this<DataPlane::Impl> {
  CacheHostNode* node = nullptr;
  transport::Transport* transport = nullptr;
  DataPlaneOptions options;
  std::function<std::uint64_t()> clock;

  mutable Mutex mu;
  bool closed KVF_GUARDED_BY(mu) = false;
  std::unordered_map<transport::Endpoint*, internal::Peer> peers KVF_GUARDED_BY(mu);
  std::unordered_map<std::string, std::uint32_t> peers_per_host KVF_GUARDED_BY(mu);
  std::unordered_map<std::uint64_t, internal::InFlightBatch> in_flight KVF_GUARDED_BY(mu);
  // Replies, and batches that are done, until Sweep frees them.
  std::vector<std::unique_ptr<transport::TransferBatch>> finished KVF_GUARDED_BY(mu);
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

  // ---- connections (data_plane_connections.cc) ----

  void OnAccept(std::unique_ptr<transport::Endpoint> ep);
  bool Admit(transport::Endpoint* ep);
  void Reply(transport::Endpoint* ep, std::uint64_t request_id, const Status& status,
             std::uint64_t bytes);
  void SendToPeer(transport::Endpoint* ep, const wire::TransferMessage& m);
  void ReplyDone(transport::Endpoint* ep);
  void OnMessage(transport::IncomingMessage& msg);
  bool Authenticated(transport::Endpoint* ep, std::shared_ptr<const DataSessionTenant>* tenant);
  void Hello(transport::Endpoint* ep, const wire::TransferMessage& m);
  Status Import(transport::Endpoint* ep, const wire::TransferMessage& m);
  const transport::RemoteRegion* FindRegion(transport::Endpoint* ep, std::uint32_t region_id,
                                            bool* alive);

  // ---- kPut, kGet, kFetch (data_plane_transfers.cc) ----

  // What a launched batch calls once: its status, the bytes moved, whether
  // the endpoint is still there to answer, and the entries' results (empty
  // when nothing was submitted; valid only during the call).
  using Finish = std::function<void(const Status&, std::uint64_t bytes, bool peer,
                                    std::span<const transport::TransferResult> results)>;

  std::vector<transport::Transfer> Entries(std::span<const wire::TransferRange> ranges,
                                           const transport::RemoteRegion* remote, bool write);
  void Move(transport::Endpoint* ep, wire::TransferMessage m, const DataSessionTenant* tenant);
  void Launch(transport::Endpoint* ep, const std::vector<transport::Transfer>& entries,
              TransferTicket ticket, bool write, Finish finish);
  void Done(transport::Endpoint* ep, std::uint64_t);
  void FetchReply(transport::Endpoint* ep, std::uint64_t request_id, const Status& status,
                  std::vector<wire::FetchKeyResult> results, std::uint64_t bytes,
                  wire::TransferOpCode op = wire::TransferOpCode::kFetchReply);
  void Fetch(transport::Endpoint* ep, const wire::TransferMessage& m,
             const DataSessionTenant* tenant);

  // ---- kStore (data_plane_store.cc) ----

  // What one kStore carries from its reserve to its commit.
  struct StoreJob {
    transport::Endpoint* ep = nullptr;
    wire::TransferMessage m;
    std::shared_ptr<const DataSessionTenant> tenant;
    std::vector<wire::FetchKeyResult> results;  // one per entry
    std::vector<BlockKey> keys;                 // one per entry
    std::vector<bool> reserved;                 // per entry: this request reserved it
    GrantInfo grant;
    // The pull's layer slices, numbered across the request: entry i's are
    // [first_slice[i], first_slice[i] + slices[i]); pulled[j] is the slice
    // of transport entry j (entries never straddle a slice, so their landed
    // CRCs fold into each slice's).
    std::vector<std::size_t> pulled;
    std::vector<std::size_t> first_slice;
    std::vector<std::uint32_t> slices;
    std::size_t total_slices = 0;
    // The reserving worker hands the job to the committing one through the
    // transport's completion, which a race detector cannot see through every
    // transport (UCX's shared memory): taken once after the reserve's writes
    // and once before the commit's reads, it orders them for it too.
    Mutex handoff;
  };

  bool PostStore(std::function<void()> job);
  void StoreLoop();
  void StopStoreWorkers();
  void AcceptStore(transport::Endpoint* ep, wire::TransferMessage m,
                   std::shared_ptr<const DataSessionTenant> tenant);
  void StoreDone(transport::Endpoint* ep);
  void StoreReply(StoreJob& job, const Status& status, std::uint64_t bytes);
  Status StoreMetas(const wire::TransferMessage& m, std::vector<BlockMeta>* metas,
                    std::vector<wire::FetchKeyResult>* results) const;
  void StoreReserve(const std::shared_ptr<StoreJob>& job);
  // `landed`: per entry, its slices' CRCs as the pull computed them where the
  // bytes landed (empty where the transport did not: the commit reads them).
  void StoreCommit(const std::shared_ptr<StoreJob>& job, const Status& moved, std::uint64_t bytes,
                   std::vector<std::vector<std::uint32_t>> landed, bool peer);
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_INTERNAL_H_
