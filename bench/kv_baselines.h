// Baselines for the cache-host benchmark: Redis 7 and memcached on loopback,
// driven with the same blocks as kvfabric.
//
// What is here
//   BaselineServer    starts `redis-server` or `memcached` as a child process
//                     on 127.0.0.1 with a free port and kills it on
//                     destruction.
//   RedisClient       a minimal RESP2 client (SET, GET, FLUSHALL, PING).
//   MemcachedClient   a minimal text-protocol client (set, get, flush_all,
//                     version).
//   RunBaseline       N connections each putting or getting its share of
//                     total_bytes / value_bytes keys, timed: GB/s and per-op
//                     p50/p99.
//
// No third-party client library: plain POSIX sockets with TCP_NODELAY, one
// request in flight per connection (no pipelining), large values sent and
// received in place (sendmsg of header + caller's span + trailer, recv straight
// into the caller's span). Every size read from the network is checked before
// it is used.
//
// The servers come from PATH (the only environment variable read here);
// tools/setup.sh installs the Debian packages redis-server and memcached.
#ifndef KVFABRIC_BENCH_KV_BASELINES_H_
#define KVFABRIC_BENCH_KV_BASELINES_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::bench {

enum class BaselineKind { kRedis, kMemcached };

// "redis" or "memcached" (for reports).
std::string_view BaselineKindName(BaselineKind kind);

// "redis-server" or "memcached".
std::string_view BaselineBinaryName(BaselineKind kind);

// The absolute path of `kind`'s server binary found on PATH (if PATH is unset:
// /usr/local/bin:/usr/bin:/bin). NotFound, with a message that names the
// binary and says to run tools/setup.sh, if there is none.
StatusOr<std::string> FindBaselineBinary(BaselineKind kind);

// The largest value either client accepts from the network or sends: Redis's
// default proto-max-bulk-len (512 MiB). memcached's own limit is -I 8m.
inline constexpr std::uint64_t kMaxBaselineValueBytes = std::uint64_t{512} << 20;

struct BaselineServerOptions {
  // memcached -m: item memory in MiB. Must hold every value the benchmark
  // keeps at once plus ~10% slab overhead, or memcached evicts (and a later
  // get finds NotFound). At least 16: memcached refuses an item limit (-I 8m)
  // above half of it. Default 1 GiB.
  std::uint64_t memcached_memory_mib = 1024;
  // memcached -t: worker threads. More than the client connections buys
  // nothing. Default 4.
  int memcached_threads = 4;
  // How long one start attempt waits for the server to answer PING/version.
  std::chrono::milliseconds start_timeout{10000};
  // Start attempts, each with a fresh port: a port found free may be taken by
  // another process before the server binds it, and the server then exits.
  int start_attempts = 3;
  // Where the server's temporary working directory (its log; Redis's --dir)
  // is created. Removed with everything in it when the server is destroyed.
  std::string temp_parent = "/tmp";
};

// BaselineServer: one redis-server or memcached child process.
//
// Start() picks a free loopback port (binds port 0, reads it, closes), makes
// a temporary directory, spawns the server there with stdin from /dev/null and
// stdout/stderr to <dir>/server.log, and waits, bounded, until a client's Ping
// succeeds. Redis runs without persistence (--save "" --appendonly no);
// memcached runs with UDP off and an 8 MiB item limit (-U 0 -I 8m). If the
// server exits before answering it is retried on a new port; the final error
// quotes the tail of its log.
//
// The child stays in this process's process group, so a terminal's Ctrl-C
// stops it too; a SIGKILLed benchmark leaves it running (pkill by its
// --dir/-p argument).
//
// Ownership: a BaselineServer owns its child and directory. The destructor
// sends SIGTERM, waits up to 5 s, then SIGKILLs, reaps the child and removes
// the directory.
//
// Thread safety: immutable after Start(); any thread may read port(). Clients
// on other threads may talk to the server while it lives.
class BaselineServer {
 public:
  // Unavailable if the server exited before answering on every attempt (each
  // attempt's log tail is in the message), DeadlineExceeded if it ran but did
  // not answer within start_timeout, NotFound if the binary is not installed,
  // InvalidArgument for bad options.
  static StatusOr<std::unique_ptr<BaselineServer>> Start(BaselineKind kind,
                                                         const BaselineServerOptions& options = {});

  BaselineServer(const BaselineServer&) = delete;
  BaselineServer& operator=(const BaselineServer&) = delete;
  ~BaselineServer();

  BaselineKind kind() const { return kind_; }
  // The server listens on 127.0.0.1:port().
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // The temporary working directory (holds server.log).
  const std::string& dir() const { return dir_; }

 private:
  BaselineServer(BaselineKind kind, std::string dir) : kind_(kind), dir_(std::move(dir)) {}
  // One attempt on `port`: spawn, then wait for Ping.
  Status StartOnce(const std::string& binary, std::uint16_t port,
                   const BaselineServerOptions& options);
  // SIGTERM, bounded wait, SIGKILL, reap. No-op when nothing runs.
  void Stop();
  std::string LogTail() const;

