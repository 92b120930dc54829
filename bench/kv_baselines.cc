#include "bench/kv_baselines.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <latch>
#include <thread>
#include <utility>
#include <vector>

#include "core/errno_status.h"

namespace kvfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadBufferBytes = 64 * 1024;
constexpr std::size_t kMaxMemcachedKeyBytes = 250;
// A reply header line: "$536870912", "VALUE <250-byte key> 0 536870912", an
// error text. Longer means the stream is not what we think it is.
constexpr std::size_t kMaxHeaderLineBytes = 1024;

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Parses a whole decimal number in [0, UINT64_MAX]; nothing else accepted
// (no sign, no spaces, no empty string).
bool ParseU64(std::string_view s, std::uint64_t* out) {
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Quotes `line` for an error message, cut at 200 bytes.
std::string Quote(std::string_view line) {
  std::string q = "\"";
  for (char c : line.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      q += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
      q += hex;
    }
  }
  if (line.size() > 200) q += "...";
  return q + "\"";
}

// --- Values ---

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t HeadWord(std::uint64_t index) { return SplitMix64(index * 2 + 0x1000); }
std::uint64_t TailWord(std::uint64_t index) { return SplitMix64(index * 2 + 0x1001); }

// The value's ends: [0, min(8, n)) from HeadWord, then [n - min(8, n), n)
// from TailWord (for n < 16 the tail overwrites part of the head).
void StampEnds(std::uint64_t index, std::span<std::byte> v) {
  const std::size_t k = std::min<std::size_t>(8, v.size());
  const std::uint64_t head = HeadWord(index);
  const std::uint64_t tail = TailWord(index);
  std::memcpy(v.data(), &head, k);
  std::memcpy(v.data() + v.size() - k, &tail, k);
}

// --- Client helpers ---

Status ValidateMemcachedKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxMemcachedKeyBytes) {
    return Status::InvalidArgument("memcached key of " + std::to_string(key.size()) +
                                   " bytes: must be 1.." + std::to_string(kMaxMemcachedKeyBytes));
  }
  for (char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return Status::InvalidArgument("memcached key " + Quote(key) +
                                     " has a space or control character");
    }
  }
  return Status::OK();
}

Status CheckValueSize(std::size_t bytes) {
  if (bytes > kMaxBaselineValueBytes) {
    return Status::InvalidArgument("value of " + std::to_string(bytes) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kMaxBaselineValueBytes));
  }
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------------------
// BufferedSocket

StatusOr<BufferedSocket> BufferedSocket::Connect(std::string_view host, std::uint16_t port,
                                                 std::chrono::milliseconds io_timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string host_str(host);
  const std::string where = host_str + ":" + std::to_string(port);
  const int gai = ::getaddrinfo(host_str.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    return Status::InvalidArgument("resolve " + where + ": " + ::gai_strerror(gai));
  }
  Status last = Status::Unavailable("no address for " + where);
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = StatusFromErrno(errno, "socket");
      continue;
    }
    int rc;
    do {
      rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) break;
    last = StatusFromErrno(errno, "connect " + where);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) return last;
  BufferedSocket sock(fd);
  sock.io_timeout_ = io_timeout;
  const int one = 1;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(io_timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((io_timeout.count() % 1000) * 1000);
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return StatusFromErrno(errno, "setsockopt on " + where);
  }
  return sock;
}

BufferedSocket::BufferedSocket(int fd) : fd_(fd), buf_(new char[kReadBufferBytes]) {}

BufferedSocket::BufferedSocket(BufferedSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      buf_(std::move(other.buf_)),
      begin_(std::exchange(other.begin_, 0)),
      end_(std::exchange(other.end_, 0)),
      io_timeout_(other.io_timeout_) {}

BufferedSocket::~BufferedSocket() {
  if (fd_ >= 0) ::close(fd_);
}

Status BufferedSocket::RecvError(int err, std::string_view what) const {
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return Status::DeadlineExceeded(std::string(what) + ": nothing for " +
                                    std::to_string(io_timeout_.count()) + " ms (io_timeout)");
  }
  return StatusFromErrno(err, what);
}

Status BufferedSocket::WriteAll(std::string_view text) {
  const std::span<const std::byte> part = AsBytes(text);
  return WriteAll(std::span<const std::span<const std::byte>>(&part, 1));
}

