// transport_peer: the other process of transport_two_process_test.
//
// Creates a UCX transport (--tls), listens on 127.0.0.1:0, prints its listen
// address on stdout as one line ("listening on <ip:port>") and flushes, then serves the protocol of
// tests/transport_peer_protocol.h until it gets kQuit, its parent process
// dies (--parent-pid, plus PR_SET_PDEATHSIG) or nothing arrives for
// --idle-exit-s seconds. Exit status 0 after kQuit, 3 when orphaned, 4 when
// idle, 2 for bad flags, 1 when the transport cannot start.
//
// Threads: the transport's progress thread runs the message handler, which
// only queues events (and accepts kBlock payloads into the inbox, which must
// happen inside the handler); the main thread serves the queue one event at
// a time, so every transfer is submitted and waited for on the main thread.
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/crc32c.h"
#include "core/status.h"
#include "core/statusor.h"
#include "tests/transport_peer_protocol.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::transport_test {
namespace {

using transport::Clock;
using transport::CloseMode;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;
using transport::Transport;

// Generous: a 2-core machine under ASan moves a 32 MiB batch in well under it.
constexpr std::chrono::seconds kTransferDeadline{60};
constexpr std::chrono::seconds kReplyDeadline{10};

struct PeerFlags {
  std::string tls = "sm,self,tcp";
  pid_t parent_pid = 0;  // 0: do not watch the parent
  int idle_exit_s = 120;
};

bool ParseFlags(int argc, char** argv, PeerFlags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](std::string_view name) -> const char* {
      return arg.substr(0, name.size()) == name ? argv[i] + name.size() : nullptr;
    };
    char* end = nullptr;
    if (const char* v = value("--tls=")) {
      flags->tls = v;
    } else if (const char* v = value("--parent-pid=")) {
      flags->parent_pid = static_cast<pid_t>(std::strtol(v, &end, 10));
      if (*end != '\0') return false;
    } else if (const char* v = value("--idle-exit-s=")) {
      flags->idle_exit_s = static_cast<int>(std::strtol(v, &end, 10));
      if (*end != '\0') return false;
    } else {
      return false;
    }
  }
  return true;
}

Transfer Entry(TransferOp op, MemoryRegion* local, std::uint64_t local_offset,
               const RemoteRegion* remote, std::uint64_t remote_offset, std::uint64_t length) {
  Transfer t;
  t.op = op;
  t.local = local;
  t.local_offset = local_offset;
  t.remote = remote;
  t.remote_offset = remote_offset;
  t.length = length;
  return t;
}

// Submits `transfers` and waits for all of them; the first failure.
Status SubmitAndWait(Endpoint& ep, std::span<const Transfer> transfers,
                     std::chrono::seconds deadline) {
  StatusOr<std::unique_ptr<TransferBatch>> batch = ep.Submit(transfers);
  if (!batch.ok()) return batch.status();
  const Status waited = (*batch)->Wait(Clock::now() + deadline);
  if (!waited.ok()) {
    // Cancel, then the destructor waits for what is left (bounded: the
    // transport completes cancelled entries).
    (*batch)->Cancel();
    return waited;
  }
  return (*batch)->FirstError();
}

// Serves the protocol; see the file comment for the threads.
class Peer {
 public:
  explicit Peer(Transport* transport) : transport_(transport) {}

  // Progress thread.
  void OnAccept(std::unique_ptr<Endpoint> ep) {
    std::lock_guard<std::mutex> lock(mu_);
    endpoints_.push_back(std::move(ep));
  }

