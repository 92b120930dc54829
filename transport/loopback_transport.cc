#include "transport/loopback_transport.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <new>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "core/mutex.h"
#include "transport/loopback_state.h"

namespace kvfabric::transport {
namespace loopback_internal {
namespace {

constexpr std::string_view kAddressPrefix = "loopback:";

// An export: magic, exporting core id, region id, offset, length, kind.
constexpr char kExportMagic[8] = {'K', 'V', 'F', 'L', 'B', 'R', 'G', '1'};
constexpr std::size_t kExportSize = sizeof(kExportMagic) + 4 * sizeof(std::uint64_t) + 1;

// True when [offset, offset + length) lies within [0, size), without overflow.
bool RangeFits(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

void PutU64(std::string* out, std::uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::uint64_t GetU64(std::string_view in, std::size_t at) {
  std::uint64_t v;
  std::memcpy(&v, in.data() + at, sizeof(v));
  return v;
}

}  // namespace

// The state of one LoopbackTransport, shared (weakly) with its regions,
// endpoints and peers so that none of them outlives what it touches.
class Core : public std::enable_shared_from_this<Core> {
 public:
  // A unit of worker work; `shutting_down` is true when the worker is draining
  // its queues at shutdown (the job must fail rather than do its work).
  using Job = std::function<void(bool shutting_down)>;

  explicit Core(std::shared_ptr<Registry> registry)
      : registry_(std::move(registry)), id_(registry_->NewCoreId()) {}

  void Start() {
    worker_ = std::thread([this] { Run(); });
  }

  std::uint64_t id() const { return id_; }
  Registry& registry() { return *registry_; }
  bool OnWorker() const { return std::this_thread::get_id() == worker_.get_id(); }

  // Queues work the worker always runs (accepts, barriers). False once shut down.
  bool PostLocal(Job job) { return Post(std::move(job), &local_work_); }
  // Queues work peers aimed at this transport (held while stalled).
  bool PostPeer(Job job) { return Post(std::move(job), &peer_work_); }

  void SetStalled(bool stalled) {
    MutexLock lock(&mu_);
    stalled_ = stalled;
    cv_.NotifyAll();
  }

  // Returns once every job queued before the call has run (or at once on the
  // worker itself, or after shutdown).
  void Barrier() {
    if (OnWorker()) return;
    auto done = std::make_shared<std::pair<Mutex, CondVar>>();
    auto flag = std::make_shared<bool>(false);
    bool posted = PostLocal([done, flag](bool) {
      MutexLock lock(&done->first);
      *flag = true;
      done->second.NotifyAll();
    });
    if (!posted) return;
    MutexLock lock(&done->first);
    done->second.Wait(&done->first, [&] { return *flag; });
  }

  void SetMessageHandler(MessageHandler handler) {
    MutexLock lock(&mu_);
    message_handler_ = std::move(handler);
  }

  Status Listen(const std::string& address, AcceptHandler on_accept);
  std::string listen_address() const {
    MutexLock lock(&mu_);
    return listen_name_.empty() ? "" : std::string(kAddressPrefix) + listen_name_;
  }

  // Registers an endpoint for shutdown. False once shutting down.
  bool AddEndpoint(std::shared_ptr<EndpointState> ep) {
    MutexLock lock(&mu_);
    if (shutting_down_) return false;
    endpoints_.insert(std::move(ep));
    return true;
  }
  void ForgetEndpoint(const std::shared_ptr<EndpointState>& ep) {
    MutexLock lock(&mu_);
    endpoints_.erase(ep);
  }

  std::uint64_t AddRegion(std::shared_ptr<RegionState> region) {
    MutexLock lock(&regions_mu_);
    std::uint64_t id = ++next_region_id_;
    regions_.emplace(id, std::move(region));
    return id;
  }
  void RemoveRegion(std::uint64_t id) {
    MutexLock lock(&regions_mu_);
    regions_.erase(id);
  }

  // Runs on this core's worker: performs `op`, which a peer aimed at this core.
  void Execute(const std::shared_ptr<Op>& op, bool shutting_down);

  // Runs on this core's worker: hands an accepted endpoint to the handler.
  void DeliverAccept(std::shared_ptr<EndpointState> ep, bool shutting_down);

  // Force-closes every endpoint, waits for their entries, stops the worker.
  void Shutdown();

 private:
  bool Post(Job job, std::deque<Job>* queue) {
    MutexLock lock(&mu_);
    if (stopping_) return false;
    queue->push_back(std::move(job));
    cv_.NotifyAll();
    return true;
  }
  void Run();
  // Sets *landed to the destination's CRC32C when op.checksum.
  Status Copy(const Op& op, std::uint64_t* bytes, std::optional<std::uint32_t>* landed);
  Status Deliver(const Op& op, EndpointState& target);

  const std::shared_ptr<Registry> registry_;
  const std::uint64_t id_;
  std::thread worker_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> local_work_ KVF_GUARDED_BY(mu_);
  std::deque<Job> peer_work_ KVF_GUARDED_BY(mu_);
  bool stalled_ KVF_GUARDED_BY(mu_) = false;
  bool stopping_ KVF_GUARDED_BY(mu_) = false;       // no more jobs are queued
  bool shutting_down_ KVF_GUARDED_BY(mu_) = false;  // no more endpoints are added
  std::string listen_name_ KVF_GUARDED_BY(mu_);
  AcceptHandler accept_handler_ KVF_GUARDED_BY(mu_);
  MessageHandler message_handler_ KVF_GUARDED_BY(mu_);
  std::set<std::shared_ptr<EndpointState>> endpoints_ KVF_GUARDED_BY(mu_);

  Mutex regions_mu_;
  std::map<std::uint64_t, std::shared_ptr<RegionState>> regions_ KVF_GUARDED_BY(regions_mu_);
  std::uint64_t next_region_id_ KVF_GUARDED_BY(regions_mu_) = 0;
};

namespace {

class LoopbackRegion final : public MemoryRegion {
 public:
  LoopbackRegion(std::shared_ptr<Core> core, std::span<std::byte> bytes,
                 std::unique_ptr<std::byte[]> owned)
      : core_(core),
        core_id_(core->id()),
        state_(std::make_shared<RegionState>(bytes)),
        id_(core->AddRegion(state_)),
        owned_(std::move(owned)) {}

  ~LoopbackRegion() override {
    if (std::shared_ptr<Core> core = core_.lock()) core->RemoveRegion(id_);
    MutexLock lock(&state_->mu);  // waits for a peer's copy
    state_->alive = false;
  }

  std::span<std::byte> bytes() const override { return state_->bytes; }
  MemoryKind kind() const override { return MemoryKind::kHost; }

  StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const override {
    if (!RangeFits(offset, length, state_->bytes.size())) {
      return Status::InvalidArgument("export range [" + std::to_string(offset) + ", +" +
                                     std::to_string(length) + ") is outside a region of " +
                                     std::to_string(state_->bytes.size()) + " bytes");
    }
    std::string out(kExportMagic, sizeof(kExportMagic));
    PutU64(&out, core_id_);
    PutU64(&out, id_);
    PutU64(&out, offset);
    PutU64(&out, length);
    out.push_back(static_cast<char>(MemoryKind::kHost));
    return out;
  }

  std::uint64_t core_id() const { return core_id_; }

 private:
  const std::weak_ptr<Core> core_;
  const std::uint64_t core_id_;
  const std::shared_ptr<RegionState> state_;
  const std::uint64_t id_;
  const std::unique_ptr<std::byte[]> owned_;  // AllocateMemory's bytes, else null
};

class LoopbackRemoteRegion final : public RemoteRegion {
 public:
  LoopbackRemoteRegion(std::uint64_t endpoint_id, std::uint64_t region_id, std::uint64_t offset,
                       std::uint64_t length)
      : endpoint_id_(endpoint_id), region_id_(region_id), offset_(offset), length_(length) {}

  std::uint64_t length() const override { return length_; }
  std::uint64_t endpoint_id() const { return endpoint_id_; }
  std::uint64_t region_id() const { return region_id_; }
  std::uint64_t offset() const { return offset_; }

 private:
  const std::uint64_t endpoint_id_, region_id_, offset_, length_;
};

// A message being handed to the handler, on the receiver's worker.
class LoopbackIncomingMessage final : public IncomingMessage {
 public:
  LoopbackIncomingMessage(Endpoint* endpoint, std::uint64_t core_id,
                          std::span<const std::byte> header, std::span<const std::byte> payload)
      : endpoint_(endpoint), core_id_(core_id), header_(header), payload_(payload) {}

  Endpoint* endpoint() const override { return endpoint_; }
  std::span<const std::byte> header() const override { return header_; }
  std::uint64_t payload_length() const override { return payload_.size(); }

  Status Accept(MemoryRegion* region, std::uint64_t offset,
                std::function<void(Status)> on_placed) override {
    if (decided_) return Status::FailedPrecondition("message already accepted or dropped");
    decided_ = true;
    auto* r = dynamic_cast<LoopbackRegion*>(region);
    if (r == nullptr || r->core_id() != core_id_) {
      return Status::InvalidArgument("Accept: region was not registered with this transport");
    }
    if (!RangeFits(offset, payload_.size(), r->bytes().size())) {
      return Status::InvalidArgument("Accept: payload of " + std::to_string(payload_.size()) +
                                     " bytes at offset " + std::to_string(offset) +
                                     " does not fit a region of " +
                                     std::to_string(r->bytes().size()) + " bytes");
    }
    if (!payload_.empty())
      std::memcpy(r->bytes().data() + offset, payload_.data(), payload_.size());
    on_placed_ = std::move(on_placed);
    return Status::OK();
  }

  void Drop() override { decided_ = true; }

  // After the handler returned: tells the acceptor its bytes are placed.
  void RunPlacedCallback() {
    if (on_placed_) on_placed_(Status::OK());
  }

 private:
  Endpoint* const endpoint_;
  const std::uint64_t core_id_;
  const std::span<const std::byte> header_;
  const std::span<const std::byte> payload_;
  bool decided_ = false;
  std::function<void(Status)> on_placed_;
};

class LoopbackEndpoint final : public Endpoint {
 public:
  LoopbackEndpoint(std::shared_ptr<EndpointState> state, std::weak_ptr<Core> core)
      : state_(std::move(state)), core_(std::move(core)) {
    MutexLock lock(&state_->mu);
    state_->owner = this;
  }

  ~LoopbackEndpoint() override {
    {
      MutexLock lock(&state_->mu);
      state_->owner = nullptr;
    }
    Close(CloseMode::kForce, Clock::now()).IgnoreError();  // kForce returns OK
    // A message handler running now may hold this object (IncomingMessage::endpoint()).
    if (std::shared_ptr<Core> core = core_.lock()) core->Barrier();
  }

  std::string peer_address() const override { return state_->peer_address; }

  Status health() const override {
    MutexLock lock(&state_->mu);
    if (!state_->failure.ok()) return Status::Unavailable(state_->failure.message());
    if (state_->peer_core.expired()) return Status::Unavailable("peer transport is gone");
    return Status::OK();
  }

  StatusOr<std::unique_ptr<RemoteRegion>> ImportRegion(std::string_view exported) override;
  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers) override;

  Status Flush(Deadline deadline) override {
    for (const std::shared_ptr<BatchCompletion>& b : LiveBatches(*state_)) {
      KVF_RETURN_IF_ERROR(b->Wait(deadline));
    }
    return Status::OK();
  }

  Status Close(CloseMode mode, Deadline deadline) override {
    Status result;
    if (mode == CloseMode::kGraceful) {
      Status flushed = Flush(deadline);
      if (!flushed.ok()) result = flushed.WithContext("graceful close fell back to force");
    }
    Disconnect(*state_, Status::Cancelled("endpoint force-closed"));
    for (const std::shared_ptr<BatchCompletion>& b : LiveBatches(*state_)) b->WaitForever();
    if (std::shared_ptr<Core> core = core_.lock()) core->ForgetEndpoint(state_);
    return result;
  }

 private:
  Status Validate(std::span<const Transfer> transfers) const;

  const std::shared_ptr<EndpointState> state_;
  const std::weak_ptr<Core> core_;
};

StatusOr<std::unique_ptr<RemoteRegion>> LoopbackEndpoint::ImportRegion(std::string_view exported) {
  if (exported.size() != kExportSize ||
      std::memcmp(exported.data(), kExportMagic, sizeof(kExportMagic)) != 0) {
    return Status::InvalidArgument("not a loopback export (" + std::to_string(exported.size()) +
                                   " bytes)");
  }
  std::size_t at = sizeof(kExportMagic);
  const std::uint64_t core_id = GetU64(exported, at);
  const std::uint64_t region_id = GetU64(exported, at + 8);
  const std::uint64_t offset = GetU64(exported, at + 16);
  const std::uint64_t length = GetU64(exported, at + 24);
  const auto kind = static_cast<MemoryKind>(exported[at + 32]);
  std::uint64_t peer_core_id;
  {
    MutexLock lock(&state_->mu);
    peer_core_id = state_->peer_core_id;
  }
  if (core_id != peer_core_id) {
    return Status::InvalidArgument("export comes from transport " + std::to_string(core_id) +
                                   ", not from this endpoint's peer");
  }
  if (kind != MemoryKind::kHost || !RangeFits(offset, length, UINT64_MAX)) {
    return Status::InvalidArgument("malformed loopback export (kind or range)");
  }
  return std::unique_ptr<RemoteRegion>(
      std::make_unique<LoopbackRemoteRegion>(state_->id, region_id, offset, length));
}

Status LoopbackEndpoint::Validate(std::span<const Transfer> transfers) const {
  std::shared_ptr<Core> core = core_.lock();
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const std::string where = "transfer " + std::to_string(i) + ": ";
    if (t.op != TransferOp::kRead && t.op != TransferOp::kWrite && t.op != TransferOp::kSend) {
      return Status::InvalidArgument(where + "unknown op");
    }
    if (t.local == nullptr) {
      if (t.op != TransferOp::kSend || t.length != 0) {
        return Status::InvalidArgument(where + "no local region");
      }
    } else {
      auto* local = dynamic_cast<const LoopbackRegion*>(t.local);
      if (local == nullptr || core == nullptr || local->core_id() != core->id()) {
        return Status::InvalidArgument(where + "local region is not from this transport");
      }
      if (!RangeFits(t.local_offset, t.length, local->bytes().size())) {
        return Status::InvalidArgument(where + "local range [" + std::to_string(t.local_offset) +
                                       ", +" + std::to_string(t.length) + ") outside " +
                                       std::to_string(local->bytes().size()) + " bytes");
      }
    }
    if (t.op == TransferOp::kSend) {
      if (t.header.size() > kMaxMessageHeaderBytes) {
        return Status::InvalidArgument(where + "header of " + std::to_string(t.header.size()) +
                                       " bytes exceeds " + std::to_string(kMaxMessageHeaderBytes));
      }
      continue;
    }
    auto* remote = dynamic_cast<const LoopbackRemoteRegion*>(t.remote);
    if (remote == nullptr || remote->endpoint_id() != state_->id) {
      return Status::InvalidArgument(where + "remote region missing or imported elsewhere");
    }
    if (!RangeFits(t.remote_offset, t.length, remote->length())) {
      return Status::InvalidArgument(where + "remote range [" + std::to_string(t.remote_offset) +
                                     ", +" + std::to_string(t.length) + ") outside " +
                                     std::to_string(remote->length()) + " bytes");
    }
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<TransferBatch>> LoopbackEndpoint::Submit(
    std::span<const Transfer> transfers) {
  KVF_RETURN_IF_ERROR(Validate(transfers));
  auto ops = std::make_shared<std::vector<std::weak_ptr<Op>>>();
  auto completion = std::make_shared<BatchCompletion>(transfers.size(), [ops] {
    for (const std::weak_ptr<Op>& w : *ops) {
      std::shared_ptr<Op> op = w.lock();
      if (op && op->TryAbort()) CompleteOp(op, Status::Cancelled("transfer cancelled"), 0);
    }
  });
  std::vector<std::shared_ptr<Op>> created;
  created.reserve(transfers.size());
  std::weak_ptr<EndpointState> target;
  std::shared_ptr<Core> peer_core;
  {
    MutexLock lock(&state_->mu);
    target = state_->peer;
    peer_core = state_->peer_core.lock();
  }
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    auto op = std::make_shared<Op>();
    op->completion = completion;
    op->index = i;
    op->op = t.op;
    if (t.local != nullptr) op->local = t.local->bytes().subspan(t.local_offset, t.length);
    if (t.op == TransferOp::kSend) {
      op->header.assign(t.header.begin(), t.header.end());
    } else {
      auto* remote = static_cast<const LoopbackRemoteRegion*>(t.remote);
      op->region_id = remote->region_id();
      op->region_offset = remote->offset() + t.remote_offset;
      op->checksum = t.checksum;
    }
    op->origin = state_;
    op->target = target;
    ops->push_back(op);
    created.push_back(std::move(op));
  }
  Status failure;
  {
    MutexLock lock(&state_->mu);
    failure = state_->failure;
    if (failure.ok()) {
      state_->pending.insert(created.begin(), created.end());
      std::erase_if(state_->batches, [](const std::weak_ptr<BatchCompletion>& w) {
        std::shared_ptr<BatchCompletion> b = w.lock();
        return b == nullptr || b->Done();
      });
      state_->batches.push_back(completion);
    }
  }
  for (const std::shared_ptr<Op>& op : created) {
    if (!failure.ok()) {
      if (op->TryAbort()) CompleteOp(op, Status::Unavailable(failure.message()), 0);
      continue;
    }
    Core* pc = peer_core.get();
    bool posted = pc != nullptr && pc->PostPeer([op, pc](bool sd) { pc->Execute(op, sd); });
    if (!posted && op->TryAbort()) {
      CompleteOp(op, Status::Unavailable("peer transport is gone"), 0);
    }
  }
  return std::make_unique<TransferBatch>(std::move(completion));
}

}  // namespace

Status Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (address.rfind(kAddressPrefix, 0) != 0 || address.size() == kAddressPrefix.size()) {
    return Status::InvalidArgument("loopback address must be \"loopback:<name>\", got \"" +
                                   address + "\"");
  }
  {
    MutexLock lock(&mu_);
    if (!listen_name_.empty()) return Status::FailedPrecondition("already listening");
  }
  KVF_ASSIGN_OR_RETURN(std::string name,
                       registry_->Bind(address.substr(kAddressPrefix.size()), weak_from_this()));
  MutexLock lock(&mu_);
  listen_name_ = std::move(name);
  accept_handler_ = std::move(on_accept);
  return Status::OK();
}

void Core::Run() {
  MutexLock lock(&mu_);
  for (;;) {
    cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) {
      return stopping_ || !local_work_.empty() || (!stalled_ && !peer_work_.empty());
    });
    if (stopping_) break;
    std::deque<Job>& queue = !local_work_.empty() ? local_work_ : peer_work_;
    Job job = std::move(queue.front());
    queue.pop_front();
    lock.Unlock();
    job(false);
    lock.Lock();
  }
  // Drain: nothing more can be queued (stopping_), so this terminates.
  std::deque<Job> local = std::move(local_work_);
  std::deque<Job> peer = std::move(peer_work_);
  lock.Unlock();
  for (Job& job : local) job(true);
  for (Job& job : peer) job(true);
}

