// GrpcServerLimits: what the peers of one gRPC server (kvfabric-cached's
// public and admin listeners, kvfabric-placement) can make it hold, each
// bounded, with a flag and a default. gRPC's own defaults bound none of
// these but the message size (4 MiB, which kvfabric raises to 16 MiB).
//
//   concurrent calls per connection  HTTP/2 MAX_CONCURRENT_STREAMS: a peer's
//                                    further calls wait on its own connection
//   threads running handlers         ResourceQuota::SetMaxThreads: the sync
//                                    server never has more; calls queue
//   memory of every connection       ResourceQuota::Resize: read buffers and
//                                    messages being received share it; under
//                                    pressure gRPC reads less
//   request size                     larger requests fail RESOURCE_EXHAUSTED
//                                    before they are parsed (responses may be
//                                    up to Limits.max_message_bytes, 16 MiB)
//   metadata (headers) per call      larger are refused
//   idle connections                 closed after the idle timeout (GOAWAY)
//
// Not bounded by gRPC 1.51: the number of connections (it has no such
// setting); idle ones are closed after idle_timeout, and each holds at most
// a file descriptor and its share of the memory quota meanwhile.
//
// Thread safety: plain values; Apply is called once per builder.
#ifndef KVFABRIC_SERVER_GRPC_SERVER_LIMITS_H_
#define KVFABRIC_SERVER_GRPC_SERVER_LIMITS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace kvfabric {

struct GrpcServerLimits {
  // Calls in flight on one connection (1..65536). Default 64: a client
  // (libkvfabric keeps one channel per daemon) has a few calls in flight
  // per context; more wait on the client's side.
  std::uint32_t max_concurrent_streams = 64;
  // Threads running handlers, in all (2..4096). Default 16: handlers do not
  // block on the network (NVMe staging waits at most the call's deadline),
  // so 16 keep up with many engines; further calls queue.
  int max_threads = 16;
  // Memory gRPC may use for all connections' buffers (16 MiB..1 TiB).
  // Default 128 MiB.
  std::uint64_t memory_bytes = std::uint64_t{128} << 20;
  // Largest request (64 KiB..16 MiB), reported as Limits.max_request_bytes.
  // Default 4 MiB (kMaxRequestBytes): a Plan of 65,536 keys is ~2.3 MiB, a
  // Reserve of 4,096 blocks ~0.4 MiB (kvfabric-cached sets 1 MiB). Why not more: a request is
  // parsed in full before its limits are checked, and parsing a message of 32-byte keys takes ~3x
  // its size (a heap string per key), on one handler thread; so the memory calls can make a server
  // hold is bounded by about max_threads x 4 x max_request_bytes, plus memory_bytes.
  std::uint64_t max_request_bytes = std::uint64_t{4} << 20;
  // Largest metadata (headers) of a call (1 KiB..1 MiB). Default 16 KiB.
  std::uint32_t max_metadata_bytes = 16 << 10;
  // A connection with no call for this long is closed (1 s..24 h). Default
  // 5 min; clients reconnect on their next call.
  std::chrono::microseconds idle_timeout{std::chrono::minutes(5)};

  // InvalidArgument naming the flag of the first field out of range.
  Status Validate() const;
  // One line for the start-up log, e.g. "64 calls per connection, 16
  // threads, 128 MiB of buffers, requests <= 4 MiB, idle connections 300 s".
  std::string ToString() const;
};

// Adds --grpc-max-concurrent-streams, --grpc-max-threads,
// --grpc-memory-bytes, --grpc-max-request-bytes and --grpc-idle-timeout.
// REQUIRES: `limits` outlives parsing.
void AddGrpcServerLimitFlags(CLI::App& app, GrpcServerLimits* limits);

// Sets the limits on `builder` (one ResourceQuota per builder).
// REQUIRES: limits.Validate() is OK.
void ApplyGrpcServerLimits(const GrpcServerLimits& limits, const std::string& quota_name,
                           grpc::ServerBuilder* builder);

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_GRPC_SERVER_LIMITS_H_