  // Progress thread: queue, and place kBlock payloads.
  void OnMessage(IncomingMessage& m) {
    std::optional<Message> msg = Decode(m.header());
    Event event;
    event.ep = m.endpoint();
    if (event.ep == nullptr) {
      // Every endpoint lives until exit, so this is the transport's doing.
      std::fprintf(stderr, "transport_peer: a message arrived with no endpoint to reply on\n");
    }
    if (!msg.has_value()) {
      std::fprintf(stderr, "transport_peer: dropped a message that is not of the protocol\n");
      if (m.payload_length() > 0) m.Drop();
      return;
    }
    event.msg = std::move(*msg);
    if (m.payload_length() > 0) {
      MemoryRegion* inbox = nullptr;
      std::uint64_t block_size = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        inbox = inbox_.get();
        block_size = block_size_;
      }
      if (event.msg.type != MessageType::kBlock || inbox == nullptr ||
          m.payload_length() != block_size) {
        m.Drop();
        event.placed = true;
        event.placed_status = Status::InvalidArgument("unexpected payload");
        Enqueue(std::move(event));
        return;
      }
      event.placed = true;
      auto shared = std::make_shared<Event>(std::move(event));
      const Status accepted =
          m.Accept(inbox, std::uint64_t{shared->msg.index} * block_size, [this, shared](Status s) {
            shared->placed_status = std::move(s);
            Enqueue(std::move(*shared));
          });
      if (!accepted.ok()) {
        shared->placed_status = accepted;
        Enqueue(std::move(*shared));
      }
      return;
    }
    Enqueue(std::move(event));
  }

  // Main thread. Serves events until kQuit (0), orphaned (3) or idle (4).
  int Run(const PeerFlags& flags) {
    auto last_event = Clock::now();
    while (true) {
      std::optional<Event> event = Pop(std::chrono::milliseconds(200));
      if (!event.has_value()) {
        if (flags.parent_pid != 0 && getppid() != flags.parent_pid) return 3;
        if (Clock::now() - last_event > std::chrono::seconds(flags.idle_exit_s)) return 4;
        continue;
      }
      last_event = Clock::now();
      if (event->placed) {
        OnPlaced(*event);
        continue;
      }
      if (event->msg.type == MessageType::kQuit) {
        Reply(event->ep, event->msg, Status::OK(), "");
        return 0;
      }
      Serve(*event);
    }
  }

  // Main thread, after Run: drops imports and closes every endpoint.
  void Shutdown() {
    connections_.clear();
    std::vector<std::unique_ptr<Endpoint>> endpoints;
    {
      std::lock_guard<std::mutex> lock(mu_);
      endpoints.swap(endpoints_);
    }
    for (auto& ep : endpoints) {
      ep->Close(CloseMode::kGraceful, Clock::now() + std::chrono::seconds(2)).IgnoreError();
    }
  }

 private:
  struct Event {
    Endpoint* ep = nullptr;
    Message msg;
    bool placed = false;  // a kBlock payload was placed (or failed to be)
    Status placed_status;
  };

  // The test's regions, imported on one endpoint.
  struct Connection {
    std::unique_ptr<RemoteRegion> test_inbox;
    std::unique_ptr<RemoteRegion> test_outbox;
  };

  // kBlock messages of one round received so far.
  struct Round {
    std::uint32_t placed = 0;
    std::string error;
  };

  void Enqueue(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    cv_.notify_one();
  }

  std::optional<Event> Pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return std::nullopt;
    Event event = std::move(events_.front());
    events_.pop_front();
    return event;
  }

  void Send(Endpoint* ep, const Message& msg) {
    if (ep == nullptr) return;
    const std::string header = Encode(msg);
    Transfer t;
    t.op = TransferOp::kSend;
    t.header = std::as_bytes(std::span(header));
    const Status st = SubmitAndWait(*ep, std::span(&t, 1), kReplyDeadline);
    if (!st.ok()) std::fprintf(stderr, "transport_peer: reply failed: %s\n", st.ToString().c_str());
  }

  void Reply(Endpoint* ep, const Message& request, const Status& status, std::string tail) {
    Message reply;
    reply.type = MessageType::kReply;
    reply.request = request.type;
    reply.round = request.round;
    reply.index = request.index;
    reply.ok = status.ok();
    reply.tail = status.ok() ? std::move(tail) : status.ToString();
    if (reply.tail.size() > kMaxTailBytes) reply.tail.resize(kMaxTailBytes);
    Send(ep, reply);
  }

  void OnPlaced(const Event& event) {
    const Message& msg = event.msg;
    Round& round = rounds_[msg.round];
    ++round.placed;
    if (round.error.empty()) {
      if (!event.placed_status.ok()) {
        round.error = "block " + std::to_string(msg.index) + ": " + event.placed_status.ToString();
      } else if (msg.tail.size() != 4 || msg.index >= count_) {
        round.error = "block " + std::to_string(msg.index) + ": malformed";
      } else {
        const std::vector<std::uint32_t> crc = DecodeCrcs(msg.tail);
        const std::string bad = CheckBlocks(
            inbox_->bytes().subspan(msg.index * block_size_, block_size_), block_size_, crc);
        if (!bad.empty()) round.error = "block " + std::to_string(msg.index) + ": " + bad;
      }
    }
    if (round.placed < msg.count) return;
    Message request = msg;
    request.type = MessageType::kBlock;
    Reply(event.ep, request, round.error.empty() ? Status::OK() : Status::DataLoss(round.error),
          "");
    rounds_.erase(msg.round);
  }

  void Serve(const Event& event) {
    const Message& msg = event.msg;
    std::string tail;
    Status st;
    switch (msg.type) {
      case MessageType::kSetup:
        st = Setup(msg.count, msg.value);
        break;
      case MessageType::kGetExport:
        st = GetExport(msg.index, &tail);
        break;
      case MessageType::kImport:
        st = Import(event.ep, msg.index, msg.tail);
        break;
      case MessageType::kVerify:
        st = Verify(msg);
        break;
      case MessageType::kPull:
        st = Pull(event.ep, msg);
        break;
      case MessageType::kPush:
        st = Push(event.ep, msg, &tail);
        break;
      case MessageType::kFill:
        st = CheckCount(msg.count);
        if (st.ok()) tail = EncodeCrcs(Fill(msg));
        break;
      case MessageType::kSendMe:
        st = SendMe(event.ep, msg);
        break;
      case MessageType::kPullLoop:
      case MessageType::kPushLoop:
        st = Loop(event.ep, msg);
        break;
      default:
        st = Status::InvalidArgument("unknown request " +
                                     std::to_string(static_cast<int>(msg.type)));
    }
    Reply(event.ep, msg, st, std::move(tail));
  }

  Status Setup(std::uint32_t count, std::uint64_t block_size) {
    if (count == 0 || block_size == 0) return Status::InvalidArgument("empty setup");
    if (inbox_ != nullptr) {
      if (count == count_ && block_size == block_size_) return Status::OK();
      return Status::FailedPrecondition("already set up with other sizes");
    }
    const std::uint64_t bytes = std::uint64_t{count} * block_size;
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> inbox,
                         transport_->AllocateMemory(bytes, MemoryKind::kHost));
    outbox_buf_.assign(bytes, std::byte{0});
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> outbox,
                         transport_->RegisterMemory(outbox_buf_, MemoryKind::kHost));
    outbox_ = std::move(outbox);
    count_ = count;
    std::lock_guard<std::mutex> lock(mu_);
    inbox_ = std::move(inbox);
    block_size_ = block_size;
    return Status::OK();
  }

  Status CheckCount(std::uint32_t count) const {
    if (inbox_ == nullptr) return Status::FailedPrecondition("no kSetup yet");
    if (count > count_) return Status::InvalidArgument("more blocks than set up");
    return Status::OK();
  }

  Status GetExport(std::uint32_t which, std::string* tail) {
    KVF_RETURN_IF_ERROR(CheckCount(0));
    const MemoryRegion* region = which == 0 ? inbox_.get() : outbox_.get();
    KVF_ASSIGN_OR_RETURN(*tail, region->Export(0, region->bytes().size()));
    if (tail->size() > kMaxTailBytes) return Status::ResourceExhausted("export too large");
    return Status::OK();
  }

  Status Import(Endpoint* ep, std::uint32_t which, std::string_view exported) {
    if (ep == nullptr) return Status::Unavailable("endpoint gone");
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RemoteRegion> remote, ep->ImportRegion(exported));
    Connection& c = connections_[ep];
    (which == 0 ? c.test_inbox : c.test_outbox) = std::move(remote);
    return Status::OK();
  }

  StatusOr<const RemoteRegion*> Imported(Endpoint* ep, bool inbox, std::uint32_t count) const {
    auto it = connections_.find(ep);
    const RemoteRegion* r = nullptr;
    if (it != connections_.end())
      r = inbox ? it->second.test_inbox.get() : it->second.test_outbox.get();
    if (r == nullptr)
      return Status::FailedPrecondition("test region not imported on this endpoint");
    if (r->length() < std::uint64_t{count} * block_size_) {
      return Status::InvalidArgument("test region too small");
    }
    return r;
  }

  std::vector<std::uint32_t> Fill(const Message& msg) {
    return FillBlocks(outbox_->bytes(), block_size_, msg.count, msg.value, msg.round);
  }

  Status Verify(const Message& msg) {
    KVF_RETURN_IF_ERROR(CheckCount(msg.count));
    const std::vector<std::uint32_t> crcs = DecodeCrcs(msg.tail);
    if (crcs.size() != msg.count) return Status::InvalidArgument("crc count");
    const std::string bad = CheckBlocks(inbox_->bytes(), block_size_, crcs);
    return bad.empty() ? Status::OK() : Status::DataLoss(bad);
  }

  std::vector<Transfer> Blocks(TransferOp op, MemoryRegion* local, const RemoteRegion* remote,
                               std::uint32_t count) const {
    std::vector<Transfer> transfers;
    for (std::uint32_t i = 0; i < count; ++i) {
      transfers.push_back(Entry(op, local, i * block_size_, remote, i * block_size_, block_size_));
    }
    return transfers;
  }

  Status Pull(Endpoint* ep, const Message& msg) {
    KVF_RETURN_IF_ERROR(CheckCount(msg.count));
    KVF_ASSIGN_OR_RETURN(const RemoteRegion* remote, Imported(ep, false, msg.count));
    KVF_RETURN_IF_ERROR(SubmitAndWait(
        *ep, Blocks(TransferOp::kRead, inbox_.get(), remote, msg.count), kTransferDeadline));
    return Verify(msg);
  }

  Status Push(Endpoint* ep, const Message& msg, std::string* tail) {
    KVF_RETURN_IF_ERROR(CheckCount(msg.count));
    KVF_ASSIGN_OR_RETURN(const RemoteRegion* remote, Imported(ep, true, msg.count));
    const std::vector<std::uint32_t> crcs = Fill(msg);
    KVF_RETURN_IF_ERROR(SubmitAndWait(
        *ep, Blocks(TransferOp::kWrite, outbox_.get(), remote, msg.count), kTransferDeadline));
    *tail = EncodeCrcs(crcs);
    return Status::OK();
  }

  Status SendMe(Endpoint* ep, const Message& msg) {
    KVF_RETURN_IF_ERROR(CheckCount(msg.count));
    if (ep == nullptr) return Status::Unavailable("endpoint gone");
    const std::vector<std::uint32_t> crcs = Fill(msg);
    std::vector<std::string> headers(msg.count);
    std::vector<Transfer> transfers;
    for (std::uint32_t i = 0; i < msg.count; ++i) {
      Message block;
      block.type = MessageType::kBlock;
      block.round = msg.round;
      block.index = i;
      block.count = msg.count;
      block.tail = EncodeCrcs(std::span(&crcs[i], 1));
      headers[i] = Encode(block);
      Transfer t =
          Entry(TransferOp::kSend, outbox_.get(), i * block_size_, nullptr, 0, block_size_);
      t.header = std::as_bytes(std::span(headers[i]));
      transfers.push_back(t);
    }
    return SubmitAndWait(*ep, transfers, kTransferDeadline);
  }

  // kPullLoop / kPushLoop: `msg.value` batches of `msg.count` blocks from or
  // into the test's memory, until the first failure.
  Status Loop(Endpoint* ep, const Message& msg) {
    KVF_RETURN_IF_ERROR(CheckCount(msg.count));
    const bool pull = msg.type == MessageType::kPullLoop;
    KVF_ASSIGN_OR_RETURN(const RemoteRegion* remote, Imported(ep, !pull, msg.count));
    Message started;
    started.type = MessageType::kStarted;
    started.request = msg.type;
    started.round = msg.round;
    Send(ep, started);
    const std::vector<Transfer> transfers =
        pull ? Blocks(TransferOp::kRead, inbox_.get(), remote, msg.count)
             : Blocks(TransferOp::kWrite, outbox_.get(), remote, msg.count);
    for (std::uint64_t i = 0; i < msg.value; ++i) {
      KVF_RETURN_IF_ERROR(SubmitAndWait(*ep, transfers, kTransferDeadline));
    }
    return Status::OK();
  }

  Transport* const transport_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;                          // guarded by mu_
  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // guarded by mu_
  // Written by Setup (main thread) under mu_, read by OnMessage under mu_;
  // the main thread reads them without the lock (it is their only writer).
  std::unique_ptr<MemoryRegion> inbox_;
  std::uint64_t block_size_ = 0;

  // Main thread only.
  std::uint32_t count_ = 0;
  std::vector<std::byte> outbox_buf_;
  std::unique_ptr<MemoryRegion> outbox_;
  std::map<Endpoint*, Connection> connections_;
  std::map<std::uint32_t, Round> rounds_;
};

