#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errno_status.h"
#include "core/mutex.h"
#include "core/socket_address.h"
#include "transport/tcp/tcp_internal.h"

namespace kvfabric::tcp::internal {

Status ReplyStatus(std::uint8_t code, std::string_view op) {
  if (!IsKnownStatusCode(code)) {
    return StatusFromCode(code, std::string(op) + ": the peer replied with it");
  }
  const auto c = static_cast<StatusCode>(code);
  if (c == StatusCode::kOk) return Status::OK();
  std::string why;
  if (c == StatusCode::kUnavailable) {
    why = "the peer no longer grants that range (never exported, or its region was destroyed)";
  } else if (c == StatusCode::kOutOfRange) {
    why = "the range is outside what the peer exported";
  } else {
    why = "the peer refused it";
  }
  return Status(c, std::string(op) + ": " + why);
}

// --- connection: sending -------------------------------------------------

std::unique_ptr<TxFrame> MakeFrame(const FrameHeader& h, std::span<const std::byte> message_header) {
  auto f = std::make_unique<TxFrame>();
  f->type = h.type;
  f->head.resize(wire::kFrameHeaderBytes + message_header.size());
  wire::EncodeFrameHeader(h, std::span<std::byte, wire::kFrameHeaderBytes>(f->head.data(),
                                                                          wire::kFrameHeaderBytes));
  if (!message_header.empty()) {
    std::memcpy(f->head.data() + wire::kFrameHeaderBytes, message_header.data(),
                message_header.size());
  }
  return f;
}

Status CheckRange(const MemoryRegion* local, std::uint64_t offset, std::uint64_t length,
                  std::size_t i) {
  const std::uint64_t size = local->bytes().size();
  if (offset > size || length > size - offset) {
    return Status::InvalidArgument("entry " + std::to_string(i) + ": local range [" +
                                   std::to_string(offset) + ", +" + std::to_string(length) +
                                   ") outside a region of " + std::to_string(size) + " bytes");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<TransferBatch>> Conn::Submit(std::span<const Transfer> transfers) {
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const std::string at = "entry " + std::to_string(i);
    if (t.op != TransferOp::kRead && t.op != TransferOp::kWrite && t.op != TransferOp::kSend) {
      return Status::InvalidArgument(at + ": unknown op");
    }
    if (t.op == TransferOp::kSend) {
      if (t.header.size() > transport::kMaxMessageHeaderBytes) {
        return Status::InvalidArgument(at + ": message header of " +
                                       std::to_string(t.header.size()) + " bytes over " +
                                       std::to_string(transport::kMaxMessageHeaderBytes));
      }
      if (t.length > 0 && t.local == nullptr) {
        return Status::InvalidArgument(at + ": payload without a local region");
      }
    } else {
      if (t.local == nullptr) return Status::InvalidArgument(at + ": no local region");
      const auto* remote = dynamic_cast<const TcpRemoteRegion*>(t.remote);
      if (remote == nullptr || remote->conn() != this) {
        return Status::InvalidArgument(at + ": remote region not imported on this endpoint");
      }
      if (t.remote_offset > remote->length() || t.length > remote->length() - t.remote_offset) {
        return Status::InvalidArgument(at + ": remote range [" + std::to_string(t.remote_offset) +
                                       ", +" + std::to_string(t.length) +
                                       ") outside an import of " +
                                       std::to_string(remote->length()) + " bytes");
      }
    }
    if (t.local != nullptr) KVF_RETURN_IF_ERROR(CheckRange(t.local, t.local_offset, t.length, i));
  }

  std::uint64_t tag = 0;
  {
    MutexLock lock(&mu_);
    tag = next_tag_++;
  }
  std::weak_ptr<Conn> weak = weak_from_this();
  auto batch = std::make_shared<BatchCompletion>(transfers.size(), [weak, tag] {
    if (std::shared_ptr<Conn> c = weak.lock()) c->CancelBatch(tag);
  });
  std::vector<Outcome> refused;
  bool post = false;
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      const Transfer& t = transfers[i];
      EntryRef e{batch, i, tag, next_id_++};
      if (closed_ || closing_) {
        refused.push_back({batch, i, 0,
                           health_.ok() ? Status::Unavailable("endpoint to " + peer_ + " is closed")
                                        : health_,
                           0});
        continue;
      }
      std::byte* local =
          t.local == nullptr ? nullptr : t.local->bytes().data() + t.local_offset;
      FrameHeader h;
      std::unique_ptr<TxFrame> f;
      if (t.op == TransferOp::kSend) {
        h.type = FrameType::kSend;
        h.message_header_bytes = static_cast<std::uint16_t>(t.header.size());
        h.length = t.length;
        f = MakeFrame(h, t.header);
        f->payload = local;
        f->payload_len = t.length;
      } else {
        const auto* remote = static_cast<const TcpRemoteRegion*>(t.remote);
        h.type = t.op == TransferOp::kWrite ? FrameType::kWrite : FrameType::kRead;
        h.id = e.id;
        h.grant = remote->grant();
        h.offset = t.remote_offset;
        h.length = t.length;
        f = MakeFrame(h, {});
        if (t.op == TransferOp::kWrite) {
          f->payload = local;
          f->payload_len = t.length;
        } else {
          reads_[e.id] = PendingRead{e, local, t.length, false};
        }
      }
      f->has_entry = true;
      f->entry = e;
      outstanding_.insert(e.id);
      txq_.push_back(std::move(f));
    }
    if (!txq_.empty() && !tx_scheduled_) {
      tx_scheduled_ = true;
      post = true;
    }
  }
  if (post) {
    std::weak_ptr<Conn> w = weak_from_this();
    if (!worker_->Post([w] {
          if (auto c = w.lock()) c->Pump();
        })) {
      // The worker stopped: the transport is going away.
      worker_->RunAndWait([this] {
        Fail(Status::Unavailable("the transport was destroyed"),
             Status::Unavailable("the transport was destroyed"));
      });
    }
  }
  Finish(refused);
  return std::make_unique<TransferBatch>(std::move(batch));
}

