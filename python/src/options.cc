#include "python/src/options.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

namespace py = pybind11;

namespace kvfabric::python {

void ThrowIfError(const Status& status, const char* what) {
  if (status.ok()) return;
  throw StatusError{
      Status(status.code(), std::string(what) + ": " + std::string(status.message()))};
}

namespace {

[[noreturn]] void Refuse(const std::string& message) {
  throw StatusError{Status::InvalidArgument(message)};
}

// Takes keys out of a dict of keyword arguments by name and type; Finish
// refuses the keys nobody took, listing the accepted ones.
class Reader {
 public:
  Reader(const py::dict& dict, std::string where) : dict_(dict), where_(std::move(where)) {}

  bool Has(const char* key) {
    accepted_.insert(key);
    return dict_.contains(key) && !dict_[key].is_none();
  }
  py::object Get(const char* key) { return dict_[key]; }

  std::string String(const char* key, std::string value) {
    if (!Has(key)) return value;
    py::object v = Get(key);
    if (!py::isinstance<py::str>(v)) Refuse(Name(key) + " must be a str");
    return v.cast<std::string>();
  }
  bool Bool(const char* key, bool value) {
    if (!Has(key)) return value;
    py::object v = Get(key);
    if (!py::isinstance<py::bool_>(v)) Refuse(Name(key) + " must be a bool");
    return v.cast<bool>();
  }
  template <typename T>
  T Unsigned(const char* key, T value) {
    if (!Has(key)) return value;
    py::object v = Get(key);
    if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v)) {
      Refuse(Name(key) + " must be an int");
    }
    // Python ints are unbounded: check the range before narrowing.
    if (v < py::int_(0) || v > py::int_(std::numeric_limits<T>::max())) {
      Refuse(Name(key) + " is " + py::str(v).cast<std::string>() + ", outside [0, " +
             std::to_string(std::numeric_limits<T>::max()) + "]");
    }
    return v.cast<T>();
  }
  double Double(const char* key, double value) {
    if (!Has(key)) return value;
    py::object v = Get(key);
    if (py::isinstance<py::bool_>(v) ||
        !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v))) {
      Refuse(Name(key) + " must be a number");
    }
    const double d = v.cast<double>();
    if (!std::isfinite(d) || d < 0) Refuse(Name(key) + " must be finite and >= 0");
    return d;
  }
  // Seconds (int, float or datetime.timedelta) as milliseconds, > 0.
  std::chrono::milliseconds Seconds(const char* key, std::chrono::milliseconds value) {
    if (!Has(key)) return value;
    py::object v = Get(key);
    double seconds = 0;
    if (py::hasattr(v, "total_seconds")) {
      seconds = v.attr("total_seconds")().cast<double>();
    } else if (!py::isinstance<py::bool_>(v) &&
               (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v))) {
      seconds = v.cast<double>();
    } else {
      Refuse(Name(key) + " must be seconds (a number or datetime.timedelta)");
    }
    if (!std::isfinite(seconds) || seconds <= 0 || seconds > 86400.0 * 365) {
      Refuse(Name(key) + " must be > 0 seconds and at most a year");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000)));
  }
  py::dict Dict(const char* key) { return Has(key) ? AsDict(Get(key), Name(key)) : py::dict(); }

  void Finish() {
    std::string unknown;
    for (auto item : dict_) {
      const std::string key = py::str(item.first).cast<std::string>();
      if (accepted_.count(key) == 0) unknown += (unknown.empty() ? "" : ", ") + key;
    }
    if (unknown.empty()) return;
    std::string known;
    for (const std::string& k : accepted_) known += (known.empty() ? "" : ", ") + k;
    Refuse("unknown " + where_ + " option(s) " + unknown + "; accepted: " + known);
  }

 private:
  std::string Name(const char* key) const { return where_ + " option " + key; }

  py::dict dict_;
  std::string where_;
  std::set<std::string> accepted_;
};

}  // namespace

