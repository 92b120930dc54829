// kvfabric._kvfabric: the Python package's native module, a pybind11 binding
// of the C++ client (client/kvfabric_client.h). python/kvfabric/client.py
// wraps it in Python's idiom (kvfabric.Client as a context manager, keyword
// options, docstrings, type hints); this file keeps to the C++ calls, their
// checks and the GIL:
//
//   - every call that can block (Open, Close, Match, Load, WaitLayer, Save,
//     Finish, Attend, the KV-cache copies) releases the GIL;
//   - options.recompute calls the Python callable on a loader thread with the
//     GIL taken; what it raises fails the load with the exception's text (a
//     kvfabric.Error keeps its code);
//   - a Status becomes the kvfabric.errors class of its code;
//   - views of the history pool (block_view) are memoryviews over the pinned
//     pages themselves, no copy; they keep the client alive.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/kvfabric_client.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "gpu/device.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/float_convert.h"
#include "metrics/exposition.h"
#include "prometheus/collectable.h"
#include "python/src/options.h"
#include "python/src/paged_kv_cache.h"

#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace py = pybind11;

namespace kvfabric::python {
namespace {

using client::Client;
using client::ContextId;
using client::ContextReport;
using client::MatchResult;

template <typename T>
T ValueOrThrow(StatusOr<T> value, const char* what) {
  ThrowIfError(value.status(), what);
  return std::move(*value);
}

BlockKey ToKey(const py::handle& h) {
  if (!py::isinstance<py::bytes>(h)) {
    throw StatusError{Status::InvalidArgument("a block key must be bytes")};
  }
  const std::string s = h.cast<std::string>();
  if (s.size() != BlockKey::kSize) {
    throw StatusError{
        Status::InvalidArgument("a block key is 32 bytes, not " + std::to_string(s.size())),
    };
  }
  BlockKey::Bytes b;
  std::memcpy(b.data(), s.data(), b.size());
  return BlockKey(b);
}

std::vector<BlockKey> ToKeys(const py::iterable& keys) {
  std::vector<BlockKey> out;
  for (py::handle h : keys) out.push_back(ToKey(h));
  return out;
}

py::list FromKeys(const std::vector<BlockKey>& keys) {
  py::list out;
  for (const BlockKey& k : keys) {
    out.append(py::bytes(reinterpret_cast<const char*>(k.bytes().data()), k.bytes().size()));
  }
  return out;
}

std::vector<std::uint32_t> ToTokens(const py::iterable& tokens) {
  std::vector<std::uint32_t> out;
  for (py::handle h : tokens) {
    py::int_ v = py::reinterpret_borrow<py::object>(h);
    if (v < py::int_(0) || v > py::int_(0xffffffffu)) {
      throw StatusError{
          Status::InvalidArgument("token id " + py::str(v).cast<std::string>() +
                                  " is outside [0, 2^32)"),
      };
    }
    out.push_back(v.cast<std::uint32_t>());
  }
  return out;
}

// The Python callable behind options.recompute, called on loader threads.
class PyRecompute {
 public:
  explicit PyRecompute(py::object fn) : fn_(std::move(fn)) {}

  Status operator()(const client::RecomputeRequest& request, std::span<std::byte> out) {
    py::gil_scoped_acquire gil;
    if (fn_.is_none()) {
      return Status::FailedPrecondition(
          "this client was opened without recompute= and the plan needs blocks " +
          std::to_string(request.first_block) + ".." +
          std::to_string(request.first_block + request.block_count) +
          " prefilled: pass recompute=callable to kvfabric.Client");
    }
    py::memoryview view = py::memoryview::from_memory(out.data(), static_cast<ssize_t>(out.size()));
    Status status;
    try {
      fn_(request, view);
    } catch (py::error_already_set& e) {
      int code = static_cast<int>(StatusCode::kAborted);
      if (e.value() && py::hasattr(e.value(), "code")) {
        try {
          code = py::cast<int>(e.value().attr("code"));
        } catch (...) {
        }
      }
      if (code <= 0 || code > static_cast<int>(StatusCode::kDataLoss)) {
        code = static_cast<int>(StatusCode::kAborted);
      }
      status = Status(static_cast<StatusCode>(code),
                      std::string("the recompute callable raised ") + e.what());
    }
    // The bytes belong to the library after the call: a view the callable kept
    // now raises instead of reading freed memory.
    try {
      view.attr("release")();
    } catch (py::error_already_set&) {
      // It re-exported the buffer (e.g. numpy.frombuffer); those views stay
      // the callable's responsibility, as documented.
    }
    return status;
  }

