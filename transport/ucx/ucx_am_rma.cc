// UcxCore, continued: owner-placed kRead/kWrite (transport/ucx/ucx_am_rma.h)
// and the grants they are checked against (shared by the transport's
// workers: CoreGroup). Progress thread, except GrantRange and RevokeRegion
// (any thread).
#include <cstring>
#include <utility>

#include "core/mutex.h"
#include "core/secure_random.h"
#include "transport/ucx/ucx_core.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx::internal {

using transport::TransferOp;

namespace {

void BeginRegionOp(const std::shared_ptr<OwnedRegion>& region, const std::shared_ptr<EpState>& s) {
  MutexLock lock(&region->mu);
  ++region->active;
  region->active_eps.push_back(s);
}

}  // namespace

// ---------------------------------------------------------------------------
// Grants (owner side).

std::uint64_t UcxCore::GrantRange(const std::shared_ptr<OwnedRegion>& region, std::uint64_t offset,
                                  std::uint64_t length) {
  MutexLock lock(&group_->grants_mu);
  auto [it, inserted] = region->grant_ids.try_emplace({offset, length}, 0);
  if (!inserted) return it->second;
  // A grant id is a capability: from the kernel's CSPRNG, so a peer cannot
  // name a range that was exported to someone else by guessing.
  std::uint64_t id = 0;
  while (id == 0 || group_->grants.count(id) != 0) id = SecureRandomU64();
  it->second = id;
  group_->grants[id] = Grant{region, offset, length};
  return id;
}

StatusCode UcxCore::ResolveGrant(std::uint64_t id, std::uint64_t offset, std::uint64_t length,
                                 std::shared_ptr<OwnedRegion>* region, std::byte** at) {
  MutexLock lock(&group_->grants_mu);
  auto it = group_->grants.find(id);
  // Never granted, or revoked because the owner destroyed the region: either
  // way the memory is not available from this owner any more. Unavailable, as
  // the loopback backend answers, so a client falls back as for a lost peer
  // (a region destroyed under in-flight reads must not look like a bad key).
  if (it == group_->grants.end()) return StatusCode::kUnavailable;
  const Grant& g = it->second;
  // The owner's own bounds check: the requester's is not trusted.
  if (offset > g.length || length > g.length - offset) return StatusCode::kInvalidArgument;
  *region = g.region;
  *at = g.region->base + g.offset + offset;
  return StatusCode::kOk;
}

void UcxCore::RevokeRegion(const std::shared_ptr<OwnedRegion>& region,
                           std::chrono::milliseconds grace) {
  {
    MutexLock lock(&group_->grants_mu);
    for (const auto& [range, id] : region->grant_ids) group_->grants.erase(id);
    region->grant_ids.clear();
  }
  // No new operation can start; wait for those running (on any worker).
  auto drained = std::make_shared<Waiter>();
  {
    MutexLock lock(&region->mu);
    if (region->active == 0) return;
    region->drained = drained;
  }
  // Force-closes the endpoints still using the region, each on its own
  // worker: at once where that is this thread, else through its queue (a
  // worker already shut down has finished its operations on the region).
  auto close_users = [this, region] {
    std::vector<std::shared_ptr<EpState>> eps;
    {
      MutexLock lock(&region->mu);
      eps = region->active_eps;
    }
    const Status why = Status::Unavailable("a local region its peer was using was destroyed");
    for (const auto& s : eps) {
      if (s->core->OnProgressThread()) {
        s->core->CloseEp(*s, /*force=*/true, /*by_user=*/true, why, nullptr);
      } else if (std::shared_ptr<UcxCore> core = group_->Find(s->core)) {
        core->Post([c = core.get(), s, why] {
          c->CloseEp(*s, /*force=*/true, /*by_user=*/true, why, nullptr);
        });
      }
    }
  };
  if (group_->OnAnyProgressThread()) {
    close_users();  // cannot wait on a progress thread: purge them
    return;
  }
  Status ignored;
  if (drained->WaitUntil(transport::Clock::now() + grace, &ignored)) return;
  close_users();
  // The force close purges their requests; bounded in case UCX does not.
  drained->WaitUntil(transport::Clock::now() + std::chrono::seconds(30), &ignored);
}

void UcxCore::EndRegionOp(const std::shared_ptr<OwnedRegion>& region,
                          const std::shared_ptr<EpState>& s) {
  std::shared_ptr<Waiter> drained;
  {
    MutexLock lock(&region->mu);
    --region->active;
    auto& eps = region->active_eps;
    for (auto it = eps.begin(); it != eps.end(); ++it) {
      if (*it == s) {
        eps.erase(it);
        break;
      }
    }
    if (region->active == 0) drained.swap(region->drained);
  }
  if (drained) drained->Set(Status::OK());
}