void Conn::Finish(std::vector<Outcome>& outcomes) {
  for (Outcome& o : outcomes) o.batch->Complete(o.index, std::move(o.status), o.bytes);
  bool any = false;
  {
    MutexLock lock(&mu_);
    for (const Outcome& o : outcomes) {
      if (o.id != 0) any |= outstanding_.erase(o.id) > 0;
    }
    if (any) cv_.NotifyAll();
  }
  outcomes.clear();
}

void Conn::Pump() {
  std::vector<Outcome> done;
  Status failure;
  bool blocked = false;  // the socket is full: EPOLLOUT resumes
  bool resume = false;   // reading was paused and the queue has drained
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    while (!txq_.empty()) {
      TxFrame& f = *txq_.front();
      const std::uint64_t head = f.head.size();
      iovec iov[2];
      int n = 0;
      if (f.sent < head) {
        iov[n++] = {f.head.data() + f.sent, head - f.sent};
        if (f.payload_len > 0) iov[n++] = {const_cast<std::byte*>(f.payload), f.payload_len};
      } else {
        iov[n++] = {const_cast<std::byte*>(f.payload) + (f.sent - head),
                    f.payload_len - (f.sent - head)};
      }
      std::string tls_error;
      const ssize_t k = Send(iov, n, &tls_error);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (!want_write_) {
            want_write_ = true;
            interest_ |= EPOLLOUT;
            worker_->SetInterest(this, fd_, interest_);
          }
          blocked = true;  // frames finished before this one still complete below
          break;
        }
        failure = tls_error.empty()
                      ? StatusFromErrno(errno, "send to " + peer_)
                      : Status::Unavailable("TLS send to " + peer_ + ": " + tls_error);
        break;
      }
      f.sent += static_cast<std::uint64_t>(k);
      if (f.sent < head + f.payload_len) continue;
      if (f.has_entry && f.type == FrameType::kSend) {
        done.push_back({f.entry.batch, f.entry.index, f.entry.id, Status::OK(), f.payload_len});
      } else if (f.has_entry && f.type == FrameType::kWrite) {
        writes_[f.entry.id] = PendingWrite{f.entry, f.payload_len};
      }
      if (f.is_reply) --replies_queued_;
      txq_.pop_front();
    }
    if (read_paused_ && replies_queued_ <= kMaxQueuedReplies / 2) resume = true;
    if (failure.ok() && !blocked) {
      tx_scheduled_ = false;
      if (want_write_) {
        want_write_ = false;
        interest_ &= ~EPOLLOUT;
        worker_->SetInterest(this, fd_, interest_);
      }
    }
  }
  Finish(done);
  if (!failure.ok()) {
    Fail(Status::Unavailable(failure.message()), Status::Unavailable(failure.message()));
    return;
  }
  if (resume) {
    read_paused_ = false;
    RefreshInterest();
    std::weak_ptr<Conn> w = weak_from_this();
    worker_->Post([w] {
      if (auto c = w.lock()) c->OnReadable();
    });
  }
}