Status Core::Copy(const Op& op, std::uint64_t* bytes, std::optional<std::uint32_t>* landed) {
  std::shared_ptr<RegionState> region;
  {
    MutexLock lock(&regions_mu_);
    auto it = regions_.find(op.region_id);
    if (it != regions_.end()) region = it->second;
  }
  if (region == nullptr) return Status::Unavailable("peer region is no longer registered");
  MutexLock lock(&region->mu);
  if (!region->alive) return Status::Unavailable("peer region is no longer registered");
  if (!RangeFits(op.region_offset, op.local.size(), region->bytes.size())) {
    return Status::Internal("loopback: range outside the peer region passed validation");
  }
  if (!op.local.empty()) {
    std::byte* remote = region->bytes.data() + op.region_offset;
    if (op.op == TransferOp::kRead) {
      std::memcpy(op.local.data(), remote, op.local.size());
    } else {
      std::memcpy(remote, op.local.data(), op.local.size());
    }
  }
  if (op.checksum) {
    *landed = crc32c::Value(
        op.op == TransferOp::kRead ? op.local.data() : region->bytes.data() + op.region_offset,
        op.local.size());
  }
  *bytes = op.local.size();
  return Status::OK();
}

Status Core::Deliver(const Op& op, EndpointState& target) {
  MessageHandler handler;
  {
    MutexLock lock(&mu_);
    handler = message_handler_;
  }
  Endpoint* owner;
  {
    MutexLock lock(&target.mu);
    owner = target.owner;
  }
  LoopbackIncomingMessage message(owner, id_, op.header, op.local);
  if (handler) handler(message);
  message.RunPlacedCallback();
  return Status::OK();
}

