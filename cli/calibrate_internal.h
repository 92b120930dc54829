// Internal to the calibrate_command target: the timing helper its probes share, and the
// cache-host probe's classes (UCX builds only; defined in calibrate_cache_host.cc).
#ifndef KVFABRIC_CLI_CALIBRATE_INTERNAL_H_
#define KVFABRIC_CLI_CALIBRATE_INTERNAL_H_

#include <chrono>

#ifdef KVF_HAVE_UCX
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/cache_host_session.h"
#include "client/data_plane_client.h"
#include "core/bus_probe.h"
#include "core/status.h"
#include "core/statusor.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "proto/transfer_wire.h"
#include "security/grpc_security.h"
#include "transport/transport.h"
#endif

namespace kvfabric::cli::calibrate_internal {

using SteadyClock = std::chrono::steady_clock;

inline double MicrosSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
}

#ifdef KVF_HAVE_UCX

// The largest probe block; a daemon's smaller max_block_bytes lowers it.
constexpr std::uint64_t kMaxProbeBlockBytes = std::uint64_t{64} << 20;

// The client side shared by every cache host: one data-plane transport (UCX or kernel TCP,
// as the daemons speak), one staging region of max_bytes exported to each daemon, one
// data-plane client.
struct ClientFabric {
  // Declared in the order of creation, so that each is destroyed before what it borrows.
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::MemoryRegion> staging;
  std::unique_ptr<client::DataPlaneClient> data;

  static StatusOr<std::unique_ptr<ClientFabric>> Create(std::uint64_t staging_bytes,
                                                        const std::string& data_transport);
};

// One daemon under measurement: its control stub, its limits, and the probe blocks it holds.
class CacheHostTarget {
 public:
  // Health (serving, host_id, limits) and Stats (room in the host pool); no data moves yet.
  // `admin_address` is the daemon's admin listener, where the probe deletes the blocks it put.
  static StatusOr<std::unique_ptr<CacheHostTarget>> Open(const std::string& address,
                                                         const std::string& admin_address,
                                                         std::span<const std::uint64_t> sizes,
                                                         int timeout_ms,
                                                         const GrpcSecurityOptions& security);

  ~CacheHostTarget();

  const std::string& host_id() const { return host_id_; }
  const std::string& address() const { return address_; }

  // Puts one set of blocks per size, read by TimedGet.
  Status PrepareGets(ClientFabric* fabric, std::span<const std::uint64_t> sizes);

  // kFetch of the probe blocks of `bytes` into the fabric's staging at `offset`, timed; then
  // (untimed) a CRC check of every block read.
  // REQUIRES: PrepareGets succeeded (also for TimedPut, which uses its fabric), and
  // offset + bytes fits the staging region.
  StatusOr<double> TimedGet(std::uint64_t bytes, std::uint64_t offset = 0);

  // Reserve + kPut + Commit of fresh blocks, timed; then (untimed) Delete.
  StatusOr<double> TimedPut(std::uint64_t bytes);

 private:
  CacheHostTarget(std::string address, std::string admin_address, int timeout_ms,
                  GrpcSecurityOptions security)
      : address_(std::move(address)),
        admin_address_(std::move(admin_address)),
        timeout_ms_(timeout_ms),
        security_(std::move(security)),
        rng_(std::random_device{}()) {}

  std::unique_ptr<grpc::ClientContext> Context() const;

  // Long enough for the largest transfer, within the daemon's max_ttl_ms.
  std::uint32_t TtlMs() const;

  Status Call(const char* rpc, const grpc::Status& g) const;

  StatusOr<BlockSplit> Split(std::uint64_t bytes) const;

  std::vector<std::string> NewKeys(std::uint64_t n);

  // CRC32C of each block of `split` as laid out in the staging region (its bytes never change:
  // gets read back what was put from it).
  const std::vector<std::uint32_t>& Crcs(const BlockSplit& split);

  Status Put(const BlockSplit& split, const std::vector<std::string>& keys,
             const std::vector<std::uint32_t>& crcs);

  Status DeleteKeys(const std::vector<std::string>& keys);

  const std::string address_;
  const std::string admin_address_;
  const int timeout_ms_;
  const GrpcSecurityOptions security_;
  std::string host_id_;
  v1::Limits limits_;
  std::uint64_t max_block_bytes_ = kMaxProbeBlockBytes;
  std::unique_ptr<v1::CacheHost::Stub> stub_;
  ClientFabric* fabric_ = nullptr;  // set by PrepareGets
  // The protocol sequences, over fabric_'s region (made by PrepareGets; its data plane
  // connects at the first grant, to the address the grant names).
  std::shared_ptr<client::CacheHostSession> session_;
  std::mt19937_64 rng_;
  std::map<std::uint64_t, std::vector<std::string>> get_keys_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::uint32_t>> crcs_;
};

class CacheHostProbe final : public PathProbe {
 public:
  CacheHostProbe(CacheHostTarget* session, bool get) : session_(session), get_(get) {}
  StatusOr<double> Measure(std::uint64_t bytes) override;

 private:
  CacheHostTarget* const session_;
  const bool get_;
};

// The client's ingest (BusPath::kClientIngest): a probe of B bytes reads B / n from each of n
// daemons at once (their probe blocks of that size, each into its own slice of the staging
// region, slice i at i x slice_bytes) and times the whole, from the start of the first read to
// the end of the last. Threads: n - 1 workers kept for the probe's life, so no thread start is
// timed. REQUIRES: every target's PrepareGets succeeded, n >= 2, and the staging region holds
// n x slice_bytes. One daemon named n times reads n at once from it (the concurrency-gain
// probe). `what` names the probe in its errors. transfers_only: the time runs to the end of
// the last fetch, without the CRC checks after them (TimedGet's own time).
class IngestProbe final : public PathProbe {
 public:
  IngestProbe(std::vector<CacheHostTarget*> targets, std::uint64_t slice_bytes,
              std::string what = "client ingest probe", bool transfers_only = false);
  ~IngestProbe() override;
  StatusOr<double> Measure(std::uint64_t bytes) override;

 private:
  void Worker(std::size_t i);
  // Target i's TimedGet of `bytes` into its slice; *end: when its fetch ended.
  Status TimedRead(std::size_t i, std::uint64_t bytes, SteadyClock::time_point* end);

  const std::vector<CacheHostTarget*> targets_;
  const std::uint64_t slice_bytes_;
  const std::string what_;
  const bool transfers_only_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;  // a new read for the workers, under mu_
  std::uint64_t share_ = 0;       // its bytes per daemon, under mu_
  std::size_t pending_ = 0;       // workers not done with it, under mu_
  bool stop_ = false;             // under mu_
  std::vector<Status> results_;   // per worker, under mu_
  std::vector<SteadyClock::time_point> ends_;  // per worker: its fetch's end, under mu_
  std::vector<std::thread> workers_;
};

#endif  // KVF_HAVE_UCX

}  // namespace kvfabric::cli::calibrate_internal

#endif  // KVFABRIC_CLI_CALIBRATE_INTERNAL_H_
