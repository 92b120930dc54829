// UcxCore, continued: UCX requests, posting batches, completing their
// entries, and receiving kSend messages. Everything here runs on the
// progress thread.
#include <cstring>
#include <utility>

#include "transport/ucx/ucx_core.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx::internal {

using transport::Endpoint;
using transport::MemoryRegion;
using transport::TransferOp;

Status UcxCore::EntryStatus(const EpState& s, ucs_status_t status, const char* what,
                            bool user_cancelled) const {
  Status st = StatusFromUcs(status, what);
  if (status == UCS_ERR_CANCELED) {
    // Cancelled only when this side asked for it; UCX also cancels (purges)
    // the requests of an endpoint whose peer failed, sometimes before it
    // reports the failure: that is the peer's failure.
    if (user_cancelled || s.closed_locally) return st;
    const Status h = s.health();
    return h.ok() ? Status::Unavailable(st.ToString() + " (the endpoint failed)") : h;
  }
  if (!s.closed_locally) {
    const Status h = s.health();
    if (!h.ok() && !st.IsUnavailable()) return h;
  }
  return st;
}

void UcxCore::FinishEntry(BatchOp& op, std::size_t i, const Status& s,
                          std::optional<std::uint32_t> landed_crc32c) {
  if (!s.ok() && op.status[i].ok()) op.status[i] = s;
  if (--op.pending[i] > 0) return;
  const bool ok = op.status[i].ok();
  op.completion->Complete(i, op.status[i], ok ? op.entries[i].length : 0, landed_crc32c);
}

// ---------------------------------------------------------------------------
// Requests.

UcxCore::Req* UcxCore::NewReq(std::shared_ptr<EpState> ep, std::shared_ptr<BatchOp> op,
                              std::function<void(ucs_status_t, std::size_t)> done) {
  auto* r = new Req;
  r->core = this;
  r->ep = std::move(ep);
  r->op = std::move(op);
  r->done = std::move(done);
  return r;
}

void UcxCore::FillParam(Req* r, ucp_request_param_t* p, bool recv) {
  p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (recv) {
    p->cb.recv_am = &UcxCore::OnRecvDone;
  } else {
    p->cb.send = &UcxCore::OnSendDone;
  }
  p->user_data = r;
}

void UcxCore::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  OnRecvDone(request, status, 0, user_data);
}

void UcxCore::OnRecvDone(void* request, ucs_status_t status, std::size_t length, void* user_data) {
  auto* r = static_cast<Req*>(user_data);
  if (r->posting) {
    // Completed before the posting call returned: Track finishes it, and
    // frees the request if that call returns one.
    r->completed_early = true;
    r->early_status = status;
    r->early_length = length;
    return;
  }
  r->core->FinishReq(r, request, status, length);
}

void UcxCore::Track(Req* r, ucs_status_ptr_t request, std::size_t inline_length) {
  r->posting = false;
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    // Done inline (UCX calls no callback and owns no request) or failed.
    ucs_status_t st = UCS_PTR_STATUS(request);
    if (st == UCS_OK && r->completed_early) st = r->early_status;
    FinishReq(r, nullptr, st, st == UCS_OK ? inline_length : 0);
    return;
  }
  if (r->completed_early) {
    FinishReq(r, request, r->early_status, r->early_length);
    return;
  }
  requests_[request] = r;
  if (r->ep) r->ep->inflight.insert(request);
  if (r->op) r->op->requests.insert(request);
}

void UcxCore::FinishReq(Req* r, void* request, ucs_status_t status, std::size_t length) {
  if (request != nullptr) {
    requests_.erase(request);
    if (r->ep) r->ep->inflight.erase(request);
    if (r->op) r->op->requests.erase(request);
    ucp_request_free(request);
  }
  auto done = std::move(r->done);
  delete r;
  if (done) done(status, length);
}

// ---------------------------------------------------------------------------
// Batches.

CopyRange MappedRange(PreparedTransfer& t) {
  std::byte* remote = t.rkey->mapped + t.remote_offset;
  std::uint32_t* crc = t.checksum ? &t.landed_crc32c : nullptr;
  if (t.op == TransferOp::kRead) return {t.local, remote, t.length, crc};
  return {remote, t.local, t.length, crc};
}

Status UcxCore::CopyRanges(std::span<const CopyRange> ranges) {
  std::uint64_t total = 0;
  for (const CopyRange& r : ranges) total += r.bytes;
  return copy_pool_.Copy(ranges, total >= options_.streaming_copy_min_bytes);
}