// ---------------------------------------------------------------------------
// Requester side.

void UcxCore::PostRmaRequest(const std::shared_ptr<BatchOp>& op, std::size_t i) {
  PreparedTransfer& t = op->entries[i];
  EpState& s = *op->ep;
  const bool write = t.op == TransferOp::kWrite;
  RmaRequest request;
  request.grant_id = t.rkey->grant_id;
  request.offset = t.remote_offset;
  request.length = t.length;
  request.request_id = next_rma_id_++;
  // Kept in the entry: UCX reads the header until the send completes.
  t.header.assign(reinterpret_cast<const char*>(&request), sizeof(request));
  ++op->pending[i];  // the owner's reply
  op->awaiting[i] = request.request_id;
  awaiting_[request.request_id] = AwaitingRma{op, i, op->ep};
  s.awaiting.insert(request.request_id);

  const char* what = write ? "ucp_am_send_nbx(kWrite)" : "ucp_am_send_nbx(kRead request)";
  Req* r = NewReq(op->ep, op, [this, op, i, what](ucs_status_t st, std::size_t) {
    if (st != UCS_OK) {
      // No reply will be trusted for a request that was not sent whole.
      const Status status = EntryStatus(*op->ep, st, what, op->cancelled);
      if (const std::uint64_t id = op->awaiting[i]; id != 0) {
        awaiting_.erase(id);
        op->ep->awaiting.erase(id);
        op->awaiting[i] = 0;
        FinishEntry(*op, i, status);
      }
      FinishEntry(*op, i, status);
      return;
    }
    FinishEntry(*op, i, Status::OK());
  });
  ucp_request_param_t p = {};
  FillParam(r, &p, /*recv=*/false);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  Track(r,
        ucp_am_send_nbx(s.ep, write ? kRmaWriteAmId : kRmaReadAmId, t.header.data(),
                        t.header.size(), write ? t.local : nullptr, write ? t.length : 0, &p),
        0);
}

void UcxCore::FailAwaiting(EpState& s, const Status& why) {
  std::vector<std::uint64_t> ids(s.awaiting.begin(), s.awaiting.end());
  s.awaiting.clear();
  for (std::uint64_t id : ids) {
    auto it = awaiting_.find(id);
    if (it == awaiting_.end()) continue;
    AwaitingRma a = std::move(it->second);
    awaiting_.erase(it);
    a.op->awaiting[a.entry] = 0;
    const Status status = a.op->cancelled || s.closed_locally
                              ? Status::Cancelled("endpoint closed before the owner replied")
                              : why;
    FinishEntry(*a.op, a.entry, status);
  }
}

void UcxCore::CancelAwaiting(BatchOp& op) {
  for (std::size_t i = 0; i < op.awaiting.size(); ++i) {
    const std::uint64_t id = op.awaiting[i];
    if (id == 0) continue;
    awaiting_.erase(id);
    op.ep->awaiting.erase(id);
    op.awaiting[i] = 0;
    FinishEntry(op, i, Status::Cancelled("batch cancelled before the owner replied"));
  }
}

ucs_status_t UcxCore::OnRmaReply(const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
  const std::optional<RmaReply> reply = DecodeRma<RmaReply>(header, header_length);
  if (!reply.has_value()) return UCS_OK;  // not ours: dropped
  auto it = awaiting_.find(reply->request_id);
  // Unknown: cancelled or failed meanwhile; its bytes are dropped. A reply
  // from another endpoint than the request's is not trusted.
  if (it == awaiting_.end() || ReplyEp(param) != it->second.ep) return UCS_OK;
  AwaitingRma a = std::move(it->second);
  awaiting_.erase(it);
  a.ep->awaiting.erase(reply->request_id);
  a.op->awaiting[a.entry] = 0;
  const PreparedTransfer& t = a.op->entries[a.entry];
  const bool write = t.op == TransferOp::kWrite;
  Status st = RmaReplyStatus(reply->code, write ? "kWrite" : "kRead");
  if (st.ok() && !write && length != t.length) {
    st = Status::DataLoss("kRead of " + std::to_string(t.length) + " bytes: the owner sent " +
                          std::to_string(length));
  }
  if (!st.ok() || write) {
    FinishEntry(*a.op, a.entry, st);
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    std::memcpy(t.local, data, length);
    FinishEntry(*a.op, a.entry, Status::OK());
    return UCS_OK;
  }
  // Straight into the local destination.
  std::shared_ptr<BatchOp> op = a.op;
  const std::size_t i = a.entry;
  Req* r = NewReq(a.ep, op, [this, op, i](ucs_status_t rs, std::size_t) {
    FinishEntry(*op, i,
                rs == UCS_OK
                    ? Status::OK()
                    : EntryStatus(*op->ep, rs, "ucp_am_recv_data_nbx(kRead)", op->cancelled));
  });
  ucp_request_param_t p = {};
  FillParam(r, &p, /*recv=*/true);
  Track(r, ucp_am_recv_data_nbx(worker_.get(), data, t.local, length, &p), length);
  return UCS_INPROGRESS;  // UCX owns the descriptor once the receive started
}