Status BufferedSocket::WriteAll(std::span<const std::span<const std::byte>> parts) {
  constexpr std::size_t kMaxIov = 8;
  std::size_t part = 0;
  std::size_t offset = 0;  // into parts[part]
  while (true) {
    while (part < parts.size() && offset == parts[part].size()) {
      ++part;
      offset = 0;
    }
    if (part == parts.size()) return Status::OK();
    iovec iov[kMaxIov];
    std::size_t n_iov = 0;
    for (std::size_t p = part, off = offset; p < parts.size() && n_iov < kMaxIov; ++p, off = 0) {
      if (parts[p].size() == off) continue;
      iov[n_iov].iov_base = const_cast<std::byte*>(parts[p].data() + off);
      iov[n_iov].iov_len = parts[p].size() - off;
      ++n_iov;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return RecvError(errno, "send");
    }
    // Advance past `sent` bytes.
    auto left = static_cast<std::size_t>(sent);
    while (left > 0) {
      const std::size_t here = std::min(left, parts[part].size() - offset);
      offset += here;
      left -= here;
      if (offset == parts[part].size()) {
        ++part;
        offset = 0;
      }
    }
  }
}

Status BufferedSocket::Fill() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (end_ == kReadBufferBytes) {
    std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  while (true) {
    const ssize_t n = ::recv(fd_, buf_.get() + end_, kReadBufferBytes - end_, 0);
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return Status::OK();
    }
    if (n == 0) return Status::Unavailable("server closed the connection");
    if (errno != EINTR) return RecvError(errno, "recv");
  }
}

StatusOr<std::string_view> BufferedSocket::ReadLine(std::size_t max_bytes) {
  max_bytes = std::min(max_bytes, kReadBufferBytes - 2);
  std::size_t scanned = 0;  // bytes of [begin_, end_) known to hold no '\n'
  while (true) {
    const char* start = buf_.get() + begin_;
    const std::size_t avail = end_ - begin_;
    const void* nl = std::memchr(start + scanned, '\n', avail - scanned);
    if (nl != nullptr) {
      const auto len = static_cast<std::size_t>(static_cast<const char*>(nl) - start);
      if (len == 0 || start[len - 1] != '\r') {
        return Status::DataLoss("reply line " + Quote(std::string_view(start, len)) +
                                " ends in a bare \\n, not \\r\\n");
      }
      begin_ += len + 1;
      return std::string_view(start, len - 1);
    }
    scanned = avail;
    if (avail > max_bytes + 1) {
      return Status::DataLoss("reply line longer than " + std::to_string(max_bytes) +
                              " bytes: " + Quote(std::string_view(start, avail)));
    }
    KVF_RETURN_IF_ERROR(Fill());
  }
}

Status BufferedSocket::ReadExact(std::span<std::byte> dst) {
  const std::size_t buffered = std::min(dst.size(), end_ - begin_);
  std::memcpy(dst.data(), buf_.get() + begin_, buffered);
  begin_ += buffered;
  std::size_t got = buffered;
  while (got < dst.size()) {
    const ssize_t n = ::recv(fd_, dst.data() + got, dst.size() - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return Status::Unavailable("server closed the connection after " + std::to_string(got) +
                                 " of " + std::to_string(dst.size()) + " value bytes");
    } else if (errno != EINTR) {
      return RecvError(errno, "recv value");
    }
  }
  return Status::OK();
}

