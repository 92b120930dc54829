#include "transport/ucx/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "transport/ucx/ucx_core.h"
#include "transport/ucx/ucx_export.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx {

namespace {

using internal::BatchOp;
using internal::EpState;
using internal::PreparedTransfer;
using internal::RkeyHolder;
using internal::UcxCore;
using internal::Waiter;
using transport::BatchCompletion;
using transport::CloseMode;
using transport::Deadline;
using transport::Endpoint;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;

// True if [offset, offset + length) lies within [0, size).
bool InRange(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

// Does the UCX TLS list let listener (sockaddr) connections be made?
bool TlsAllowsSockaddr(const std::string& tls) {
  bool negated = !tls.empty() && tls.front() == '^';
  std::stringstream ss(negated ? tls.substr(1) : tls);
  std::string item;
  bool has_tcp = false;
  while (std::getline(ss, item, ',')) {
    if (item == "tcp" || item == "all") has_tcp = true;
  }
  return negated ? !has_tcp : has_tcp;
}

// How long a destroyed MemoryRegion lets peers' operations on it finish
// before it force-closes their endpoints.
constexpr std::chrono::milliseconds kRegionRevokeGrace{1000};

class UcxMemoryRegion final : public MemoryRegion {
 public:
  UcxMemoryRegion(std::shared_ptr<UcxCore> core, std::span<std::byte> bytes,
                  std::unique_ptr<UcpMemHandle> memh)
      : core_(core), bytes_(bytes), memh_(std::move(memh)), owned_(new internal::OwnedRegion) {
    owned_->base = bytes.data();
    owned_->size = bytes.size();
  }
  ~UcxMemoryRegion() override {
    // Peers may be placing into or sending from the region: revoke its
    // grants and wait for them before the memory goes.
    if (auto core = core_.lock()) core->RevokeRegion(owned_, kRegionRevokeGrace);
  }

  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return MemoryKind::kHost; }

  StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const override {
    if (!InRange(offset, length, bytes_.size())) {
      return Status::InvalidArgument("export of [" + std::to_string(offset) + ", +" +
                                     std::to_string(length) + ") outside a " +
                                     std::to_string(bytes_.size()) + "-byte region");
    }
    void* buffer = nullptr;
    std::size_t size = 0;
    KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_rkey_pack(memh_->context(), memh_->get(), &buffer, &size),
                                      "ucp_rkey_pack"));
    UniqueRkeyBuffer owned(buffer);
    if (size == 0 || size > kMaxPackedRkeyBytes) {
      return Status::Internal("ucp_rkey_pack produced " + std::to_string(size) + " bytes");
    }
    ExportedRange r;
    std::shared_ptr<UcxCore> core = core_.lock();
    if (!core) return Status::Unavailable("the UCX transport was destroyed");
    r.kind = MemoryKind::kHost;
    r.address = reinterpret_cast<std::uint64_t>(bytes_.data()) + offset;
    r.length = length;
    r.grant_id = core->GrantRange(owned_, offset, length);
    r.packed_rkey.assign(static_cast<const char*>(buffer), size);
    return EncodeExportedRange(r);
  }

 private:
  const std::weak_ptr<UcxCore> core_;
  const std::span<std::byte> bytes_;
  const std::unique_ptr<UcpMemHandle> memh_;
  const std::shared_ptr<internal::OwnedRegion> owned_;
};

class UcxRemoteRegion final : public RemoteRegion {
 public:
  UcxRemoteRegion(std::weak_ptr<UcxCore> core, std::shared_ptr<RkeyHolder> holder)
      : core_(std::move(core)), holder_(std::move(holder)) {}
  ~UcxRemoteRegion() override {
    // The key belongs to the progress thread; if the core is gone, its
    // endpoint was closed and the key destroyed with it.
    if (auto core = core_.lock()) {
      core->Post([core_raw = core.get(), h = holder_] { core_raw->DestroyRkey(h); });
    }
  }
  std::uint64_t length() const override { return holder_->length; }
  const std::shared_ptr<RkeyHolder>& holder() const { return holder_; }

 private:
  const std::weak_ptr<UcxCore> core_;
  const std::shared_ptr<RkeyHolder> holder_;
};

