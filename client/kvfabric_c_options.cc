// The C API's options conversion (kvfabric_c_options.h), split from
// kvfabric_c.cc.
#include "client/kvfabric_c_options.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include "client/device_arena.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"

namespace kvfabric::client::capi {
namespace {

// The arena's refusals name the kvf_options fields, not the flags.
DeviceArenaSettingNames CSettingNames() {
  DeviceArenaSettingNames names;
  names.arena_bytes = "options->device_arena_bytes";
  names.page_bytes = "options->device_page_bytes";
  names.staging_pages = "options->device_staging_pages";
  names.context_floor_pages = "options->device_context_floor_pages";
  names.scratch_bytes = "";     // sized by the library from the model and tile_tokens
  names.hot_newest_pages = "";  // the C++ default (1): not a kvf_options field
  return names;
}

Status NotSet(const char* field, const char* what) {
  return Status::InvalidArgument(std::string("options->") + field + " is not set: " + what);
}

}  // namespace

Status ToClientOptions(const kvf_options& o, ClientOptions* out) {
  if (o.struct_size != sizeof(kvf_options)) {
    return Status::InvalidArgument(
        "options->struct_size is " + std::to_string(o.struct_size) + ", this library's " +
        "kvf_options is " + std::to_string(sizeof(kvf_options)) +
        " bytes: fill the options with kvf_options_init before setting fields");
  }
  if (o.placement_address == nullptr || o.placement_address[0] == '\0') {
    return NotSet("placement_address", "give placement's HOST:PORT (--placement-address)");
  }
  if (o.model_id == nullptr) return NotSet("model_id", "name the model's weights");
  if (o.dtype != KVF_DTYPE_FP16 && o.dtype != KVF_DTYPE_BF16 && o.dtype != KVF_DTYPE_FP32) {
    return Status::InvalidArgument("options->dtype is " + std::to_string(o.dtype) +
                                   ": use KVF_DTYPE_FP16 (1), KVF_DTYPE_BF16 (2) or "
                                   "KVF_DTYPE_FP32 (3)");
  }
  if (o.device_arena_bytes == 0) {
    return NotSet("device_arena_bytes",
                  "the device arena has no default; give the bytes of device memory the "
                  "client may hold (--device-arena-bytes)");
  }
  if (o.recompute == nullptr) {
    return NotSet("recompute", "the engine's prefill callback is required");
  }
  for (const auto& [name, v] :
       {std::pair{"prefill_c0_us", o.prefill_c0_us}, std::pair{"prefill_c1_us", o.prefill_c1_us},
        std::pair{"prefill_c2_us", o.prefill_c2_us}, std::pair{"prefill_c3_us", o.prefill_c3_us}}) {
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument(std::string("options->") + name + " is " + std::to_string(v) +
                                     ": the prefill constants must be finite and >= 0 (all 0: "
                                     "not stated)");
    }
  }
  if (!(o.prefill_split_serial_fraction >= 0 && o.prefill_split_serial_fraction <= 1)) {
    return Status::InvalidArgument("options->prefill_split_serial_fraction is " +
                                   std::to_string(o.prefill_split_serial_fraction) +
                                   ": it must be in [0, 1] (0: the default, full overlap)");
  }
  if (o.device_kind != KVF_DEVICE_CPU && o.device_kind != KVF_DEVICE_CUDA) {
    return Status::InvalidArgument("options->device_kind is " + std::to_string(o.device_kind) +
                                   ": use KVF_DEVICE_CPU (0) or KVF_DEVICE_CUDA (1)");
  }
  if (o.device_kind == KVF_DEVICE_CPU && o.device_index != 0) {
    return Status::InvalidArgument(
        "options->device_index is " + std::to_string(o.device_index) +
        " but options->device_kind is KVF_DEVICE_CPU, which has only device 0: set "
        "device_kind = KVF_DEVICE_CUDA to select a GPU");
  }
  if (o.device_index > static_cast<std::uint32_t>(INT_MAX)) {
    return Status::InvalidArgument("options->device_index is " + std::to_string(o.device_index) +
                                   ", not a CUDA ordinal");
  }

