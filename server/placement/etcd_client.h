// EtcdClient: a small client of etcd's v3 gRPC API (the subset declared in
// proto/etcd/etcdserverpb/rpc.proto): key-value put/range/delete, txn,
// leases, and watches, over stubs generated from that file.
//
// Members. The endpoint option lists one or more client URLs of one etcd
// cluster; the client talks to one member at a time and moves to the next
// when a call fails as Unavailable (the member is down, partitioned, or did
// not answer within the timeouts), so a cluster that keeps a quorum keeps
// answering. The failed call itself is not retried: a Txn that timed out may
// have been applied, and only the caller knows whether repeating it is safe.
//
// Limits. A reply larger than EtcdClientOptions::max_response_bytes is
// refused by gRPC before it is buffered. Each unary call, a keep-alive, and a
// watch's creation are bounded by request_timeout (connecting included); a
// member that went away is retried at most max_reconnect_backoff apart. An
// idle watch is kept honest by HTTP/2 keepalive pings (every 10 s, 5 s to
// answer), so a watch on a member that went silent ends within ~15 s.
//
// Errors. Unavailable, naming the member's URL and the method, for network
// failures and for no answer within request_timeout. For an error reported by
// etcd, its gRPC code mapped to ours with etcd's message: NotFound (e.g.
// "requested lease not found"), InvalidArgument, DeadlineExceeded (etcd's own
// request timeout), ResourceExhausted, OutOfRange (a compacted revision),
// Unavailable, and FailedPrecondition for every other code.
//
// Threads: every method may be called from any number of threads at once.
// An EtcdWatch runs one reader thread of its own.
#ifndef KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_
#define KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "security/grpc_security.h"

namespace kvfabric::placement {

// The range_end that makes a range or watch cover every key starting with
// `prefix` (etcd's rule: increment the last byte below 0xff, dropping trailing
// 0xff bytes; "\0" = every key when nothing is left).
std::string EtcdPrefixRangeEnd(std::string_view prefix);

struct EtcdClientOptions {
  // Client URLs of the members of one etcd cluster, comma-separated:
  // "http://host:port" or "host:port" each (plaintext; IPv6 as
  // "[::1]:2379"), or "https://host:port" (TLS with `tls`).
  std::string endpoint = "http://127.0.0.1:2379";

  // For https:// members (--etcd-ca, --etcd-cert, --etcd-key): ca_file
  // verifies etcd's certificate; cert_file/key_file are placement's client
  // certificate when etcd runs with --client-cert-auth. Ignored for http://.
  GrpcSecurityOptions tls;

  // Longest wait between attempts to reconnect to a member that went away
  // (gRPC's reconnect backoff starts at 100 ms and doubles up to this).
  // Default 1 s: a restarted member is used again within about a second.
  std::chrono::milliseconds max_reconnect_backoff{1000};

  // Bound on one unary call, a keep-alive, and a watch's creation. Default
  // 5 s: above etcd's own request timeout for a slow disk (its fsync can take
  // seconds), below the member lease TTLs callers use.
  std::chrono::milliseconds request_timeout{5000};

  // Largest reply (one gRPC message) accepted. Default 16 MiB: far above a
  // membership listing; a larger one is refused rather than buffered.
  std::size_t max_response_bytes = std::size_t{16} << 20;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;  // 0: none
};

struct EtcdRangeResult {
  std::int64_t revision = 0;  // the store's revision when the range was read
  std::vector<EtcdKeyValue> kvs;
  bool more = false;  // a limit cut the result short
  std::int64_t count = 0;
};

// One compare of a transaction: `target` of `key` against the field that
// matches it (value, or number for the others).
struct EtcdCompare {
  enum class Target : std::uint8_t { kValue, kVersion, kCreateRevision, kModRevision, kLease };
  enum class Result : std::uint8_t { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kValue;
  Result result = Result::kEqual;
  std::string value;        // for kValue (a missing key never compares equal)
  std::int64_t number = 0;  // for the others (a missing key has them all 0)
};

struct EtcdOp {
  enum class Kind : std::uint8_t { kPut, kRange, kDeleteRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;       // kPut
  std::int64_t lease = 0;  // kPut
  std::string range_end;   // kRange, kDeleteRange: empty for the single key
};

struct EtcdTxn {
  std::vector<EtcdCompare> compare;
  std::vector<EtcdOp> success;
  std::vector<EtcdOp> failure;
};

struct EtcdTxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
  // One per op of the branch that ran; only kRange ops fill kvs.
  std::vector<EtcdRangeResult> responses;
};

struct EtcdLease {
  std::int64_t id = 0;
  std::int64_t ttl_seconds = 0;  // as granted (etcd may raise a small TTL)
};

struct EtcdEvent {
  enum class Type : std::uint8_t { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;                      // for kDelete: key and mod_revision only
  std::optional<EtcdKeyValue> prev_kv;  // when the watch asked for it and etcd had it
};

struct EtcdWatchRequest {
  std::string key;
  std::string range_end;            // EtcdPrefixRangeEnd(prefix) for a prefix
  std::int64_t start_revision = 0;  // 0: from now
  bool prev_kv = false;
};

// A running watch: one gRPC stream and the thread that reads it.
//
// The reader calls on_event once per event, in revision order, and, if the
// stream ends for any reason but Cancel(), on_end once with why: never OK
// (Unavailable when etcd goes away or the stream breaks, OutOfRange when etcd
// cancelled the watch because its revision was compacted, FailedPrecondition
// for another cancellation). Either callback may be empty. Callbacks run on
// the reader thread; they must not call Cancel() or destroy the watch.
//
// Ownership: returned by EtcdClient::Watch; destroying it cancels it.
class EtcdWatch {
 public:
  using EventCallback = std::function<void(const EtcdEvent&)>;
  using EndCallback = std::function<void(const Status&)>;

  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;
  ~EtcdWatch();

