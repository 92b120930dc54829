// CacheHostTestClient: what cross-process tests use to talk to a real
// kvfabric-cached: gRPC (CacheHost) for control, UCX for data (owner-driven:
// the daemon pulls puts from and pushes gets into this client's staging
// region, client/data_plane_client.h).
//
// Blocks are 2 MiB (32 layers x 2 x 16 tokens x 8 heads x 128 dims, fp16) with
// keys and payloads derived from a seed and an index, so any process that
// knows the seed can check every byte. PutBatch writes blocks [first, first+n)
// (at most 16 at a time); GetBatch leases, reads, compares every byte with
// what PutBatch wrote, and releases.
//
// Thread safety: one thread at a time.
#ifndef KVFABRIC_TESTS_CACHE_HOST_TEST_CLIENT_H_
#define KVFABRIC_TESTS_CACHE_HOST_TEST_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/cache_host_session.h"
#include "client/data_plane_client.h"
#include "core/status.h"
#include "core/statusor.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "transport/transport.h"

namespace kvfabric::testing {

inline constexpr std::uint64_t kTestBlockBytes = 2 << 20;
inline constexpr char kKernelTcp[] = "kernel-tcp";

class CacheHostTestClient {
 public:
  // A data-plane transport and a 64 MiB staging region. `data_transport` is a UCX
  // transport list ("sm,self,tcp", "tcp"), or kKernelTcp for the kernel-socket
  // transport (a daemon started with --data-transport=tcp).
  static StatusOr<std::unique_ptr<CacheHostTestClient>> Create(std::uint64_t seed,
                                                               const std::string& data_transport);
  ~CacheHostTestClient();

  // Connects to a daemon (gRPC address, transport address) and exports the
  // staging region to it; replaces an earlier daemon.
  Status Attach(const std::string& grpc_address, const std::string& transport_address);
  // How Attach secures gRPC (default: plaintext, for daemons started with
  // --insecure).
  void set_security(const GrpcSecurityOptions& security) { security_ = security; }

  v1::CacheHost::Stub* stub() { return &session_->stub(); }
  client::DataPlaneClient* data() { return data_.get(); }
  client::DaemonConnection* connection() { return *session_->DataConnection(); }
  client::CacheHostSession& session() { return *session_; }
  transport::Transport* transport() { return transport_.get(); }

  static v1::ModelFingerprint Fingerprint();
  // Key of block i (32 bytes), of the chain this seed defines.
  std::string Key(int i) const;
  // Block i's payload.
  void Fill(int i, std::span<std::byte> dst) const;

  Status PutBatch(int first, int n, const std::string& ns = "");
  // PutBatch through the one-round-trip kStore (CacheHostSession::StoreByKey,
  // its admission window and retries); at most 32 blocks. *throttled counts
  // blocks the daemon refused for room and the session sent again.
  Status StoreBatch(int first, int n, std::uint64_t* throttled, const std::string& ns = "");
  Status GetBatch(const std::vector<int>& ids, const std::string& ns = "");

 private:
  CacheHostTestClient() = default;
  std::span<std::byte> Staging(std::uint64_t offset, std::uint64_t bytes);
  // Blocks [first, first + n) filled into staging slots 0..n-1, described
  // (format_version, fingerprint digest) and checksummed; their ids appended
  // to *ids.
  std::vector<client::CacheHostSession::StoreBlock> StageBlocks(int first, int n,
                                                                std::uint32_t format_version,
                                                                std::string_view digest,
                                                                std::vector<int>* ids);

  std::uint64_t seed_ = 0;
  GrpcSecurityOptions security_ = [] {
    GrpcSecurityOptions o;
    o.insecure = true;
    return o;
  }();
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<transport::MemoryRegion> staging_;
  std::unique_ptr<client::DataPlaneClient> data_;
  std::shared_ptr<client::CacheHostSession> session_;
};

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_CACHE_HOST_TEST_CLIENT_H_
