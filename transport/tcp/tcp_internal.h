// Internals of the kernel-TCP transport (tcp_transport.h), shared by its
// three source files: tcp_core.cc (the core: grants, workers, accepting),
// tcp_conn.cc (one connection: sending, receiving, cancel, close, failure)
// and tcp_transport.cc (endpoints and the public TcpTransport). Not for use
// outside transport/tcp.
#ifndef KVFABRIC_TRANSPORT_TCP_TCP_INTERNAL_H_
#define KVFABRIC_TRANSPORT_TCP_TCP_INTERNAL_H_

#include <sys/mman.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "transport/tcp/tcp_tls.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace kvfabric::tcp::internal {

using transport::BatchCompletion;
using transport::Deadline;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;
using wire::FrameHeader;
using wire::FrameType;

class Conn;
class Worker;

// Replies (READ_DATA, WRITE_ACK) a connection may have queued before its
// worker stops reading from it: every READ or WRITE a peer sends queues one,
// so a peer that sends requests and never reads the replies would otherwise
// grow the queue (and the pins READ_DATA frames hold) without bound.
// Reading resumes once they are down to half. Only replies count: a side
// that sends many requests of its own keeps reading, so the two ends cannot
// wait on each other as long as requests go one way, as in kvfabric's data
// plane (the daemon reads and writes, the client answers).
constexpr std::size_t kMaxQueuedReplies = 4096;

// Registered memory and the pins that keep it from being revoked while a
// worker moves its bytes for a peer (or into it for an accepted message).
struct RegionState {
  std::byte* base = nullptr;
  std::uint64_t size = 0;
  Mutex mu;
  CondVar cv;
  int pins KVF_GUARDED_BY(mu) = 0;
  bool revoked KVF_GUARDED_BY(mu) = false;

  bool Pin() {
    MutexLock lock(&mu);
    if (revoked) return false;
    ++pins;
    return true;
  }
  void Unpin() {
    MutexLock lock(&mu);
    if (--pins == 0) cv.NotifyAll();
  }
};

// A held pin, released when destroyed or reset.
class PinRef {
 public:
  PinRef() = default;
  explicit PinRef(std::shared_ptr<RegionState> r) : r_(std::move(r)) {}
  PinRef(PinRef&& o) noexcept : r_(std::move(o.r_)) {}
  PinRef& operator=(PinRef&& o) noexcept {
    reset();
    r_ = std::move(o.r_);
    return *this;
  }
  ~PinRef() { reset(); }
  void reset() {
    if (r_) r_->Unpin();
    r_.reset();
  }
  const RegionState* get() const { return r_.get(); }

 private:
  std::shared_ptr<RegionState> r_;
};

struct Grant {
  std::shared_ptr<RegionState> region;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// An entry's outcome, reported after every lock is released.
struct Outcome {
  std::shared_ptr<BatchCompletion> batch;
  std::size_t index = 0;
  std::uint64_t id = 0;
  Status status;
  std::uint64_t bytes = 0;
};

// Where one entry of a batch stands, for cancellation.
struct EntryRef {
  std::shared_ptr<BatchCompletion> batch;
  std::size_t index = 0;
  std::uint64_t tag = 0;  // the batch's number on its connection
  std::uint64_t id = 0;   // the entry's number on its connection
};

struct TxFrame {
  std::vector<std::byte> head;  // frame header (+ message header)
  const std::byte* payload = nullptr;
  std::uint64_t payload_len = 0;
  std::uint64_t sent = 0;  // bytes of head + payload written
  FrameType type = FrameType::kSend;
  bool has_entry = false;  // SEND, WRITE, READ of a local batch
  bool is_reply = false;   // READ_DATA, WRITE_ACK: counted in replies_queued_
  EntryRef entry;
  PinRef pin;  // READ_DATA: the source region
};

struct PendingRead {
  EntryRef entry;
  std::byte* dest = nullptr;
  std::uint64_t length = 0;
  bool landing = false;  // its bytes are being received: not cancellable
};

struct PendingWrite {
  EntryRef entry;
  std::uint64_t length = 0;
};

// The status of an owner's reply code, with what the code means for `op`.
Status ReplyStatus(std::uint8_t code, std::string_view op);

class Core {
 public:
  explicit Core(const TcpTransportOptions& options);
  ~Core();

