// The data-plane transport a process creates from its flags: UCX (RDMA,
// shared memory, TCP) or the kernel-socket TCP transport. One place that
// turns kvfabric-cached's, the embedded cluster's and libkvfabric's
// settings into a Transport, so all three accept the same names and give
// the same errors. Both ends of a data-plane connection must use the same
// kind: a daemon started with --data-transport=tcp serves kernel-TCP
// clients only.
#ifndef KVFABRIC_TRANSPORT_DATA_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_DATA_TRANSPORT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/statusor.h"
#include "transport/tcp/tcp_tls.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_log.h"

namespace kvfabric::transport {

struct DataTransportOptions {
  // "ucx" (the default) or "tcp" (transport/tcp/tcp_transport.h).
  std::string kind = "ucx";
  // UCX only: the transport list (must include tcp) and copy helpers.
  std::string ucx_tls = "sm,self,tcp";
  // UCX only: the setting ucx_tls came from, named in the one warning about
  // transports of the list this machine lacks (ucx/ucx_log.h).
  std::string ucx_tls_setting = "--ucx-tls";
  // UCX only: receives UCX's own messages and that warning (default:
  // spdlog's default logger; libkvfabric passes its own logger).
  ucx::UcxLogSink ucx_log_sink;
  // UCX only, listeners: "same-user" (the default) accepts connections from
  // processes of this host only when their socket belongs to this process's
  // user, while ucx_tls uses shared memory; "any" accepts every user
  // (ucx::SharedMemoryPeers). Peers on other hosts are not affected.
  std::string shared_memory_peers = "same-user";
  // UCX only: told of each connection request refused under
  // shared_memory_peers (on a progress thread; must not block).
  std::function<void(const std::string& peer, const Status& why)> on_rejected_peer;
  int copy_threads = 1;
  // UCX only: UcxTransportOptions::streaming_copy_min_bytes (batches copied
  // through a mapping of at least this many bytes use streaming stores).
  std::uint64_t streaming_copy_min_bytes = std::uint64_t{8} << 20;
  // UCX only: UcxTransportOptions::populate_imported_mappings (fill in the
  // page tables of imported shared-memory regions in the background).
  bool populate_imported_mappings = true;
  // UCX only: UcxTransportOptions::max_rank_deferral (how long a ranked
  // batch, a load's later layers, waits behind urgent ones at most).
  std::chrono::milliseconds max_rank_deferral{20};
  // Progress threads serving connections (both kinds).
  int workers = 1;
  // tcp only: TcpTransportOptions::send_buffer_bytes (0: auto, -1: kernel
  // autotuning, else bytes) and receive_buffer_bytes (0: kernel autotuning).
  int tcp_send_buffer_bytes = 0;
  int tcp_receive_buffer_bytes = 0;
  // tcp only: TcpTransportOptions::max_pacing_rate_bytes_per_s (0: no cap).
  std::uint64_t tcp_max_pacing_rate_bytes_per_s = 0;
  // tcp only: TcpTransportOptions::max_handshakes (connections accepted and
  // not yet past their hello).
  std::uint32_t tcp_max_handshakes = 1024;
  // tcp only: TLS on every data-plane connection (tcp::TcpTls): a listener
  // presents tcp_tls.cert_file/key_file, a connecting side verifies against
  // tcp_tls.ca_file. Refused for ucx (InvalidArgument naming the setting).
  bool tcp_tls_enabled = false;
  tcp::TcpTlsOptions tcp_tls;
};

// Changes the send-rate cap of a "tcp" transport's connections now and later
// (tcp::TcpTransport::SetMaxPacingRate); FailedPrecondition for any other
// kind (UCX's sockets are its own).
Status SetDataTransportPacingRate(Transport* transport, std::uint64_t bytes_per_s);

// InvalidArgument naming `setting` unless kind is "ucx" or "tcp".
Status ValidateDataTransportKind(const std::string& kind, const std::string& setting);

// Whether a transport made from `options` may move bytes through shared
// memory with a peer on the same host: UCX with any of sm, shm, sysv, posix,
// cma, knem, xpmem or all in ucx_tls (or a "^..." list that does not exclude
// sm/shm). Such a peer must then run as the same user (core/process_identity.h).
bool UsesSharedMemory(const DataTransportOptions& options);

// The transport, or the backend's error with the kind (and UCX list) in its
// context.
StatusOr<std::unique_ptr<Transport>> CreateDataTransport(const DataTransportOptions& options);

}  // namespace kvfabric::transport

#endif  // KVFABRIC_TRANSPORT_DATA_TRANSPORT_H_