 private:
  py::object fn_;
};

// A client and what it borrows: its device, the recompute callable. Deleted
// by Deleter, which drops the GIL while the client's threads stop.
struct PyClient {
  std::unique_ptr<gpu::Device> device;
  std::unique_ptr<PyRecompute> recompute;
  std::unique_ptr<Client> client;

  Client& c() {
    if (!client) {
      throw StatusError{Status::FailedPrecondition("the client is closed")};
    }
    return *client;
  }

  struct Deleter {
    void operator()(PyClient* p) const {
      {
        py::gil_scoped_release release;
        p->client.reset();  // Close(): waits for loads whose recompute may need the GIL
        p->device.reset();
      }
      delete p;  // the callable, with the GIL held
    }
  };
};

using PyClientPtr = std::unique_ptr<PyClient, PyClient::Deleter>;

// One block's payload in the client's history pool, exported through the
// buffer protocol (memoryview(buffer), numpy.frombuffer, torch.frombuffer):
// the pinned pages themselves, no copy. It holds the client object, so the
// pool outlives every view; the page belongs to the context until its finish.
struct BlockBuffer {
  py::object owner;
  std::byte* data = nullptr;
  std::size_t size = 0;
};

PyClientPtr Open(py::dict options, py::object recompute) {
  DeviceChoice device;
  client::ClientOptions o = ParseClientOptions(options, &device);
  PyClientPtr p(new PyClient);
  // Without the engine's prefill a cut stream's blocks could not fall back.
  if (recompute.is_none()) o.straggler_factor = 0;
  p->recompute = std::make_unique<PyRecompute>(std::move(recompute));
  PyRecompute* fn = p->recompute.get();
  o.recompute = [fn](const client::RecomputeRequest& r, std::span<std::byte> out) {
    return (*fn)(r, out);
  };
  if (device.options.arena_bytes == 0) {
    throw StatusError{
        Status::InvalidArgument(
            "device_arena_bytes is required: the bytes of the device working set "
            "(client/device_arena.h), allocated once at open"),
    };
  }
  {
    py::gil_scoped_release release;
    if (device.kind == "cpu") {
      if (device.options.device_index != 0) {
        throw StatusError{
            Status::InvalidArgument("device_index must be 0 for device 'cpu'"),
        };
      }
      p->device = ValueOrThrow(gpu::CreateCpuDevice(device.options), "creating the CPU device");
    } else if (device.kind == "cuda") {
#ifdef KVF_HAVE_CUDA
      p->device = ValueOrThrow(gpu::CreateCudaDevice(device.options), "creating the CUDA device");
#else
      throw StatusError{
          Status::Unimplemented("device 'cuda': this kvfabric was built without "
                                "CUDA; use device='cpu'"),
      };
#endif
    } else {
      throw StatusError{
          Status::InvalidArgument("device is '" + device.kind + "'; accepted: 'cpu', 'cuda'"),
      };
    }
    o.device = p->device.get();
    p->client = ValueOrThrow(Client::Open(std::move(o)), "Client.open");
  }
  return p;
}

py::dict MetricsDict(const client::ClientMetrics& m) {
  py::dict d;
#define KVF_FIELD(name) d[#name] = m.name
  KVF_FIELD(matches);
  KVF_FIELD(plans_recompute_all);
  KVF_FIELD(plans_fetch_all);
  KVF_FIELD(plans_split);
  KVF_FIELD(plans_mixed);
  KVF_FIELD(placement_unavailable);
  KVF_FIELD(placement_calls_skipped);
  KVF_FIELD(blocks_fetched);
  KVF_FIELD(bytes_fetched);
  KVF_FIELD(compact_blocks_fetched);
  KVF_FIELD(compact_bytes_fetched);
  KVF_FIELD(plans_with_compact);
  KVF_FIELD(fetch_us);
  KVF_FIELD(blocks_recomputed);
  KVF_FIELD(tokens_recomputed);
  KVF_FIELD(recompute_us);
  KVF_FIELD(fallbacks_to_replica);
  KVF_FIELD(fallbacks_to_recompute);
  KVF_FIELD(blocks_fallen_back);
  KVF_FIELD(crc_failures);
  KVF_FIELD(stale_entries_reported);
  KVF_FIELD(blocks_saved);
  KVF_FIELD(bytes_saved);
  KVF_FIELD(blocks_already_cached);
  KVF_FIELD(save_us);
  KVF_FIELD(save_failures);
  KVF_FIELD(history_pool_pages);
  KVF_FIELD(history_pages_in_use);
  KVF_FIELD(history_pages_quarantined);
  KVF_FIELD(fetch_requests_throttled);
  KVF_FIELD(streams_cut_past_cut_off);
  KVF_FIELD(streams_cut_projected);
  KVF_FIELD(store_blocks_throttled);
  KVF_FIELD(peak_history_pages_in_use);
  KVF_FIELD(attends);
  KVF_FIELD(attend_us);
  KVF_FIELD(peak_arena_pages);
  KVF_FIELD(arena_pages);
#undef KVF_FIELD
  return d;
}

// A float32 buffer of exactly `n` elements (C-contiguous), for Attend.
std::span<float> FloatBuffer(const py::buffer& b, std::size_t n, bool writable, const char* name) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != sizeof(float) || info.format != py::format_descriptor<float>::format()) {
    throw StatusError{
        Status::InvalidArgument(std::string(name) + " must hold float32"),
    };
  }
  if (static_cast<std::size_t>(info.size) != n) {
    throw StatusError{
        Status::InvalidArgument(std::string(name) + " has " + std::to_string(info.size) +
                                " elements, expected " + std::to_string(n)),
    };
  }
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expect) {
      throw StatusError{
          Status::InvalidArgument(std::string(name) + " must be C-contiguous"),
      };
    }
    expect *= info.shape[i];
  }
  return {static_cast<float*>(info.ptr), n};
}

