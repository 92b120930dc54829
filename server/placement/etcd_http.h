// The HTTP/1.1 layer under EtcdClient (etcd_client.h): one request on one TCP
// connection, its response head, and its body in pieces (Content-Length,
// chunked, or until close), with every size from the network checked. Also
// splits a streamed body into its JSON messages. Internal to the etcd client;
// nothing else should include it.
//
// Errors are Unavailable with the stream's context ("etcd <endpoint> POST
// <path>: ...") so that every failure names the endpoint.
//
// Threads: one thread uses a stream, except Shutdown(), which another thread
// may call to wake a blocked read.
#ifndef KVFABRIC_SERVER_PLACEMENT_ETCD_HTTP_H_
#define KVFABRIC_SERVER_PLACEMENT_ETCD_HTTP_H_

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::placement {

namespace etcd_http {

inline constexpr std::size_t kMaxHeadBytes = 64 * 1024;  // status line + headers
inline constexpr std::size_t kMaxLineBytes = 4096;       // a chunk-size or trailer line
inline constexpr int kMaxJsonDepth = 64;                 // etcd's replies nest ~5 deep

// The whole of `text` as a decimal number: no '+', no space, no junk.
template <typename T>
bool ParseDecimal(std::string_view text, T* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && text[0] != '+' && ec == std::errc() && end == text.data() + text.size();
}

inline std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// Whether JSON `text` nests objects and arrays at most `max_depth` deep
// (brackets inside strings do not count). Checked before parsing a reply, so
// that a hostile "[[[[..." cannot make the parser allocate a tree per byte.
bool NestingWithin(std::string_view text, int max_depth);

// Splits a byte stream into top-level JSON objects ("{...}{...}", whitespace
// between) without parsing them: it tracks nesting outside strings.
class JsonObjectSplitter {
 public:
  explicit JsonObjectSplitter(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  void Append(std::string_view data) { buf_.append(data); }

  // The next complete object, nullopt if none is complete yet. Unavailable for
  // a byte between objects that is not whitespace or '{', nesting deeper than
  // kMaxJsonDepth, or an object over max_bytes.
  StatusOr<std::optional<std::string>> Next();

 private:
  const std::size_t max_bytes_;
  std::string buf_;
  std::size_t scan_ = 0;   // next byte to look at
  std::size_t start_ = 0;  // where the current object starts (depth_ > 0)
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

}  // namespace etcd_http

class EtcdHttpStream {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects to host:port (any address getaddrinfo gives, in order), waiting
  // at most `connect_timeout`. `context` prefixes every error message.
  static StatusOr<std::unique_ptr<EtcdHttpStream>> Connect(
      const std::string& host, const std::string& port, std::chrono::milliseconds connect_timeout,
      std::string context, std::size_t max_body);

  EtcdHttpStream(const EtcdHttpStream&) = delete;
  EtcdHttpStream& operator=(const EtcdHttpStream&) = delete;
  ~EtcdHttpStream();

  const std::string& context() const { return context_; }
  // The response's status code, once ReadHead succeeded.
  int status_code() const { return status_code_; }

  // Bounds every later wait; nullopt: wait forever (a watch after creation).
  // `budget` is the setting's value, for the error message.
  void SetDeadline(std::optional<Clock::time_point> deadline, std::chrono::milliseconds budget);

  // Unavailable("<context>: <what>").
  Status Error(std::string_view what) const;

  // Wakes a thread blocked on this stream: it then sees an end or an error.
  void Shutdown();

  Status Send(std::string_view data);

  // Reads the status line and headers and picks how the body is delimited.
  Status ReadHead();

  // Appends the next part of the body to `out`; false once the body ended.
  // A chunk or Content-Length over max_body is refused.
  StatusOr<bool> ReadBody(std::string* out);

  // The whole body, at most max_body bytes.
  StatusOr<std::string> ReadAll();

  // The next top-level JSON object of a streamed body; nullopt at its end.
  StatusOr<std::optional<std::string>> NextMessage();

 private:
  enum class Mode : std::uint8_t { kLength, kChunked, kUntilClose };

  EtcdHttpStream(int fd, std::string context, std::size_t max_body);
  Status TooLarge(std::uint64_t n) const;
  Status Wait(short events);
  StatusOr<bool> Fill();  // reads more into buf_; false at end of stream
  Status FillOrFail();
  StatusOr<std::string> TakeLine();
  void Compact();

  const int fd_;
  const std::string context_;
  const std::size_t max_body_;
  std::optional<Clock::time_point> deadline_;
  std::chrono::milliseconds budget_{0};
  std::string buf_;  // received bytes; buf_[pos_..] not consumed yet
  std::size_t pos_ = 0;
  int status_code_ = 0;
  Mode mode_ = Mode::kUntilClose;
  std::uint64_t remaining_ = 0;  // kLength
  bool body_done_ = false;
  etcd_http::JsonObjectSplitter splitter_;
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_ETCD_HTTP_H_