// How long a destroyed Endpoint lets posted requests finish before it
// force-closes (see Close).
constexpr std::chrono::milliseconds kDestructorGrace{1000};

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxCore> core, std::shared_ptr<EpState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~UcxEndpoint() override {
    Close(CloseMode::kForce, transport::Clock::now() + kDestructorGrace).IgnoreError();
  }

  std::string peer_address() const override { return state_->peer; }
  Status health() const override { return state_->health(); }

  StatusOr<std::unique_ptr<RemoteRegion>> ImportRegion(std::string_view exported) override {
    KVF_ASSIGN_OR_RETURN(ExportedRange range, DecodeExportedRange(exported));
    if (range.kind != MemoryKind::kHost) {
      return Status::Unimplemented("importing device memory: this UCX build has no GPU transports");
    }
    StatusOr<std::shared_ptr<RkeyHolder>> holder =
        Status::Unavailable("the UCX transport was destroyed");
    core_->RunSync([&] {
      holder =
          core_->UnpackRkey(state_, range.packed_rkey, range.address, range.length, range.grant_id);
    });
    if (!holder.ok()) return holder.status();
    core_->PopulateMapping(*holder);
    return std::unique_ptr<RemoteRegion>(
        std::make_unique<UcxRemoteRegion>(core_, std::move(holder).value()));
  }

  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers) override {
    auto op = std::make_shared<BatchOp>();
    op->ep = state_;
    op->entries.resize(transfers.size());
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      Status st = Prepare(transfers[i], &op->entries[i]);
      if (!st.ok()) return st.WithContext("transfer " + std::to_string(i));
    }
    if (CopyInline(*op)) {
      core_->CountInline(transfers.size());
      return std::make_unique<TransferBatch>(op->completion);
    }
    std::weak_ptr<BatchOp> weak_op = op;
    std::weak_ptr<UcxCore> weak_core = core_;
    op->completion = std::make_shared<BatchCompletion>(transfers.size(), [weak_op, weak_core] {
      auto core = weak_core.lock();
      auto o = weak_op.lock();
      if (core && o) core->Post([c = core.get(), o] { c->CancelBatch(o); });
    });
    auto batch = std::make_unique<TransferBatch>(op->completion);
    {
      MutexLock lock(&mu_);
      std::erase_if(batches_, [](const auto& c) { return c->Done(); });
      batches_.push_back(op->completion);
    }
    Status h = closed_.load() ? Status::Unavailable("endpoint to " + state_->peer + " was closed")
                              : state_->health();
    std::uint32_t rank = transfers.empty() ? 0 : transfers[0].rank;
    for (const Transfer& t : transfers) rank = std::min(rank, t.rank);
    const bool posted =
        h.ok() && core_->PostRanked(rank, [c = core_.get(), op] { c->StartBatch(op); });
    if (!posted) {
      Status why = h.ok() ? Status::Unavailable("the UCX transport was destroyed")
                          : internal::AsUnavailable(h);
      for (std::size_t i = 0; i < transfers.size(); ++i) op->completion->Complete(i, why, 0);
    }
    return batch;
  }

  // The inline path of UcxTransportOptions::inline_copy_max_bytes: when
  // every entry is a kRead/kWrite into a range mapped here and the batch is
  // small enough, copies it on this thread, completes op->completion and
  // returns true; otherwise changes nothing and returns false.
  bool CopyInline(BatchOp& op) {
    const std::uint64_t limit = core_->options().inline_copy_max_bytes;
    if (limit == 0 || op.entries.empty() || core_->OnProgressThread()) return false;
    std::uint64_t total = 0;
    for (const PreparedTransfer& t : op.entries) {
      if (t.op == TransferOp::kSend || t.rkey == nullptr) return false;
      total += t.length;
      if (total > limit) return false;
    }
    if (closed_.load() || !state_->health().ok()) return false;  // the queued path reports it
    // Lock every distinct key's mapping (a batch normally names one).
    std::vector<std::shared_lock<std::shared_mutex>> locks;
    std::vector<const RkeyHolder*> held;
    for (const PreparedTransfer& t : op.entries) {
      if (std::find(held.begin(), held.end(), t.rkey.get()) != held.end()) continue;
      locks.emplace_back(t.rkey->map_mu);
      held.push_back(t.rkey.get());
      if (t.rkey->mapped == nullptr) return false;  // not mapped, or already released
    }
    op.completion = std::make_shared<BatchCompletion>(op.entries.size(), nullptr);
    std::vector<CopyRange> ranges;
    ranges.reserve(op.entries.size());
    for (PreparedTransfer& t : op.entries) ranges.push_back(MappedRange(t));
    // A fault (the peer shrank the memory it shared: SIGBUS) fails the batch,
    // not the process (core/guarded_copy.h).
    const Status copied = core_->CopyRanges(ranges);
    // Complete() publishes under the completion's mutex: the bytes are in
    // place before anyone learns the batch completed.
    for (std::size_t i = 0; i < op.entries.size(); ++i) {
      const PreparedTransfer& t = op.entries[i];
      op.completion->Complete(i, copied, copied.ok() ? t.length : 0, t.LandedCrc());
    }
    return true;
  }

  Status Flush(Deadline deadline) override {
    std::vector<std::shared_ptr<BatchCompletion>> batches;
    {
      MutexLock lock(&mu_);
      batches = batches_;
    }
    for (const auto& b : batches) KVF_RETURN_IF_ERROR(b->Wait(deadline));
    return Status::OK();
  }

  Status Close(CloseMode mode, Deadline deadline) override {
    if (closed_.exchange(true)) return Flush(transport::Deadline::max());
    const Status reason = Status::Unavailable("endpoint to " + state_->peer + " was closed");
    if (mode == CloseMode::kGraceful) {
      Status flushed = Flush(deadline);
      if (flushed.ok()) {
        auto waiter = std::make_shared<Waiter>();
        const bool ran = core_->RunSync([&] {
          state_->owner = nullptr;
          core_->CloseEp(*state_, /*force=*/false, /*by_user=*/true, reason, waiter);
        });
        if (!ran) return Status::OK();
        Status closed;
        if (!waiter->WaitUntil(deadline, &closed)) {
          return Status::DeadlineExceeded("graceful close of the endpoint to " + state_->peer +
                                          " did not finish by the deadline");
        }
        return Status::OK();
      }
    }
    if (mode == CloseMode::kForce) {
      // Cancel what is not posted yet and abandon owner-placed entries
      // waiting for replies, give what UCX has posted until the deadline,
      // and only then force-close (which completes the rest Cancelled). The
      // grace keeps a peer from seeing half-sent payloads where it can be
      // avoided; UCX's emulated get/put, whose forced close could abort the
      // peer in UCX 1.13.1, are never used (see ucx_transport.h).
      std::vector<std::shared_ptr<BatchCompletion>> batches;
      {
        MutexLock lock(&mu_);
        batches = batches_;
      }
      for (const auto& b : batches) b->Cancel();
      // Bounded by the deadline; the rest is purged below. Not on the
      // progress thread, which completes them.
      if (!core_->OnProgressThread()) Flush(deadline).IgnoreError();
    }
    core_->RunSync([&] {
      state_->owner = nullptr;
      core_->CloseEp(*state_, /*force=*/true, /*by_user=*/true, reason, nullptr);
    });
    state_->SetFailure(reason);
    // Batches queued before the close ran before it (the queue is FIFO) and
    // their requests were purged, so this does not block for long.
    Flush(transport::Deadline::max()).IgnoreError();
    if (mode == CloseMode::kGraceful) {
      return Status::DeadlineExceeded("in-flight transfers to " + state_->peer +
                                      " did not finish by the deadline; force-closed");
    }
    return Status::OK();
  }

 private:
  Status Prepare(const Transfer& t, PreparedTransfer* out) const {
    out->op = t.op;
    out->length = t.length;
    auto local_range = [&]() -> Status {
      if (t.local == nullptr) return Status::InvalidArgument("no local region");
      if (t.local->kind() != MemoryKind::kHost) {
        return Status::InvalidArgument("local region is not host memory");
      }
      if (!InRange(t.local_offset, t.length, t.local->bytes().size())) {
        return Status::InvalidArgument("local range [" + std::to_string(t.local_offset) + ", +" +
                                       std::to_string(t.length) + ") outside a " +
                                       std::to_string(t.local->bytes().size()) + "-byte region");
      }
      out->local = t.local->bytes().data() + t.local_offset;
      return Status::OK();
    };
    switch (t.op) {
      case TransferOp::kRead:
      case TransferOp::kWrite: {
        KVF_RETURN_IF_ERROR(local_range());
        const auto* remote = dynamic_cast<const UcxRemoteRegion*>(t.remote);
        if (remote == nullptr) {
          return Status::InvalidArgument("no remote region imported by a UCX endpoint");
        }
        if (remote->holder()->ep_identity != state_.get()) {
          return Status::InvalidArgument("remote region was imported on another endpoint");
        }
        if (!InRange(t.remote_offset, t.length, remote->length())) {
          return Status::InvalidArgument("remote range [" + std::to_string(t.remote_offset) +
                                         ", +" + std::to_string(t.length) + ") outside the " +
                                         std::to_string(remote->length()) + "-byte imported range");
        }
        out->rkey = remote->holder();
        out->remote_address = remote->holder()->address + t.remote_offset;
        out->remote_offset = t.remote_offset;
        out->checksum = t.checksum;
        return Status::OK();
      }
      case TransferOp::kSend:
        if (t.header.size() > core_->max_header_bytes()) {
          return Status::InvalidArgument("kSend header of " + std::to_string(t.header.size()) +
                                         " bytes exceeds " +
                                         std::to_string(core_->max_header_bytes()));
        }
        out->header.assign(reinterpret_cast<const char*>(t.header.data()), t.header.size());
        if (t.length == 0 && t.local == nullptr) return Status::OK();
        return local_range();
    }
    return Status::InvalidArgument("unknown transfer op " + std::to_string(static_cast<int>(t.op)));
  }

  const std::shared_ptr<UcxCore> core_;
  const std::shared_ptr<EpState> state_;
  std::atomic<bool> closed_{false};
  Mutex mu_;
  std::vector<std::shared_ptr<BatchCompletion>> batches_ KVF_GUARDED_BY(mu_);
};