void Core::Execute(const std::shared_ptr<Op>& op, bool shutting_down) {
  if (!op->TryStart()) return;  // cancelled or failed while queued
  Status status;
  std::uint64_t bytes = 0;
  std::optional<std::uint32_t> landed;
  std::shared_ptr<EndpointState> target = op->target.lock();
  Status target_failure = Status::Unavailable("peer endpoint is gone");
  if (target != nullptr) {
    MutexLock lock(&target->mu);
    target_failure = target->failure;
  }
  if (shutting_down) {
    status = Status::Unavailable("peer transport shut down");
  } else if (!target_failure.ok()) {
    status = Status::Unavailable("peer endpoint closed: " + std::string(target_failure.message()));
  } else if (op->op == TransferOp::kSend) {
    status = Deliver(*op, *target);
    bytes = status.ok() ? op->local.size() : 0;
  } else {
    status = Copy(*op, &bytes, &landed);
  }
  op->state.store(Op::kFinished);
  CompleteOp(op, std::move(status), bytes, landed);
}

void Core::DeliverAccept(std::shared_ptr<EndpointState> ep, bool shutting_down) {
  AcceptHandler handler;
  {
    MutexLock lock(&mu_);
    handler = accept_handler_;
  }
  if (shutting_down || !handler) {
    Disconnect(*ep, Status::Cancelled("listener shut down"));
    ForgetEndpoint(ep);
    return;
  }
  handler(std::make_unique<LoopbackEndpoint>(std::move(ep), weak_from_this()));
}