PagedKvCache MakeKvCache(PyClient& p, const py::list& layers) {
  std::vector<PagedLayer> out;
  for (py::handle h : layers) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(h);
    if (t.size() != 7) {
      throw StatusError{
          Status::InvalidArgument("a KV cache layer is (data_ptr, num_blocks, "
                                  "kv_stride, block_stride, token_stride, "
                                  "head_stride, extent_bytes), in bytes"),
      };
    }
    PagedLayer l;
    l.base = reinterpret_cast<std::byte*>(t[0].cast<std::uintptr_t>());
    l.num_blocks = t[1].cast<std::uint64_t>();
    l.kv_stride = t[2].cast<std::int64_t>();
    l.block_stride = t[3].cast<std::int64_t>();
    l.token_stride = t[4].cast<std::int64_t>();
    l.head_stride = t[5].cast<std::int64_t>();
    l.extent_bytes = t[6].cast<std::uint64_t>();
    out.push_back(l);
  }
  return ValueOrThrow(PagedKvCache::Create(p.c().options().model, std::move(out)),
                      "register_kv_cache");
}

// Block `block` of `context` decoded from its compact copy into the model's
// KV dtype, in `*decoded` (through `*values`, fp32).
std::span<std::byte> DecodeToModelDtype(Client& c, ContextId context, std::uint32_t block,
                                        std::vector<float>* values,
                                        std::vector<std::byte>* decoded) {
  const ModelFingerprint& m = c.options().model;
  const std::uint64_t bytes = ValueOrThrow(m.BlockBytes(), "block");
  const std::uint64_t elems =
      std::uint64_t{m.layer_count} * 2 * m.tokens_per_block * m.kv_heads * m.head_dim;
  values->resize(elems);
  decoded->resize(bytes);
  ThrowIfError(c.DecodeBlock(context, block, *values), "decode compact block");
  if (m.dtype == KvDtype::kFp32) {
    std::memcpy(decoded->data(), values->data(), bytes);
  } else {
    auto* out = reinterpret_cast<std::uint16_t*>(decoded->data());
    for (std::uint64_t i = 0; i < elems; ++i) {
      out[i] = m.dtype == KvDtype::kFp16 ? gpu::FloatToFp16Bits((*values)[i])
                                         : gpu::FloatToBf16Bits((*values)[i]);
    }
  }
  return *decoded;
}

