// The C API (client/include/kvfabric/kvfabric.h) over kvfabric::client::Client.
//
// Every entry point runs its body inside Guard(): a non-OK Status becomes its
// code plus the thread-local message, and any C++ exception (bad_alloc from a
// vector, one thrown by a C++ recompute callback) becomes KVF_INTERNAL, so
// nothing unwinds into the caller's C frames. Argument checks here name the C
// argument or kvf_options field; everything else is Client's to validate.
#include <prometheus/collectable.h>
#include <spdlog/common.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/client_log.h"
#include "client/device_arena.h"
#include "client/kvfabric_c_options.h"
#include "client/kvfabric_client.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/device.h"
#include "kvfabric/kvfabric.h"
#include "metrics/exposition.h"

#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

using kvfabric::BlockKey;
using kvfabric::KvDtype;
using kvfabric::Status;
using kvfabric::StatusCode;
using kvfabric::StatusOr;
using kvfabric::client::Client;
using kvfabric::client::ClientMetrics;
using kvfabric::client::ClientOptions;
using kvfabric::client::ContextReport;
using kvfabric::client::DeviceArenaSettingNames;
using kvfabric::client::MatchResult;
using kvfabric::client::RecomputeRequest;
using kvfabric::client::capi::ToClientOptions;

// The codes are StatusCode's, so conversion is a cast both ways.
static_assert(KVF_OK == static_cast<int>(StatusCode::kOk));
static_assert(KVF_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(KVF_UNKNOWN == static_cast<int>(StatusCode::kUnknown));
static_assert(KVF_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(KVF_DEADLINE_EXCEEDED == static_cast<int>(StatusCode::kDeadlineExceeded));
static_assert(KVF_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(KVF_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists));
static_assert(KVF_PERMISSION_DENIED == static_cast<int>(StatusCode::kPermissionDenied));
static_assert(KVF_RESOURCE_EXHAUSTED == static_cast<int>(StatusCode::kResourceExhausted));
static_assert(KVF_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(KVF_ABORTED == static_cast<int>(StatusCode::kAborted));
static_assert(KVF_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange));
static_assert(KVF_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(KVF_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(KVF_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(KVF_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss));
static_assert(KVF_DTYPE_FP16 == static_cast<std::uint32_t>(KvDtype::kFp16));
static_assert(KVF_DTYPE_BF16 == static_cast<std::uint32_t>(KvDtype::kBf16));
static_assert(KVF_DTYPE_FP32 == static_cast<std::uint32_t>(KvDtype::kFp32));
static_assert(sizeof(kvf_block_key) == BlockKey::kSize);

// The handle: the device is declared first so that it is destroyed last (the
// Client borrows it).
struct kvf_client {
  std::unique_ptr<kvfabric::gpu::Device> device;
  std::unique_ptr<Client> client;
  // Copies of the geometry the C layer checks sizes against.
  std::uint32_t tokens_per_block = 0;
  std::uint32_t num_q_heads = 0;
  std::uint32_t head_dim = 0;
};

struct kvf_match_result {
  MatchResult result;
};

namespace {

// The message of the last failing call on this thread. If recording it ran
// out of memory, `t_error_lost` says so instead.
thread_local std::string t_last_error;
thread_local bool t_error_lost = false;

// Indexed by kvf_status.
constexpr const char* kStatusNames[] = {
    "KVF_OK",
    "KVF_CANCELLED",
    "KVF_UNKNOWN",
    "KVF_INVALID_ARGUMENT",
    "KVF_DEADLINE_EXCEEDED",
    "KVF_NOT_FOUND",
    "KVF_ALREADY_EXISTS",
    "KVF_PERMISSION_DENIED",
    "KVF_RESOURCE_EXHAUSTED",
    "KVF_FAILED_PRECONDITION",
    "KVF_ABORTED",
    "KVF_OUT_OF_RANGE",
    "KVF_UNIMPLEMENTED",
    "KVF_INTERNAL",
    "KVF_UNAVAILABLE",
    "KVF_DATA_LOSS",
};
constexpr kvf_status kLastStatus = KVF_DATA_LOSS;
static_assert(sizeof(kStatusNames) / sizeof(kStatusNames[0]) == kLastStatus + 1);

bool IsStatusCode(kvf_status status) { return status >= KVF_OK && status <= kLastStatus; }

// Records "<function>: <Code>: <message>" and returns `code`. Never throws.
kvf_status Fail(const char* function, StatusCode code, std::string_view message) noexcept {
  try {
    t_last_error.assign(function);
    t_last_error.append(": ");
    t_last_error.append(kvfabric::StatusCodeName(code));
    t_last_error.append(": ");
    t_last_error.append(message);
    t_error_lost = false;
  } catch (...) {
    t_last_error.clear();
    t_error_lost = true;
  }
  return static_cast<kvf_status>(code);
}

void AppendToLastError(const char* text) noexcept {
  if (t_error_lost) return;
  try {
    t_last_error.append(text);
  } catch (...) {
    t_last_error.clear();
    t_error_lost = true;
  }
}

// Runs `body` (returning a Status) so that neither an error nor an exception
// escapes except as a kvf_status.
template <typename Body>
kvf_status Guard(const char* function, Body&& body) noexcept {
  try {
    Status status = body();
    if (status.ok()) return KVF_OK;
    return Fail(function, status.code(), status.message());
  } catch (const std::exception& e) {
    const kvf_status code =
        Fail(function, StatusCode::kInternal, "unexpected C++ exception inside kvfabric: ");
    AppendToLastError(e.what());
    return code;
  } catch (...) {
    return Fail(function, StatusCode::kInternal, "unexpected C++ exception inside kvfabric");
  }
}

Status NullArgument(const char* name) {
  return Status::InvalidArgument(std::string(name) + " is NULL");
}

// Refuses a null pointer argument, naming it as the caller spelled it.
#define KVF_C_REQUIRE(ptr)                           \
  do {                                               \
    if ((ptr) == nullptr) return NullArgument(#ptr); \
  } while (0)

// Creates the device options->device_kind names. REQUIRES: ToClientOptions
// accepted `o` (a known kind, a CPU index of 0, an index that fits an int).
StatusOr<std::unique_ptr<kvfabric::gpu::Device>> CreateDevice(const kvf_options& o) {
  kvfabric::gpu::DeviceOptions device_options;
  device_options.arena_bytes = o.device_arena_bytes;
  device_options.device_index = static_cast<int>(o.device_index);
  const std::string arena = "options->device_arena_bytes = " + std::to_string(o.device_arena_bytes);
  if (o.device_kind == KVF_DEVICE_CPU) {
    StatusOr<std::unique_ptr<kvfabric::gpu::Device>> device =
        kvfabric::gpu::CreateCpuDevice(device_options);
    if (!device.ok()) return device.status().WithContext("creating the CPU device of " + arena);
    return device;
  }
#ifdef KVF_HAVE_CUDA
  StatusOr<std::unique_ptr<kvfabric::gpu::Device>> device =
      kvfabric::gpu::CreateCudaDevice(device_options);
  if (!device.ok()) {
    Status status = device.status().WithContext(
        "creating the CUDA device of options->device_kind = KVF_DEVICE_CUDA, "
        "options->device_index = " +
        std::to_string(o.device_index) + ", " + arena);
    if (status.code() != StatusCode::kFailedPrecondition) return status;
    // No GPU, no driver, or no such ordinal: CUDA's own words for it (e.g.
    // "driver version is insufficient" where no driver is installed) do not
    // say what to do.
    return Status(status.code(), std::string(status.message()) +
                                     "; no usable GPU here: check the driver and "
                                     "CUDA_VISIBLE_DEVICES, or use KVF_DEVICE_CPU");
  }
  return device;
#else
  return Status::Unimplemented(
      "options->device_kind is KVF_DEVICE_CUDA, but this libkvfabric was built without CUDA "
      "(no CUDA toolkit at build time): use KVF_DEVICE_CPU, or a libkvfabric built with CUDA");
#endif
}

// kvf_log_level -> spdlog's level; false for a value not in kvf_log_level_code.
bool FromKvfLogLevel(kvf_log_level level, spdlog::level::level_enum* out) {
  switch (level) {
    case KVF_LOG_TRACE:
      *out = spdlog::level::trace;
      return true;
    case KVF_LOG_DEBUG:
      *out = spdlog::level::debug;
      return true;
    case KVF_LOG_INFO:
      *out = spdlog::level::info;
      return true;
    case KVF_LOG_WARN:
      *out = spdlog::level::warn;
      return true;
    case KVF_LOG_ERROR:
      *out = spdlog::level::err;
      return true;
    case KVF_LOG_OFF:
      *out = spdlog::level::off;
      return true;
    default:
      return false;
  }
}

// spdlog's level of a line -> kvf_log_level (critical, which the C API does
// not have, reads as KVF_LOG_ERROR).
kvf_log_level ToKvfLogLevel(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return KVF_LOG_TRACE;
    case spdlog::level::debug:
      return KVF_LOG_DEBUG;
    case spdlog::level::info:
      return KVF_LOG_INFO;
    case spdlog::level::warn:
      return KVF_LOG_WARN;
    default:
      return KVF_LOG_ERROR;
  }
}

std::vector<BlockKey> ToBlockKeys(const kvf_block_key* keys, size_t n) {
  std::vector<BlockKey> chain;
  chain.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    BlockKey::Bytes bytes;
    std::memcpy(bytes.data(), keys[i].bytes, BlockKey::kSize);
    chain.emplace_back(bytes);
  }
  return chain;
}

}  // namespace

extern "C" {

const char* kvf_last_error(void) {
  if (t_error_lost) return "kvfabric: out of memory while recording the last error";
  return t_last_error.c_str();
}

const char* kvf_status_name(kvf_status status) {
  return IsStatusCode(status) ? kStatusNames[status] : "KVF_UNRECOGNISED_STATUS";
}

kvf_status kvf_set_log_level(kvf_log_level level) {
  return Guard("kvf_set_log_level", [&]() -> Status {
    spdlog::level::level_enum spdlog_level;
    if (!FromKvfLogLevel(level, &spdlog_level)) {
      return Status::InvalidArgument("level is " + std::to_string(level) +
                                     ": use KVF_LOG_TRACE (0), KVF_LOG_DEBUG (1), KVF_LOG_INFO "
                                     "(2), KVF_LOG_WARN (3), KVF_LOG_ERROR (4) or KVF_LOG_OFF (5)");
    }
    kvfabric::client::SetLogLevel(spdlog_level);
    return Status::OK();
  });
}

void kvf_set_log_sink(kvf_log_fn fn, void* user) {
  // Two pointers fit std::function's inline storage, so nothing here
  // allocates; the try only keeps a theoretical std::system_error from the
  // sink's mutex out of the caller's C frames (the previous sink then stays).
  try {
    if (fn == nullptr) {
      kvfabric::client::SetLogSink(nullptr);
      return;
    }
    kvfabric::client::SetLogSink(
        [fn, user](spdlog::level::level_enum level, std::string_view line) {
          fn(user, ToKvfLogLevel(level), line.data());  // NUL-terminated: client_log.h
        });
  } catch (...) {
  }
}

void kvf_options_init(kvf_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(kvf_options);
  options->dtype = KVF_DTYPE_BF16;
  options->tokens_per_block = 16;
  options->tp_size = 1;
  options->tile_tokens = 256;
  options->staging_bytes = std::uint64_t{64} << 20;
  options->fetch_depth = 4;
  options->key_version = 2;  // block-key encoding v2; the v2 fields are unstated (zero)
  options->ucx_tls = "sm,self,tcp";
  options->data_transport = "ucx";
  options->rpc_timeout_ms = 5000;
  options->transfer_timeout_ms = 30000;
  options->device_kind = KVF_DEVICE_CPU;
  options->device_index = 0;
  options->device_staging_pages = 0;        // two tiles' worth (Client)
  options->device_context_floor_pages = 0;  // 1 sink + hot_newest_pages (Client)
  options->straggler_factor = 4.0;
  options->straggler_slack_ms = 50;
  options->connect_at_open = 1;
  options->daemon_checks_landing = 1;
}

kvf_status kvf_client_open(const kvf_options* options, kvf_client** out) {
  if (out != nullptr) *out = nullptr;
  return Guard("kvf_client_open", [&]() -> Status {
    KVF_C_REQUIRE(options);
    KVF_C_REQUIRE(out);
    ClientOptions client_options;
    KVF_RETURN_IF_ERROR(ToClientOptions(*options, &client_options));

    auto handle = std::make_unique<kvf_client>();
    StatusOr<std::unique_ptr<kvfabric::gpu::Device>> device = CreateDevice(*options);
    if (!device.ok()) return std::move(device).status();
    handle->device = std::move(device).value();
    client_options.device = handle->device.get();
    handle->tokens_per_block = client_options.model.tokens_per_block;
    handle->num_q_heads = client_options.num_q_heads;
    handle->head_dim = client_options.model.head_dim;

    StatusOr<std::unique_ptr<Client>> client = Client::Open(std::move(client_options));
    if (!client.ok()) return std::move(client).status();
    handle->client = std::move(client).value();
    *out = handle.release();
    return Status::OK();
  });
}

kvf_status kvf_client_close(kvf_client* client) {
  return Guard("kvf_client_close", [&]() -> Status {
    std::unique_ptr<kvf_client> owned(client);
    if (owned == nullptr || owned->client == nullptr) return Status::OK();
    Status status = owned->client->Close();
    owned->client.reset();  // before the device it borrows
    return status;
  });
}

kvf_status kvf_key_tokens(kvf_client* client, const uint32_t* tokens, size_t n,
                          kvf_block_key* keys_out, size_t keys_cap, size_t* keys_len) {
  return Guard("kvf_key_tokens", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(keys_len);
    if (tokens == nullptr && n > 0) {
      return Status::InvalidArgument("tokens is NULL (n is " + std::to_string(n) + ")");
    }
    const size_t blocks = n / client->tokens_per_block;
    *keys_len = blocks;
    if (keys_out == nullptr && keys_cap == 0) return Status::OK();  // a size query
    if (keys_out == nullptr) {
      return Status::InvalidArgument("keys_out is NULL (keys_cap is " + std::to_string(keys_cap) +
                                     "; pass keys_cap 0 to ask for the count)");
    }
    if (keys_cap < blocks) {
      return Status::InvalidArgument(
          "keys_cap is " + std::to_string(keys_cap) + ", the " + std::to_string(n) +
          " tokens hold " + std::to_string(blocks) + " full blocks of tokens_per_block = " +
          std::to_string(client->tokens_per_block) + " (*keys_len says how many)");
    }
    if (blocks == 0) return Status::OK();
    StatusOr<std::vector<BlockKey>> keys = client->client->KeyTokens(std::span(tokens, n));
    if (!keys.ok()) return std::move(keys).status();
    if (keys->size() != blocks) {
      return Status::Internal("KeyTokens returned " + std::to_string(keys->size()) + " keys for " +
                              std::to_string(blocks) + " full blocks");
    }
    for (size_t i = 0; i < blocks; ++i) {
      std::memcpy(keys_out[i].bytes, (*keys)[i].bytes().data(), BlockKey::kSize);
    }
    return Status::OK();
  });
}

namespace {

// kvf_match and kvf_match_accuracy: `accuracy` NULL is `exact`.
kvf_status MatchAs(const char* function, kvf_client* client, const kvf_block_key* keys, size_t n,
                   uint64_t suffix_tokens, const char* accuracy, uint64_t decode_steps,
                   uint32_t flags, kvf_match_result** out) {
  if (out != nullptr) *out = nullptr;
  return Guard(function, [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(out);
    if (keys == nullptr && n > 0) {
      return Status::InvalidArgument("keys is NULL (n is " + std::to_string(n) + ")");
    }
    constexpr uint32_t kKnownFlags = KVF_MATCH_PREFIX_PLANS_ONLY;
    if ((flags & ~kKnownFlags) != 0) {
      return Status::InvalidArgument(
          "flags " + std::to_string(flags) + " name bits this library does not know (known: " +
          std::to_string(kKnownFlags) + " = KVF_MATCH_PREFIX_PLANS_ONLY)");
    }
    kvfabric::client::MatchOptions options;
    options.prefix_plans_only = (flags & KVF_MATCH_PREFIX_PLANS_ONLY) != 0;
    if (accuracy != nullptr) {
      KVF_ASSIGN_OR_RETURN(options.accuracy, kvfabric::client::AccuracyPolicy::Parse(accuracy));
    }
    options.accuracy.decode_steps = decode_steps;
    const std::vector<BlockKey> chain = ToBlockKeys(keys, n);
    auto match = std::make_unique<kvf_match_result>();
    KVF_RETURN_IF_ERROR(client->client->Match(chain, suffix_tokens, options, &match->result));
    *out = match.release();
    return Status::OK();
  });
}

}  // namespace

kvf_status kvf_match(kvf_client* client, const kvf_block_key* keys, size_t n,
                     uint64_t suffix_tokens, kvf_match_result** out) {
  return MatchAs("kvf_match", client, keys, n, suffix_tokens, nullptr, 0, 0, out);
}

kvf_status kvf_match_accuracy(kvf_client* client, const kvf_block_key* keys, size_t n,
                              uint64_t suffix_tokens, const char* accuracy, uint64_t decode_steps,
                              kvf_match_result** out) {
  return MatchAs("kvf_match_accuracy", client, keys, n, suffix_tokens, accuracy, decode_steps, 0,
                 out);
}

kvf_status kvf_match_with_flags(kvf_client* client, const kvf_block_key* keys, size_t n,
                                uint64_t suffix_tokens, const char* accuracy, uint64_t decode_steps,
                                uint32_t flags, kvf_match_result** out) {
  return MatchAs("kvf_match_with_flags", client, keys, n, suffix_tokens, accuracy, decode_steps,
                 flags, out);
}

const char* kvf_match_representation(const kvf_match_result* match) {
  return match == nullptr ? "" : match->result.representation.c_str();
}

kvf_status kvf_block_is_compact(kvf_client* client, kvf_context_id context, uint32_t block,
                                int* out) {
  if (out != nullptr) *out = 0;
  return Guard("kvf_block_is_compact", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(out);
    KVF_ASSIGN_OR_RETURN(const bool compact, client->client->BlockIsCompact(context, block));
    *out = compact ? 1 : 0;
    return Status::OK();
  });
}

uint32_t kvf_match_cached_blocks(const kvf_match_result* match) {
  return match == nullptr ? 0 : match->result.cached_prefix_blocks;
}

uint32_t kvf_match_chain_blocks(const kvf_match_result* match) {
  return match == nullptr ? 0 : static_cast<uint32_t>(match->result.chain.size());
}

uint64_t kvf_match_plan_id(const kvf_match_result* match) {
  return match == nullptr ? 0 : match->result.plan_id;
}

const char* kvf_match_kind(const kvf_match_result* match) {
  return match == nullptr ? "" : match->result.kind.c_str();
}

double kvf_match_predicted_us(const kvf_match_result* match) {
  return match == nullptr ? 0 : match->result.predicted_us;
}

void kvf_match_free(kvf_match_result* match) { delete match; }

kvf_status kvf_new_context(kvf_client* client, uint64_t tokens, kvf_context_id* out) {
  return Guard("kvf_new_context", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(out);
    StatusOr<kvfabric::client::ContextId> context = client->client->NewContext(tokens);
    if (!context.ok()) return std::move(context).status();
    *out = *context;
    return Status::OK();
  });
}

kvf_status kvf_load(kvf_client* client, const kvf_match_result* match, kvf_context_id context) {
  return Guard("kvf_load", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(match);
    return client->client->Load(match->result, context);
  });
}