Status BufferedSocket::Discard(std::uint64_t bytes) {
  while (bytes > 0) {
    if (begin_ == end_) KVF_RETURN_IF_ERROR(Fill());
    const std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>(bytes, end_ - begin_));
    begin_ += take;
    bytes -= take;
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// BaselineClient

StatusOr<std::unique_ptr<BaselineClient>> BaselineClient::Connect(
    BaselineKind kind, std::string_view host, std::uint16_t port,
    std::chrono::milliseconds io_timeout) {
  if (kind == BaselineKind::kRedis) {
    KVF_ASSIGN_OR_RETURN(auto c, RedisClient::Connect(host, port, io_timeout));
    return std::unique_ptr<BaselineClient>(std::move(c));
  }
  KVF_ASSIGN_OR_RETURN(auto c, MemcachedClient::Connect(host, port, io_timeout));
  return std::unique_ptr<BaselineClient>(std::move(c));
}

Status BaselineClient::CheckUsable() const {
  if (broken_.ok()) return Status::OK();
  return Status::FailedPrecondition("connection unusable after an earlier error: " +
                                    broken_.ToString());
}

Status BaselineClient::Break(Status s) {
  if (broken_.ok()) broken_ = s;
  return s;
}

StatusOr<bool> BaselineClient::ReadValue(std::uint64_t len, std::span<std::byte> dst,
                                         std::string_view what) {
  if (len > kMaxBaselineValueBytes) {
    return Break(Status::DataLoss(std::string(what) + ": value length " + std::to_string(len) +
                                  " exceeds the limit of " +
                                  std::to_string(kMaxBaselineValueBytes)));
  }
  const bool fits = len <= dst.size();
  Status s =
      fits ? socket_.ReadExact(dst.first(static_cast<std::size_t>(len))) : socket_.Discard(len);
  std::byte crlf[2];
  if (s.ok()) s = socket_.ReadExact(crlf);
  if (!s.ok()) return Break(s.WithContext(what));
  if (crlf[0] != std::byte{'\r'} || crlf[1] != std::byte{'\n'}) {
    return Break(Status::DataLoss(std::string(what) + ": value of " + std::to_string(len) +
                                  " bytes not followed by \\r\\n"));
  }
  return fits;
}

namespace {

Status DoesNotFit(std::string_view what, std::string_view key, std::uint64_t len,
                  std::size_t dst_bytes) {
  return Status::ResourceExhausted(std::string(what) + " " + Quote(key) + ": value of " +
                                   std::to_string(len) + " bytes does not fit dst of " +
                                   std::to_string(dst_bytes));
}

}  // namespace

// ---------------------------------------------------------------------------
// RedisClient

namespace {

// A RESP error reply ("-ERR ...", "-OOM ...") as a Status.
Status RedisErrorReply(std::string_view command, std::string_view line) {
  const std::string msg = "redis " + std::string(command) + ": " + std::string(line.substr(1));
  if (line.substr(1, 3) == "OOM") return Status::ResourceExhausted(msg);
  return Status::Internal(msg);
}

std::string BulkHeader(std::size_t bytes) { return "$" + std::to_string(bytes) + "\r\n"; }

}  // namespace

StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(std::string_view host,
                                                            std::uint16_t port,
                                                            std::chrono::milliseconds io_timeout) {
  KVF_ASSIGN_OR_RETURN(BufferedSocket sock, BufferedSocket::Connect(host, port, io_timeout));
  return std::unique_ptr<RedisClient>(new RedisClient(std::move(sock)));
}

Status RedisClient::ExpectSimple(std::string_view command, std::string_view expected) {
  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("redis " + std::string(command)));
  if (!line->empty() && (*line)[0] == '-') return RedisErrorReply(command, *line);
  if (line->size() == expected.size() + 1 && (*line)[0] == '+' && line->substr(1) == expected) {
    return Status::OK();
  }
  return Break(Status::DataLoss("redis " + std::string(command) + ": expected +" +
                                std::string(expected) + ", got " + Quote(*line)));
}

Status RedisClient::Set(std::string_view key, std::span<const std::byte> value) {
  KVF_RETURN_IF_ERROR(CheckUsable());
  KVF_RETURN_IF_ERROR(CheckValueSize(value.size()));
  const std::string head = "*3\r\n$3\r\nSET\r\n" + BulkHeader(key.size());
  const std::string value_head = "\r\n" + BulkHeader(value.size());
  const std::span<const std::byte> parts[] = {AsBytes(head), AsBytes(key), AsBytes(value_head),
                                              value, AsBytes("\r\n")};
  const Status s = socket_.WriteAll(parts);
  if (!s.ok()) return Break(s.WithContext("redis SET"));
  return ExpectSimple("SET", "OK");
}

