#include "server/grpc_server_limits.h"

#include <grpc/grpc.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include <CLI/CLI.hpp>

#include "core/config/unit_flags.h"
#include "core/units.h"
#include "proto/wire_limits.h"

namespace kvfabric {
namespace {

Status OutOfRange(const std::string& flag, const std::string& value, const std::string& range) {
  return Status::InvalidArgument(flag + "=" + value + ": must be " + range);
}

}  // namespace

Status GrpcServerLimits::Validate() const {
  if (max_concurrent_streams < 1 || max_concurrent_streams > 65536) {
    return OutOfRange("--grpc-max-concurrent-streams", std::to_string(max_concurrent_streams),
                      "1..65536");
  }
  if (max_threads < 2 || max_threads > 4096) {
    return OutOfRange("--grpc-max-threads", std::to_string(max_threads), "2..4096");
  }
  if (memory_bytes < (std::uint64_t{16} << 20) || memory_bytes > (std::uint64_t{1} << 40)) {
    return OutOfRange("--grpc-memory-bytes", FormatBytes(memory_bytes), "16MiB..1TiB");
  }
  if (max_request_bytes < (64u << 10) || max_request_bytes > kMaxMessageBytes) {
    return OutOfRange("--grpc-max-request-bytes", FormatBytes(max_request_bytes), "64KiB..16MiB");
  }
  if (max_metadata_bytes < 1024 || max_metadata_bytes > (1u << 20)) {
    return OutOfRange("max_metadata_bytes", std::to_string(max_metadata_bytes), "1KiB..1MiB");
  }
  if (idle_timeout < std::chrono::seconds(1) || idle_timeout > std::chrono::hours(24)) {
    return OutOfRange("--grpc-idle-timeout", std::to_string(idle_timeout.count()) + "us",
                      "1s..24h");
  }
  return Status::OK();
}

std::string GrpcServerLimits::ToString() const {
  return std::to_string(max_concurrent_streams) + " calls per connection, " +
         std::to_string(max_threads) + " threads, " + FormatBytes(memory_bytes) +
         " of buffers, requests <= " + FormatBytes(max_request_bytes) + ", idle connections " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(idle_timeout).count()) +
         " s";
}

void AddGrpcServerLimitFlags(CLI::App& app, GrpcServerLimits* limits) {
  // The defaults in the help are the values `limits` holds now (a binary may
  // set its own before adding the flags).
  app.add_option("--grpc-max-concurrent-streams", limits->max_concurrent_streams,
                 "gRPC calls in flight on one connection; further calls wait (default " +
                     std::to_string(limits->max_concurrent_streams) + ")");
  app.add_option("--grpc-max-threads", limits->max_threads,
                 "threads running gRPC handlers, in all; further calls queue (default " +
                     std::to_string(limits->max_threads) + ")");
  AddBytesOption(app, "--grpc-memory-bytes", &limits->memory_bytes,
                 "memory gRPC may use for every connection's buffers (default " +
                     FormatBytes(limits->memory_bytes) + ")");
  AddBytesOption(app, "--grpc-max-request-bytes", &limits->max_request_bytes,
                 "largest gRPC request accepted, refused before it is parsed (default " +
                     FormatBytes(limits->max_request_bytes) + "; responses may be up to 16 MiB)");
  AddDurationOption(
      app, "--grpc-idle-timeout", &limits->idle_timeout,
      "a gRPC connection without calls for this long is closed (default " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(limits->idle_timeout).count()) +
          "s)");
}

void ApplyGrpcServerLimits(const GrpcServerLimits& limits, const std::string& quota_name,
                           grpc::ServerBuilder* builder) {
  grpc::ResourceQuota quota(quota_name);
  quota.Resize(static_cast<std::size_t>(limits.memory_bytes));
  quota.SetMaxThreads(limits.max_threads);
  builder->SetResourceQuota(quota);
  builder->SetMaxReceiveMessageSize(static_cast<int>(limits.max_request_bytes));
  builder->SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              static_cast<int>(limits.max_concurrent_streams));
  builder->AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                              static_cast<int>(limits.max_metadata_bytes));
  builder->AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(limits.idle_timeout).count()));
}

}  // namespace kvfabric