void Core::Shutdown() {
  std::set<std::shared_ptr<EndpointState>> endpoints;
  std::string name;
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    endpoints.swap(endpoints_);
    name = listen_name_;
  }
  if (!name.empty()) registry_->Unbind(name);
  for (const std::shared_ptr<EndpointState>& ep : endpoints) {
    Disconnect(*ep, Status::Cancelled("transport destroyed"));
  }
  // Entries that were running on a peer's worker finish there.
  for (const std::shared_ptr<EndpointState>& ep : endpoints) {
    for (const std::shared_ptr<BatchCompletion>& b : LiveBatches(*ep)) b->WaitForever();
  }
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace loopback_internal

using loopback_internal::Core;
using loopback_internal::EndpointState;

LoopbackNetwork::LoopbackNetwork() : registry_(std::make_shared<loopback_internal::Registry>()) {}
LoopbackNetwork::~LoopbackNetwork() = default;

LoopbackTransport::LoopbackTransport(const LoopbackOptions& options)
    : core_(std::make_shared<Core>(options.network->registry_)) {
  core_->Start();
}

LoopbackTransport::~LoopbackTransport() { core_->Shutdown(); }

StatusOr<std::unique_ptr<MemoryRegion>> LoopbackTransport::RegisterMemory(
    std::span<std::byte> bytes, MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return Status::Unimplemented("loopback transport registers host memory only");
  }
  return std::unique_ptr<MemoryRegion>(
      std::make_unique<loopback_internal::LoopbackRegion>(core_, bytes, nullptr));
}