  Status Start();
  void Shutdown();

  std::shared_ptr<Worker> NextWorker();
  std::uint64_t instance() const { return instance_; }
  const TcpTransportOptions& options() const { return options_; }

  // Grants.
  std::uint64_t NewGrant(std::shared_ptr<RegionState> region, std::uint64_t offset,
                         std::uint64_t length);
  // The region and the address of [offset, +length) of `grant`, pinned; or
  // the status code the owner answers with.
  StatusCode Resolve(std::uint64_t grant, std::uint64_t offset, std::uint64_t length,
                     PinRef* pin, std::byte** where);
  void Revoke(const std::shared_ptr<RegionState>& region);

  // NODELAY and the receive buffer: before connect(), or on accept.
  void ApplySocketOptions(int fd) const;
  // The send buffer (TcpTransportOptions::send_buffer_bytes), once `fd` is
  // connected and its peer's address known.
  void ApplySendBuffer(int fd) const;
  // SO_MAX_PACING_RATE = pacing_rate (no cap at 0).
  void ApplyPacingRate(int fd) const;

  // The cap in force (TcpTransport::SetMaxPacingRate), bytes per second.
  std::atomic<std::uint64_t> pacing_rate{0};

  transport::MessageHandler handler;                    // set before Listen/Connect
  transport::AcceptHandler on_accept;                   // set by Listen
  std::atomic<bool> stalled{false};
  // Accepted connections still in their handshake (TcpTransportOptions::
  // max_handshakes); shared with the connections that hold a slot, which
  // may outlive the core.
  std::shared_ptr<std::atomic<std::uint32_t>> handshaking =
      std::make_shared<std::atomic<std::uint32_t>>(0);
  std::atomic<std::uint64_t> handshakes_shed{0};
  std::vector<std::shared_ptr<Worker>> workers;         // fixed after Start
  Mutex mu;
  int listen_fd KVF_GUARDED_BY(mu) = -1;
  std::string listen_address KVF_GUARDED_BY(mu);

 private:
  const TcpTransportOptions options_;
  std::uint64_t instance_ = 0;
  std::atomic<unsigned> next_worker_{0};
  std::unordered_map<std::uint64_t, Grant> grants_ KVF_GUARDED_BY(mu);
};

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  explicit Worker(Core* core) : core_(core) {}
  ~Worker();

  Status Start();
  // Runs `fn` on the worker thread. false once the worker stopped.
  bool Post(std::function<void()> fn);
  // Runs `fn` here when on the worker thread (or after it stopped), else
  // posts it and waits for it.
  void RunAndWait(const std::function<void()>& fn);
  bool OnThread() const { return std::this_thread::get_id() == thread_id_; }
  void Stop();

  // Worker thread only.
  void Adopt(std::shared_ptr<Conn> conn);
  // Adopt, for an accepted connection: it must say hello within the
  // transport's handshake_timeout.
  void AdoptAccepted(std::shared_ptr<Conn> conn);
  void Forget(Conn* conn);
  void SetInterest(Conn* conn, int fd, std::uint32_t events);
  void WatchListener(int fd);
  void FailAll(const Status& status);
  void FailConnsPinning(const RegionState* region);
  // Core::ApplyPacingRate on every connection.
  void ApplyPacingRate();
  void RefreshInterest();
  Core* core() const { return core_; }

 private:
  void Loop();
  void AcceptAll();

  Core* const core_;
  int epfd_ = -1;
  int wakefd_ = -1;
  int listen_fd_ = -1;  // worker thread only
  std::thread thread_;
  std::thread::id thread_id_;
  Mutex mu_;
  std::vector<std::function<void()>> tasks_ KVF_GUARDED_BY(mu_);
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  bool stopped_ KVF_GUARDED_BY(mu_) = false;
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;  // worker thread only
  // Accepted connections still owing their hello, oldest first, with the
  // time by which it must come (worker thread only).
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::weak_ptr<Conn>>> handshakes_;
  // A spare descriptor, given up to accept and shed a connection when the
  // process is out of descriptors (else the listener stays readable and the
  // loop spins). Worker with the listener only.
  int spare_fd_ = -1;
};