class UcxTransport final : public transport::Transport {
 public:
  // cores[0] made the context and owns the listener; memory is mapped and
  // exported through it (the context and grants are shared by all).
  explicit UcxTransport(std::vector<std::shared_ptr<UcxCore>> cores)
      : cores_(std::move(cores)) {
    for (const auto& core : cores_) {
      std::weak_ptr<UcxCore> weak = core;
      core->RunSync([&] {
        core->set_endpoint_factory([weak](std::shared_ptr<EpState> s) {
          return std::unique_ptr<Endpoint>(
              std::make_unique<UcxEndpoint>(weak.lock(), std::move(s)));
        });
      });
    }
  }
  // The listener's core last: until then it hands new connections to
  // workers that refuse them once shut down (it then rejects them).
  ~UcxTransport() override {
    for (auto it = cores_.rbegin(); it != cores_.rend(); ++it) (*it)->Shutdown();
  }

  std::string name() const override {
    const int workers = static_cast<int>(cores_.size());
    return "ucx(tls=" + first()->options().tls +
           (workers > 1 ? ", " + std::to_string(workers) + " workers" : std::string()) + ")";
  }

  StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(std::span<std::byte> bytes,
                                                         MemoryKind kind) override {
    KVF_RETURN_IF_ERROR(CheckKind(kind));
    if (bytes.empty()) return Status::InvalidArgument("cannot register an empty range");
    ucp_mem_map_params_t p = {};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = bytes.data();
    p.length = bytes.size();
    KVF_ASSIGN_OR_RETURN(auto memh, Map(p));
    return std::unique_ptr<MemoryRegion>(
        std::make_unique<UcxMemoryRegion>(first(), bytes, std::move(memh)));
  }

  StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(std::uint64_t size,
                                                         MemoryKind kind) override {
    KVF_RETURN_IF_ERROR(CheckKind(kind));
    if (size == 0) return Status::InvalidArgument("cannot allocate an empty region");
    ucp_mem_map_params_t p = {};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.address = nullptr;
    p.length = size;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    KVF_ASSIGN_OR_RETURN(auto memh, Map(p));
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_mem_query(memh->get(), &attr), "ucp_mem_query"));
    if (attr.length < size) {
      return Status::Internal("ucp_mem_map allocated " + std::to_string(attr.length) +
                              " bytes, asked for " + std::to_string(size));
    }
    std::span<std::byte> bytes(static_cast<std::byte*>(attr.address), size);
    return std::unique_ptr<MemoryRegion>(
        std::make_unique<UcxMemoryRegion>(first(), bytes, std::move(memh)));
  }

  void SetMessageHandler(transport::MessageHandler handler) override {
    for (const auto& core : cores_) {
      core->RunSync([&] { core->set_message_handler(handler); });
    }
  }

  Status Listen(const std::string& address, transport::AcceptHandler on_accept) override {
    Status st = Status::Unavailable("the UCX transport was destroyed");
    // Every worker may accept (the listener hands requests around), so
    // every one has the handler before the listener exists.
    for (const auto& core : cores_) {
      core->RunSync([&] { core->set_accept_handler(on_accept); });
    }
    first()->RunSync([&] { st = first()->Listen(address); });
    return st;
  }

  std::string listen_address() const override { return first()->listen_address(); }

  StatusOr<std::unique_ptr<Endpoint>> Connect(const std::string& address,
                                              transport::PeerFailureMode mode,
                                              Deadline deadline) override {
    if (mode != transport::PeerFailureMode::kFailInFlight) {
      return Status::InvalidArgument("unknown peer failure mode");
    }
    auto waiter = std::make_shared<Waiter>();
    StatusOr<std::shared_ptr<EpState>> state =
        Status::Unavailable("the UCX transport was destroyed");
    std::unique_ptr<Endpoint> endpoint;
    // Connections take the workers in turn.
    const std::shared_ptr<UcxCore>& core =
        cores_[next_connect_.fetch_add(1, std::memory_order_relaxed) % cores_.size()];
    core->RunSync([&] {
      state = core->Connect(address, waiter);
      // The Endpoint exists as soon as the UCX endpoint does, so a message
      // arriving before Connect returns can be answered.
      if (state.ok()) endpoint = core->MakeEndpoint(*state);
    });
    if (!state.ok()) return state.status();
    Status connected;
    if (!waiter->WaitUntil(deadline, &connected)) {
      return Status::DeadlineExceeded("connecting to " + address + " did not finish in time");
    }
    if (!connected.ok())
      return internal::AsUnavailable(connected.WithContext("connect " + address));
    return endpoint;
  }

  UcxTestCounters counters() const {
    UcxTestCounters sum;
    for (const auto& core : cores_) sum += core->counters();
    return sum;
  }

 private:
  static Status CheckKind(MemoryKind kind) {
    if (kind == MemoryKind::kHost) return Status::OK();
    return Status::Unimplemented(
        "device memory: Debian's UCX has no CUDA transports; stage through host memory");
  }

  StatusOr<std::unique_ptr<UcpMemHandle>> Map(const ucp_mem_map_params_t& p) {
    std::shared_ptr<UcpContext> context = first()->context();
    if (!context) return Status::Unavailable("the UCX transport was destroyed");
    ucp_mem_h memh = nullptr;
    KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_mem_map(context->get(), &p, &memh), "ucp_mem_map"));
    return std::make_unique<UcpMemHandle>(std::move(context), memh);
  }

  // The first core: it made the context, maps and exports memory, listens.
  const std::shared_ptr<UcxCore>& first() const { return cores_.front(); }

  const std::vector<std::shared_ptr<UcxCore>> cores_;  // never empty
  std::atomic<std::size_t> next_connect_{0};
};

}  // namespace