StatusOr<std::unique_ptr<MemoryRegion>> LoopbackTransport::AllocateMemory(std::uint64_t size,
                                                                          MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return Status::Unimplemented("loopback transport allocates host memory only");
  }
  if (size == 0) return Status::InvalidArgument("AllocateMemory of 0 bytes");
  std::unique_ptr<std::byte[]> owned(new (std::nothrow) std::byte[size]());
  if (owned == nullptr) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(size) + " bytes");
  }
  std::span<std::byte> bytes(owned.get(), size);
  return std::unique_ptr<MemoryRegion>(
      std::make_unique<loopback_internal::LoopbackRegion>(core_, bytes, std::move(owned)));
}

void LoopbackTransport::SetMessageHandler(MessageHandler handler) {
  core_->SetMessageHandler(std::move(handler));
}

Status LoopbackTransport::Listen(const std::string& address, AcceptHandler on_accept) {
  return core_->Listen(address, std::move(on_accept));
}

std::string LoopbackTransport::listen_address() const { return core_->listen_address(); }

StatusOr<std::unique_ptr<Endpoint>> LoopbackTransport::Connect(const std::string& address,
                                                               PeerFailureMode mode,
                                                               Deadline /*deadline*/) {
  if (mode != PeerFailureMode::kFailInFlight) {
    return Status::InvalidArgument("unknown peer failure mode");
  }
  const std::string_view prefix = "loopback:";
  if (address.rfind(prefix, 0) != 0) {
    return Status::InvalidArgument("not a loopback address: \"" + address + "\"");
  }
  std::shared_ptr<Core> peer = core_->registry().Find(address.substr(prefix.size()));
  if (peer == nullptr) return Status::Unavailable("nothing listens on " + address);
  const std::string self_address =
      core_->listen_address().empty() ? "loopback:(client)" : core_->listen_address();
  auto mine = std::make_shared<EndpointState>(core_->registry().NewEndpointId(), address);
  auto theirs = std::make_shared<EndpointState>(core_->registry().NewEndpointId(), self_address);
  {
    // Not shared yet: the locks cost nothing and let the analysis check the rest.
    MutexLock lock(&mine->mu);
    mine->peer = theirs;
    mine->peer_core = peer;
    mine->peer_core_id = peer->id();
  }
  {
    MutexLock lock(&theirs->mu);
    theirs->peer = mine;
    theirs->peer_core = core_;
    theirs->peer_core_id = core_->id();
  }
  if (!core_->AddEndpoint(mine)) return Status::FailedPrecondition("transport is shutting down");
  Core* pc = peer.get();
  if (!peer->AddEndpoint(theirs) ||
      !peer->PostLocal([theirs, pc](bool sd) { pc->DeliverAccept(theirs, sd); })) {
    core_->ForgetEndpoint(mine);
    peer->ForgetEndpoint(theirs);
    return Status::Unavailable("listener at " + address + " is shutting down");
  }
  return std::unique_ptr<Endpoint>(
      std::make_unique<loopback_internal::LoopbackEndpoint>(mine, core_));
}

void LoopbackTransport::TEST_StallPeerWork(bool stalled) { core_->SetStalled(stalled); }

StatusOr<std::unique_ptr<LoopbackTransport>> CreateLoopbackTransport(
    const LoopbackOptions& options) {
  if (options.network == nullptr) return Status::InvalidArgument("LoopbackOptions.network is null");
  return std::make_unique<LoopbackTransport>(options);
}

}  // namespace kvfabric::transport
