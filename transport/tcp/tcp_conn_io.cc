// The connection's two socket I/O sites, plaintext or inside TLS (tcp_tls.h):
// one non-blocking write of a frame's buffers and one non-blocking read.
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "core/errno_status.h"
#include "transport/tcp/tcp_internal.h"

namespace kvfabric::tcp::internal {

ssize_t Conn::Send(const iovec* iov, int n, std::string* tls_error) {
  if (ssl_ == nullptr) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<std::size_t>(n);
    return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  MutexLock lock(&ssl_mu_);
  ssize_t total = 0;
  for (int i = 0; i < n; ++i) {
    const int len = static_cast<int>(std::min<std::size_t>(iov[i].iov_len, 1 << 30));
    if (len == 0) continue;
    const int w = SSL_write(ssl_, iov[i].iov_base, len);
    if (w > 0) {
      total += w;
      if (w < len) break;
      continue;
    }
    if (total > 0) break;  // what was written counts; the rest next time
    const int err = SSL_get_error(ssl_, w);
    if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
      errno = EAGAIN;
      return -1;
    }
    *tls_error = TcpTls::LastError();
    if (tls_error->empty()) *tls_error = "SSL_write error " + std::to_string(err);
    errno = EPIPE;
    return -1;
  }
  return total;
}

std::size_t Conn::Receive(std::byte* to, std::uint64_t want) {
  if (ssl_ != nullptr) {
    int k = 0, err = 0;
    std::string why;
    {
      MutexLock lock(&ssl_mu_);
      k = SSL_read(ssl_, to, static_cast<int>(std::min<std::uint64_t>(want, 1 << 30)));
      if (k <= 0) {
        err = SSL_get_error(ssl_, k);
        why = TcpTls::LastError();
      }
    }
    if (k > 0) return static_cast<std::size_t>(k);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return 0;
    const Status s =
        err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && why.empty())
            ? Status::Unavailable("peer " + peer_ + " closed the connection")
            : Status::Unavailable("TLS receive from " + peer_ + ": " +
                                  (why.empty() ? "error " + std::to_string(err) : why));
    Fail(s, s);
    return 0;
  }
  for (;;) {
    const ssize_t k = ::recv(fd_, to, want, MSG_DONTWAIT);
    if (k > 0) return static_cast<std::size_t>(k);
    if (k == 0) {
      const Status s = Status::Unavailable("peer " + peer_ + " closed the connection");
      Fail(s, s);
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    const Status s = Status::Unavailable(StatusFromErrno(errno, "receive from " + peer_).message());
    Fail(s, s);
    return 0;
  }
}

}  // namespace kvfabric::tcp::internal