kvf_status kvf_wait_layer(kvf_client* client, kvf_context_id context, uint32_t layer,
                          uint32_t timeout_ms) {
  return Guard("kvf_wait_layer", [&]() -> Status {
    KVF_C_REQUIRE(client);
    return client->client->WaitLayer(context, layer, std::chrono::milliseconds(timeout_ms));
  });
}

kvf_status kvf_block_payload(kvf_client* client, kvf_context_id context, uint32_t block,
                             uint8_t** data, uint64_t* bytes) {
  if (data != nullptr) *data = nullptr;
  if (bytes != nullptr) *bytes = 0;
  return Guard("kvf_block_payload", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(data);
    KVF_C_REQUIRE(bytes);
    StatusOr<std::span<std::byte>> payload = client->client->BlockPayload(context, block);
    if (!payload.ok()) return std::move(payload).status();
    *data = reinterpret_cast<uint8_t*>(payload->data());
    *bytes = payload->size();
    return Status::OK();
  });
}

kvf_status kvf_save(kvf_client* client, kvf_context_id context, uint32_t layer,
                    uint32_t first_block, const kvf_block_key* keys, size_t n) {
  return Guard("kvf_save", [&]() -> Status {
    KVF_C_REQUIRE(client);
    if (keys == nullptr && n > 0) {
      return Status::InvalidArgument("keys is NULL (n is " + std::to_string(n) + ")");
    }
    const std::vector<BlockKey> chain = ToBlockKeys(keys, n);
    return client->client->Save(context, layer, first_block, chain);
  });
}