  // Ends the stream and joins the reader: no callback runs after it returns.
  // Idempotent.
  // REQUIRES: not called from a callback of this watch.
  void Cancel();

  // The store revision the watch was created at (events after it follow).
  std::int64_t created_revision() const { return created_revision_; }

  // True once the stream has ended (not by Cancel).
  bool ended() const { return ended_.load(std::memory_order_acquire); }

 private:
  friend class EtcdClient;
  struct Call;  // the gRPC context and stream (etcd_client.cc)

  EtcdWatch();
  // The reader thread: opens the stream, sends the create request, reports
  // the creation (or why it failed) through `created_`/`create_status_`, then
  // delivers events.
  void Run();

  std::unique_ptr<Call> call_;
  std::string context_;  // "etcd <url> Watch.Watch": prefix of every error
  EventCallback on_event_;
  EndCallback on_end_;
  std::int64_t created_revision_ = 0;   // written by Run before it signals creation
  std::atomic<bool> cancelled_{false};  // release by Cancel, acquire by Run
  std::atomic<bool> ended_{false};      // release by Run, acquire by ended()
  std::mutex cancel_mu_;                // serialises Cancel

  // Creation handshake between Run and EtcdClient::Watch.
  std::mutex create_mu_;
  std::condition_variable create_cv_;
  bool create_done_ = false;  // guarded by create_mu_
  Status create_status_;      // guarded by create_mu_; OK once etcd confirmed

  std::thread reader_;
};

class EtcdClient {
 public:
  // InvalidArgument for an endpoint list with an entry that is not
  // "[http://]host:port", or for zero timeouts / size limit. Does not connect.
  static StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdClientOptions& options);

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;
  ~EtcdClient();

  // The endpoint list as given.
  const std::string& endpoint() const { return options_.endpoint; }

  // The member the next call goes to (its URL as listed).
  std::string current_member() const;

  // Sets `key` to `value`, attached to `lease` (0: none). Returns the new
  // revision. NotFound if the lease does not exist (any more).
  StatusOr<std::int64_t> Put(std::string_view key, std::string_view value, std::int64_t lease = 0);

  // The keys in [key, range_end) (just `key` for an empty range_end), sorted,
  // at most `limit` of them (0: no limit).
  StatusOr<EtcdRangeResult> Range(std::string_view key, std::string_view range_end = {},
                                  std::int64_t limit = 0);

  // Deletes [key, range_end); returns how many keys it deleted.
  StatusOr<std::int64_t> DeleteRange(std::string_view key, std::string_view range_end = {});

  StatusOr<EtcdTxnResult> Txn(const EtcdTxn& txn);

  // A lease of ttl_seconds (>= 1).
  StatusOr<EtcdLease> LeaseGrant(std::int64_t ttl_seconds);
  // Renews `id` for its TTL; returns the TTL. NotFound if it expired or is
  // unknown.
  StatusOr<std::int64_t> LeaseKeepAlive(std::int64_t id);
  // Ends `id` and deletes its keys. NotFound if it expired or is unknown.
  Status LeaseRevoke(std::int64_t id);

  // Starts a watch and waits (up to request_timeout) for etcd to confirm it,
  // so every change after Watch returns is reported. FailedPrecondition if
  // etcd refuses the watch, OutOfRange if start_revision is compacted.
  StatusOr<std::unique_ptr<EtcdWatch>> Watch(const EtcdWatchRequest& request,
                                             EtcdWatch::EventCallback on_event,
                                             EtcdWatch::EndCallback on_end);

 private:
  struct Member;  // one etcd member's URL, channel and stubs (etcd_client.cc)

  explicit EtcdClient(const EtcdClientOptions& options);

  // The member calls go to now, and its index (for MemberFailed).
  std::size_t CurrentIndex() const { return current_.load(std::memory_order_relaxed); }
  // After a call to member `index` failed as Unavailable: the next call goes
  // to the member after it (unless another thread moved on already).
  void MemberFailed(std::size_t index);

  // A unary call through `invoke` (which calls one stub method with the
  // context it is given) on the current member, under request_timeout.
  // `method` names it in errors ("KV.Range").
  template <typename Invoke>
  Status Unary(std::string_view method, Invoke invoke);

  const EtcdClientOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<std::size_t> current_{0};
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_
