// DataSessions: what binds a data-plane connection to an authenticated gRPC
// caller (docs/security.md, "Data plane").
//
// A client calls CacheHost.OpenDataSession over its (TLS) gRPC channel and
// gets a session id and a 32-byte secret, both from the CSPRNG, recorded
// with the tenant the call authenticated as. When its data-plane connection
// is accepted the daemon sends a fresh 32-byte nonce (kChallenge); the
// client answers kHello with the session id and HMAC-SHA256(secret,
// wire::HelloProofInput(nonce, id)). Verify checks the proof in constant time;
// the connection then acts for that tenant only: a grant or a kFetch of a
// namespace the tenant does not hold is refused as if it did not exist. The
// secret never crosses the data plane, and a proof is good for one nonce, so
// a recorded hello does not open another connection.
//
// Bounds: at most max_sessions live sessions (ResourceExhausted naming
// --max-data-sessions once full of unexpired ones); each expires ttl_us after
// it was opened (a connection already verified keeps working; a client
// reconnecting after that opens a new session).
//
// Thread safety: thread-safe.
#ifndef KVFABRIC_SERVER_CACHE_HOST_DATA_SESSIONS_H_
#define KVFABRIC_SERVER_CACHE_HOST_DATA_SESSIONS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "proto/transfer_wire.h"

namespace kvfabric::cache_host {

struct DataSessionOptions {
  std::uint32_t max_sessions = 65536;       // --max-data-sessions
  std::uint64_t ttl_us = 3'600'000'000ull;  // --data-session-ttl (1 h)
};

// Who a session acts for.
struct DataSessionTenant {
  std::string name;
  std::vector<std::string> namespaces;  // "*": every namespace
  bool MayUse(std::string_view ns) const;
};

struct OpenedDataSession {
  std::uint64_t id = 0;
  std::array<std::uint8_t, 32> secret{};
  std::uint64_t expires_us = 0;
};

class DataSessions {
 public:
  explicit DataSessions(DataSessionOptions options) : options_(options) {}

  // A new session for `tenant` at `now_us`.
  StatusOr<OpenedDataSession> Open(DataSessionTenant tenant, std::uint64_t now_us);

  // The tenant of session `id` when `proof` is its HMAC over
  // HelloProofInput(nonce, id); PermissionDenied otherwise (unknown, expired
  // or wrong proof alike).
  StatusOr<DataSessionTenant> Verify(std::uint64_t id,
                                     const std::array<std::uint8_t, wire::kHelloBytes>& nonce,
                                     const std::array<std::uint8_t, wire::kHelloBytes>& proof,
                                     std::uint64_t now_us);

  std::size_t size() const;
  const DataSessionOptions& options() const { return options_; }

 private:
  struct Session {
    std::array<std::uint8_t, 32> secret{};
    std::uint64_t expires_us = 0;
    DataSessionTenant tenant;
  };
  const DataSessionOptions options_;
  mutable Mutex mu_;
  std::unordered_map<std::uint64_t, Session> sessions_ KVF_GUARDED_BY(mu_);
};

// HMAC-SHA256(secret, HelloProofInput(nonce, session_id)): what a client
// sends in kHello.
std::array<std::uint8_t, wire::kHelloBytes> HelloProof(
    const std::array<std::uint8_t, 32>& secret,
    const std::array<std::uint8_t, wire::kHelloBytes>& nonce, std::uint64_t session_id);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_DATA_SESSIONS_H_