kvf_status kvf_attend(kvf_client* client, kvf_context_id context, uint32_t layer, uint64_t step,
                      const float* q, size_t q_len, float* out, size_t out_len, float* lse,
                      size_t lse_len) {
  return Guard("kvf_attend", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(q);
    KVF_C_REQUIRE(out);
    KVF_C_REQUIRE(lse);
    const std::uint64_t heads = client->num_q_heads;
    const std::uint64_t outputs = heads * client->head_dim;
    const std::string shape = "num_q_heads * head_dim = " + std::to_string(heads) + " * " +
                              std::to_string(client->head_dim) + " = " + std::to_string(outputs);
    if (q_len != outputs) {
      return Status::InvalidArgument("q_len is " + std::to_string(q_len) + ", expected " + shape);
    }
    if (out_len != outputs) {
      return Status::InvalidArgument("out_len is " + std::to_string(out_len) + ", expected " +
                                     shape);
    }
    if (lse_len != heads) {
      return Status::InvalidArgument("lse_len is " + std::to_string(lse_len) +
                                     ", expected num_q_heads = " + std::to_string(heads));
    }
    return client->client->Attend(context, layer, step, std::span(q, q_len),
                                  std::span(out, out_len), std::span(lse, lse_len));
  });
}

kvf_status kvf_finish(kvf_client* client, kvf_context_id context, kvf_context_report* report) {
  return Guard("kvf_finish", [&]() -> Status {
    KVF_C_REQUIRE(client);
    ContextReport finished;
    const Status status = client->client->Finish(context, &finished);
    if (report != nullptr) {
      std::memset(report, 0, sizeof(*report));
      report->plan_id = finished.plan_id;
      report->blocks_fetched = finished.blocks_fetched;
      report->blocks_recomputed = finished.blocks_recomputed;
      report->bytes_fetched = finished.bytes_fetched;
      report->blocks_saved = finished.blocks_written;
      report->blocks_already_cached = finished.blocks_already_cached;
      report->save_failures = finished.save_failures;
      report->predicted_us = finished.predicted_us;
      report->load_us = finished.load_us;
    }
    return status;
  });
}

