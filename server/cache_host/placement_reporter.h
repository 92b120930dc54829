// PlacementReporter: keeps a cache-host daemon registered with the placement
// service and its block directory current (placement.proto: Register,
// Heartbeat, ReportBlocks, Deregister).
//
// One thread. It registers (with the daemon's addresses and tier capacities),
// heartbeats every heartbeat_interval_ms placement asks for, and sends the
// node's block events (CacheHostNode::set_block_event_sink) in ReportBlocks
// calls of at most max_keys_per_batch events, numbered 1, 2, 3, ... per
// incarnation; a failed call is retried with the same sequence. When
// placement asks for a full report (a new incarnation, or placement restarted
// and lost its directory), or when the event queue overflowed, it sends the
// node's whole holding (SnapshotBlocks) as snapshot chunks. A heartbeat or
// report answered NOT_FOUND (placement forgot the lease) registers again.
// Placement being down never blocks the daemon: events queue up to
// max_queued_events, then the queue is dropped and a full report is owed.
//
// Threads: the event sink may be called from any thread; Stop() from one.
#ifndef KVFABRIC_SERVER_CACHE_HOST_PLACEMENT_REPORTER_H_
#define KVFABRIC_SERVER_CACHE_HOST_PLACEMENT_REPORTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "security/grpc_security.h"
#include "server/cache_host/cache_host_node.h"

namespace kvfabric::cache_host {

struct PlacementReporterOptions {
  // --placement-address: placement's gRPC address, or several replicas'
  // separated by commas (at most 8; they share one membership store): when
  // one does not answer (Unavailable, DeadlineExceeded) the reporter moves to
  // the next, registers there if it must, and reports in full. Required.
  std::string placement_address;
  // This daemon, as clients reach it.
  std::string host_id;
  std::string grpc_address;
  std::string transport_address;
  std::string node_name;
  std::string version;
  // Requested membership TTL. Default 10 s: a dead daemon leaves plans
  // within ~10 s; heartbeats every ~3 s.
  std::chrono::milliseconds ttl{10000};
  // Events kept while placement is unreachable before a full report is owed
  // instead. Default 1M (~100 MiB at worst).
  std::size_t max_queued_events = 1 << 20;
  // Per-call deadline. Default 5 s.
  std::chrono::milliseconds rpc_timeout{5000};
  // How the daemon reaches placement (security/grpc_security.h): the
  // daemon's own certificate as its client identity, --tls-ca to verify
  // placement, or --insecure. Start fails naming the flag when unset.
  GrpcSecurityOptions security;
};

struct PlacementReporterStats {
  std::uint64_t registrations = 0;
  std::uint64_t heartbeats = 0;
  std::uint64_t reports = 0;
  std::uint64_t events_sent = 0;
  std::uint64_t snapshots = 0;
  std::uint64_t failures = 0;
  std::uint64_t events_dropped = 0;
  bool registered = false;
};

class PlacementReporter {
 public:
  // Installs the node's block event sink and starts the thread. The node
  // must outlive the reporter (call Stop() before destroying the node).
  static StatusOr<std::unique_ptr<PlacementReporter>> Start(CacheHostNode* node,
                                                            PlacementReporterOptions options);
  ~PlacementReporter();  // Stop()
  PlacementReporter(const PlacementReporter&) = delete;
  PlacementReporter& operator=(const PlacementReporter&) = delete;

  // Sends what is queued (bounded by rpc_timeout), deregisters, stops.
  void Stop();
  PlacementReporterStats stats() const;

 private:
  PlacementReporter(CacheHostNode* node, PlacementReporterOptions options);
  void Run();
  Status Register();
  Status Heartbeat();
  Status SendEvents(std::vector<BlockEventRecord> events, std::uint64_t snapshot_id,
                    bool snapshot_last);
  Status SendSnapshot();
  void FillTiers(google::protobuf::RepeatedPtrField<v1::TierUsage>* tiers) const;
  void OnEvents(std::vector<BlockEventRecord> events);

  CacheHostNode* const node_;
  const PlacementReporterOptions options_;
  const std::uint64_t incarnation_;
  // One stub per replica; the reporter thread uses stubs_[current_] and moves
  // on when it does not answer.
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::Placement::Stub>> stubs_;
  std::size_t current_ = 0;  // the reporter thread's only
  std::size_t failures_in_a_row_ = 0;
  v1::Placement::Stub* stub() const { return stubs_[current_].get(); }

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<BlockEventRecord> queue_ KVF_GUARDED_BY(mu_);
  bool snapshot_owed_ KVF_GUARDED_BY(mu_) = true;
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  PlacementReporterStats stats_ KVF_GUARDED_BY(mu_);

  // Reporter thread only.
  std::uint64_t lease_id_ = 0;
  // The membership token of the last Register, quoted with lease_id_; kept
  // when placement forgets the lease, so the next Register proves it is this
  // incarnation registering again.
  std::string token_;
  std::uint64_t sequence_ = 0;
  std::uint64_t next_snapshot_id_ = 1;
  std::chrono::milliseconds heartbeat_every_{3000};
  std::chrono::steady_clock::time_point next_warning_{};
  std::thread thread_;
};

// The proto event for one record (Tier host for kHost/kBoth, NVMe for kNvme).
v1::BlockEvent ToProto(const BlockEventRecord& e);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_PLACEMENT_REPORTER_H_
