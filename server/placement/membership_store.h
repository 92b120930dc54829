// MembershipStore: where the placement service keeps cluster membership (which
// cache-host daemons are alive, under leases) and small configuration values
// (the calibration file, settings shared by placement replicas).
//
// Two implementations behind one interface:
//   MemoryMembershipStore  in-process, for the embedded single-node setup and
//                          tests; leases expire on the store's clock.
//   EtcdMembershipStore    etcd v3 (server/placement/etcd_membership_store.h):
//                          leases with keep-alive for membership, transactions
//                          for compare-and-swap, a watch so every placement
//                          replica sees changes.
// The per-block directory never goes here (etcd's gateway handles ~1-2k ops/s;
// block churn is far above that): it lives in placement's memory and is
// rebuilt from the daemons' reports.
//
// Records. A member is keyed by host_id; joining again (a new incarnation)
// replaces the record and its lease. A member whose lease expires disappears
// from List() and is reported to watchers as left.
//
// Threads: every method may be called from any thread. Watch callbacks run on
// a store thread (or inside the mutating call, for the in-process store),
// must not block, and must not call back into the store.
#ifndef KVFABRIC_SERVER_PLACEMENT_MEMBERSHIP_STORE_H_
#define KVFABRIC_SERVER_PLACEMENT_MEMBERSHIP_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::placement {

// What placement knows about one daemon. Encoded as versioned JSON in etcd
// (EncodeMemberRecord); every field is checked when decoded.
struct MemberRecord {
  std::string host_id;            // non-empty, at most 128 bytes
  std::uint64_t incarnation = 0;  // random per daemon start
  std::string grpc_address;       // "host:port" of its CacheHost service
  std::string transport_address;  // "host:port" of its data plane
  std::string node_name;          // machine / topology label (may be empty)
  std::uint64_t host_capacity_bytes = 0;
  std::uint64_t host_free_bytes = 0;
  std::uint64_t nvme_capacity_bytes = 0;
  std::uint64_t nvme_free_bytes = 0;
  bool draining = false;
  std::uint64_t joined_unix_us = 0;
  // SHA-256, in lower-case hex, of the membership token placement issued
  // when the daemon registered (NewMembershipToken); Heartbeat, ReportBlocks
  // and Deregister must present the token. Empty in records written before
  // tokens existed: no token is asked of such a member.
  std::string token_digest;

  friend bool operator==(const MemberRecord&, const MemberRecord&) = default;
};

// Membership tokens: the capability a daemon gets from Register and quotes
// with its lease id, as a daemon's grants carry an access token. A lease id
// alone could be guessed (etcd's are sequential), and with it a stranger
// could deregister a live daemon or report blocks in its name.
inline constexpr std::size_t kMembershipTokenBytes = 16;
// kMembershipTokenBytes from getrandom.
std::string NewMembershipToken();
// Lower-case hex SHA-256 of `token` (what MemberRecord::token_digest keeps).
std::string MembershipTokenDigest(std::string_view token);
// Whether `token` is the one behind `digest` (compared in constant time).
// An empty digest (a record from before tokens) accepts any token.
bool MembershipTokenMatches(std::string_view digest, std::string_view token);

// JSON with a "v":1 field, e.g.
//   {"v":1,"host_id":"h1","incarnation":"1234",...,"draining":false,"joined_unix_us":17,
//    "token_digest":"9f86..."}
// token_digest is optional (records written before it existed have none).
// incarnation is a decimal string (a random 64-bit value does not survive
// tools that read JSON numbers as doubles); byte counts are JSON numbers.
// DecodeMemberRecord: InvalidArgument naming the field for anything missing,
// mistyped or out of range (it also applies ValidateMemberRecord, and refuses
// input over kMaxMemberRecordBytes); fields it does not know are ignored, so a
// later v1 writer may add optional ones. Strings that are not valid UTF-8 are
// encoded with U+FFFD in their place (ValidateMemberRecord refuses them).
inline constexpr std::size_t kMaxMemberRecordBytes = 64 * 1024;
std::string EncodeMemberRecord(const MemberRecord& record);
StatusOr<MemberRecord> DecodeMemberRecord(std::string_view json);

struct Member {
  MemberRecord record;
  std::uint64_t lease_id = 0;
};

enum class MemberEventKind : std::uint8_t {
  kJoined = 1,   // new host_id, or a new incarnation of one
  kUpdated = 2,  // same incarnation, record changed (capacity, draining)
  kLeft = 3,     // left, or its lease expired
};

struct MemberEvent {
  MemberEventKind kind = MemberEventKind::kJoined;
  MemberRecord record;  // for kLeft: the last record known
};

using MemberWatcher = std::function<void(const MemberEvent&)>;

class MembershipStore {
 public:
  virtual ~MembershipStore() = default;

  // "memory", "etcd(http://127.0.0.1:2379)".
  virtual std::string name() const = 0;

  // Creates or replaces record.host_id's record under a new lease of `ttl`.
  // Returns the lease id. InvalidArgument for a bad record or TTL.
  virtual StatusOr<std::uint64_t> Join(const MemberRecord& record,
                                       std::chrono::milliseconds ttl) = 0;