void UcxCore::StartBatch(const std::shared_ptr<BatchOp>& op) {
  EpState& s = *op->ep;
  if (!s.ready && s.ep != nullptr && !op->cancelled) {
    s.deferred.push_back([this, op] { StartBatch(op); });
    return;
  }
  const std::size_t n = op->entries.size();
  op->started = true;
  op->pending.assign(n, 1);
  op->status.assign(n, Status::OK());
  op->awaiting.assign(n, 0);
  if (op->cancelled || s.ep == nullptr) {
    const Status why = op->cancelled ? Status::Cancelled("batch cancelled before it was posted")
                                     : AsUnavailable(s.health());
    for (std::size_t i = 0; i < n; ++i) op->completion->Complete(i, why, 0);
    return;
  }

  // Posts one request; `entries` are released when it completes.
  auto post = [&](const char* what, std::vector<std::size_t> entries, auto&& call) {
    Req* r = NewReq(op->ep, op, [this, op, what, entries](ucs_status_t st, std::size_t) {
      const Status status =
          st == UCS_OK ? Status::OK() : EntryStatus(*op->ep, st, what, op->cancelled);
      for (std::size_t i : entries) FinishEntry(*op, i, status);
    });
    ucp_request_param_t p = {};
    FillParam(r, &p, /*recv=*/false);
    Track(r, call(p), 0);
  };

  // Entries whose range is mapped here are copied first, all together (split
  // across the copy pool), and completed in the loop below. Reading
  // `mapped` without map_mu is safe here: only this thread changes it
  // (RkeyHolder::Reset), and it is blocked in the copy meanwhile.
  // (`mapped` is set only while the key is alive: RkeyHolder.)
  std::vector<CopyRange> mapped;
  for (PreparedTransfer& t : op->entries) {
    if (t.op != TransferOp::kSend && t.length > 0 && t.rkey->mapped != nullptr) {
      mapped.push_back(MappedRange(t));
    }
  }
  // A fault in the copy (the peer shrank the memory it shared: SIGBUS)
  // fails this batch's mapped entries, not the process.
  Status copied;
  if (!mapped.empty()) copied = CopyRanges(mapped);
  std::vector<std::size_t> writes;  // one-sided puts, completed by one flush
  for (std::size_t i = 0; i < n; ++i) {
    PreparedTransfer& t = op->entries[i];
    if (s.ep == nullptr) {  // failed while posting (an inline error callback)
      FinishEntry(*op, i, AsUnavailable(s.health()));
      continue;
    }
    switch (t.op) {
      case TransferOp::kRead:
      case TransferOp::kWrite: {
        if (t.length == 0) {
          FinishEntry(*op, i, Status::OK());
          break;
        }
        ucp_rkey_h rkey = t.rkey->rkey.get();
        if (rkey == nullptr) {
          FinishEntry(*op, i, Status::Unavailable("remote region's key was released"));
          break;
        }
        if (!t.rkey->one_sided) {
          owner_placed_transfers_.fetch_add(1, std::memory_order_relaxed);
          PostRmaRequest(op, i);
          break;
        }
        one_sided_transfers_.fetch_add(1, std::memory_order_relaxed);
        if (t.rkey->mapped != nullptr) {
          // Mapped here: copied above, through the mapping (UCX's get/put
          // on these lanes are the same copy cut into bcopy fragments).
          FinishEntry(*op, i, copied, t.LandedCrc());
          break;
        }
        if (t.op == TransferOp::kRead) {
          post("ucp_get_nbx", {i}, [&](const ucp_request_param_t& p) {
            return ucp_get_nbx(s.ep, t.local, t.length, t.remote_address, rkey, &p);
          });
        } else {
          // The entry also waits for the batch's flush (one for all puts).
          ++op->pending[i];
          writes.push_back(i);
          post("ucp_put_nbx", {i}, [&](const ucp_request_param_t& p) {
            return ucp_put_nbx(s.ep, t.local, t.length, t.remote_address, rkey, &p);
          });
        }
        break;
      }
      case TransferOp::kSend: {
        post("ucp_am_send_nbx", {i}, [&](ucp_request_param_t& p) {
          p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
          p.flags = UCP_AM_SEND_FLAG_REPLY;
          return ucp_am_send_nbx(s.ep, kAmId, t.header.data(), t.header.size(), t.local, t.length,
                                 &p);
        });
        break;
      }
    }
  }
  if (!writes.empty()) {
    if (s.ep == nullptr) {
      for (std::size_t i : writes) FinishEntry(*op, i, AsUnavailable(s.health()));
    } else {
      // kWrite succeeds only once its bytes are placed remotely.
      post("ucp_ep_flush_nbx", writes,
           [&](const ucp_request_param_t& p) { return ucp_ep_flush_nbx(s.ep, &p); });
    }
  }
}

