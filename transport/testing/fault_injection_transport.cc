#include "transport/testing/fault_injection_transport.h"

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace kvfabric::transport {
namespace fault_injection_internal {
namespace {

bool RangeFits(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

// Runs callbacks at their time on one thread; after Shutdown, at once.
class Timer {
 public:
  Timer() : thread_([this] { Run(); }) {}
  ~Timer() { Shutdown(); }

  void Schedule(Clock::time_point when, std::function<void()> fn) {
    {
      MutexLock lock(&mu_);
      if (!stopped_) {
        queue_.emplace(when, std::move(fn));
        cv_.NotifyAll();
        return;
      }
    }
    fn();
  }

  // Runs what is still queued now and stops the thread.
  void Shutdown() {
    std::multimap<Clock::time_point, std::function<void()>> rest;
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      cv_.NotifyAll();
    }
    thread_.join();
    {
      MutexLock lock(&mu_);
      rest.swap(queue_);
    }
    for (auto& [when, fn] : rest) fn();
  }

 private:
  void Run() {
    MutexLock lock(&mu_);
    while (!stopped_) {
      if (queue_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      auto first = queue_.begin();
      if (Clock::now() < first->first) {
        cv_.WaitUntil(&mu_, first->first);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      queue_.erase(first);
      lock.Unlock();
      fn();
      lock.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::multimap<Clock::time_point, std::function<void()>> queue_ KVF_GUARDED_BY(mu_);
  bool stopped_ KVF_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

enum class FaultKind { kNone, kFail, kFailAfter, kDelay, kDrop, kCorrupt, kCorruptWrite };

struct Fault {
  FaultKind kind = FaultKind::kNone;
  std::uint64_t bit = 0;  // kCorrupt: which bit of the range to flip
};

class FaultEndpoint;

// State shared by the transport and everything it hands out.
struct Shared {
  explicit Shared(const FaultInjectionOptions& options) : rng(options.seed), rates(options.rates) {}

  // Draws the fault of one entry of `length` bytes.
  Fault Draw(TransferOp op, std::uint64_t length) {
    MutexLock lock(&mu);
    ++counters.entries;
    auto fires = [this](std::uint32_t n) KVF_REQUIRES(mu) { return n != 0 && rng() % n == 0; };
    Fault f;
    if (fires(rates.fail_one_in)) {
      f.kind = FaultKind::kFail;
      ++counters.failed;
    } else if (fires(rates.fail_after_one_in)) {
      f.kind = FaultKind::kFailAfter;
      ++counters.failed_after;
    } else if (fires(rates.delay_one_in)) {
      f.kind = FaultKind::kDelay;
      ++counters.delayed;
    } else if (fires(rates.drop_one_in)) {
      f.kind = FaultKind::kDrop;
      ++counters.dropped;
    } else if (op == TransferOp::kRead && length != 0 && fires(rates.corrupt_one_in)) {
      f.kind = FaultKind::kCorrupt;
      f.bit = rng() % (length * 8);
      ++counters.corrupted;
    } else if (op == TransferOp::kWrite && length != 0 && base != nullptr &&
               length >= rates.corrupt_write_min_bytes && fires(rates.corrupt_write_one_in)) {
      f.kind = FaultKind::kCorruptWrite;
      f.bit = rng() % (length * 8);
      ++counters.corrupted_writes;
    }
    return f;
  }

  // For an accepted payload of `length` bytes: the bit to flip, if any.
  std::optional<std::uint64_t> DrawPayloadCorruption(std::uint64_t length) {
    MutexLock lock(&mu);
    ++counters.messages;
    if (length == 0 || rates.corrupt_one_in == 0 || rng() % rates.corrupt_one_in != 0) {
      return std::nullopt;
    }
    ++counters.corrupted;
    return rng() % (length * 8);
  }

  Status FailStatus(const char* what) {
    MutexLock lock(&mu);
    return Status(rates.fail_code, what);
  }
  std::chrono::milliseconds Delay() {
    MutexLock lock(&mu);
    return rates.delay;
  }

  void AddEndpoint(Endpoint* base, FaultEndpoint* wrapper) {
    MutexLock lock(&mu);
    endpoints[base] = wrapper;
  }
  void RemoveEndpoint(Endpoint* base) {
    MutexLock lock(&mu);
    endpoints.erase(base);
  }
  FaultEndpoint* FindEndpoint(Endpoint* base) {
    MutexLock lock(&mu);
    auto it = endpoints.find(base);
    return it == endpoints.end() ? nullptr : it->second;
  }
  std::vector<FaultEndpoint*> AllEndpoints() {
    MutexLock lock(&mu);
    std::vector<FaultEndpoint*> all;
    for (auto& [base, wrapper] : endpoints) all.push_back(wrapper);
    return all;
  }

  // A bounce region of `length` bytes from the base transport (null once
  // the transport is gone).
  StatusOr<std::unique_ptr<MemoryRegion>> Bounce(std::uint64_t length) {
    MutexLock lock(&mu);
    if (base == nullptr) return Status::Unavailable("fault injection transport destroyed");
    return base->AllocateMemory(length, MemoryKind::kHost);
  }

  Timer timer;
  Mutex mu;
  Transport* base KVF_GUARDED_BY(mu) = nullptr;  // the wrapped transport while it lives
  std::mt19937_64 rng KVF_GUARDED_BY(mu);
  FaultRates rates KVF_GUARDED_BY(mu);
  FaultInjectionCounters counters KVF_GUARDED_BY(mu);
  std::map<Endpoint*, FaultEndpoint*> endpoints KVF_GUARDED_BY(mu);  // base -> wrapper
};

namespace {

void FlipBit(std::span<std::byte> bytes, std::uint64_t bit) {
  bytes[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
}

class FaultRegion final : public MemoryRegion {
 public:
  explicit FaultRegion(std::unique_ptr<MemoryRegion> base) : base_(std::move(base)) {}
  std::span<std::byte> bytes() const override { return base_->bytes(); }
  MemoryKind kind() const override { return base_->kind(); }
  StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const override {
    return base_->Export(offset, length);
  }
  MemoryRegion* base() const { return base_.get(); }

 private:
  const std::unique_ptr<MemoryRegion> base_;
};

class FaultRemoteRegion final : public RemoteRegion {
 public:
  explicit FaultRemoteRegion(std::unique_ptr<RemoteRegion> base) : base_(std::move(base)) {}
  std::uint64_t length() const override { return base_->length(); }
  const RemoteRegion* base() const { return base_.get(); }

 private:
  const std::unique_ptr<RemoteRegion> base_;
};

// One Submit: the outer completion the caller sees, and the base batch that
// performs the entries that were neither failed nor dropped.
struct WrappedBatch {
  std::shared_ptr<BatchCompletion> outer;
  std::vector<Fault> faults;                // per outer entry
  std::vector<std::span<std::byte>> local;  // per outer entry: its local range
  // kCorruptWrite entries: the flipped copy the base transport writes from.
  std::vector<std::unique_ptr<MemoryRegion>> bounce;
  std::vector<std::size_t> base_to_outer;   // base entry -> outer entry
  Mutex mu;
  std::unique_ptr<TransferBatch> base KVF_GUARDED_BY(mu);              // set once
  std::vector<std::optional<TransferResult>> held KVF_GUARDED_BY(mu);  // delayed outcomes
  bool cancelled KVF_GUARDED_BY(mu) = false;
};

// Outer cancel: drops and held delays complete now; the base batch is cancelled.
void CancelWrapped(const std::shared_ptr<WrappedBatch>& wb) {
  std::vector<std::pair<std::size_t, TransferResult>> now;
  TransferBatch* base;
  {
    MutexLock lock(&wb->mu);
    wb->cancelled = true;
    for (std::size_t j = 0; j < wb->faults.size(); ++j) {
      if (wb->faults[j].kind == FaultKind::kDrop) {
        now.push_back({j, {Status::Cancelled("dropped entry cancelled"), 0, std::nullopt}});
      } else if (wb->held[j].has_value()) {
        now.push_back({j, std::move(*wb->held[j])});
        wb->held[j].reset();
      }
    }
    base = wb->base.get();
  }
  for (auto& [j, r] : now) wb->outer->Complete(j, std::move(r.status), r.bytes);
  if (base != nullptr) base->Cancel();
}

// The base batch finished: apply the faults and complete the outer entries.
void OnBaseDone(const std::shared_ptr<WrappedBatch>& wb, const std::shared_ptr<Shared>& shared) {
  TransferBatch* base;
  {
    MutexLock lock(&wb->mu);
    base = wb->base.get();
  }
  std::span<const TransferResult> results = base->results();
  for (std::size_t b = 0; b < results.size(); ++b) {
    const std::size_t j = wb->base_to_outer[b];
    TransferResult r = results[b];
    switch (wb->faults[j].kind) {
      case FaultKind::kFailAfter:
        r = {shared->FailStatus("injected failure after the transfer"), 0, std::nullopt};
        break;
      case FaultKind::kCorrupt:
        if (r.status.ok()) FlipBit(wb->local[j], wb->faults[j].bit);
        // The base's CRC was of the bytes before the flip: the caller checks.
        r.landed_crc32c.reset();
        break;
      case FaultKind::kDelay: {
        MutexLock lock(&wb->mu);
        if (wb->cancelled) break;
        wb->held[j] = std::move(r);
        lock.Unlock();
        shared->timer.Schedule(Clock::now() + shared->Delay(), [wb, j] {
          std::optional<TransferResult> held;
          {
            MutexLock lock(&wb->mu);
            held.swap(wb->held[j]);
          }
          if (held) {
            wb->outer->Complete(j, std::move(held->status), held->bytes, held->landed_crc32c);
          }
        });
        continue;
      }
      default:
        break;
    }
    wb->outer->Complete(j, std::move(r.status), r.bytes, r.landed_crc32c);
  }
}

class FaultIncomingMessage final : public IncomingMessage {
 public:
  FaultIncomingMessage(IncomingMessage& base, std::shared_ptr<Shared> shared)
      : base_(base), shared_(std::move(shared)) {}

  Endpoint* endpoint() const override;
  std::span<const std::byte> header() const override { return base_.header(); }
  std::uint64_t payload_length() const override { return base_.payload_length(); }

  Status Accept(MemoryRegion* region, std::uint64_t offset,
                std::function<void(Status)> on_placed) override {
    auto* r = dynamic_cast<FaultRegion*>(region);
    if (r == nullptr) {
      base_.Drop();
      return Status::InvalidArgument("Accept: region not from this fault-injection transport");
    }
    std::optional<std::uint64_t> bit;
    if (RangeFits(offset, payload_length(), r->bytes().size())) {
      bit = shared_->DrawPayloadCorruption(payload_length());
    }
    std::span<std::byte> dest;
    if (bit) dest = r->bytes().subspan(offset, payload_length());
    return base_.Accept(r->base(), offset, [dest, bit, on_placed = std::move(on_placed)](Status s) {
      if (s.ok() && bit) FlipBit(dest, *bit);
      if (on_placed) on_placed(std::move(s));
    });
  }

  void Drop() override { base_.Drop(); }

 private:
  IncomingMessage& base_;
  const std::shared_ptr<Shared> shared_;
};

}  // namespace

class FaultEndpoint final : public Endpoint {
 public:
  FaultEndpoint(std::unique_ptr<Endpoint> base, std::shared_ptr<Shared> shared)
      : base_(std::move(base)), shared_(std::move(shared)) {
    shared_->AddEndpoint(base_.get(), this);
  }

  ~FaultEndpoint() override {
    shared_->RemoveEndpoint(base_.get());
    CancelAll();
    // Destroying the base force-closes it and waits out handlers using it.
    base_.reset();
    for (const std::shared_ptr<BatchCompletion>& b : Live()) b->WaitForever();
  }

  std::string peer_address() const override { return base_->peer_address(); }
  Status health() const override { return base_->health(); }

  StatusOr<std::unique_ptr<RemoteRegion>> ImportRegion(std::string_view exported) override {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RemoteRegion> base, base_->ImportRegion(exported));
    return std::unique_ptr<RemoteRegion>(std::make_unique<FaultRemoteRegion>(std::move(base)));
  }

  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers) override;

  Status Flush(Deadline deadline) override {
    for (const std::shared_ptr<BatchCompletion>& b : Live()) {
      KVF_RETURN_IF_ERROR(b->Wait(deadline));
    }
    return Status::OK();
  }

  Status Close(CloseMode mode, Deadline deadline) override {
    if (mode == CloseMode::kGraceful) {
      Status flushed = Flush(deadline);
      if (flushed.ok()) return base_->Close(CloseMode::kGraceful, deadline);
      CancelAll();
      base_->Close(CloseMode::kForce, deadline).IgnoreError();  // kForce cannot fail
      for (const std::shared_ptr<BatchCompletion>& b : Live()) b->WaitForever();
      return flushed.WithContext("graceful close fell back to force");
    }
    CancelAll();
    Status closed = base_->Close(CloseMode::kForce, deadline);
    for (const std::shared_ptr<BatchCompletion>& b : Live()) b->WaitForever();
    return closed;
  }

  // Cancels every batch in flight (the transport is going away, or Close).
  void CancelAll() {
    for (const std::shared_ptr<BatchCompletion>& b : Live()) b->Cancel();
  }

 private:
  Status Validate(std::span<const Transfer> transfers) const;

  // The outer completions still held by someone (the caller's handle, or the
  // wrapped batch while it runs). Flush and Close wait on these, not on the
  // wrapped batches: a wrapped batch is freed by the thread that completed
  // its last entry, and only the completion's own mutex orders those writes
  // before the caller's reads of results() (found by TSan: Flush returned
  // while its waiter had not synchronised with the completing thread).
  std::vector<std::shared_ptr<BatchCompletion>> Live() {
    MutexLock lock(&mu_);
    std::vector<std::shared_ptr<BatchCompletion>> live;
    for (const std::weak_ptr<BatchCompletion>& w : batches_) {
      if (std::shared_ptr<BatchCompletion> b = w.lock()) live.push_back(std::move(b));
    }
    return live;
  }

  std::unique_ptr<Endpoint> base_;
  const std::shared_ptr<Shared> shared_;
  Mutex mu_;
  std::vector<std::weak_ptr<BatchCompletion>> batches_ KVF_GUARDED_BY(mu_);
};

namespace {
Endpoint* FaultIncomingMessage::endpoint() const {
  Endpoint* base = base_.endpoint();
  return base == nullptr ? nullptr : shared_->FindEndpoint(base);
}
}  // namespace

Status FaultEndpoint::Validate(std::span<const Transfer> transfers) const {
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
    } else if (dynamic_cast<const FaultRegion*>(t.local) == nullptr) {
      return Status::InvalidArgument(where + "local region not from this transport");
    } else if (!RangeFits(t.local_offset, t.length, t.local->bytes().size())) {
      return Status::InvalidArgument(where + "local range out of bounds");
    }
    if (t.op == TransferOp::kSend) {
      if (t.header.size() > kMaxMessageHeaderBytes) {
        return Status::InvalidArgument(where + "header too long");
      }
      continue;
    }
    if (dynamic_cast<const FaultRemoteRegion*>(t.remote) == nullptr) {
      return Status::InvalidArgument(where + "remote region missing or not from this transport");
    }
    if (!RangeFits(t.remote_offset, t.length, t.remote->length())) {
      return Status::InvalidArgument(where + "remote range out of bounds");
    }
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<TransferBatch>> FaultEndpoint::Submit(
    std::span<const Transfer> transfers) {
  KVF_RETURN_IF_ERROR(Validate(transfers));
  auto wb = std::make_shared<WrappedBatch>();
  const std::size_t n = transfers.size();
  wb->faults.resize(n);
  wb->local.resize(n);
  {
    MutexLock lock(&wb->mu);  // not shared yet; for the analysis
    wb->held.resize(n);
  }
  std::vector<Transfer> base_transfers;
  for (std::size_t j = 0; j < n; ++j) {
    Transfer t = transfers[j];
    wb->faults[j] = shared_->Draw(t.op, t.length);
    if (t.local != nullptr) {
      wb->local[j] = t.local->bytes().subspan(t.local_offset, t.length);
      t.local = static_cast<FaultRegion*>(t.local)->base();
    }
    if (t.remote != nullptr && t.op != TransferOp::kSend) {
      t.remote = static_cast<const FaultRemoteRegion*>(t.remote)->base();
    }
    if (wb->faults[j].kind == FaultKind::kCorruptWrite) {
      // Write a flipped copy; without a bounce region the entry goes as is.
      StatusOr<std::unique_ptr<MemoryRegion>> bounce = shared_->Bounce(t.length);
      if (bounce.ok()) {
        std::span<std::byte> copy = (*bounce)->bytes().first(t.length);
        std::memcpy(copy.data(), wb->local[j].data(), t.length);
        FlipBit(copy, wb->faults[j].bit);
        t.local = bounce->get();
        t.local_offset = 0;
        wb->bounce.push_back(std::move(bounce).value());
      }
    }
    if (wb->faults[j].kind == FaultKind::kFail || wb->faults[j].kind == FaultKind::kDrop) {
      continue;
    }
    wb->base_to_outer.push_back(j);
    base_transfers.push_back(t);
  }
  // The outer completion keeps `wb` alive until it is done or first cancelled,
  // so dropped entries can always be cancelled.
  wb->outer = std::make_shared<BatchCompletion>(n, [wb] { CancelWrapped(wb); });
  std::unique_ptr<TransferBatch> base;
  if (!base_transfers.empty()) {
    StatusOr<std::unique_ptr<TransferBatch>> submitted = base_->Submit(base_transfers);
    if (!submitted.ok()) {
      wb->outer->Cancel();  // breaks the cycle wb <-> outer; nothing was started
      for (std::size_t j = 0; j < n; ++j) wb->outer->Complete(j, Status::Cancelled("rejected"), 0);
      return std::move(submitted).status();
    }
    base = std::move(submitted).value();
  }
  {
    MutexLock lock(&mu_);
    std::erase_if(batches_, [](const std::weak_ptr<BatchCompletion>& w) {
      std::shared_ptr<BatchCompletion> b = w.lock();
      return b == nullptr || b->Done();
    });
    batches_.push_back(wb->outer);
  }
  for (std::size_t j = 0; j < n; ++j) {
    if (wb->faults[j].kind == FaultKind::kFail) {
      wb->outer->Complete(j, shared_->FailStatus("injected failure"), 0);
    }
  }
  if (base != nullptr) {
    TransferBatch* raw = base.get();
    {
      MutexLock lock(&wb->mu);
      wb->base = std::move(base);
    }
    raw->OnDone([wb, shared = shared_] { OnBaseDone(wb, shared); });
  }
  return std::make_unique<TransferBatch>(wb->outer);
}

}  // namespace fault_injection_internal

using fault_injection_internal::FaultEndpoint;
using fault_injection_internal::FaultIncomingMessage;
using fault_injection_internal::FaultRegion;
using fault_injection_internal::Shared;

FaultInjectionTransport::FaultInjectionTransport(std::unique_ptr<Transport> base,
                                                 const FaultInjectionOptions& options)
    : shared_(std::make_shared<Shared>(options)), base_(std::move(base)) {
  MutexLock lock(&shared_->mu);
  shared_->base = base_.get();
}

FaultInjectionTransport::~FaultInjectionTransport() {
  {
    MutexLock lock(&shared_->mu);
    shared_->base = nullptr;
  }
  for (FaultEndpoint* ep : shared_->AllEndpoints()) ep->CancelAll();
  base_.reset();              // completes every base batch
  shared_->timer.Shutdown();  // delayed completions run now
}

void FaultInjectionTransport::SetRates(const FaultRates& rates) {
  MutexLock lock(&shared_->mu);
  shared_->rates = rates;
}

FaultInjectionCounters FaultInjectionTransport::counters() const {
  MutexLock lock(&shared_->mu);
  return shared_->counters;
}

std::string FaultInjectionTransport::name() const {
  return "fault_injection(" + base_->name() + ")";
}

StatusOr<std::unique_ptr<MemoryRegion>> FaultInjectionTransport::RegisterMemory(
    std::span<std::byte> bytes, MemoryKind kind) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> base, base_->RegisterMemory(bytes, kind));
  return std::unique_ptr<MemoryRegion>(std::make_unique<FaultRegion>(std::move(base)));
}

StatusOr<std::unique_ptr<MemoryRegion>> FaultInjectionTransport::AllocateMemory(std::uint64_t size,
                                                                                MemoryKind kind) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> base, base_->AllocateMemory(size, kind));
  return std::unique_ptr<MemoryRegion>(std::make_unique<FaultRegion>(std::move(base)));
}

void FaultInjectionTransport::SetMessageHandler(MessageHandler handler) {
  base_->SetMessageHandler([shared = shared_, handler = std::move(handler)](IncomingMessage& m) {
    FaultIncomingMessage wrapped(m, shared);
    if (handler) {
      handler(wrapped);
    } else {
      m.Drop();
    }
  });
}

Status FaultInjectionTransport::Listen(const std::string& address, AcceptHandler on_accept) {
  return base_->Listen(
      address, [shared = shared_, on_accept = std::move(on_accept)](std::unique_ptr<Endpoint> ep) {
        auto wrapped = std::make_unique<FaultEndpoint>(std::move(ep), shared);
        if (on_accept) on_accept(std::move(wrapped));
      });
}

StatusOr<std::unique_ptr<Endpoint>> FaultInjectionTransport::Connect(const std::string& address,
                                                                     PeerFailureMode mode,
                                                                     Deadline deadline) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> base, base_->Connect(address, mode, deadline));
  return std::unique_ptr<Endpoint>(std::make_unique<FaultEndpoint>(std::move(base), shared_));
}

}  // namespace kvfabric::transport