  // Renews the lease (for its original TTL) and, if `updated` is set, stores
  // it as the member's record. NotFound if the lease expired or is unknown
  // (the daemon must Join again).
  virtual Status KeepAlive(std::uint64_t lease_id, const MemberRecord* updated) = 0;

  // Ends the lease now; the member is gone. Idempotent (OK if already gone).
  virtual Status Leave(std::uint64_t lease_id) = 0;

  // Live members, sorted by host_id.
  virtual StatusOr<std::vector<Member>> List() = 0;

  // Calls `watcher` for every change from now on (members present before
  // the first Watch are not reported). At most one watcher; replaces a
  // previous one, which is not running and is never called again once Watch
  // returns. An empty watcher stops reporting.
  virtual void Watch(MemberWatcher watcher) = 0;

  // Configuration values (small, < 64 KiB; see ValidateConfigEntry). Get:
  // nullopt if absent.
  virtual StatusOr<std::optional<std::string>> Get(const std::string& key) = 0;
  // Sets `key` to `value` if its current value is `expected` (nullopt: the key
  // must be absent). Returns whether it swapped.
  virtual StatusOr<bool> CompareAndSwap(const std::string& key,
                                        const std::optional<std::string>& expected,
                                        const std::string& value) = 0;
};

// In-process store. Leases expire on env->NowMicros(); expiry is applied on
// every call (and by ExpireNow), so a member that stops calling KeepAlive is
// gone from the next List() after its TTL.
class MemoryMembershipStore final : public MembershipStore {
 public:
  // REQUIRES: env outlives the store.
  explicit MemoryMembershipStore(Env* env);

  std::string name() const override { return "memory"; }
  StatusOr<std::uint64_t> Join(const MemberRecord& record, std::chrono::milliseconds ttl) override;
  Status KeepAlive(std::uint64_t lease_id, const MemberRecord* updated) override;
  Status Leave(std::uint64_t lease_id) override;
  StatusOr<std::vector<Member>> List() override;
  void Watch(MemberWatcher watcher) override;
  StatusOr<std::optional<std::string>> Get(const std::string& key) override;
  StatusOr<bool> CompareAndSwap(const std::string& key, const std::optional<std::string>& expected,
                                const std::string& value) override;

  // Applies expiry now (the placement service calls it periodically so that
  // watchers hear of expiries without waiting for the next call).
  void ExpireNow();

 private:
  struct Lease {
    std::string host_id;
    std::uint64_t ttl_us = 0;
    std::uint64_t expires_at_us = 0;
  };
  // Removes expired leases and their members, appending a kLeft event for
  // each to `events`.
  void ExpireLocked(std::uint64_t now_us, std::vector<MemberEvent>* events) KVF_REQUIRES(mu_);
  // Delivers `events` to the watcher. Takes watcher_mu_ before releasing
  // `held` (a lock on mu_), so that events reach the watcher in the order
  // their changes were made, yet the watcher runs outside mu_.
  void Notify(MutexLock& held, const std::vector<MemberEvent>& events) KVF_RELEASE(mu_);

  Env* const env_;
  Mutex mu_;
  std::map<std::uint64_t, Lease> leases_ KVF_GUARDED_BY(mu_);
  std::map<std::string, Member> members_ KVF_GUARDED_BY(mu_);  // by host_id
  std::map<std::string, std::string> config_ KVF_GUARDED_BY(mu_);
  Mutex watcher_mu_ KVF_ACQUIRED_AFTER(mu_);  // after mu_ when both are held
  MemberWatcher watcher_ KVF_GUARDED_BY(watcher_mu_);
};

// The event a store reports when host_id's record goes from `before` (nullptr:
// none known) to `after`: kJoined for a new host_id or another incarnation,
// kUpdated for the same incarnation with changed fields, nothing for an
// identical record. Shared by both stores so they classify alike.
std::optional<MemberEvent> ClassifyMemberChange(const MemberRecord* before,
                                                const MemberRecord& after);

// Checks a record before it is stored: non-empty host_id of at most 128
// bytes, addresses and node_name of at most 256 bytes, every string valid
// UTF-8 (JSON carries nothing else), free <= capacity for host and NVMe.
// InvalidArgument naming the field.
Status ValidateMemberRecord(const MemberRecord& record);

// Lease TTLs both stores accept: [1 ms, 24 h]. The etcd store rounds up to
// whole seconds (and etcd raises a TTL below its own minimum, 1-2 s depending
// on its election timeout). InvalidArgument naming the TTL otherwise.
inline constexpr std::chrono::milliseconds kMinMemberTtl{1};
inline constexpr std::chrono::milliseconds kMaxMemberTtl{24 * 3600 * 1000};
Status ValidateMemberTtl(std::chrono::milliseconds ttl);

// Configuration keys are 1..256 bytes; values are below 64 KiB.
// InvalidArgument naming the key and the size otherwise.
inline constexpr std::size_t kMaxConfigKeyBytes = 256;
inline constexpr std::size_t kMaxConfigValueBytes = 64 * 1024 - 1;
Status ValidateConfigKey(std::string_view key);
Status ValidateConfigEntry(std::string_view key, std::string_view value);

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_MEMBERSHIP_STORE_H_
