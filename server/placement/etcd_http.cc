#include "server/placement/etcd_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <utility>

#include "core/errno_status.h"

namespace kvfabric::placement {

using etcd_http::kMaxHeadBytes;
using etcd_http::kMaxLineBytes;
using etcd_http::Ms;
using etcd_http::ParseDecimal;

namespace {

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool etcd_http::NestingWithin(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escape = false;
  for (const char c : text) {
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

StatusOr<std::optional<std::string>> etcd_http::JsonObjectSplitter::Next() {
  for (; scan_ < buf_.size(); ++scan_) {
    const char c = buf_[scan_];
    if (depth_ == 0) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
      if (c != '{') return Status::Unavailable("unexpected byte between streamed messages");
      start_ = scan_;
      depth_ = 1;
    } else if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      if (++depth_ > kMaxJsonDepth) return Status::Unavailable("streamed message nests too deep");
    } else if ((c == '}' || c == ']') && --depth_ == 0) {
      std::string message = buf_.substr(start_, scan_ + 1 - start_);
      buf_.erase(0, scan_ + 1);
      scan_ = 0;
      start_ = 0;
      return std::optional<std::string>(std::move(message));
    }
  }
  if (depth_ == 0) {  // only whitespace so far
    buf_.clear();
    scan_ = 0;
  } else {
    buf_.erase(0, start_);
    scan_ -= start_;
    start_ = 0;
    if (buf_.size() > max_bytes_) {
      return Status::Unavailable("streamed message over " + std::to_string(max_bytes_) +
                                 " bytes (EtcdClientOptions::max_response_bytes)");
    }
  }
  return std::optional<std::string>();
}

StatusOr<std::unique_ptr<EtcdHttpStream>> EtcdHttpStream::Connect(
    const std::string& host, const std::string& port, std::chrono::milliseconds connect_timeout,
    std::string context, std::size_t max_body) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs);
  if (gai != 0) {
    return Status::Unavailable(context + ": cannot resolve " + host + ": " + gai_strerror(gai));
  }
  const Clock::time_point deadline = Clock::now() + connect_timeout;
  int fd = -1;
  Status failure = Status::Unavailable(context + ": no address to connect to");
  for (addrinfo* a = addrs; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      failure = Status::Unavailable(context + ": " +
                                    std::string(StatusFromErrno(errno, "socket").message()));
      continue;
    }
    int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    while (err == EINPROGRESS) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd, POLLOUT, 0};
      const int r = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) {
        err = ETIMEDOUT;
      } else if (r < 0) {
        err = errno;
      } else {
        socklen_t len = sizeof(err);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err != 0) {
      failure = Status::Unavailable(context + ": " +
                                    (err == ETIMEDOUT
                                         ? "connect timed out after " + Ms(connect_timeout) +
                                               " (EtcdClientOptions::connect_timeout)"
                                         : std::string(StatusFromErrno(err, "connect").message())));
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(addrs);
  if (fd < 0) return failure;
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best effort: latency only
  return std::unique_ptr<EtcdHttpStream>(new EtcdHttpStream(fd, std::move(context), max_body));
}

EtcdHttpStream::EtcdHttpStream(int fd, std::string context, std::size_t max_body)
    : fd_(fd), context_(std::move(context)), max_body_(max_body), splitter_(max_body) {}

EtcdHttpStream::~EtcdHttpStream() { ::close(fd_); }

void EtcdHttpStream::SetDeadline(std::optional<Clock::time_point> deadline,
                                 std::chrono::milliseconds budget) {
  deadline_ = deadline;
  budget_ = budget;
}

Status EtcdHttpStream::Error(std::string_view what) const {
  return Status::Unavailable(context_ + ": " + std::string(what));
}

void EtcdHttpStream::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

Status EtcdHttpStream::Send(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return Error(StatusFromErrno(errno, "send").message());
    } else {
      KVF_RETURN_IF_ERROR(Wait(POLLOUT));
    }
  }
  return Status::OK();
}

Status EtcdHttpStream::ReadHead() {
  std::size_t end;
  while ((end = buf_.find("\r\n\r\n", pos_)) == std::string::npos) {
    if (buf_.size() - pos_ > kMaxHeadBytes) return Error("response head over 64 KiB");
    KVF_RETURN_IF_ERROR(FillOrFail());
  }
  const std::string head = buf_.substr(pos_, end - pos_);
  pos_ = end + 4;
  std::size_t line_end = head.find("\r\n");
  const std::string_view status_line = std::string_view(head).substr(0, line_end);
  // "HTTP/1.1 200 OK": version, one space, three digits, then a space or nothing.
  if (status_line.size() < 12 || status_line.substr(0, 7) != "HTTP/1." || status_line[8] != ' ' ||
      (status_line.size() > 12 && status_line[12] != ' ') ||
      !ParseDecimal(status_line.substr(9, 3), &status_code_)) {
    return Error("malformed HTTP status line \"" + std::string(status_line.substr(0, 80)) + "\"");
  }
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
  while (line_end != std::string::npos) {
    const std::size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    const std::string_view line = std::string_view(head).substr(start, line_end - start);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return Error("malformed HTTP header");
    const std::string name = ToLower(line.substr(0, colon));
    const std::string_view value = Trim(line.substr(colon + 1));
    if (name == "content-length") {
      std::uint64_t n = 0;
      if (!ParseDecimal(value, &n) || (content_length && *content_length != n)) {
        return Error("bad Content-Length \"" + std::string(value.substr(0, 40)) + "\"");
      }
      content_length = n;
    } else if (name == "transfer-encoding") {
      if (ToLower(value) != "chunked") {
        return Error("unsupported Transfer-Encoding \"" + std::string(value.substr(0, 40)) + "\"");
      }
      chunked = true;
    }
  }
  if (chunked) {  // RFC 9112 6.3: chunked wins over a Content-Length
    mode_ = Mode::kChunked;
  } else if (content_length) {
    if (*content_length > max_body_) return TooLarge(*content_length);
    mode_ = Mode::kLength;
    remaining_ = *content_length;
  } else {
    mode_ = Mode::kUntilClose;
  }
  return Status::OK();
}