kvf_status kvf_client_metrics(kvf_client* client, kvf_metrics* out) {
  return Guard("kvf_client_metrics", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(out);
    const ClientMetrics m = client->client->metrics();
    std::memset(out, 0, sizeof(*out));
    out->matches = m.matches;
    out->plans_recompute_all = m.plans_recompute_all;
    out->plans_fetch_all = m.plans_fetch_all;
    out->plans_split = m.plans_split;
    out->plans_mixed = m.plans_mixed;
    out->placement_unavailable = m.placement_unavailable;
    out->blocks_fetched = m.blocks_fetched;
    out->bytes_fetched = m.bytes_fetched;
    out->fetch_us = m.fetch_us;
    out->blocks_recomputed = m.blocks_recomputed;
    out->tokens_recomputed = m.tokens_recomputed;
    out->recompute_us = m.recompute_us;
    out->fallbacks_to_replica = m.fallbacks_to_replica;
    out->fallbacks_to_recompute = m.fallbacks_to_recompute;
    out->blocks_fallen_back = m.blocks_fallen_back;
    out->crc_failures = m.crc_failures;
    out->stale_entries_reported = m.stale_entries_reported;
    out->blocks_saved = m.blocks_saved;
    out->bytes_saved = m.bytes_saved;
    out->save_us = m.save_us;
    out->save_failures = m.save_failures;
    out->blocks_already_cached = m.blocks_already_cached;
    out->attends = m.attends;
    out->attend_us = m.attend_us;
    out->peak_arena_pages = m.peak_arena_pages;
    out->arena_pages = m.arena_pages;
    out->history_pool_pages = m.history_pool_pages;
    out->history_pages_in_use = m.history_pages_in_use;
    return Status::OK();
  });
}