void Conn::Enqueue(std::unique_ptr<TxFrame> frame) {
  MutexLock lock(&mu_);
  if (closed_) return;
  if (frame->type == FrameType::kReadData || frame->type == FrameType::kWriteAck) {
    frame->is_reply = true;
    ++replies_queued_;
  }
  txq_.push_back(std::move(frame));
  tx_scheduled_ = true;
}

// --- connection: receiving -----------------------------------------------

void Conn::RefreshInterest() {
  std::uint32_t want = EPOLLRDHUP;
  if (!hello_done_ || (!worker_->core()->stalled.load() && !read_paused_)) want |= EPOLLIN;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    if (want_write_) want |= EPOLLOUT;
    if (want == interest_) return;
    interest_ = want;
  }
  worker_->SetInterest(this, fd_, want);
}

void Conn::HandshakeExpired() {
  if (hello_done_) return;
  const Status s = Status::Unavailable("peer " + peer_ + " sent no kvfabric TCP hello in time");
  Fail(s, s);
}

Conn::~Conn() {
  ReleaseHandshakeSlot();
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
}

void Conn::SendHello() {
  auto f = std::make_unique<TxFrame>();
  const auto hello = wire::EncodeHello(worker_->core()->instance());
  f->head.assign(hello.begin(), hello.end());
  f->type = FrameType::kSend;  // raw hello bytes: no entry, not a reply
  Enqueue(std::move(f));
  Pump();
}

void Conn::Started(bool send_hello) {
  if (ssl_ != nullptr && tls_accepting_) {
    // The TLS handshake first (ReadSome drives it); the hello inside it.
    hello_after_tls_ = send_hello;
    phase_ = Phase::kTls;
    return;
  }
  if (send_hello) SendHello();
  if (!hello_done_) phase_ = Phase::kHello;
}

bool Conn::Fill() {
  if (rstart_ == rend_) rstart_ = rend_ = 0;
  if (rend_ == rbuf_.size()) {
    std::memmove(rbuf_.data(), rbuf_.data() + rstart_, rend_ - rstart_);
    rend_ -= rstart_;
    rstart_ = 0;
  }
  const std::size_t k = Receive(rbuf_.data() + rend_, rbuf_.size() - rend_);
  rend_ += k;
  return k > 0;
}

void Conn::ProtocolError(const Status& why) {
  const Status s =
      Status::Unavailable("protocol error from " + peer_ + ": " + std::string(why.message()));
  Fail(s, s);
}

void Conn::OnReadable() {
  if (ReadSome()) {
    // Stopped for fairness with frames maybe already buffered here: epoll
    // would not report them again, so come back after the others' turn.
    std::weak_ptr<Conn> w = weak_from_this();
    worker_->Post([w] {
      if (auto c = w.lock()) c->OnReadable();
    });
  }
  // Replies queued while reading (READ_DATA, WRITE_ACK) go out now, however
  // reading stopped: nothing else would send them.
  bool pump = false;
  {
    MutexLock lock(&mu_);
    pump = !closed_ && !txq_.empty() && !want_write_;
  }
  if (pump) Pump();
}