py::dict AsDict(const py::handle& value, const std::string& what) {
  if (py::isinstance<py::dict>(value)) return py::reinterpret_borrow<py::dict>(value);
  if (py::hasattr(value, "as_dict")) return value.attr("as_dict")().cast<py::dict>();
  Refuse(what + " must be a dict (or have as_dict())");
}

ModelFingerprint ParseFingerprint(const py::dict& model) {
  Reader r(model, "model");
  ModelFingerprint fp;
  fp.model_id = r.String("model_id", "");
  fp.first_layer = r.Unsigned<std::uint32_t>("first_layer", fp.first_layer);
  fp.layer_count = r.Unsigned<std::uint32_t>("layer_count", fp.layer_count);
  if (r.Has("dtype")) {
    StatusOr<KvDtype> dtype = ParseKvDtype(r.String("dtype", ""));
    ThrowIfError(dtype.status(), "model option dtype");
    fp.dtype = *dtype;
  }
  fp.kv_heads = r.Unsigned<std::uint32_t>("kv_heads", fp.kv_heads);
  fp.head_dim = r.Unsigned<std::uint32_t>("head_dim", fp.head_dim);
  fp.tokens_per_block = r.Unsigned<std::uint32_t>("tokens_per_block", fp.tokens_per_block);
  fp.tp_rank = r.Unsigned<std::uint32_t>("tp_rank", fp.tp_rank);
  fp.tp_size = r.Unsigned<std::uint32_t>("tp_size", fp.tp_size);
  fp.layout_version = r.Unsigned<std::uint32_t>("layout_version", fp.layout_version);
  fp.key_version = r.Unsigned<std::uint32_t>("key_version", fp.key_version);
  fp.weights_revision = r.String("weights_revision", "");
  fp.quantization = r.String("quantization", "");
  fp.kv_scale_scheme = r.String("kv_scale_scheme", "");
  if (r.Has("kv_scales_digest")) {
    py::object v = r.Get("kv_scales_digest");
    std::string bytes;
    if (py::isinstance<py::bytes>(v)) {
      bytes = v.cast<std::string>();
    } else if (py::isinstance<py::str>(v)) {
      try {
        bytes =
            py::module_::import("builtins").attr("bytes").attr("fromhex")(v).cast<std::string>();
      } catch (py::error_already_set&) {
        bytes.clear();  // not hex: refused below
      }
    }
    if (bytes.size() != fp.kv_scales_digest.size()) {
      Refuse(
          "model option kv_scales_digest must be 32 bytes (or 64 hex characters), e.g. "
          "kvfabric.kv_scales_digest(k_scales, v_scales, layer_count)");
    }
    std::memcpy(fp.kv_scales_digest.data(), bytes.data(), bytes.size());
  }
  fp.rope = r.String("rope", "");
  fp.v_head_dim = r.Unsigned<std::uint32_t>("v_head_dim", fp.v_head_dim);
  fp.vocab_size = r.Unsigned<std::uint32_t>("vocab_size", fp.vocab_size);
  r.Finish();
  ThrowIfError(fp.Validate(), "model");
  return fp;
}