// Copies `text` into the caller's buffer (the contract of kvf_client_metrics_text).
static Status CopyOut(const std::string& text, char* buffer, size_t capacity, size_t* length,
                      const char* what) {
  *length = text.size();
  if (buffer == nullptr || capacity < text.size() + 1) {
    return Status::ResourceExhausted(std::string(what) + ": needs " +
                                     std::to_string(text.size() + 1) + " bytes, buffer has " +
                                     std::to_string(buffer == nullptr ? 0 : capacity));
  }
  std::memcpy(buffer, text.data(), text.size());
  buffer[text.size()] = '\0';
  return Status::OK();
}

kvf_status kvf_client_metrics_text(kvf_client* client, char* buffer, size_t capacity,
                                   size_t* length) {
  return Guard("kvf_client_metrics_text", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(length);
    const std::string text =
        kvfabric::metrics::RenderText(client->client->metrics_collectable()->Collect());
    return CopyOut(text, buffer, capacity, length, "kvf_client_metrics_text");
  });
}

kvf_status kvf_client_metrics_url(kvf_client* client, char* buffer, size_t capacity,
                                  size_t* length) {
  return Guard("kvf_client_metrics_url", [&]() -> Status {
    KVF_C_REQUIRE(client);
    KVF_C_REQUIRE(length);
    return CopyOut(client->client->metrics_url(), buffer, capacity, length,
                   "kvf_client_metrics_url");
  });
}

}  // extern "C"