bool Conn::ReadSome() {
  std::uint64_t budget = 16 << 20;  // bytes per call: other connections get a turn
  int frames = 0;
  while (!Closed()) {
    if (hello_done_ && worker_->core()->stalled.load()) return false;
    if (read_paused_) return false;
    if (phase_ == Phase::kHeader) {
      MutexLock lock(&mu_);
      if (replies_queued_ >= kMaxQueuedReplies) read_paused_ = true;
    }
    if (read_paused_) {
      // The peer is not reading our replies: stop reading its requests
      // until the queue drains (Pump resumes us).
      RefreshInterest();
      return false;
    }
    if (phase_ == Phase::kPayload) {
      const std::uint64_t buffered = std::min<std::uint64_t>(rend_ - rstart_, remaining_);
      if (buffered > 0) {
        if (dest_ != nullptr) std::memcpy(dest_ + received_, rbuf_.data() + rstart_, buffered);
        rstart_ += buffered;
        received_ += buffered;
        remaining_ -= buffered;
      }
      while (remaining_ > 0) {
        std::byte* to = dest_ != nullptr ? dest_ + received_ : rbuf_.data();
        const std::uint64_t want =
            dest_ != nullptr ? remaining_ : std::min<std::uint64_t>(remaining_, rbuf_.size());
        rstart_ = rend_ = 0;
        const std::uint64_t k = Receive(to, want);
        if (k == 0) return false;  // nothing buffered now, or the connection failed
        received_ += k;
        remaining_ -= k;
        budget = k >= budget ? 0 : budget - k;
        if (budget == 0 && remaining_ > 0) return true;
      }
      PayloadDone();
      phase_ = Phase::kHeader;
      if (budget == 0 || ++frames >= 64) return true;
      continue;
    }
    if (phase_ == Phase::kTls) {
      int r = 0, err = 0;
      std::string why;
      {
        MutexLock lock(&ssl_mu_);
        r = SSL_do_handshake(ssl_);
        if (r != 1) {
          err = SSL_get_error(ssl_, r);
          why = TcpTls::LastError();
        }
      }
      if (r == 1) {
        phase_ = Phase::kHello;
        if (hello_after_tls_) SendHello();
        continue;
      }
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return false;
      ProtocolError(Status::Unavailable(
          "TLS handshake: " + (why.empty() ? "error " + std::to_string(err) : why) +
          " (both ends must run the data plane with TLS)"));
      return false;
    }
    if (phase_ == Phase::kHello) {
      if (rend_ - rstart_ < wire::kHelloBytes) {
        if (!Fill()) return false;
        continue;
      }
      StatusOr<std::uint64_t> instance =
          wire::DecodeHello(std::span<const std::byte>(rbuf_.data() + rstart_, wire::kHelloBytes));
      rstart_ += wire::kHelloBytes;
      if (!instance.ok()) {
        ProtocolError(instance.status());
        return false;
      }
      peer_instance_ = *instance;
      hello_done_ = true;
      ReleaseHandshakeSlot();
      phase_ = Phase::kHeader;
      RefreshInterest();
      std::unique_ptr<Endpoint> ep = NewEndpoint(shared_from_this());
      SetEndpoint(ep.get());
      if (worker_->core()->on_accept) {
        worker_->core()->on_accept(std::move(ep));
      }
      continue;
    }
    // A frame header, and a message header after it.
    if (rend_ - rstart_ < wire::kFrameHeaderBytes) {
      if (!Fill()) return false;
      continue;
    }
    StatusOr<FrameHeader> h = wire::DecodeFrameHeader(
        std::span<const std::byte, wire::kFrameHeaderBytes>(rbuf_.data() + rstart_,
                                                            wire::kFrameHeaderBytes));
    if (!h.ok()) {
      ProtocolError(h.status());
      return false;
    }
    const std::size_t whole = wire::kFrameHeaderBytes + h->message_header_bytes;
    if (rend_ - rstart_ < whole) {
      if (!Fill()) return false;
      continue;
    }
    const std::span<const std::byte> message_header(rbuf_.data() + rstart_ + wire::kFrameHeaderBytes,
                                                    h->message_header_bytes);
    if (!DispatchHeader(*h, message_header)) return false;
    rstart_ += whole;
    if (phase_ == Phase::kHeader && ++frames >= 64) return true;
  }
  return false;
}

class TcpIncomingMessage final : public IncomingMessage {
 public:
  TcpIncomingMessage(Endpoint* ep, std::span<const std::byte> header, std::uint64_t length)
      : ep_(ep), header_(header), length_(length) {}
  Endpoint* endpoint() const override { return ep_; }
  std::span<const std::byte> header() const override { return header_; }
  std::uint64_t payload_length() const override { return length_; }
  Status Accept(MemoryRegion* region, std::uint64_t offset,
                std::function<void(Status)> on_placed) override {
    if (decided_) return Status::FailedPrecondition("message payload already accepted or dropped");
    decided_ = true;
    auto* r = dynamic_cast<TcpRegion*>(region);
    if (r == nullptr) {
      return Status::InvalidArgument("Accept into a region of another transport");
    }
    const std::uint64_t size = r->bytes().size();
    if (offset > size || length_ > size - offset) {
      return Status::InvalidArgument("payload of " + std::to_string(length_) +
                                     " bytes does not fit at offset " + std::to_string(offset) +
                                     " of a region of " + std::to_string(size) + " bytes");
    }
    if (!r->state()->Pin()) return Status::Unavailable("Accept into a region being destroyed");
    pin_ = PinRef(r->state());
    dest_ = r->bytes().data() + offset;
    on_placed_ = std::move(on_placed);
    return Status::OK();
  }
  void Drop() override { decided_ = true; }