// History blocks [first_block, first_block + n) of `context` into engine
// pages `pages[i]` of `layer` (a load), or the reverse (a save), all of
// layer `layer`; `tokens` of the last block when it is a partial tail.
void CopyLayer(PyClient& p, ContextId context, const PagedKvCache& cache, std::uint32_t layer,
               std::uint32_t first_block, const std::vector<std::uint64_t>& pages, bool to_cache,
               std::uint32_t last_tokens) {
  Client& c = p.c();
  py::gil_scoped_release release;
  const std::uint32_t tpb = c.options().model.tokens_per_block;
  // A block that landed as its compact copy (a compact_after request) is
  // decoded to the model's dtype first; it is never saved (Client::Save refuses it).
  thread_local std::vector<float> values;
  thread_local std::vector<std::byte> decoded;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const auto block = static_cast<std::uint32_t>(first_block + i);
    std::span<std::byte> payload;
    if (to_cache && ValueOrThrow(c.BlockIsCompact(context, block), "block")) {
      payload = DecodeToModelDtype(c, context, block, &values, &decoded);
    } else {
      payload = ValueOrThrow(c.BlockPayload(context, block), "block");
    }
    if (to_cache) {
      const std::uint32_t tokens = (i + 1 == pages.size() && last_tokens != 0) ? last_tokens : tpb;
      ThrowIfError(cache.BlockToPage(payload, layer, pages[i], tokens), "load_into_kv_cache");
    } else {
      ThrowIfError(cache.PageToBlock(layer, pages[i], payload), "save_from_kv_cache");
    }
  }
}

void RaiseStatusError(const StatusError& e) {
  py::module_ errors = py::module_::import("kvfabric.errors");
  py::object cls = errors.attr("error_class")(static_cast<int>(e.status.code()));
  py::object exc = cls(static_cast<int>(e.status.code()), std::string(e.status.message()));
  if (e.report) exc.attr("report") = py::cast(*e.report);
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

}  // namespace
}  // namespace kvfabric::python