client::ClientOptions ParseClientOptions(const py::dict& options, DeviceChoice* device) {
  Reader r(options, "Client");
  client::ClientOptions o;
  o.placement_address = r.String("placement_address", "");
  {
    Reader s(r.Dict("security"), "security");
    o.security.cert_file = s.String("cert_file", "");
    o.security.key_file = s.String("key_file", "");
    o.security.ca_file = s.String("ca_file", "");
    o.security.token_file = s.String("token_file", "");
    o.security.server_name = s.String("server_name", "");
    o.security.insecure = s.Bool("insecure", false);
    o.security.allow_insecure_remote = s.Bool("allow_insecure_remote", false);
    s.Finish();
  }
  o.data_plane_tls = r.Bool("data_plane_tls", o.data_plane_tls);
  o.namespace_name = r.String("namespace_name", "");
  if (!r.Has("model")) Refuse("Client option model is required (a kvfabric.ModelFingerprint)");
  o.model = ParseFingerprint(r.Dict("model"));
  o.client_node = r.String("client_node", "");
  o.data_transport = r.String("data_transport", o.data_transport);
  o.ucx_tls = r.String("ucx_tls", o.ucx_tls);
  device->kind = r.String("device", "cpu");
  device->options.device_index = static_cast<int>(r.Unsigned<std::uint32_t>("device_index", 0));
  device->options.arena_bytes = r.Unsigned<std::uint64_t>("device_arena_bytes", 0);
  {
    Reader a(r.Dict("arena"), "arena");
    o.arena.page_bytes = a.Unsigned<std::uint64_t>("page_bytes", 0);
    o.arena.staging_pages = a.Unsigned<std::uint32_t>("staging_pages", 0);
    o.arena.context_floor_pages = a.Unsigned<std::uint32_t>("context_floor_pages", 0);
    o.arena.hot_newest_pages = a.Unsigned<std::uint32_t>("hot_newest_pages", 1);
    a.Finish();
  }
  o.arena.setting_names.arena_bytes = "device_arena_bytes";
  o.arena.setting_names.page_bytes = "arena['page_bytes']";
  o.arena.setting_names.staging_pages = "arena['staging_pages']";
  o.arena.setting_names.context_floor_pages = "arena['context_floor_pages']";
  o.arena.setting_names.hot_newest_pages = "arena['hot_newest_pages']";
  o.arena.setting_names.scratch_bytes = "";
  o.num_q_heads = r.Unsigned<std::uint32_t>("num_q_heads", 0);
  o.tile_tokens = r.Unsigned<std::uint32_t>("tile_tokens", o.tile_tokens);
  o.staging_bytes = r.Unsigned<std::uint64_t>("staging_bytes", o.staging_bytes);
  o.fetch_depth = r.Unsigned<std::uint32_t>("fetch_depth", o.fetch_depth);
  o.store_by_key = r.Bool("store_by_key", o.store_by_key);
  o.save_threads = r.Unsigned<std::uint32_t>("save_threads", o.save_threads);
  o.history_pool_bytes = r.Unsigned<std::uint64_t>("history_pool_bytes", 0);
  o.max_context_tokens = r.Unsigned<std::uint64_t>("max_context_tokens", 0);
  o.history_pool_setting = "history_pool_bytes";
  o.ucx_tls_setting = "ucx_tls";
  if (r.Has("prefill")) {
    Reader p(r.Dict("prefill"), "prefill");
    RecomputeParameters prefill;
    prefill.c0_us = p.Double("c0_us", 0);
    prefill.c1_us_per_token = p.Double("c1_us_per_token", 0);
    prefill.c2_us_per_token2 = p.Double("c2_us_per_token2", 0);
    prefill.c3_us_per_prefix_token = p.Double("c3_us_per_prefix_token", 0);
    prefill.split_serial_fraction = p.Double("split_serial_fraction", 0);
    p.Finish();
    o.prefill = prefill;
  }
  o.rpc_timeout = r.Seconds("rpc_timeout", o.rpc_timeout);
  o.transfer_timeout = r.Seconds("transfer_timeout", o.transfer_timeout);
  o.lease_ttl_ms = r.Unsigned<std::uint32_t>("lease_ttl_ms", o.lease_ttl_ms);
  // Open refuses a straggler_factor that is neither 0 nor >= 1.5; a client
  // without recompute= keeps 0 whatever is given (module.cc).
  o.straggler_factor = r.Double("straggler_factor", o.straggler_factor);
  o.straggler_slack = r.Seconds("straggler_slack", o.straggler_slack);
  o.connect_at_open = r.Bool("connect_at_open", o.connect_at_open);
  o.daemon_checks_landing = r.Bool("daemon_checks_landing", o.daemon_checks_landing);
  o.metrics_address = r.String("metrics_address", "");
  if (r.Has("compact_extra_decode_us_per_token")) {
    o.compact_extra_decode_us_per_token = r.Double("compact_extra_decode_us_per_token", 0);
  }
  // Taken by the module itself (a Python callable), not a ClientOptions value here.
  r.Has("recompute");
  r.Finish();
  return o;
}

}  // namespace kvfabric::python