  std::byte* dest_ = nullptr;
  PinRef pin_;
  std::function<void(Status)> on_placed_;

 private:
  Endpoint* const ep_;
  const std::span<const std::byte> header_;
  const std::uint64_t length_;
  bool decided_ = false;
};

bool Conn::DispatchHeader(const FrameHeader& h, std::span<const std::byte> message_header) {
  Core* core = worker_->core();
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  received_ = 0;
  remaining_ = h.length;
  rx_id_ = h.id;
  rx_code_ = StatusCode::kOk;
  switch (h.type) {
    case FrameType::kSend: {
      TcpIncomingMessage m(endpoint(), message_header, h.length);
      if (core->handler) {
        core->handler(m);
      } else {
        m.Drop();
      }
      if (Closed()) return false;  // the handler closed or destroyed the endpoint
      if (m.dest_ != nullptr) {
        sink_ = Sink::kMessage;
        dest_ = m.dest_;
        rx_pin_ = std::move(m.pin_);
        on_placed_ = std::move(m.on_placed_);
      }
      break;
    }
    case FrameType::kWrite: {
      PinRef pin;
      std::byte* where = nullptr;
      rx_code_ = core->Resolve(h.grant, h.offset, h.length, &pin, &where);
      sink_ = Sink::kWrite;
      if (rx_code_ == StatusCode::kOk) {
        dest_ = where;
        rx_pin_ = std::move(pin);
      }
      break;
    }
    case FrameType::kRead: {
      PinRef pin;
      std::byte* where = nullptr;
      FrameHeader reply;
      reply.type = FrameType::kReadData;
      reply.id = h.id;
      reply.status = static_cast<std::uint8_t>(core->Resolve(h.grant, h.offset, h.length, &pin,
                                                              &where));
      reply.length = reply.status == 0 ? h.length : 0;
      std::unique_ptr<TxFrame> f = MakeFrame(reply, {});
      if (reply.status == 0) {
        f->payload = where;
        f->payload_len = h.length;
        f->pin = std::move(pin);
      }
      Enqueue(std::move(f));
      remaining_ = 0;  // a request carries no payload
      return true;
    }
    case FrameType::kWriteAck: {
      std::vector<Outcome> done;
      {
        MutexLock lock(&mu_);
        auto it = writes_.find(h.id);
        if (it != writes_.end()) {
          Status s = ReplyStatus(h.status, "kWrite to " + peer_);
          const std::uint64_t bytes = s.ok() ? it->second.length : 0;
          done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id,
                          std::move(s), bytes});
          writes_.erase(it);
        }
      }
      Finish(done);
      return true;
    }
    case FrameType::kReadData: {
      std::vector<Outcome> done;
      Status bad;
      {
        MutexLock lock(&mu_);
        auto it = reads_.find(h.id);
        if (it != reads_.end()) {
          if (h.status != 0) {
            if (h.length != 0) {
              bad = Status::InvalidArgument("READ_DATA with an error status and a payload");
            } else {
              done.push_back({it->second.entry.batch, it->second.entry.index,
                              it->second.entry.id, ReplyStatus(h.status, "kRead from " + peer_),
                              0});
              reads_.erase(it);
            }
          } else if (h.length != it->second.length) {
            bad = Status::InvalidArgument("READ_DATA of " + std::to_string(h.length) +
                                          " bytes for a read of " +
                                          std::to_string(it->second.length));
          } else {
            it->second.landing = true;
            sink_ = Sink::kReadData;
            dest_ = it->second.dest;
          }
        }
      }
      if (!bad.ok()) {
        ProtocolError(bad);
        return false;
      }
      Finish(done);
      break;
    }
  }
  phase_ = Phase::kPayload;
  if (remaining_ == 0) {
    // Nothing to receive: complete now (the header is consumed by the caller).
    PayloadDone();
    phase_ = Phase::kHeader;
  }
  return true;
}