StatusOr<bool> EtcdHttpStream::ReadBody(std::string* out) {
  if (body_done_) return false;
  switch (mode_) {
    case Mode::kLength: {
      if (remaining_ == 0) break;
      if (pos_ == buf_.size()) KVF_RETURN_IF_ERROR(FillOrFail());
      const auto n =
          static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, buf_.size() - pos_));
      out->append(buf_, pos_, n);
      pos_ += n;
      remaining_ -= n;
      return true;
    }
    case Mode::kUntilClose: {
      if (pos_ == buf_.size()) {
        KVF_ASSIGN_OR_RETURN(const bool more, Fill());
        if (!more) break;
      }
      out->append(buf_, pos_, std::string::npos);
      pos_ = buf_.size();
      return true;
    }
    case Mode::kChunked: {
      // chunk = hex-size [";" extensions] CRLF data CRLF; the last has size 0
      // and is followed by trailer fields and an empty line.
      KVF_ASSIGN_OR_RETURN(const std::string line, TakeLine());
      const std::string_view digits = std::string_view(line).substr(0, line.find(';'));
      std::uint64_t size = 0;
      const auto [end, ec] =
          std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
      if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
        return Error("malformed chunk size \"" + line.substr(0, 40) + "\"");
      }
      if (size > max_body_) return TooLarge(size);
      if (size == 0) {
        for (;;) {
          KVF_ASSIGN_OR_RETURN(const std::string trailer, TakeLine());
          if (trailer.empty()) break;
        }
        break;
      }
      while (buf_.size() - pos_ < size + 2) KVF_RETURN_IF_ERROR(FillOrFail());
      if (buf_.compare(pos_ + size, 2, "\r\n") != 0) return Error("chunk not ended by CRLF");
      out->append(buf_, pos_, static_cast<std::size_t>(size));
      pos_ += size + 2;
      Compact();
      return true;
    }
  }
  body_done_ = true;
  return false;
}

StatusOr<std::string> EtcdHttpStream::ReadAll() {
  std::string body;
  for (;;) {
    KVF_ASSIGN_OR_RETURN(const bool more, ReadBody(&body));
    if (!more) return body;
    if (body.size() > max_body_) return TooLarge(body.size());
  }
}

StatusOr<std::optional<std::string>> EtcdHttpStream::NextMessage() {
  for (;;) {
    StatusOr<std::optional<std::string>> message = splitter_.Next();
    if (!message.ok()) return Error(message.status().message());
    if (*message) return message;
    std::string piece;
    KVF_ASSIGN_OR_RETURN(const bool more, ReadBody(&piece));
    if (!more) return std::optional<std::string>();
    splitter_.Append(piece);
  }
}

Status EtcdHttpStream::TooLarge(std::uint64_t n) const {
  return Error("response of " + std::to_string(n) + " bytes exceeds the limit of " +
               std::to_string(max_body_) + " (EtcdClientOptions::max_response_bytes)");
}

Status EtcdHttpStream::Wait(short events) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline_) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - Clock::now()).count();
      if (left <= 0) {
        return Error("no answer within " + Ms(budget_) + " (EtcdClientOptions::request_timeout)");
      }
      timeout_ms = static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
    }
    pollfd p{fd_, events, 0};
    const int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return Status::OK();
    if (r < 0 && errno != EINTR) return Error(StatusFromErrno(errno, "poll").message());
  }
}

StatusOr<bool> EtcdHttpStream::Fill() {
  Compact();
  char tmp[16 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n > 0) {
      buf_.append(tmp, static_cast<std::size_t>(n));
      return true;
    }
    if (n == 0) return false;
    if (errno != EAGAIN && errno != EINTR) return Error(StatusFromErrno(errno, "recv").message());
    KVF_RETURN_IF_ERROR(Wait(POLLIN));
  }
}

Status EtcdHttpStream::FillOrFail() {
  KVF_ASSIGN_OR_RETURN(const bool more, Fill());
  return more ? Status::OK() : Error("connection closed by etcd mid-response");
}

StatusOr<std::string> EtcdHttpStream::TakeLine() {
  std::size_t end;
  while ((end = buf_.find("\r\n", pos_)) == std::string::npos) {
    if (buf_.size() - pos_ > kMaxLineBytes) return Error("chunk or trailer line over 4 KiB");
    KVF_RETURN_IF_ERROR(FillOrFail());
  }
  std::string line = buf_.substr(pos_, end - pos_);
  pos_ = end + 2;
  return line;
}

void EtcdHttpStream::Compact() {
  if (pos_ > 0 && (pos_ == buf_.size() || pos_ >= 64 * 1024)) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
}

}  // namespace kvfabric::placement