  const BaselineKind kind_;
  const std::string dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;  // > 0 while the child is unreaped
};

// BufferedSocket: a connected, blocking TCP socket (TCP_NODELAY, send and
// receive timeouts) with a read buffer for protocol header lines.
//
// Values bypass the buffer: ReadExact first takes what is buffered, then
// recv()s the rest straight into the destination.
//
// Ownership: owns the descriptor; move-constructible (to return it in a
// StatusOr), not assignable or copyable.
// Thread safety: one thread at a time.
class BufferedSocket {
 public:
  // Connects to host:port (numeric or resolvable host). `io_timeout` bounds
  // each blocking send and recv: a server that stops answering yields
  // DeadlineExceeded instead of a hang.
  static StatusOr<BufferedSocket> Connect(std::string_view host, std::uint16_t port,
                                          std::chrono::milliseconds io_timeout);

  BufferedSocket(BufferedSocket&& other) noexcept;
  BufferedSocket& operator=(BufferedSocket&&) = delete;
  BufferedSocket(const BufferedSocket&) = delete;
  BufferedSocket& operator=(const BufferedSocket&) = delete;
  ~BufferedSocket();

  // Sends every byte of every part, in order (one sendmsg per round, looping
  // on short writes; MSG_NOSIGNAL, so a closed peer is an error, not SIGPIPE).
  Status WriteAll(std::span<const std::span<const std::byte>> parts);
  Status WriteAll(std::string_view text);

  // The next line without its "\r\n". The view is valid until the next read.
  // DataLoss if no "\r\n" comes within `max_bytes` or a bare '\n' ends it.
  StatusOr<std::string_view> ReadLine(std::size_t max_bytes = 1024);
  // Exactly dst.size() bytes.
  Status ReadExact(std::span<std::byte> dst);
  // Reads and drops exactly `bytes` bytes.
  Status Discard(std::uint64_t bytes);

 private:
  explicit BufferedSocket(int fd);
  // Appends at least one byte to the buffer.
  Status Fill();
  Status RecvError(int err, std::string_view what) const;

  int fd_ = -1;
  std::unique_ptr<char[]> buf_;
  std::size_t begin_ = 0;  // unread bytes are buf_[begin_, end_)
  std::size_t end_ = 0;
  std::chrono::milliseconds io_timeout_{0};
};

// BaselineClient: one connection to a baseline server, one request at a time.
//
// Set stores `value` under `key`; Get copies the value into `dst` and returns
// its length: NotFound if the key is absent, ResourceExhausted if the value
// is longer than dst (it is read and dropped, the connection stays usable).
// A protocol error, a short read or an I/O error leaves the connection
// unusable: later calls return FailedPrecondition quoting the first error.
//
// Ownership: owns its socket. Thread safety: one thread at a time; use one
// client per thread.
class BaselineClient {
 public:
  // A RedisClient or MemcachedClient for `kind`.
  static StatusOr<std::unique_ptr<BaselineClient>> Connect(
      BaselineKind kind, std::string_view host, std::uint16_t port,
      std::chrono::milliseconds io_timeout = std::chrono::seconds(30));

  virtual ~BaselineClient() = default;
  virtual Status Set(std::string_view key, std::span<const std::byte> value) = 0;
  virtual StatusOr<std::size_t> Get(std::string_view key, std::span<std::byte> dst) = 0;
  // Drops every key on the server.
  virtual Status FlushAll() = 0;
  // A round trip that touches no data (Redis PING, memcached version).
  virtual Status Ping() = 0;

 protected:
  explicit BaselineClient(BufferedSocket socket) : socket_(std::move(socket)) {}
  // FailedPrecondition if an earlier error broke the connection.
  Status CheckUsable() const;
  // Records `s` as the connection-breaking error and returns it.
  Status Break(Status s);
  // Reads a value of `len` bytes announced by a reply header, and the "\r\n"
  // after it, into dst; a value longer than dst is read and dropped. Returns
  // whether it fit. DataLoss (breaking the connection) if len exceeds
  // kMaxBaselineValueBytes or the "\r\n" is missing. `what` prefixes errors.
  StatusOr<bool> ReadValue(std::uint64_t len, std::span<std::byte> dst, std::string_view what);

  BufferedSocket socket_;
  Status broken_;  // OK while usable
};

// RESP2 over TCP: SET/GET with binary-safe bulk strings, FLUSHALL, PING.
// Redis error replies ("-ERR ...") become Internal with the server's text
// (the connection stays usable).
class RedisClient final : public BaselineClient {
 public:
  static StatusOr<std::unique_ptr<RedisClient>> Connect(
      std::string_view host, std::uint16_t port,
      std::chrono::milliseconds io_timeout = std::chrono::seconds(30));