void UcxCore::CancelBatch(const std::shared_ptr<BatchOp>& op) {
  op->cancelled = true;
  if (!op->started) return;  // StartBatch completes every entry Cancelled
  // Replies not yet arrived are abandoned; requests are revoked where UCX
  // can, and the rest complete on their own (a kWrite's source and a kRead's
  // destination stay UCX's until its request completed).
  CancelAwaiting(*op);
  std::vector<void*> reqs(op->requests.begin(), op->requests.end());
  for (void* req : reqs) ucp_request_cancel(worker_.get(), req);
}

// ---------------------------------------------------------------------------
// kSend messages.

std::shared_ptr<EpState> UcxCore::ReplyEp(const ucp_am_recv_param_t* param) const {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return nullptr;
  auto it = eps_.find(param->reply_ep);
  return it != eps_.end() ? it->second : nullptr;
}

// One arrived message, alive during the MessageHandler call.
class UcxCore::Incoming final : public transport::IncomingMessage {
 public:
  Incoming(UcxCore* core, std::shared_ptr<EpState> ep, const void* header,
           std::size_t header_length, void* data, std::size_t length, bool rendezvous)
      : core_(core),
        ep_(std::move(ep)),
        header_(static_cast<const std::byte*>(header), header_length),
        data_(data),
        length_(length),
        rendezvous_(rendezvous) {}

  Endpoint* endpoint() const override { return ep_ ? ep_->owner : nullptr; }
  std::span<const std::byte> header() const override { return header_; }
  std::uint64_t payload_length() const override { return length_; }
  bool receive_started() const { return receive_started_; }

  Status Accept(MemoryRegion* region, std::uint64_t offset,
                std::function<void(Status)> on_placed) override {
    if (consumed_) return Status::FailedPrecondition("message payload already accepted or dropped");
    consumed_ = true;
    if (length_ == 0) {
      core_->Post([cb = std::move(on_placed)] { cb(Status::OK()); });
      return Status::OK();
    }
    if (region == nullptr) return Status::InvalidArgument("Accept into a null region");
    if (region->kind() != transport::MemoryKind::kHost) {
      return Status::InvalidArgument("Accept needs host memory");
    }
    const std::uint64_t size = region->bytes().size();
    if (offset > size || length_ > size - offset) {
      return Status::InvalidArgument("payload of " + std::to_string(length_) +
                                     " bytes does not fit at offset " + std::to_string(offset) +
                                     " of a " + std::to_string(size) + "-byte region");
    }
    std::byte* dest = region->bytes().data() + offset;
    if (!rendezvous_) {
      std::memcpy(dest, data_, length_);
      core_->Post([cb = std::move(on_placed)] { cb(Status::OK()); });
      return Status::OK();
    }
    // on_placed runs from the queue, never inside this call (the handler
    // may hold locks), whichever of the three outcomes the receive has.
    UcxCore* core = core_;
    Req* r = core_->NewReq(ep_, nullptr,
                           [core, cb = std::move(on_placed)](ucs_status_t st, std::size_t) {
                             Status s = StatusFromUcs(st, "ucp_am_recv_data_nbx");
                             if (st == UCS_ERR_CANCELED || st == UCS_ERR_CONNECTION_RESET) {
                               s = Status::Unavailable(s.ToString());
                             }
                             core->Post([cb, s] { cb(s); });
                           });
    ucp_request_param_t p = {};
    FillParam(r, &p, /*recv=*/true);
    // After this call UCX owns the descriptor whatever the outcome.
    receive_started_ = true;
    core_->Track(r, ucp_am_recv_data_nbx(core_->worker_.get(), data_, dest, length_, &p), length_);
    return Status::OK();
  }

  void Drop() override { consumed_ = true; }

 private:
  UcxCore* const core_;
  const std::shared_ptr<EpState> ep_;
  const std::span<const std::byte> header_;
  void* const data_;
  const std::size_t length_;
  const bool rendezvous_;
  bool consumed_ = false;
  bool receive_started_ = false;
};

ucs_status_t UcxCore::OnAmThunk(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxCore*>(arg)->OnAm(header, header_length, data, length, param);
}

ucs_status_t UcxCore::OnAm(const void* header, std::size_t header_length, void* data,
                           std::size_t length, const ucp_am_recv_param_t* param) {
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  (rendezvous ? rendezvous_messages_ : eager_messages_).fetch_add(1, std::memory_order_relaxed);
  if (!message_handler_) return UCS_OK;  // dropped: UCX releases the data
  Incoming msg(this, ReplyEp(param), header, header_length, data, length, rendezvous);
  message_handler_(msg);
  // A receive started in the callback keeps the descriptor until it is done;
  // otherwise UCX releases it (for rendezvous: tells the sender it is done).
  return msg.receive_started() ? UCS_INPROGRESS : UCS_OK;
}

}  // namespace kvfabric::ucx::internal
