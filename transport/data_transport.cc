#include "transport/data_transport.h"

#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::transport {

Status ValidateDataTransportKind(const std::string& kind, const std::string& setting) {
  if (kind == "ucx" || kind == "tcp") return Status::OK();
  return Status::InvalidArgument(setting + "=\"" + kind +
                                 "\": must be ucx (RDMA, shared memory, TCP) or tcp (kernel "
                                 "sockets; the daemon and its clients must agree)");
}

bool UsesSharedMemory(const DataTransportOptions& options) {
  return options.kind == "ucx" && ucx::TlsUsesSharedMemory(options.ucx_tls);
}

Status SetDataTransportPacingRate(Transport* transport, std::uint64_t bytes_per_s) {
  auto* tcp = dynamic_cast<tcp::TcpTransport*>(transport);
  if (tcp == nullptr) {
    return Status::FailedPrecondition(
        "a send-rate cap needs the kernel TCP data plane (--data-transport=tcp); this transport "
        "is " +
        (transport == nullptr ? std::string("none") : transport->name()));
  }
  return tcp->SetMaxPacingRate(bytes_per_s);
}

StatusOr<std::unique_ptr<Transport>> CreateDataTransport(const DataTransportOptions& options) {
  KVF_RETURN_IF_ERROR(ValidateDataTransportKind(options.kind, "data transport"));
  if (options.tcp_tls_enabled && options.kind != "tcp") {
    return Status::InvalidArgument(
        "data-plane TLS runs on the kernel TCP data plane only (--data-transport=tcp); UCX "
        "moves bytes with RDMA or shared memory, which TLS cannot wrap");
  }
  if (options.kind == "tcp") {
    tcp::TcpTransportOptions t;
    t.workers = options.workers;
    t.send_buffer_bytes = options.tcp_send_buffer_bytes;
    t.receive_buffer_bytes = options.tcp_receive_buffer_bytes;
    t.max_pacing_rate_bytes_per_s = options.tcp_max_pacing_rate_bytes_per_s;
    t.max_handshakes = options.tcp_max_handshakes;
    if (options.tcp_tls_enabled) {
      StatusOr<std::shared_ptr<const tcp::TcpTls>> tls = tcp::TcpTls::Create(options.tcp_tls);
      if (!tls.ok()) return tls.status().WithContext("kernel TCP data transport");
      t.tls = *tls;
    }
    StatusOr<std::unique_ptr<tcp::TcpTransport>> created = tcp::CreateTcpTransport(t);
    if (!created.ok()) return created.status().WithContext("kernel TCP data transport");
    return std::unique_ptr<Transport>(std::move(created).value());
  }
  ucx::UcxTransportOptions u;
  u.tls = options.ucx_tls;
  u.tls_setting = options.ucx_tls_setting;
  u.log_sink = options.ucx_log_sink;
  if (options.shared_memory_peers == "same-user") {
    u.shared_memory_peers = ucx::SharedMemoryPeers::kSameUser;
  } else if (options.shared_memory_peers == "any") {
    u.shared_memory_peers = ucx::SharedMemoryPeers::kAnyUser;
  } else {
    return Status::InvalidArgument("shared memory peers \"" + options.shared_memory_peers +
                                   "\": must be same-user or any");
  }
  u.on_rejected_peer = options.on_rejected_peer;
  u.copy_threads = options.copy_threads;
  u.streaming_copy_min_bytes = options.streaming_copy_min_bytes;
  u.populate_imported_mappings = options.populate_imported_mappings;
  u.max_rank_deferral = options.max_rank_deferral;
  u.workers = options.workers;
  StatusOr<std::unique_ptr<Transport>> created = ucx::CreateUcxTransport(u);
  if (!created.ok()) {
    return created.status().WithContext("UCX data transport (tls \"" + options.ucx_tls + "\")");
  }
  return created;
}

}  // namespace kvfabric::transport