  // REQUIRES: value.size() <= kMaxBaselineValueBytes.
  Status Set(std::string_view key, std::span<const std::byte> value) override;
  StatusOr<std::size_t> Get(std::string_view key, std::span<std::byte> dst) override;
  Status FlushAll() override;
  Status Ping() override;

 private:
  explicit RedisClient(BufferedSocket socket) : BaselineClient(std::move(socket)) {}
  // Reads a simple-string reply and checks it equals `expected`.
  Status ExpectSimple(std::string_view command, std::string_view expected);
};

// memcached's text protocol: set (flags 0, no expiry), get, flush_all,
// version. Keys are 1..250 bytes with no spaces or control characters
// (InvalidArgument otherwise). "SERVER_ERROR ..." to a set (too large, out of
// memory) is ResourceExhausted with the server's text; memcached has read
// and dropped the value, so the connection stays usable.
class MemcachedClient final : public BaselineClient {
 public:
  static StatusOr<std::unique_ptr<MemcachedClient>> Connect(
      std::string_view host, std::uint16_t port,
      std::chrono::milliseconds io_timeout = std::chrono::seconds(30));

  // REQUIRES: value.size() <= kMaxBaselineValueBytes.
  Status Set(std::string_view key, std::span<const std::byte> value) override;
  StatusOr<std::size_t> Get(std::string_view key, std::span<std::byte> dst) override;
  Status FlushAll() override;
  Status Ping() override;

 private:
  explicit MemcachedClient(BufferedSocket socket) : BaselineClient(std::move(socket)) {}
};

// --- The harness ---

// The key RunBaseline uses for block `index`: "kvf-baseline-<index>".
std::string BaselineKey(std::uint64_t index);

// The value RunBaseline stores for block `index`, of dst.size() bytes: a body
// that depends only on the byte offset, with the first 8 and the last 8 bytes
// (fewer for shorter values) replaced by words derived from `index`. A reader
// can then check a value's identity cheaply (StampedEndsMatch) and a test can
// check it in full (compare with FillBaselineValue's output).
void FillBaselineValue(std::uint64_t index, std::span<std::byte> dst);
// Rewrites only the index-derived ends of a FillBaselineValue buffer for
// another index: O(1), so the timed put loop does not fill whole values.
void StampBaselineValue(std::uint64_t index, std::span<std::byte> value);
// Whether the index-derived ends of `value` match `index`.
bool StampedEndsMatch(std::uint64_t index, std::span<const std::byte> value);

enum class BaselineOp { kPut, kGet };

struct BaselineResult {
  double gbps = 0;    // value bytes moved / wall seconds / 1e9
  double p50_us = 0;  // per-operation latency, microseconds
  double p99_us = 0;
  std::uint64_t ops = 0;  // completed operations (= keys)
};

// Runs `op` once over keys 0 .. total_bytes / value_bytes - 1 against the
// server of `kind` on 127.0.0.1:port, with min(connections, keys) threads,
// each with its own client and a contiguous share of the keys. Connecting is
// not timed; the wall clock runs from when every thread is connected until
// the last one finishes.
//   put: SET of every key with its FillBaselineValue value, sent from one
//        per-thread buffer of value_bytes that stays in cache. A first put
//        writes fresh memory on the server (page faults): callers warm up with
//        one untimed put and report a second, overwriting one. With
//        ring_bytes > value_bytes each thread instead sends value after value
//        from the next slot of its own ring of that many bytes (every slot
//        filled before the clock starts), wrapping around: the values are
//        read from distinct, mostly cold memory, as kvfabric's write-back
//        reads a history's blocks from the client's history pool.
//   get: GET of every key into a per-thread buffer of value_bytes, checking
//        the length and StampedEndsMatch: DataLoss if either is wrong,
//        NotFound (with the key) if a key is absent (run a put first, or the
//        server evicted: raise memcached_memory_mib). With ring_bytes >
//        value_bytes each thread instead receives value after value into the
//        next slot of its own ring of that many bytes, wrapping around: the
//        values land in distinct, mostly cold memory, as kvfabric's blocks
//        land in a client's staging region, rather than in one buffer that
//        stays in cache.
// Latency is per request, send to last byte of the reply; p50/p99 are nearest
// rank over all operations. The first error of any thread stops the others
// at their next operation and is returned.
// REQUIRES: 0 < value_bytes <= total_bytes, value_bytes <=
// kMaxBaselineValueBytes, connections >= 1.
StatusOr<BaselineResult> RunBaseline(BaselineKind kind, BaselineOp op, std::uint16_t port,
                                     std::uint64_t value_bytes, std::uint64_t total_bytes,
                                     int connections, std::uint64_t ring_bytes = 0);

}  // namespace kvfabric::bench

#endif  // KVFABRIC_BENCH_KV_BASELINES_H_