void Conn::PayloadDone() {
  std::vector<Outcome> done;
  switch (sink_) {
    case Sink::kDiscard:
      break;
    case Sink::kMessage: {
      rx_pin_.reset();
      auto cb = std::move(on_placed_);
      on_placed_ = nullptr;
      if (cb) cb(Status::OK());
      break;
    }
    case Sink::kWrite: {
      rx_pin_.reset();
      FrameHeader ack;
      ack.type = FrameType::kWriteAck;
      ack.id = rx_id_;
      ack.status = static_cast<std::uint8_t>(rx_code_);
      Enqueue(MakeFrame(ack, {}));
      break;
    }
    case Sink::kReadData: {
      MutexLock lock(&mu_);
      auto it = reads_.find(rx_id_);
      if (it != reads_.end()) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id,
                        Status::OK(), it->second.length});
        reads_.erase(it);
      }
      break;
    }
  }
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  Finish(done);
}

// --- connection: cancel, close, fail ------------------------------------

void Conn::CancelBatch(std::uint64_t tag) {
  std::vector<Outcome> done;
  {
    MutexLock lock(&mu_);
    const Status c = Status::Cancelled("batch cancelled");
    for (auto it = txq_.begin(); it != txq_.end();) {
      TxFrame& f = **it;
      if (f.has_entry && f.entry.tag == tag && f.sent == 0) {
        if (f.type != FrameType::kRead) {
          done.push_back({f.entry.batch, f.entry.index, f.entry.id, c, 0});
        }
        it = txq_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = reads_.begin(); it != reads_.end();) {
      if (it->second.entry.tag == tag && !it->second.landing) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id, c, 0});
        it = reads_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = writes_.begin(); it != writes_.end();) {
      if (it->second.entry.tag == tag) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id, c, 0});
        it = writes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Finish(done);
}

Status Conn::Flush(Deadline deadline) {
  MutexLock lock(&mu_);
  const std::uint64_t upto = next_id_;
  const bool ok = cv_.WaitUntil(&mu_, deadline, [&]() KVF_REQUIRES(mu_) {
    return outstanding_.empty() || *outstanding_.begin() >= upto;
  });
  if (!ok) {
    return Status::DeadlineExceeded("flush of the endpoint to " + peer_ + ": " +
                                    std::to_string(outstanding_.size()) + " entries in flight");
  }
  return Status::OK();
}

Status Conn::Close(transport::CloseMode mode, Deadline deadline) {
  Status result;
  if (mode == transport::CloseMode::kGraceful) {
    {
      MutexLock lock(&mu_);
      closing_ = true;
    }
    if (!Flush(deadline).ok()) {
      result = Status::DeadlineExceeded("graceful close of the endpoint to " + peer_ +
                                        " ran past its deadline; closed by force");
    }
  }
  std::shared_ptr<Conn> self = shared_from_this();
  worker_->RunAndWait([self] {
    self->Fail(Status::Cancelled("endpoint closed"),
               Status::Unavailable("endpoint to " + self->peer() + " was closed"));
  });
  return result;
}

bool Conn::Pins(const RegionState* region) {
  if (rx_pin_.get() == region) return true;
  MutexLock lock(&mu_);
  for (const auto& f : txq_) {
    if (f->pin.get() == region) return true;
  }
  return false;
}

void Conn::Fail(const Status& entries, const Status& health) {
  std::vector<Outcome> done;
  std::deque<std::unique_ptr<TxFrame>> frames;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    health_ = health;
    frames.swap(txq_);
    replies_queued_ = 0;
    for (auto& f : frames) {
      if (f->has_entry && f->type != FrameType::kRead) {
        done.push_back({f->entry.batch, f->entry.index, f->entry.id, entries, 0});
      }
    }
    for (auto& [id, r] : reads_) done.push_back({r.entry.batch, r.entry.index, id, entries, 0});
    for (auto& [id, w] : writes_) done.push_back({w.entry.batch, w.entry.index, id, entries, 0});
    reads_.clear();
    writes_.clear();
  }
  worker_->Forget(this);
  ::shutdown(fd_, SHUT_RDWR);
  frames.clear();  // releases READ_DATA pins
  rx_pin_.reset();
  auto cb = std::move(on_placed_);
  on_placed_ = nullptr;
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  if (cb) cb(entries.code() == StatusCode::kCancelled ? Status::Cancelled(entries.message())
                                                      : Status::Unavailable(entries.message()));
  Finish(done);
  MutexLock lock(&mu_);
  cv_.NotifyAll();
}

}  // namespace kvfabric::tcp::internal