int PeerMain(int argc, char** argv) {
  PeerFlags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: transport_peer [--tls=LIST] [--parent-pid=PID] "
                 "[--idle-exit-s=S]\n");
    return 2;
  }
  // Never outlive the test that started us (a SIGKILLed test runs no teardown).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (flags.parent_pid != 0 && getppid() != flags.parent_pid) return 3;

  ucx::UcxTransportOptions options;
  options.tls = flags.tls;
  StatusOr<std::unique_ptr<Transport>> created = ucx::CreateUcxTransport(options);
  if (!created.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", created.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Transport> transport = std::move(*created);
  auto peer = std::make_unique<Peer>(transport.get());
  transport->SetMessageHandler([p = peer.get()](IncomingMessage& m) { p->OnMessage(m); });
  const Status listening = transport->Listen(
      "127.0.0.1:0",
      [p = peer.get()](std::unique_ptr<Endpoint> ep) { p->OnAccept(std::move(ep)); });
  if (!listening.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", listening.ToString().c_str());
    return 1;
  }
  // UCX logs to stdout too: the address line carries a prefix, and stdout
  // goes to stderr after it so that later logs cannot fill the test's pipe.
  std::printf("%s%s\n", kListeningPrefix, transport->listen_address().c_str());
  std::fflush(stdout);
  dup2(STDERR_FILENO, STDOUT_FILENO);

  const int rc = peer->Run(flags);
  peer->Shutdown();
  // The transport goes first: its handlers point at the peer.
  transport.reset();
  peer.reset();
  return rc;
}

}  // namespace
}  // namespace kvfabric::transport_test

int main(int argc, char** argv) { return kvfabric::transport_test::PeerMain(argc, argv); }
