// UcxCore, continued: posting batches, completing their entries, and
// receiving active messages. Everything here runs on the progress thread.
#include <cstring>
#include <utility>

#include "transport/ucx/ucx_core.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx::internal {

using transport::Endpoint;
using transport::MemoryRegion;
using transport::TransferOp;

Status UcxCore::EntryStatus(const EpState& s, ucs_status_t status, const char* what) const {
  // A request purged because the peer failed reports the failure; one purged
  // by our own close reports Cancelled.
  if (status == UCS_ERR_CANCELED) {
    if (s.closed_locally) return StatusFromUcs(status, what);
    Status h = s.health();
    if (!h.ok()) return h;
  }
  Status st = StatusFromUcs(status, what);
  if (!s.closed_locally) {
    Status h = s.health();
    if (!h.ok() && !st.IsUnavailable()) return h;
  }
  return st;
}

void UcxCore::FinishEntry(BatchOp& op, std::size_t i, const Status& s) {
  if (!s.ok() && op.status[i].ok()) op.status[i] = s;
  if (--op.pending[i] > 0) return;
  const bool ok = op.status[i].ok();
  op.completion->Complete(i, op.status[i], ok ? op.entries[i].length : 0);
}

void UcxCore::OnOpDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  BatchOp& op = *ctx->op;
  op.ep->inflight.erase(request);
  --op.ep->core->inflight_requests_;
  op.requests.erase(request);
  ucp_request_free(request);
  const Status st =
      status == UCS_OK ? Status::OK() : op.ep->core->EntryStatus(*op.ep, status, ctx->what);
  for (std::size_t i : ctx->entries) op.ep->core->FinishEntry(op, i, st);
  delete ctx;
}

void UcxCore::StartBatch(const std::shared_ptr<BatchOp>& op) {
  const std::size_t n = op->entries.size();
  op->started = true;
  op->pending.assign(n, 1);
  op->status.assign(n, Status::OK());
  EpState& s = *op->ep;
  if (op->cancelled || s.ep == nullptr) {
    const Status why = op->cancelled ? Status::Cancelled("batch cancelled before it was posted")
                                     : AsUnavailable(s.health());
    for (std::size_t i = 0; i < n; ++i) op->completion->Complete(i, why, 0);
    return;
  }

  // Posts one request; `entries` are released when it completes.
  auto post = [&](const char* what, std::vector<std::size_t> entries, auto&& call) {
    auto* ctx = new OpCtx{op, std::move(entries), what};
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxCore::OnOpDone;
    p.user_data = ctx;
    ucs_status_ptr_t req = call(p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      const ucs_status_t st = UCS_PTR_STATUS(req);
      const Status status = st == UCS_OK ? Status::OK() : EntryStatus(s, st, what);
      for (std::size_t i : ctx->entries) FinishEntry(*op, i, status);
      delete ctx;
      return;
    }
    ctx->request = req;
    s.inflight.insert(req);
    ++inflight_requests_;
    op->requests.insert(req);
  };

  std::vector<std::size_t> writes;
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
  if (!op->started) {
    op->cancelled = true;  // StartBatch completes every entry Cancelled
    return;
  }
  // Only what UCX can revoke is revoked; the rest completes on its own.
  std::vector<void*> reqs(op->requests.begin(), op->requests.end());
  for (void* req : reqs) ucp_request_cancel(worker_.get(), req);
}

// ---------------------------------------------------------------------------
// Active messages.

// One arrived message, alive during the MessageHandler call.
class UcxCore::Incoming final : public transport::IncomingMessage {
 public:
  Incoming(UcxCore* core, Endpoint* endpoint, const void* header, std::size_t header_length,
           void* data, std::size_t length, bool rendezvous)
      : core_(core),
        endpoint_(endpoint),
        header_(static_cast<const std::byte*>(header), header_length),
        data_(data),
        length_(length),
        rendezvous_(rendezvous) {}

  Endpoint* endpoint() const override { return endpoint_; }
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
    auto* ctx = new RecvCtx{core_, std::move(on_placed)};
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxCore::OnRecvDone;
    p.user_data = ctx;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(core_->worker_.get(), data_, dest, length_, &p);
    receive_started_ = true;
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      Status st = StatusFromUcs(UCS_PTR_STATUS(req), "ucp_am_recv_data_nbx");
      core_->Post([cb = std::move(ctx->on_placed), st] { cb(st); });
      delete ctx;
      return Status::OK();
    }
    ctx->request = req;
    core_->other_requests_.insert(req);
    ++core_->inflight_requests_;
    return Status::OK();
  }

  void Drop() override { consumed_ = true; }

 private:
  UcxCore* const core_;
  Endpoint* const endpoint_;
  const std::span<const std::byte> header_;
  void* const data_;
  const std::size_t length_;
  const bool rendezvous_;
  bool consumed_ = false;
  bool receive_started_ = false;
};

void UcxCore::OnRecvDone(void* request, ucs_status_t status, std::size_t /*length*/,
                         void* user_data) {
  auto* ctx = static_cast<RecvCtx*>(user_data);
  ctx->core->other_requests_.erase(request);
  --ctx->core->inflight_requests_;
  ucp_request_free(request);
  Status st = StatusFromUcs(status, "ucp_am_recv_data_nbx");
  if (status == UCS_ERR_CANCELED || status == UCS_ERR_CONNECTION_RESET) {
    st = Status::Unavailable(st.ToString());
  }
  auto cb = std::move(ctx->on_placed);
  delete ctx;
  cb(std::move(st));
}

ucs_status_t UcxCore::OnAmThunk(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxCore*>(arg)->OnAm(header, header_length, data, length, param);
}

ucs_status_t UcxCore::OnAm(const void* header, std::size_t header_length, void* data,
                           std::size_t length, const ucp_am_recv_param_t* param) {
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  (rendezvous ? rendezvous_messages_ : eager_messages_).fetch_add(1, std::memory_order_relaxed);
  if (!message_handler_) return UCS_OK;  // dropped: UCX releases the data
  Endpoint* endpoint = nullptr;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
    auto it = eps_.find(param->reply_ep);
    if (it != eps_.end()) endpoint = it->second->owner;
  }
  Incoming msg(this, endpoint, header, header_length, data, length, rendezvous);
  message_handler_(msg);
  // A receive started in the callback keeps the descriptor until it is done;
  // otherwise UCX releases it (for rendezvous: tells the sender it is done).
  return msg.receive_started() ? UCS_INPROGRESS : UCS_OK;
}

}  // namespace kvfabric::ucx::internal