PYBIND11_MODULE(_kvfabric, m) {
  using namespace kvfabric;
  using namespace kvfabric::python;
  m.doc() = "kvfabric's native module (use the kvfabric package, not this)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatusError(e);
    }
  });

  m.def("block_bytes", [](py::object model) {
    return ValueOrThrow(ParseFingerprint(AsDict(model, "model")).BlockBytes(), "model");
  });
  m.def("fingerprint_digest", [](py::object model) {
    FingerprintDigest d = ValueOrThrow(ParseFingerprint(AsDict(model, "model")).Digest(), "model");
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  });
  m.def(
      "compute_block_keys",
      [](py::object model, std::string ns, py::iterable tokens, py::object extra_per_block) {
        const ModelFingerprint fp = ParseFingerprint(AsDict(model, "model"));
        const std::vector<std::uint32_t> t = ToTokens(tokens);
        std::vector<ExtraKeys> extra;
        if (!extra_per_block.is_none()) {
          for (py::handle block : extra_per_block.cast<py::iterable>()) {
            ExtraKeys keys;
            for (py::handle k : block.cast<py::iterable>()) {
              if (py::isinstance<py::str>(k)) {
                keys.push_back(k.cast<std::string>());
              } else {
                keys.push_back(
                    py::bytes(py::reinterpret_borrow<py::object>(k)).cast<std::string>());
              }
            }
            extra.push_back(std::move(keys));
          }
        }
        return FromKeys(
            ValueOrThrow(ComputeBlockKeys(Namespace{std::move(ns)}, fp, t, extra), "block keys"));
      },
      py::arg("model"), py::arg("namespace_name"), py::arg("tokens"),
      py::arg("extra_per_block") = py::none());

  m.def(
      "extra_keys_per_block",
      [](std::uint64_t token_count, std::uint32_t tokens_per_block, std::string lora_id,
         std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>> multimodal,
         std::string cache_salt) {
        RequestExtras extras;
        extras.lora_id = std::move(lora_id);
        extras.cache_salt = std::move(cache_salt);
        for (auto& [hex, offset, length] : multimodal) {
          extras.multimodal.push_back({std::move(hex), offset, length});
        }
        std::vector<ExtraKeys> per_block = ValueOrThrow(
            ExtraKeysPerBlock(extras, token_count, tokens_per_block), "extra_keys_per_block");
        py::list out;
        for (const ExtraKeys& keys : per_block) {
          py::list block;
          for (const std::string& k : keys) block.append(py::bytes(k));
          out.append(block);
        }
        return out;
      },
      py::arg("token_count"), py::arg("tokens_per_block"), py::arg("lora_id") = "",
      py::arg("multimodal") = std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>>{},
      py::arg("cache_salt") = "");
  m.def("kv_scales_digest",
        [](std::vector<float> k, std::vector<float> v, std::uint32_t layer_count) {
          FingerprintDigest d = ValueOrThrow(KvScalesDigest(k, v, layer_count), "kv_scales_digest");
          return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
        });

  m.def(
      "compact_int8_roundtrip",
      [](const std::string& dtype, std::uint32_t layers, std::uint32_t tokens,
         std::uint32_t kv_heads, std::uint32_t head_dim, const py::bytes& exact) {
        gpu::CompactShape shape;
        shape.dtype = ValueOrThrow(ParseKvDtype(dtype), "dtype");
        shape.layers = layers;
        shape.tokens = tokens;
        shape.kv_heads = kv_heads;
        shape.head_dim = head_dim;
        const std::string in = exact;
        std::vector<std::byte> compact(
            gpu::CompactPayloadBytes(layers, tokens, kv_heads, head_dim));
        std::vector<float> decoded(std::size_t{layers} * 2 * tokens * kv_heads * head_dim);
        {
          py::gil_scoped_release release;
          ThrowIfError(gpu::EncodeCompactInt8(shape, std::as_bytes(std::span(in.data(), in.size())),
                                              compact),
                       "compact_int8 encode");
          ThrowIfError(gpu::DecodeCompactInt8(shape, compact, decoded), "compact_int8 decode");
        }
        return py::make_tuple(
            py::bytes(reinterpret_cast<const char*>(decoded.data()), decoded.size() * 4),
            compact.size());
      },
      py::arg("dtype"), py::arg("layers"), py::arg("tokens"), py::arg("kv_heads"),
      py::arg("head_dim"), py::arg("exact"));

  py::class_<client::RecomputeRequest>(m, "RecomputeRequest")
      .def_readonly("context", &client::RecomputeRequest::context)
      .def_readonly("first_block", &client::RecomputeRequest::first_block)
      .def_readonly("block_count", &client::RecomputeRequest::block_count)
      .def_readonly("first_token", &client::RecomputeRequest::first_token)
      .def_readonly("tokens", &client::RecomputeRequest::tokens)
      .def_readonly("prefix_tokens", &client::RecomputeRequest::prefix_tokens)
      .def("__repr__", [](const client::RecomputeRequest& r) {
        return "RecomputeRequest(context=" + std::to_string(r.context) +
               ", first_block=" + std::to_string(r.first_block) +
               ", block_count=" + std::to_string(r.block_count) +
               ", tokens=" + std::to_string(r.tokens) + ")";
      });

  py::class_<MatchResult::Run>(m, "PlanRun")
      .def_readonly("first_block", &MatchResult::Run::first_block)
      .def_readonly("block_count", &MatchResult::Run::block_count)
      .def_readonly("fetch", &MatchResult::Run::fetch)
      .def_readonly("host", &MatchResult::Run::host)
      .def_readonly("tier", &MatchResult::Run::tier)
      .def_readonly("predicted_start_us", &MatchResult::Run::predicted_start_us)
      .def_readonly("predicted_end_us", &MatchResult::Run::predicted_end_us)
      .def_readonly("compact", &MatchResult::Run::compact);

  py::class_<MatchResult, std::shared_ptr<MatchResult>>(m, "Match")
      .def_property_readonly("chain_blocks", [](const MatchResult& r) { return r.chain.size(); })
      .def_property_readonly("chain", [](const MatchResult& r) { return FromKeys(r.chain); })
      .def_readonly("suffix_tokens", &MatchResult::suffix_tokens)
      .def_readonly("cached_prefix_blocks", &MatchResult::cached_prefix_blocks)
      .def_readonly("plan_id", &MatchResult::plan_id)
      .def_readonly("kind", &MatchResult::kind)
      .def_readonly("predicted_us", &MatchResult::predicted_us)
      .def_readonly("explanation", &MatchResult::explanation)
      .def_readonly("runs", &MatchResult::runs)
      .def_readonly("representation", &MatchResult::representation)
      .def_readonly("compact_penalty_us", &MatchResult::compact_penalty_us)
      .def_property_readonly("hosts", [](const MatchResult& r) {
        py::list out;
        for (const MatchResult::Host& h : r.hosts) out.append(h.host_id);
        return out;
      });

  py::class_<client::RunOutcome>(m, "RunOutcome")
      .def_readonly("first_block", &client::RunOutcome::first_block)
      .def_readonly("block_count", &client::RunOutcome::block_count)
      .def_readonly("fetch", &client::RunOutcome::fetch)
      .def_readonly("host_id", &client::RunOutcome::host_id)
      .def_readonly("tier", &client::RunOutcome::tier)
      .def_readonly("predicted_end_us", &client::RunOutcome::predicted_end_us)
      .def_readonly("measured_end_us", &client::RunOutcome::measured_end_us)
      .def_readonly("blocks_from_fallback_host", &client::RunOutcome::blocks_from_fallback_host)
      .def_readonly("blocks_recomputed_after_failure",
                    &client::RunOutcome::blocks_recomputed_after_failure)
      .def_readonly("failure", &client::RunOutcome::failure);

  py::class_<ContextReport>(m, "ContextReport")
      .def_readonly("plan_id", &ContextReport::plan_id)
      .def_readonly("kind", &ContextReport::kind)
      .def_readonly("predicted_us", &ContextReport::predicted_us)
      .def_readonly("load_us", &ContextReport::load_us)
      .def_readonly("layer0_ready_us", &ContextReport::layer0_ready_us)
      .def_readonly("all_layers_ready_us", &ContextReport::all_layers_ready_us)
      .def_readonly("runs", &ContextReport::runs)
      .def_readonly("blocks_fetched", &ContextReport::blocks_fetched)
      .def_readonly("blocks_recomputed", &ContextReport::blocks_recomputed)
      .def_readonly("bytes_fetched", &ContextReport::bytes_fetched)
      .def_readonly("blocks_written", &ContextReport::blocks_written)
      .def_readonly("blocks_already_cached", &ContextReport::blocks_already_cached)
      .def_readonly("save_failures", &ContextReport::save_failures);

  py::class_<BlockBuffer>(m, "BlockBuffer", py::buffer_protocol())
      .def_buffer([](BlockBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<ssize_t>(b.size)}, {ssize_t{1}}, false);
      })
      .def_property_readonly(
          "address", [](const BlockBuffer& b) { return reinterpret_cast<std::uintptr_t>(b.data); })
      .def("__len__", [](const BlockBuffer& b) { return b.size; });

  py::class_<PagedKvCache>(m, "PagedKvCache")
      .def_property_readonly("layers", &PagedKvCache::layers);

  py::class_<PyClient, PyClientPtr>(m, "NativeClient")
      .def(py::init(&Open), py::arg("options"), py::arg("recompute"))
      .def("close",
           [](PyClient& p) {
             if (!p.client) return;
             Status s;
             {
               py::gil_scoped_release release;
               s = p.client->Close();
             }
             ThrowIfError(s, "close");
           })
      .def_property_readonly("closed", [](const PyClient& p) { return !p.client; })
      .def("key_tokens",
           [](PyClient& p, py::iterable tokens) {
             return FromKeys(ValueOrThrow(p.c().KeyTokens(ToTokens(tokens)), "key_tokens"));
           })
      .def("match",
           [](PyClient& p, py::iterable keys, std::uint64_t suffix_tokens, bool explain,
              const std::string& accuracy, std::uint64_t decode_steps, bool prefix_only) {
             const std::vector<BlockKey> chain = ToKeys(keys);
             client::MatchOptions options;
             options.explain = explain;
             options.prefix_plans_only = prefix_only;
             options.accuracy = ValueOrThrow(client::AccuracyPolicy::Parse(accuracy), "match");
             options.accuracy.decode_steps = decode_steps;
             auto out = std::make_shared<MatchResult>();
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().Match(chain, suffix_tokens, options, out.get());
             }
             ThrowIfError(s, "match");
             return out;
           })
      .def("block_is_compact",
           [](PyClient& p, ContextId context, std::uint32_t block) {
             return ValueOrThrow(p.c().BlockIsCompact(context, block), "block_is_compact");
           })
      .def("decode_block",
           [](PyClient& p, ContextId context, std::uint32_t block) {
             const ModelFingerprint& m = p.c().options().model;
             const std::uint64_t elems =
                 std::uint64_t{m.layer_count} * 2 * m.tokens_per_block * m.kv_heads * m.head_dim;
             std::vector<float> values(elems);
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().DecodeBlock(context, block, values);
             }
             ThrowIfError(s, "decode_block");
             return py::bytes(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float));
           })
      .def("new_context",
           [](PyClient& p, std::uint64_t tokens) {
             return ValueOrThrow(p.c().NewContext(tokens), "new_context");
           })
      .def("load",
           [](PyClient& p, std::shared_ptr<MatchResult> match, ContextId context) {
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().Load(*match, context);
             }
             ThrowIfError(s, "load");
           })
      .def("wait_layer",
           [](PyClient& p, ContextId context, std::uint32_t layer, double timeout_s) {
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().WaitLayer(
                   context, layer,
                   std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
             }
             ThrowIfError(s, "wait_layer");
           })
      .def("block_view",
           [](py::object self, ContextId context, std::uint32_t block) {
             PyClient& p = self.cast<PyClient&>();
             std::span<std::byte> bytes =
                 ValueOrThrow(p.c().BlockPayload(context, block), "block_view");
             return BlockBuffer{self, bytes.data(), bytes.size()};
           })
      .def("save",
           [](PyClient& p, ContextId context, std::uint32_t layer, std::uint32_t first_block,
              py::iterable keys) {
             const std::vector<BlockKey> k = ToKeys(keys);
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().Save(context, layer, first_block, k);
             }
             ThrowIfError(s, "save");
           })
      .def("attend",
           [](PyClient& p, ContextId context, std::uint32_t layer, std::uint64_t step, py::buffer q,
              py::buffer out, py::buffer lse) {
             const client::ClientOptions& o = p.c().options();
             const std::size_t n = std::size_t{o.num_q_heads} * o.model.head_dim;
             std::span<float> qs = FloatBuffer(q, n, false, "q");
             std::span<float> os = FloatBuffer(out, n, true, "out");
             std::span<float> ls = FloatBuffer(lse, o.num_q_heads, true, "lse");
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().Attend(context, layer, step, qs, os, ls);
             }
             ThrowIfError(s, "attend");
           })
      .def("finish",
           [](PyClient& p, ContextId context) {
             ContextReport report;
             Status s;
             {
               py::gil_scoped_release release;
               s = p.c().Finish(context, &report);
             }
             if (!s.ok()) {
               throw StatusError{Status(s.code(), "finish: " + std::string(s.message())),
                                 std::make_shared<ContextReport>(std::move(report))};
             }
             return report;
           })
      .def("metrics", [](PyClient& p) { return MetricsDict(p.c().metrics()); })
      .def("metrics_text",
           [](PyClient& p) { return metrics::RenderText(p.c().metrics_collectable()->Collect()); })
      .def_property_readonly("metrics_url", [](PyClient& p) { return p.c().metrics_url(); })
      .def("describe_history_pool", [](PyClient& p) { return p.c().DescribeHistoryPool(); })
      .def("describe_arena", [](PyClient& p) { return p.c().DescribeArena(); })
      .def("register_kv_cache", &MakeKvCache)
      .def("load_into_kv_cache",
           [](PyClient& p, ContextId context, const PagedKvCache& cache, std::uint32_t layer,
              std::uint32_t first_block, std::vector<std::uint64_t> pages,
              std::uint32_t last_tokens) {
             CopyLayer(p, context, cache, layer, first_block, pages, true, last_tokens);
           })
      .def("save_from_kv_cache",
           [](PyClient& p, ContextId context, const PagedKvCache& cache, std::uint32_t layer,
              std::uint32_t first_block, std::vector<std::uint64_t> pages) {
             CopyLayer(p, context, cache, layer, first_block, pages, false, 0);
           });
}