class TcpRegion;

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(int fd, std::shared_ptr<Worker> worker, std::string peer, bool accepted,
       std::uint64_t peer_instance)
      : fd_(fd),
        worker_(std::move(worker)),
        peer_(std::move(peer)),
        peer_instance_(peer_instance),
        hello_done_(!accepted),
        rbuf_(64 << 10) {}
  ~Conn();
  // Runs the connection inside TLS (tcp_tls.h): `ssl` (owned from now on) is
  // attached to fd(); with `accepting`, its handshake runs first, in the
  // worker, before the transport's hello. Before Started.
  void SetTls(SSL* ssl, bool accepting) {
    ssl_ = ssl;
    tls_accepting_ = accepting;
  }
  // An accepted connection counts against Core::handshaking until its hello
  // arrives or it is destroyed.
  void HoldHandshakeSlot(std::shared_ptr<std::atomic<std::uint32_t>> counter) {
    handshake_slot_ = std::move(counter);
  }
  void ReleaseHandshakeSlot() {
    if (handshake_slot_ == nullptr) return;
    handshake_slot_->fetch_sub(1, std::memory_order_relaxed);
    handshake_slot_.reset();
  }

  // Any thread.
  std::string peer() const { return peer_; }
  std::uint64_t peer_instance() const { return peer_instance_; }
  Status health() const {
    MutexLock lock(&mu_);
    return health_;
  }
  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers);
  Status Flush(Deadline deadline);
  Status Close(transport::CloseMode mode, Deadline deadline);
  void CancelBatch(std::uint64_t tag);
  void SetEndpoint(Endpoint* ep) {
    MutexLock lock(&mu_);
    endpoint_ = ep;
  }
  Endpoint* endpoint() const {
    MutexLock lock(&mu_);
    return endpoint_;
  }
  const std::shared_ptr<Worker>& worker() const { return worker_; }

  // Worker thread only.
  void Started(bool send_hello);
  void OnReadable();
  void Pump();
  void Fail(const Status& entries, const Status& health);
  bool Pins(const RegionState* region);
  void RefreshInterest();
  // Fails an accepted connection whose hello has not come (worker thread).
  void HandshakeExpired();
  bool hello_done() const { return hello_done_; }
  int fd() const { return fd_; }

 private:
  enum class Phase { kTls, kHello, kHeader, kPayload };
  enum class Sink { kDiscard, kMessage, kWrite, kReadData };

  // Reads and handles frames; true when it stopped for fairness (a byte or
  // frame budget) rather than for want of bytes.
  bool ReadSome();
  bool Fill();
  // One non-blocking recv into `to` (EINTR retried): the bytes received, or
  // 0 when none are buffered now or the connection failed (EOF or error:
  // Fail has run).
  std::size_t Receive(std::byte* to, std::uint64_t want);
  // One non-blocking write of `iov` (sendmsg, or SSL_write per buffer under
  // TLS): bytes written, or -1 with errno (EAGAIN: try again on EPOLLOUT).
  ssize_t Send(const iovec* iov, int n, std::string* tls_error);
  // Queues this side's transport hello and sends it.
  void SendHello();
  bool DispatchHeader(const FrameHeader& h, std::span<const std::byte> message_header);
  void PayloadDone();
  void Enqueue(std::unique_ptr<TxFrame> frame);  // worker thread, replies
  void Finish(std::vector<Outcome>& outcomes);
  bool Closed() const {
    MutexLock lock(&mu_);
    return closed_;
  }
  void ProtocolError(const Status& why);

  const int fd_;
  const std::shared_ptr<Worker> worker_;
  const std::string peer_;
  std::uint64_t peer_instance_;  // set before the endpoint exists

  mutable Mutex mu_;
  CondVar cv_;
  Status health_ KVF_GUARDED_BY(mu_);
  bool closing_ KVF_GUARDED_BY(mu_) = false;  // no new entries
  bool closed_ KVF_GUARDED_BY(mu_) = false;
  bool tx_scheduled_ KVF_GUARDED_BY(mu_) = false;  // the worker will pump
  bool want_write_ KVF_GUARDED_BY(mu_) = false;    // waiting for EPOLLOUT
  Endpoint* endpoint_ KVF_GUARDED_BY(mu_) = nullptr;
  std::uint64_t next_id_ KVF_GUARDED_BY(mu_) = 1;
  std::uint64_t next_tag_ KVF_GUARDED_BY(mu_) = 1;
  std::deque<std::unique_ptr<TxFrame>> txq_ KVF_GUARDED_BY(mu_);
  std::size_t replies_queued_ KVF_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::uint64_t, PendingRead> reads_ KVF_GUARDED_BY(mu_);
  std::unordered_map<std::uint64_t, PendingWrite> writes_ KVF_GUARDED_BY(mu_);
  std::set<std::uint64_t> outstanding_ KVF_GUARDED_BY(mu_);

  // TLS (null: plaintext). SSL objects are not safe for concurrent use:
  // every call into ssl_ holds ssl_mu_ (taken after mu_, never before).
  SSL* ssl_ = nullptr;
  bool tls_accepting_ = false;
  bool hello_after_tls_ = false;  // worker thread only
  Mutex ssl_mu_;

  // Receive state: worker thread only.
  bool hello_done_;
  std::shared_ptr<std::atomic<std::uint32_t>> handshake_slot_;
  bool read_paused_ = false;  // too many replies queued (kMaxQueuedReplies)
  std::uint32_t interest_ = 0;
  std::vector<std::byte> rbuf_;
  std::size_t rstart_ = 0, rend_ = 0;
  Phase phase_ = Phase::kHeader;
  Sink sink_ = Sink::kDiscard;
  std::byte* dest_ = nullptr;
  std::uint64_t remaining_ = 0, received_ = 0;
  std::uint64_t rx_id_ = 0;
  StatusCode rx_code_ = StatusCode::kOk;
  PinRef rx_pin_;
  std::function<void(Status)> on_placed_;
};

