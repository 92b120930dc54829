// RAII owners for the UCX handles the UCX transport uses.
//
// Each type owns exactly one handle and releases it with the matching UCX call
// when destroyed; they are move-only. They add no locking: which thread may
// touch a handle is the user's business (transport/ucx/ucx_transport.h: a
// worker, its endpoints, listeners and unpacked remote keys are touched only
// by the worker's progress thread; contexts, memory handles and packed key
// buffers by any thread, because the context is created with
// mt_workers_shared, which makes UCX lock its context-level state).
//
// Endpoints are not wrapped here: closing one is a non-blocking request with
// three outcomes, which ucx_transport.cc drives explicitly.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_HANDLES_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_HANDLES_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <utility>

namespace kvfabric::ucx {

// A UCP configuration read with ucp_config_read (released with
// ucp_config_release).
struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
using UniqueConfig = std::unique_ptr<ucp_config_t, ConfigDeleter>;

// A UCP context. Shared (std::shared_ptr) by the transport and every memory
// region mapped on it, so that the context outlives the last region.
class UcpContext {
 public:
  explicit UcpContext(ucp_context_h h) : h_(h) {}
  ~UcpContext() {
    if (h_ != nullptr) ucp_cleanup(h_);
  }
  UcpContext(const UcpContext&) = delete;
  UcpContext& operator=(const UcpContext&) = delete;
  ucp_context_h get() const { return h_; }

 private:
  ucp_context_h h_;
};

// A UCP worker (ucp_worker_destroy). REQUIRES: destroyed on the thread that
// progresses it, after every endpoint on it was closed.
struct WorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
using UniqueWorker = std::unique_ptr<ucp_worker, WorkerDeleter>;

// A listener (ucp_listener_destroy). Same thread rule as its worker.
struct ListenerDeleter {
  void operator()(ucp_listener* l) const { ucp_listener_destroy(l); }
};
using UniqueListener = std::unique_ptr<ucp_listener, ListenerDeleter>;

// An unpacked remote key (ucp_rkey_destroy). Same thread rule as the worker
// of the endpoint it was unpacked on.
struct RkeyDeleter {
  void operator()(ucp_rkey* k) const { ucp_rkey_destroy(k); }
};
using UniqueRkey = std::unique_ptr<ucp_rkey, RkeyDeleter>;

// A packed remote key buffer from ucp_rkey_pack (ucp_rkey_buffer_release).
struct RkeyBufferDeleter {
  void operator()(void* p) const { ucp_rkey_buffer_release(p); }
};
using UniqueRkeyBuffer = std::unique_ptr<void, RkeyBufferDeleter>;

// A memory mapping from ucp_mem_map (ucp_mem_unmap), holding its context.
class UcpMemHandle {
 public:
  UcpMemHandle(std::shared_ptr<UcpContext> context, ucp_mem_h memh)
      : context_(std::move(context)), memh_(memh) {}
  ~UcpMemHandle() {
    // Nothing useful can be done about a failed unmap at destruction; UCX
    // logs it itself.
    if (memh_ != nullptr) (void)ucp_mem_unmap(context_->get(), memh_);
  }
  UcpMemHandle(const UcpMemHandle&) = delete;
  UcpMemHandle& operator=(const UcpMemHandle&) = delete;
  ucp_mem_h get() const { return memh_; }
  ucp_context_h context() const { return context_->get(); }

 private:
  std::shared_ptr<UcpContext> context_;
  ucp_mem_h memh_;
};

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_HANDLES_H_