  ClientOptions options;
  options.placement_address = o.placement_address;
  if (o.namespace_name != nullptr) options.namespace_name = o.namespace_name;
  if (o.client_node != nullptr) options.client_node = o.client_node;
  options.model.model_id = o.model_id;
  options.model.first_layer = o.first_layer;
  options.model.layer_count = o.layer_count;
  options.model.dtype = static_cast<KvDtype>(o.dtype);
  options.model.kv_heads = o.kv_heads;
  options.model.head_dim = o.head_dim;
  options.model.tokens_per_block = o.tokens_per_block;
  options.model.tp_rank = o.tp_rank;
  options.model.tp_size = o.tp_size;
  options.model.key_version = o.key_version;
  if (o.weights_revision != nullptr) options.model.weights_revision = o.weights_revision;
  if (o.quantization != nullptr) options.model.quantization = o.quantization;
  if (o.kv_scale_scheme != nullptr) options.model.kv_scale_scheme = o.kv_scale_scheme;
  static_assert(sizeof(kvf_options::kv_scales_digest) == kvfabric::kFingerprintDigestSize);
  std::memcpy(options.model.kv_scales_digest.data(), o.kv_scales_digest,
              options.model.kv_scales_digest.size());
  if (o.rope != nullptr) options.model.rope = o.rope;
  options.model.v_head_dim = o.v_head_dim;
  options.model.vocab_size = o.vocab_size;
  KVF_RETURN_IF_ERROR(options.model.Validate().WithContext("options"));
  KVF_RETURN_IF_ERROR(options.model.RequireEqualKvHalves().WithContext("options"));
  if (o.ucx_tls != nullptr) options.ucx_tls = o.ucx_tls;
  if (o.data_transport != nullptr) options.data_transport = o.data_transport;
  options.arena.page_bytes = o.device_page_bytes;
  options.arena.staging_pages = o.device_staging_pages;
  options.arena.context_floor_pages = o.device_context_floor_pages;
  options.arena.setting_names = CSettingNames();
  options.num_q_heads = o.num_q_heads;
  options.tile_tokens = o.tile_tokens;
  options.staging_bytes = o.staging_bytes;
  options.history_pool_bytes = o.history_pool_bytes;
  options.max_context_tokens = o.max_context_tokens;
  if (o.prefill_c0_us != 0 || o.prefill_c1_us != 0 || o.prefill_c2_us != 0 ||
      o.prefill_c3_us != 0) {
    // Open refuses non-finite or negative constants, naming ClientOptions::prefill.
    options.prefill =
        kvfabric::RecomputeParameters{o.prefill_c0_us, o.prefill_c1_us, o.prefill_c2_us,
                                      o.prefill_split_serial_fraction, o.prefill_c3_us};
  }
  if (o.metrics_address != nullptr) options.metrics_address = o.metrics_address;
  if (o.tls_ca_file != nullptr) options.security.ca_file = o.tls_ca_file;
  if (o.tls_cert_file != nullptr) options.security.cert_file = o.tls_cert_file;
  if (o.tls_key_file != nullptr) options.security.key_file = o.tls_key_file;
  if (o.tls_token_file != nullptr) options.security.token_file = o.tls_token_file;
  if (o.tls_server_name != nullptr) options.security.server_name = o.tls_server_name;
  options.security.insecure = o.insecure != 0;
  options.security.allow_insecure_remote = o.allow_insecure_remote != 0;
  options.data_plane_tls = o.data_plane_tls != 0;
  options.fetch_depth = o.fetch_depth != 0 ? o.fetch_depth : 4;  // 0: older callers
  if (!(o.straggler_factor == 0 ||
        (std::isfinite(o.straggler_factor) && o.straggler_factor >= 1.5))) {
    return Status::InvalidArgument("options->straggler_factor is " +
                                   std::to_string(o.straggler_factor) +
                                   ": it must be 0 (off) or finite and >= 1.5 (default 4)");
  }
  options.straggler_factor = o.straggler_factor;
  options.straggler_slack = std::chrono::milliseconds(o.straggler_slack_ms);
  options.connect_at_open = o.connect_at_open != 0;
  options.daemon_checks_landing = o.daemon_checks_landing != 0;
  if (o.write_back_protocol > 1) {
    return Status::InvalidArgument("options->write_back_protocol is " +
                                   std::to_string(o.write_back_protocol) +
                                   ": use 0 (kStore) or 1 (Reserve, put, Commit)");
  }
  options.store_by_key = o.write_back_protocol == 0;
  options.history_pool_setting = "options->history_pool_bytes";
  options.ucx_tls_setting = "options->ucx_tls";
  options.rpc_timeout = std::chrono::milliseconds(o.rpc_timeout_ms);
  options.transfer_timeout = std::chrono::milliseconds(o.transfer_timeout_ms);

  // The engine's callback behind the C++ RecomputeFn. A C++ engine's callback
  // may throw; that must not unwind through the loader thread.
  options.recompute = [fn = o.recompute, user = o.recompute_user](
                          const RecomputeRequest& r, std::span<std::byte> bytes) -> Status {
    const kvf_recompute_request request = {r.context,     r.first_block, r.block_count,
                                           r.first_token, r.tokens,      r.prefix_tokens};
    auto blocks = [&r] {
      return "blocks [" + std::to_string(r.first_block) + ", " +
             std::to_string(r.first_block + r.block_count) + ") of context " +
             std::to_string(r.context);
    };
    kvf_status code = KVF_OK;
    try {
      code = fn(user, &request, reinterpret_cast<std::uint8_t*>(bytes.data()), bytes.size());
    } catch (...) {
      return Status::Internal("the recompute callback threw a C++ exception for " + blocks());
    }
    if (code == KVF_OK) return Status::OK();
    if (code < KVF_OK || code > KVF_DATA_LOSS) {
      return Status::Internal("the recompute callback returned " + std::to_string(code) +
                              ", not a kvf_status code, for " + blocks());
    }
    return Status(static_cast<StatusCode>(code), std::string("the recompute callback returned ") +
                                                     kvf_status_name(code) + " for " + blocks());
  };
  *out = std::move(options);
  return Status::OK();
}

}  // namespace kvfabric::client::capi