// ---------------------------------------------------------------------------
// Owner side.

ucs_status_t UcxCore::OnRmaRequest(bool write, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
  const std::optional<RmaRequest> request = DecodeRma<RmaRequest>(header, header_length);
  std::shared_ptr<EpState> s = ReplyEp(param);
  // Malformed, or from no endpoint we know: dropped (a rendezvous payload
  // is then never fetched).
  if (!request.has_value() || s == nullptr || s->ep == nullptr) return UCS_OK;
  std::shared_ptr<OwnedRegion> region;
  std::byte* at = nullptr;
  StatusCode code = ResolveGrant(request->grant_id, request->offset, request->length, &region, &at);
  if (code == StatusCode::kOk && write && length != request->length) {
    code = StatusCode::kInvalidArgument;
  }
  const std::uint64_t id = request->request_id;
  if (code != StatusCode::kOk) {
    SendRmaReply(s, id, code, nullptr, nullptr, 0);
    return UCS_OK;
  }
  if (!write) {
    SendRmaReply(s, id, StatusCode::kOk, region, at, request->length);
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    std::memcpy(at, data, length);
    SendRmaReply(s, id, StatusCode::kOk, nullptr, nullptr, 0);
    return UCS_OK;
  }
  BeginRegionOp(region, s);
  Req* r = NewReq(s, nullptr, [this, s, region, id](ucs_status_t st, std::size_t) {
    EndRegionOp(region, s);
    SendRmaReply(s, id, st == UCS_OK ? StatusCode::kOk : StatusCode::kUnavailable, nullptr, nullptr,
                 0);
  });
  ucp_request_param_t p = {};
  FillParam(r, &p, /*recv=*/true);
  Track(r, ucp_am_recv_data_nbx(worker_.get(), data, at, length, &p), length);
  return UCS_INPROGRESS;
}

void UcxCore::SendRmaReply(const std::shared_ptr<EpState>& s, std::uint64_t request_id,
                           StatusCode code, const std::shared_ptr<OwnedRegion>& region,
                           const std::byte* data, std::uint64_t length) {
  if (region) BeginRegionOp(region, s);  // the reply reads from it until sent
  WhenReady(*s, [this, s, request_id, code, region, data, length] {
    if (s->ep == nullptr) {
      if (region) EndRegionOp(region, s);
      return;
    }
    auto reply = std::make_shared<RmaReply>();
    reply->request_id = request_id;
    reply->code = static_cast<std::uint32_t>(code);
    // A failed reply needs nothing more: the requester fails the entry when
    // the endpoint fails.
    Req* r = NewReq(s, nullptr, [this, s, region, reply](ucs_status_t, std::size_t) {
      if (region) EndRegionOp(region, s);
    });
    ucp_request_param_t p = {};
    FillParam(r, &p, /*recv=*/false);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    Track(r,
          ucp_am_send_nbx(s->ep, kRmaReplyAmId, reply.get(), sizeof(RmaReply), data,
                          data != nullptr ? length : 0, &p),
          0);
  });
}

ucs_status_t UcxCore::OnRmaWriteThunk(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* param) {
  return static_cast<UcxCore*>(arg)->OnRmaRequest(true, header, header_length, data, length, param);
}

ucs_status_t UcxCore::OnRmaReadThunk(void* arg, const void* header, std::size_t header_length,
                                     void* data, std::size_t length,
                                     const ucp_am_recv_param_t* param) {
  return static_cast<UcxCore*>(arg)->OnRmaRequest(false, header, header_length, data, length,
                                                  param);
}

ucs_status_t UcxCore::OnRmaReplyThunk(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* param) {
  return static_cast<UcxCore*>(arg)->OnRmaReply(header, header_length, data, length, param);
}

}  // namespace kvfabric::ucx::internal