StatusOr<std::size_t> RedisClient::Get(std::string_view key, std::span<std::byte> dst) {
  KVF_RETURN_IF_ERROR(CheckUsable());
  const std::string head = "*2\r\n$3\r\nGET\r\n" + BulkHeader(key.size());
  const std::span<const std::byte> parts[] = {AsBytes(head), AsBytes(key), AsBytes("\r\n")};
  const Status s = socket_.WriteAll(parts);
  if (!s.ok()) return Break(s.WithContext("redis GET"));

  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("redis GET"));
  if (!line->empty() && (*line)[0] == '-') return RedisErrorReply("GET", *line);
  if (*line == "$-1") return Status::NotFound("redis GET " + Quote(key) + ": no such key");
  std::uint64_t len = 0;
  if (line->empty() || (*line)[0] != '$' || !ParseU64(line->substr(1), &len)) {
    return Break(Status::DataLoss("redis GET: expected a bulk string header, got " + Quote(*line)));
  }
  KVF_ASSIGN_OR_RETURN(const bool fits, ReadValue(len, dst, "redis GET"));
  if (!fits) return DoesNotFit("redis GET", key, len, dst.size());
  return static_cast<std::size_t>(len);
}

Status RedisClient::FlushAll() {
  KVF_RETURN_IF_ERROR(CheckUsable());
  const Status s = socket_.WriteAll("*1\r\n$8\r\nFLUSHALL\r\n");
  if (!s.ok()) return Break(s.WithContext("redis FLUSHALL"));
  return ExpectSimple("FLUSHALL", "OK");
}

Status RedisClient::Ping() {
  KVF_RETURN_IF_ERROR(CheckUsable());
  const Status s = socket_.WriteAll("*1\r\n$4\r\nPING\r\n");
  if (!s.ok()) return Break(s.WithContext("redis PING"));
  return ExpectSimple("PING", "PONG");
}

// ---------------------------------------------------------------------------
// MemcachedClient

StatusOr<std::unique_ptr<MemcachedClient>> MemcachedClient::Connect(
    std::string_view host, std::uint16_t port, std::chrono::milliseconds io_timeout) {
  KVF_ASSIGN_OR_RETURN(BufferedSocket sock, BufferedSocket::Connect(host, port, io_timeout));
  return std::unique_ptr<MemcachedClient>(new MemcachedClient(std::move(sock)));
}

Status MemcachedClient::Set(std::string_view key, std::span<const std::byte> value) {
  KVF_RETURN_IF_ERROR(CheckUsable());
  KVF_RETURN_IF_ERROR(ValidateMemcachedKey(key));
  KVF_RETURN_IF_ERROR(CheckValueSize(value.size()));
  const std::string head =
      "set " + std::string(key) + " 0 0 " + std::to_string(value.size()) + "\r\n";
  const std::span<const std::byte> parts[] = {AsBytes(head), value, AsBytes("\r\n")};
  const Status s = socket_.WriteAll(parts);
  if (!s.ok()) return Break(s.WithContext("memcached set"));
  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("memcached set"));
  if (*line == "STORED") return Status::OK();
  if (line->rfind("SERVER_ERROR", 0) == 0) {
    return Status::ResourceExhausted(
        "memcached set " + Quote(key) + " of " + std::to_string(value.size()) +
        " bytes: " + std::string(*line) + " (raise memcached_memory_mib; -I 8m)");
  }
  // CLIENT_ERROR may leave memcached reading our value as commands.
  return Break(Status::DataLoss("memcached set: expected STORED, got " + Quote(*line)));
}

StatusOr<std::size_t> MemcachedClient::Get(std::string_view key, std::span<std::byte> dst) {
  KVF_RETURN_IF_ERROR(CheckUsable());
  KVF_RETURN_IF_ERROR(ValidateMemcachedKey(key));
  const std::string request = "get " + std::string(key) + "\r\n";
  const Status s = socket_.WriteAll(request);
  if (!s.ok()) return Break(s.WithContext("memcached get"));

  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("memcached get"));
  if (*line == "END") return Status::NotFound("memcached get " + Quote(key) + ": no such key");
  // "VALUE <key> <flags> <bytes>" (a fourth number, the CAS, only for gets).
  std::string_view rest = *line;
  const std::string_view prefix = "VALUE ";
  const std::string expect_key = std::string(key) + " ";
  std::uint64_t flags = 0;
  std::uint64_t len = 0;
  bool well_formed = rest.substr(0, prefix.size()) == prefix;
  if (well_formed) {
    rest.remove_prefix(prefix.size());
    well_formed = rest.substr(0, expect_key.size()) == expect_key;
  }
  if (well_formed) {
    rest.remove_prefix(expect_key.size());
    const std::size_t sp = rest.find(' ');
    well_formed = sp != std::string_view::npos && ParseU64(rest.substr(0, sp), &flags) &&
                  ParseU64(rest.substr(sp + 1), &len);
  }
  if (!well_formed) {
    return Break(Status::DataLoss("memcached get " + Quote(key) +
                                  ": expected \"VALUE <key> <flags> <bytes>\" or END, got " +
                                  Quote(*line)));
  }
  KVF_ASSIGN_OR_RETURN(const bool fits, ReadValue(len, dst, "memcached get"));
  line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("memcached get"));
  if (*line != "END") {
    return Break(
        Status::DataLoss("memcached get: expected END after the value, got " + Quote(*line)));
  }
  if (!fits) return DoesNotFit("memcached get", key, len, dst.size());
  return static_cast<std::size_t>(len);
}