std::unique_ptr<Endpoint> NewEndpoint(std::shared_ptr<Conn> conn);

// --- regions -------------------------------------------------------------

class TcpRegion final : public MemoryRegion {
 public:
  TcpRegion(std::shared_ptr<Core> core, std::span<std::byte> bytes, bool owned)
      : core_(std::move(core)), state_(std::make_shared<RegionState>()), owned_(owned) {
    state_->base = bytes.data();
    state_->size = bytes.size();
  }
  ~TcpRegion() override {
    core_->Revoke(state_);
    if (owned_) ::munmap(state_->base, state_->size);
  }
  std::span<std::byte> bytes() const override { return {state_->base, state_->size}; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const override {
    if (offset > state_->size || length > state_->size - offset) {
      return Status::InvalidArgument("export of [" + std::to_string(offset) + ", +" +
                                     std::to_string(length) + ") outside a region of " +
                                     std::to_string(state_->size) + " bytes");
    }
    const std::uint64_t grant = core_->NewGrant(state_, offset, length);
    return wire::EncodeExport({.instance = core_->instance(), .grant = grant, .length = length});
  }
  const std::shared_ptr<RegionState>& state() const { return state_; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<RegionState> state_;
  const bool owned_;
};

class TcpRemoteRegion final : public RemoteRegion {
 public:
  TcpRemoteRegion(const Conn* conn, std::uint64_t grant, std::uint64_t length)
      : conn_(conn), grant_(grant), length_(length) {}
  std::uint64_t length() const override { return length_; }
  const Conn* conn() const { return conn_; }
  std::uint64_t grant() const { return grant_; }

 private:
  const Conn* conn_;
  const std::uint64_t grant_;
  const std::uint64_t length_;
};

}  // namespace kvfabric::tcp::internal

#endif  // KVFABRIC_TRANSPORT_TCP_TCP_INTERNAL_H_
