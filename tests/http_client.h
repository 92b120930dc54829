// A minimal HTTP/1.0 client for tests: scraping /metrics and querying
// Prometheus's HTTP API on loopback. One request per connection, read to
// EOF (HTTP/1.0: no chunked bodies), bounded by a timeout.
//
// Thread safety: free functions, no shared state.
#ifndef KVFABRIC_TESTS_HTTP_CLIENT_H_
#define KVFABRIC_TESTS_HTTP_CLIENT_H_

#include <chrono>
#include <string>
#include <string_view>

#include "core/statusor.h"

namespace kvfabric::testing {

struct HttpResponse {
  int status = 0;    // 200, 404, ...
  std::string body;  // after the headers
};

// `method` "GET" or "POST"; `address` "HOST:PORT"; a POST sends `body` as
// application/x-www-form-urlencoded. Unavailable when it cannot connect or
// the response is not HTTP; DeadlineExceeded past `timeout`.
StatusOr<HttpResponse> HttpRequest(const std::string& address, const std::string& method,
                                   const std::string& path, const std::string& body = "",
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

// "HOST:PORT" of "http://HOST:PORT/path".
std::string HostPort(std::string_view url);

// Percent-encoding of a form value (RFC 3986 unreserved characters kept).
std::string UrlEncode(std::string_view value);

// A free TCP port on 127.0.0.1 at the time of the call (bound and released:
// a server started with it soon after gets it unless another process raced).
int PickFreePort();

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_HTTP_CLIENT_H_