StatusOr<std::unique_ptr<transport::Transport>> CreateUcxTransport(
    const UcxTransportOptions& options) {
  if (!TlsAllowsSockaddr(options.tls)) {
    return Status::InvalidArgument("UcxTransportOptions.tls \"" + options.tls +
                                   "\" lacks tcp: listener (sockaddr) connections are wired up "
                                   "over tcp; add it, e.g. \"sm,self,tcp\"");
  }
  if (options.workers < 1 || options.workers > kMaxUcxWorkers) {
    return Status::InvalidArgument("UcxTransportOptions.workers is " +
                                   std::to_string(options.workers) + "; it must be 1.." +
                                   std::to_string(kMaxUcxWorkers));
  }
  auto group = std::make_shared<internal::CoreGroup>();
  std::vector<std::shared_ptr<UcxCore>> cores;
  for (int i = 0; i < options.workers; ++i) {
    // The first core makes the context; the others share it.
    auto core = UcxCore::Create(options, group, cores.empty() ? nullptr : cores[0]->context());
    if (!core.ok()) {
      for (auto it = cores.rbegin(); it != cores.rend(); ++it) (*it)->Shutdown();
      return core.status();
    }
    cores.push_back(std::move(*core));
  }
  for (const auto& core : cores) group->cores.push_back(core);
  return std::unique_ptr<transport::Transport>(std::make_unique<UcxTransport>(std::move(cores)));
}

bool TlsUsesSharedMemory(const std::string& tls) {
  std::string list = tls;
  const bool negated = !list.empty() && list.front() == '^';
  if (negated) list.erase(0, 1);
  std::set<std::string> names;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) names.insert(name);
  if (negated) return names.count("sm") == 0 && names.count("shm") == 0;
  for (const char* sm : {"sm", "shm", "mm", "sysv", "posix", "cma", "knem", "xpmem", "all"}) {
    if (names.count(sm) != 0) return true;
  }
  return list.empty();  // UCX's default: every transport
}

UcxTestCounters TEST_GetCounters(const transport::Transport& t) {
  return static_cast<const UcxTransport&>(t).counters();
}

}  // namespace kvfabric::ucx
