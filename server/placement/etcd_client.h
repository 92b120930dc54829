// EtcdClient: a small client of etcd 3.4's v3 JSON gateway (grpc-gateway)
// over plain HTTP/1.1 on POSIX sockets: key-value put/range/delete, txn,
// leases, and watches.
//
// Wire format. Every call is a POST of a JSON body to /v3/...; keys and values
// travel base64-encoded, int64 fields come back as JSON strings, and fields
// at their default (0, "", false) are left out by the gateway. Unary calls
// use one connection each ("Connection: close"): the placement service makes a
// few calls a second, and etcd's gateway tops out near 1-2k/s anyway. Lease
// keep-alive and watch are gRPC streams; the gateway answers them with a
// chunked stream of {"result": ...} or {"error": ...} objects.
//
// Limits. Every size read from the network is checked: headers at most 64 KiB,
// a response body (or one streamed message) at most
// EtcdClientOptions::max_response_bytes, Content-Length and chunk sizes parsed
// strictly. Connect and each unary request are bounded by the timeouts in
// the options.
//
// Errors. Unavailable, naming the endpoint, for network failures (timeouts
// included), malformed HTTP and malformed replies. For an error reported by
// etcd, its gRPC code mapped to ours with etcd's message: NotFound (e.g.
// "requested lease not found"), InvalidArgument, DeadlineExceeded,
// ResourceExhausted, OutOfRange (a compacted revision), Unavailable, and
// FailedPrecondition for every other code.
//
// Threads: every method may be called from any number of threads at once.
// An EtcdWatch runs one reader thread of its own.
#ifndef KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_
#define KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_

#include <atomic>
#include <chrono>
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

namespace kvfabric::placement {

class EtcdHttpStream;  // one HTTP exchange on one connection (etcd_http.h)

// Standard base64 (RFC 4648 section 4) with padding, as Go's encoding/json
// writes []byte. Base64Decode is strict: the length must be a multiple of 4,
// '=' only as the last one or two characters, no whitespace, and the unused
// bits of the last character must be zero. nullopt for anything else.
std::string Base64Encode(std::string_view bytes);
std::optional<std::string> Base64Decode(std::string_view text);

// The range_end that makes a range or watch cover every key starting with
// `prefix` (etcd's rule: increment the last byte below 0xff, dropping trailing
// 0xff bytes; "\0" = every key when nothing is left).
std::string EtcdPrefixRangeEnd(std::string_view prefix);

struct EtcdClientOptions {
  // Client URL of one etcd member, "http://host:port" (IPv6 as "[::1]:2379").
  // https is not supported: run etcd on loopback or a private network.
  std::string endpoint = "http://127.0.0.1:2379";

  // Bound on establishing a TCP connection. Default 2 s: on a LAN a connect
  // takes well under a millisecond, so waiting longer only delays failover.
  std::chrono::milliseconds connect_timeout{2000};

  // Bound on one unary call after connecting (send the request, read the
  // whole response), and on a watch's creation. Default 5 s: above etcd's own
  // request timeout for a slow disk (its fsync can take seconds), below the
  // member lease TTLs callers use.
  std::chrono::milliseconds request_timeout{5000};

  // Largest response body, or one streamed message, accepted. Default 16 MiB:
  // far above a membership listing; a larger one is refused (Unavailable)
  // rather than buffered.
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

// A running watch: one HTTP stream and the thread that reads it.
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

  // Closes the stream and joins the reader: no callback runs after it
  // returns. Idempotent.
  // REQUIRES: not called from a callback of this watch.
  void Cancel();

  // The store revision the watch was created at (events after it follow).
  std::int64_t created_revision() const { return created_revision_; }

  // True once the stream has ended (not by Cancel).
  bool ended() const { return ended_.load(std::memory_order_acquire); }

 private:
  friend class EtcdClient;
  EtcdWatch();
  void Run();

  std::unique_ptr<EtcdHttpStream> stream_;
  EventCallback on_event_;
  EndCallback on_end_;
  std::int64_t created_revision_ = 0;
  std::atomic<bool> cancelled_{false};  // release by Cancel, acquire by Run
  std::atomic<bool> ended_{false};      // release by Run, acquire by ended()
  std::mutex cancel_mu_;                // serialises Cancel
  std::thread reader_;
};

class EtcdClient {
 public:
  // InvalidArgument for an endpoint that is not "http://host:port" or for
  // zero timeouts / size limit. Does not connect.
  static StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdClientOptions& options);

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoint() const { return options_.endpoint; }

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
  explicit EtcdClient(const EtcdClientOptions& options);

  // Connects, sends a POST of `body` to `path` and reads the response head.
  // For a status other than 200, reads the body and returns etcd's error.
  StatusOr<std::unique_ptr<EtcdHttpStream>> Open(std::string_view path,
                                                 const std::string& body) const;
  // Open + the whole body (at most max_response_bytes).
  StatusOr<std::string> Call(std::string_view path, const std::string& body) const;

  const EtcdClientOptions options_;
  std::string host_;  // for connect, brackets removed
  std::string port_;
  std::string host_header_;
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_ETCD_CLIENT_H_