Status MemcachedClient::FlushAll() {
  KVF_RETURN_IF_ERROR(CheckUsable());
  const Status s = socket_.WriteAll("flush_all\r\n");
  if (!s.ok()) return Break(s.WithContext("memcached flush_all"));
  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("memcached flush_all"));
  if (*line != "OK") {
    return Break(Status::DataLoss("memcached flush_all: expected OK, got " + Quote(*line)));
  }
  return Status::OK();
}

Status MemcachedClient::Ping() {
  KVF_RETURN_IF_ERROR(CheckUsable());
  const Status s = socket_.WriteAll("version\r\n");
  if (!s.ok()) return Break(s.WithContext("memcached version"));
  auto line = socket_.ReadLine(kMaxHeaderLineBytes);
  if (!line.ok()) return Break(line.status().WithContext("memcached version"));
  if (line->rfind("VERSION ", 0) != 0) {
    return Break(Status::DataLoss("memcached version: expected VERSION, got " + Quote(*line)));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Harness

std::string BaselineKey(std::uint64_t index) { return "kvf-baseline-" + std::to_string(index); }

void FillBaselineValue(std::uint64_t index, std::span<std::byte> dst) {
  // The body depends on the offset only, so one buffer serves every key once
  // StampBaselineValue rewrites its ends.
  std::size_t i = 0;
  for (std::uint64_t word = 0; i < dst.size(); ++word) {
    const std::uint64_t w = SplitMix64(word);
    const std::size_t k = std::min<std::size_t>(8, dst.size() - i);
    std::memcpy(dst.data() + i, &w, k);
    i += k;
  }
  StampEnds(index, dst);
}

void StampBaselineValue(std::uint64_t index, std::span<std::byte> value) {
  // Every byte StampEnds may have written for another index it writes again.
  StampEnds(index, value);
}

bool StampedEndsMatch(std::uint64_t index, std::span<const std::byte> value) {
  const std::size_t k = std::min<std::size_t>(8, value.size());
  const std::uint64_t head = HeadWord(index);
  const std::uint64_t tail = TailWord(index);
  // For short values the tail was written last and may cover the head.
  const std::size_t head_only = value.size() >= 16 ? k : value.size() - k;
  return std::memcmp(value.data(), &head, head_only) == 0 &&
         std::memcmp(value.data() + value.size() - k, &tail, k) == 0;
}

namespace {

struct WorkerResult {
  Status status;
  std::vector<double> latencies_us;
};

// One connection's share [first, last) of the keys, after `go` opens.
void RunWorker(BaselineKind kind, BaselineOp op, std::uint16_t port, std::uint64_t value_bytes,
               std::uint64_t ring_bytes, std::uint64_t first, std::uint64_t last,
               std::latch& connected, std::latch& go, std::atomic<bool>& stop, WorkerResult& out) {
  auto client = BaselineClient::Connect(kind, "127.0.0.1", port);
  // GETs land in, and PUTs are sent from, slot after slot of the ring; one
  // slot when it is no larger than a value. Touched (PUT: filled) once here,
  // so no request pays for page faults.
  const std::uint64_t slots = std::max<std::uint64_t>(1, ring_bytes / value_bytes);
  std::vector<std::byte> ring(static_cast<std::size_t>(slots * value_bytes), std::byte{0});
  auto slot_bytes = [&](std::uint64_t s) {
    return std::span<std::byte>(ring.data() + s * value_bytes,
                                static_cast<std::size_t>(value_bytes));
  };
  std::span<std::byte> buf = slot_bytes(0);
  std::uint64_t slot = 0;
  if (client.ok() && op == BaselineOp::kPut) {
    for (std::uint64_t s = 0; s < slots; ++s) FillBaselineValue(first + s, slot_bytes(s));
  }
  out.latencies_us.reserve(static_cast<std::size_t>(last - first));
  connected.count_down();
  go.wait();
  if (!client.ok()) {
    out.status = client.status().WithContext("connect to " + std::string(BaselineKindName(kind)) +
                                             " on 127.0.0.1:" + std::to_string(port));
    stop.store(true, std::memory_order_relaxed);
    return;
  }
  BaselineClient& c = **client;
  for (std::uint64_t i = first; i < last; ++i) {
    // Relaxed: a hint to give up early; results are read after join().
    if (stop.load(std::memory_order_relaxed)) return;
    const std::string key = BaselineKey(i);
    Status s;
    const Clock::time_point t0 = Clock::now();
    buf = slot_bytes(slot);
    slot = (slot + 1) % slots;
    if (op == BaselineOp::kPut) {
      StampBaselineValue(i, buf);
      s = c.Set(key, buf);
    } else {
      auto n = c.Get(key, buf);
      if (!n.ok()) {
        s = n.status();
        if (s.IsNotFound()) {
          s = s.WithContext("key " + std::to_string(i) +
                            " (run a put first; memcached may have evicted it: raise "
                            "memcached_memory_mib)");
        }
      } else if (*n != value_bytes) {
        s = Status::DataLoss("get " + key + " returned " + std::to_string(*n) +
                             " bytes, expected " + std::to_string(value_bytes));
      } else if (!StampedEndsMatch(i, buf)) {
        s = Status::DataLoss("get " + key + ": first/last 8 bytes are not that key's pattern");
      }
    }
    const Clock::time_point t1 = Clock::now();
    if (!s.ok()) {
      out.status = s;
      stop.store(true, std::memory_order_relaxed);
      return;
    }
    out.latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
}

// Nearest rank: the smallest sample with at least per_mille / 1000 of all
// samples at or below it. REQUIRES: !v.empty(); reorders v.
double Percentile(std::vector<double>& v, std::size_t per_mille) {
  // Integer arithmetic: ceil(0.99 * 100) in doubles can come out as 100.
  std::size_t rank = (v.size() * per_mille + 999) / 1000;
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank - 1), v.end());
  return v[rank - 1];
}

}  // namespace

StatusOr<BaselineResult> RunBaseline(BaselineKind kind, BaselineOp op, std::uint16_t port,
                                     std::uint64_t value_bytes, std::uint64_t total_bytes,
                                     int connections, std::uint64_t ring_bytes) {
  if (value_bytes == 0 || value_bytes > total_bytes || value_bytes > kMaxBaselineValueBytes) {
    return Status::InvalidArgument("value_bytes = " + std::to_string(value_bytes) +
                                   " with total_bytes = " + std::to_string(total_bytes) +
                                   ": need 0 < value_bytes <= total_bytes and value_bytes <= " +
                                   std::to_string(kMaxBaselineValueBytes));
  }
  if (connections < 1) {
    return Status::InvalidArgument("connections = " + std::to_string(connections) +
                                   ": must be at least 1");
  }
  const std::uint64_t keys = total_bytes / value_bytes;
  const auto threads =
      static_cast<std::size_t>(std::min<std::uint64_t>(keys, static_cast<unsigned>(connections)));

  std::vector<WorkerResult> results(threads);
  std::latch connected(static_cast<std::ptrdiff_t>(threads));
  std::latch go(1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (std::size_t t = 0; t < threads; ++t) {
    const std::uint64_t first = keys * t / threads;
    const std::uint64_t last = keys * (t + 1) / threads;
    workers.emplace_back(RunWorker, kind, op, port, value_bytes, ring_bytes, first, last,
                         std::ref(connected), std::ref(go), std::ref(stop), std::ref(results[t]));
  }
  connected.wait();
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> all;
  all.reserve(static_cast<std::size_t>(keys));
  for (WorkerResult& r : results) {
    KVF_RETURN_IF_ERROR(r.status);
    all.insert(all.end(), r.latencies_us.begin(), r.latencies_us.end());
  }
  BaselineResult result;
  result.ops = all.size();
  result.gbps = seconds > 0 ? static_cast<double>(result.ops * value_bytes) / seconds / 1e9 : 0;
  result.p50_us = Percentile(all, 500);
  result.p99_us = Percentile(all, 990);
  return result;
}

}  // namespace kvfabric::bench
