// The C API's own contract, without a cluster: defaults, argument checks that
// name what was wrong, per-thread last errors, the open that cannot reach
// placement, device selection, the arena's refusals in kvf_options' terms,
// and the log level and sink. The calls' behaviour with a cluster is Client's
// (its tests and tests/ cover it).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client_log.h"
#include "core/status.h"
#include "kvfabric/kvfabric.h"

#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_probe.h"
#endif

// client/kvfabric_c_header_check.c, compiled as C99.
extern "C" int kvf_c_header_check(void);

namespace {

using kvfabric::StatusCode;

kvf_status NoRecompute(void*, const kvf_recompute_request*, uint8_t*, uint64_t) {
  return KVF_UNIMPLEMENTED;
}

// Options that pass every check of the C layer and of the model: a tiny
// model, a 16 MiB arena, and a placement address nothing listens on.
kvf_options ValidOptions() {
  kvf_options o;
  kvf_options_init(&o);
  o.placement_address = "127.0.0.1:1";
  o.insecure = 1;
  o.model_id = "kvfabric/c-api-test";
  o.layer_count = 2;
  o.dtype = KVF_DTYPE_FP16;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.num_q_heads = 4;
  o.tile_tokens = 64;
  o.device_arena_bytes = std::uint64_t{16} << 20;
  o.staging_bytes = std::uint64_t{4} << 20;
  o.history_pool_bytes = std::uint64_t{4} << 20;
  o.rpc_timeout_ms = 300;
  o.recompute = NoRecompute;
  return o;
}

std::string LastError() { return kvf_last_error(); }

// A non-NULL handle value that is never dereferenced: a call that must set
// its out-parameter to NULL on failure starts from it.
kvf_client* NotNull() {
  static char storage;
  return reinterpret_cast<kvf_client*>(&storage);
}

// Opens with `o`, expects it refused with `code`, the handle NULL and a last
// error that mentions `needle`.
void ExpectOpenRefused(const kvf_options& o, kvf_status code, const std::string& needle) {
  kvf_client* const sentinel = NotNull();
  kvf_client* client = sentinel;  // open must set NULL on failure
  EXPECT_EQ(kvf_client_open(&o, &client), code) << LastError();
  EXPECT_EQ(client, nullptr);
  EXPECT_NE(LastError().find(needle), std::string::npos)
      << "last error \"" << LastError() << "\" does not name " << needle;
  if (client != sentinel) {
    EXPECT_EQ(kvf_client_close(client), KVF_OK);
  }
}

TEST(KvfabricCTest, OptionsInitFillsTheDocumentedDefaults) {
  kvf_options o;
  std::memset(&o, 0xAB, sizeof(o));
  kvf_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(kvf_options));
  EXPECT_EQ(o.placement_address, nullptr);
  EXPECT_EQ(o.namespace_name, nullptr);
  EXPECT_EQ(o.client_node, nullptr);
  EXPECT_EQ(o.model_id, nullptr);
  EXPECT_EQ(o.first_layer, 0u);
  EXPECT_EQ(o.layer_count, 0u);
  EXPECT_EQ(o.dtype, static_cast<std::uint32_t>(KVF_DTYPE_BF16));
  EXPECT_EQ(o.kv_heads, 0u);
  EXPECT_EQ(o.head_dim, 0u);
  EXPECT_EQ(o.tokens_per_block, 16u);
  EXPECT_EQ(o.tp_rank, 0u);
  EXPECT_EQ(o.tp_size, 1u);
  EXPECT_EQ(o.num_q_heads, 0u);
  EXPECT_EQ(o.tile_tokens, 256u);
  EXPECT_EQ(o.device_arena_bytes, 0u);
  EXPECT_EQ(o.device_page_bytes, 0u);
  EXPECT_EQ(o.staging_bytes, std::uint64_t{64} << 20);
  ASSERT_NE(o.ucx_tls, nullptr);
  EXPECT_STREQ(o.ucx_tls, "sm,self,tcp");
  ASSERT_NE(o.data_transport, nullptr);
  EXPECT_STREQ(o.data_transport, "ucx");
  EXPECT_EQ(o.rpc_timeout_ms, 5000u);
  EXPECT_EQ(o.transfer_timeout_ms, 30000u);
  EXPECT_EQ(o.recompute, nullptr);
  EXPECT_EQ(o.recompute_user, nullptr);
  EXPECT_EQ(o.device_kind, static_cast<std::uint32_t>(KVF_DEVICE_CPU));
  EXPECT_EQ(o.device_index, 0u);
  EXPECT_EQ(o.device_staging_pages, 0u);
  EXPECT_EQ(o.device_context_floor_pages, 0u);
  EXPECT_EQ(o.key_version, 2u);  // block-key encoding v2, every v2 field unstated
  EXPECT_EQ(o.weights_revision, nullptr);
  EXPECT_EQ(o.quantization, nullptr);
  EXPECT_EQ(o.kv_scale_scheme, nullptr);
  for (std::uint8_t b : o.kv_scales_digest) EXPECT_EQ(b, 0u);
  EXPECT_EQ(o.rope, nullptr);
  EXPECT_EQ(o.v_head_dim, 0u);
  EXPECT_EQ(o.vocab_size, 0u);
  kvf_options_init(nullptr);  // does nothing
}

TEST(KvfabricCTest, HeaderCompilesAsC99AndSeesTheSameDefaults) {
  EXPECT_EQ(kvf_c_header_check(), 0);
}

TEST(KvfabricCTest, StatusCodesMirrorStatusCode) {
  EXPECT_EQ(KVF_OK, static_cast<int>(StatusCode::kOk));
  EXPECT_EQ(KVF_INVALID_ARGUMENT, static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(KVF_DEADLINE_EXCEEDED, static_cast<int>(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(KVF_NOT_FOUND, static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(KVF_RESOURCE_EXHAUSTED, static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_EQ(KVF_FAILED_PRECONDITION, static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(KVF_INTERNAL, static_cast<int>(StatusCode::kInternal));
  EXPECT_EQ(KVF_UNAVAILABLE, static_cast<int>(StatusCode::kUnavailable));
  EXPECT_EQ(KVF_DATA_LOSS, static_cast<int>(StatusCode::kDataLoss));
  EXPECT_STREQ(kvf_status_name(KVF_OK), "KVF_OK");
  EXPECT_STREQ(kvf_status_name(KVF_UNAVAILABLE), "KVF_UNAVAILABLE");
  EXPECT_STREQ(kvf_status_name(KVF_DATA_LOSS), "KVF_DATA_LOSS");
  EXPECT_STREQ(kvf_status_name(-1), "KVF_UNRECOGNISED_STATUS");
  EXPECT_STREQ(kvf_status_name(16), "KVF_UNRECOGNISED_STATUS");
}

TEST(KvfabricCTest, OpenRefusesNullOptionsAndNullOut) {
  kvf_client* client = NotNull();
  EXPECT_EQ(kvf_client_open(nullptr, &client), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(client, nullptr);
  EXPECT_EQ(LastError(), "kvf_client_open: InvalidArgument: options is NULL");

  const kvf_options o = ValidOptions();
  EXPECT_EQ(kvf_client_open(&o, nullptr), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_client_open: InvalidArgument: out is NULL");
}

TEST(KvfabricCTest, OpenRefusesOptionsNotFilledByOptionsInit) {
  kvf_options o = ValidOptions();
  o.struct_size = 0;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->struct_size is 0");
  o.struct_size = sizeof(kvf_options) - 8;  // an older, smaller kvf_options
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "kvf_options_init");
}

TEST(KvfabricCTest, OpenRefusesAnUnknownDataTransportNamingIt) {
  kvf_options o = ValidOptions();
  o.data_transport = "rdma";
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "data_transport=\"rdma\"");
}

TEST(KvfabricCTest, OpenRefusesMissingPlacementAddress) {
  kvf_options o = ValidOptions();
  o.placement_address = nullptr;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->placement_address");
  o.placement_address = "";
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->placement_address");
  // A list of replicas: no empty entry, at most 8.
  o.placement_address = "127.0.0.1:1,,127.0.0.1:2";
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "has an empty entry");
  o.placement_address = "h:1,h:2,h:3,h:4,h:5,h:6,h:7,h:8,h:9";
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "9 replicas; at most 8");
}

TEST(KvfabricCTest, OpenRefusesBadModelGeometryNamingTheField) {
  struct Case {
    const char* field;
    void (*spoil)(kvf_options&);
  };
  const Case cases[] = {
      {"model_id", [](kvf_options& o) { o.model_id = nullptr; }},
      {"model_id", [](kvf_options& o) { o.model_id = ""; }},
      {"layer_count", [](kvf_options& o) { o.layer_count = 0; }},
      {"kv_heads", [](kvf_options& o) { o.kv_heads = 0; }},
      {"head_dim", [](kvf_options& o) { o.head_dim = 0; }},
      {"tokens_per_block", [](kvf_options& o) { o.tokens_per_block = 3; }},
      {"tokens_per_block", [](kvf_options& o) { o.tokens_per_block = 512; }},
      {"tp_rank", [](kvf_options& o) { o.tp_rank = 1; }},
      {"dtype", [](kvf_options& o) { o.dtype = 4; }},  // fp8: not an attention dtype
      {"dtype", [](kvf_options& o) { o.dtype = 0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    kvf_options o = ValidOptions();
    c.spoil(o);
    ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, c.field);
  }
}

// Block-key v2 fields (docs/block-key.md, section 6): refused before anything
// is allocated, naming the field.
TEST(KvfabricCTest, OpenRefusesBadBlockKeyV2FieldsNamingTheField) {
  struct Case {
    const char* field;
    void (*spoil)(kvf_options&);
  };
  const Case cases[] = {
      {"key_version", [](kvf_options& o) { o.key_version = 3; }},
      {"key_version", [](kvf_options& o) { o.key_version = 0; }},
      {"rope \"theta=10000\" cannot be expressed in block-key v1",
       [](kvf_options& o) {
         o.key_version = 1;
         o.rope = "theta=10000";
       }},
      {"vocab_size 32000 cannot be expressed in block-key v1",
       [](kvf_options& o) {
         o.key_version = 1;
         o.vocab_size = 32000;
       }},
      {"kv_scale_scheme \"fp8-per-tensor\" needs kv_scales_digest",
       [](kvf_options& o) { o.kv_scale_scheme = "fp8-per-tensor"; }},
      {"kv_scales_digest", [](kvf_options& o) { o.kv_scales_digest[3] = 1; }},
      {"write 1e6 as 1000000", [](kvf_options& o) { o.rope = "theta=1e6"; }},
      {"quantization is 65 bytes",
       [](kvf_options& o) {
         static const std::string long_name(65, 'q');
         o.quantization = long_name.c_str();
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    kvf_options o = ValidOptions();
    c.spoil(o);
    ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, c.field);
  }
  // Unequal key and value heads are keyed by v2 but not held by the client.
  kvf_options o = ValidOptions();
  o.v_head_dim = 32;
  ExpectOpenRefused(o, KVF_UNIMPLEMENTED, "options: v_head_dim 32 != head_dim 64");
}

// Every v2 field set (and v1 with none) passes the C layer and the client's
// checks: the open gets as far as placement, which nothing answers.
TEST(KvfabricCTest, OpenAcceptsEveryBlockKeyV2FieldUpToPlacement) {
  kvf_options o = ValidOptions();
  o.weights_revision = "0e9e39f249a16976918f6564b8830bc894c89659";
  o.quantization = "awq-int4";
  o.kv_scale_scheme = "fp8-per-tensor";
  std::memset(o.kv_scales_digest, 0x5a, sizeof(o.kv_scales_digest));
  o.rope = "factor=8;scaling=llama3;theta=500000";
  o.v_head_dim = o.head_dim;
  o.vocab_size = 128256;
  ExpectOpenRefused(o, KVF_UNAVAILABLE, "Unavailable");
  o = ValidOptions();
  o.key_version = 1;
  ExpectOpenRefused(o, KVF_UNAVAILABLE, "Unavailable");
}

TEST(KvfabricCTest, OpenRefusesPrefillConstantsThatAreNotFiniteAndNonNegative) {
  kvf_options o = ValidOptions();
  o.prefill_c1_us = -1;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->prefill_c1_us");
  o = ValidOptions();
  o.prefill_c2_us = std::numeric_limits<double>::infinity();
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->prefill_c2_us");
  o = ValidOptions();
  o.straggler_factor = 1.0;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->straggler_factor");
  o = ValidOptions();
  o.prefill_c3_us = -0.5;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->prefill_c3_us");
  o = ValidOptions();
  o.prefill_split_serial_fraction = 1.5;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->prefill_split_serial_fraction");
  o = ValidOptions();
  o.prefill_split_serial_fraction = std::nan("");
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->prefill_split_serial_fraction");
}

TEST(KvfabricCTest, OpenRefusesZeroDeviceArenaAndMissingRecompute) {
  kvf_options o = ValidOptions();
  o.device_arena_bytes = 0;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->device_arena_bytes");
  o = ValidOptions();
  o.recompute = nullptr;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->recompute");
}

// Needs Client::Open: it validates the options, then asks placement for
// Health, which nothing at 127.0.0.1:1 answers.
TEST(KvfabricCTest, OpenAgainstUnreachablePlacementIsUnavailable) {
  const kvf_options o = ValidOptions();
  kvf_client* client = nullptr;
  EXPECT_EQ(kvf_client_open(&o, &client), KVF_UNAVAILABLE) << LastError();
  EXPECT_EQ(client, nullptr);
  EXPECT_EQ(LastError().rfind("kvf_client_open: Unavailable: ", 0), 0u) << LastError();
  EXPECT_EQ(kvf_client_close(client), KVF_OK);
}

TEST(KvfabricCTest, EveryCallRefusesANullClientNamingIt) {
  const std::string expected = ": InvalidArgument: client is NULL";
  kvf_block_key key{};
  std::uint32_t tokens[16] = {};
  size_t keys_len = 0;
  kvf_match_result* match = nullptr;
  kvf_context_id context = 0;
  std::uint8_t* data = nullptr;
  std::uint64_t bytes = 0;
  float q[4] = {}, out[4] = {}, lse[1] = {};
  kvf_context_report report;
  kvf_metrics metrics;

  EXPECT_EQ(kvf_key_tokens(nullptr, tokens, 16, &key, 1, &keys_len), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_key_tokens" + expected);
  EXPECT_EQ(kvf_match(nullptr, &key, 1, 0, &match), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_match" + expected);
  EXPECT_EQ(match, nullptr);
  EXPECT_EQ(kvf_match_accuracy(nullptr, &key, 1, 0, "compact_after=16", 0, &match),
            KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_match_accuracy" + expected);
  EXPECT_EQ(match, nullptr);
  EXPECT_EQ(
      kvf_match_with_flags(nullptr, &key, 1, 0, nullptr, 0, KVF_MATCH_PREFIX_PLANS_ONLY, &match),
      KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_match_with_flags" + expected);
  EXPECT_EQ(match, nullptr);
  int compact = 7;
  EXPECT_EQ(kvf_block_is_compact(nullptr, context, 0, &compact), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_block_is_compact" + expected);
  EXPECT_EQ(compact, 0);
  EXPECT_EQ(kvf_new_context(nullptr, 16, &context), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_new_context" + expected);
  EXPECT_EQ(kvf_load(nullptr, match, context), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_load" + expected);
  EXPECT_EQ(kvf_wait_layer(nullptr, context, 0, 0), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_wait_layer" + expected);
  EXPECT_EQ(kvf_block_payload(nullptr, context, 0, &data, &bytes), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_block_payload" + expected);
  EXPECT_EQ(data, nullptr);
  EXPECT_EQ(kvf_save(nullptr, context, 0, 0, &key, 1), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_save" + expected);
  EXPECT_EQ(kvf_attend(nullptr, context, 0, 0, q, 4, out, 4, lse, 1), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_attend" + expected);
  EXPECT_EQ(kvf_finish(nullptr, context, &report), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_finish" + expected);
  EXPECT_EQ(kvf_client_metrics(nullptr, &metrics), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(), "kvf_client_metrics" + expected);
}

TEST(KvfabricCTest, NullHandlesAreHarmlessWhereDocumented) {
  EXPECT_EQ(kvf_client_close(nullptr), KVF_OK);
  kvf_match_free(nullptr);
  EXPECT_STREQ(kvf_match_representation(nullptr), "");
  EXPECT_EQ(kvf_match_cached_blocks(nullptr), 0u);
  EXPECT_EQ(kvf_match_chain_blocks(nullptr), 0u);
  EXPECT_EQ(kvf_match_plan_id(nullptr), 0u);
  EXPECT_STREQ(kvf_match_kind(nullptr), "");
  EXPECT_EQ(kvf_match_predicted_us(nullptr), 0.0);
}

TEST(KvfabricCTest, SuccessfulCallsLeaveTheLastErrorUnchanged) {
  EXPECT_EQ(kvf_client_open(nullptr, nullptr), KVF_INVALID_ARGUMENT);
  const std::string failed = LastError();
  EXPECT_FALSE(failed.empty());
  EXPECT_EQ(kvf_client_close(nullptr), KVF_OK);
  EXPECT_EQ(LastError(), failed);
}

TEST(KvfabricCTest, LastErrorIsPerThread) {
  EXPECT_EQ(kvf_new_context(nullptr, 1, nullptr), KVF_INVALID_ARGUMENT);
  const std::string mine = LastError();
  ASSERT_EQ(mine, "kvf_new_context: InvalidArgument: client is NULL");

  std::string other_before, other_after;
  std::thread other([&] {
    other_before = kvf_last_error();
    kvf_metrics metrics;
    EXPECT_EQ(kvf_client_metrics(nullptr, &metrics), KVF_INVALID_ARGUMENT);
    other_after = kvf_last_error();
  });
  other.join();

  EXPECT_EQ(other_before, "");  // that thread had not failed yet
  EXPECT_EQ(other_after, "kvf_client_metrics: InvalidArgument: client is NULL");
  EXPECT_EQ(LastError(), mine);  // untouched by the other thread's failure
}

// ---- Device selection

TEST(KvfabricCTest, OpenRefusesAnUnknownDeviceKindAndAnIndexForTheCpu) {
  kvf_options o = ValidOptions();
  o.device_kind = 7;
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->device_kind is 7");
  o = ValidOptions();
  o.device_index = 1;  // KVF_DEVICE_CPU has device 0 only
  ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "options->device_index is 1");
  EXPECT_NE(LastError().find("KVF_DEVICE_CUDA"), std::string::npos) << LastError();
}

// Whatever the build: without a GPU (or without CUDA in the library) a CUDA
// request fails at open, saying which option asked for what and why it cannot
// be had. With a GPU the device is created and placement is what is missing.
TEST(KvfabricCTest, OpenWithACudaDeviceFailsClearlyWhereThereIsNone) {
  kvf_options o = ValidOptions();
  o.device_kind = KVF_DEVICE_CUDA;
#ifdef KVF_HAVE_CUDA
  const kvfabric::cuda::CudaProbeResult probe = kvfabric::cuda::ProbeCuda();
  if (probe.devices.empty()) {
    ExpectOpenRefused(o, KVF_FAILED_PRECONDITION,
                      "kvf_client_open: FailedPrecondition: creating the CUDA device of "
                      "options->device_kind = KVF_DEVICE_CUDA, options->device_index = 0, "
                      "options->device_arena_bytes = 16777216: ");
    EXPECT_NE(LastError().find("; no usable GPU here: check the driver and CUDA_VISIBLE_DEVICES, "
                               "or use KVF_DEVICE_CPU"),
              std::string::npos)
        << LastError();
  } else {
    kvf_client* client = nullptr;
    EXPECT_EQ(kvf_client_open(&o, &client), KVF_UNAVAILABLE) << LastError();
    EXPECT_EQ(client, nullptr);
    o.device_index = static_cast<std::uint32_t>(probe.devices.size());  // one past the last
    ExpectOpenRefused(o, KVF_FAILED_PRECONDITION,
                      "options->device_index = " + std::to_string(probe.devices.size()));
  }
#else
  ExpectOpenRefused(o, KVF_UNIMPLEMENTED,
                    "kvf_client_open: Unimplemented: options->device_kind is KVF_DEVICE_CUDA, "
                    "but this libkvfabric was built without CUDA");
#endif
}

// ---- The arena's sizing, in kvf_options' names

// Refused at open before placement is asked; each refusal names the
// kvf_options field and none a flag the C caller does not have.
TEST(KvfabricCTest, ArenaRefusalsNameTheKvfOptionsFields) {
  auto expect_refusal = [](const kvf_options& o, const std::string& needle) {
    ExpectOpenRefused(o, KVF_INVALID_ARGUMENT, "kvf_client_open: InvalidArgument: device arena: ");
    EXPECT_NE(LastError().find(needle), std::string::npos) << LastError();
    EXPECT_EQ(LastError().find("--"), std::string::npos) << LastError();
  };
  kvf_options o = ValidOptions();
  o.device_arena_bytes = std::uint64_t{64} << 10;  // two 32 KiB pages, less the scratch
  expect_refusal(o, "raise options->device_arena_bytes");

  o = ValidOptions();
  o.device_staging_pages = 10000;  // the 16 MiB arena holds fewer than 512 pages
  expect_refusal(o, "staging 10000 + one context's floor 2");
  EXPECT_NE(LastError().find("or lower options->device_staging_pages, "
                             "options->device_context_floor_pages or options->device_page_bytes"),
            std::string::npos)
      << LastError();

  o = ValidOptions();
  o.device_context_floor_pages = 1;  // below the sink page + the newest page
  expect_refusal(o,
                 "context floor 1 pages < 1 sink page + 1 hot newest pages (raise "
                 "options->device_context_floor_pages)");
}

// ---- Logging

// One captured line.
struct LogLine {
  kvf_log_level level;
  std::string text;
};

// A kvf_log_fn's user data: every line it was given.
struct CapturedLog {
  std::mutex mu;
  std::vector<LogLine> lines;

  std::vector<LogLine> Take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(lines, {});
  }
};

void Capture(void* user, kvf_log_level level, const char* line) {
  auto* log = static_cast<CapturedLog*>(user);
  std::lock_guard<std::mutex> lock(log->mu);
  log->lines.push_back({level, line});
}

// Restores the documented defaults (stderr, KVF_LOG_WARN) when a test ends,
// so that every test starts from them whatever the order.
struct RestoreLogDefaults {
  ~RestoreLogDefaults() {
    kvf_set_log_sink(nullptr, nullptr);
    EXPECT_EQ(kvf_set_log_level(KVF_LOG_WARN), KVF_OK);
  }
};

TEST(KvfabricCTest, LogSinkReceivesLinesAtTheLevelAndAboveOnly) {
  RestoreLogDefaults restore;
  EXPECT_EQ(kvfabric::client::Log().level(), spdlog::level::warn);  // the default
  CapturedLog log;
  kvf_set_log_sink(Capture, &log);
  kvfabric::client::Log().debug("a debug line");
  kvfabric::client::Log().info("an info line");
  kvfabric::client::Log().warn("a warn line: {} pages", 3);
  kvfabric::client::Log().error("an error line");
  std::vector<LogLine> lines = log.Take();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].level, KVF_LOG_WARN);
  EXPECT_EQ(lines[0].text, "a warn line: 3 pages");  // no timestamp, no newline
  EXPECT_EQ(lines[1].level, KVF_LOG_ERROR);
  EXPECT_EQ(lines[1].text, "an error line");

  ASSERT_EQ(kvf_set_log_level(KVF_LOG_ERROR), KVF_OK);
  kvfabric::client::Log().warn("a warn line");
  kvfabric::client::Log().error("an error line");
  lines = log.Take();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].level, KVF_LOG_ERROR);

  ASSERT_EQ(kvf_set_log_level(KVF_LOG_TRACE), KVF_OK);
  kvfabric::client::Log().trace("a trace line");
  kvfabric::client::Log().debug("a debug line");
  lines = log.Take();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].level, KVF_LOG_TRACE);
  EXPECT_EQ(lines[1].level, KVF_LOG_DEBUG);
}

TEST(KvfabricCTest, LogLevelOffSilencesEveryLine) {
  RestoreLogDefaults restore;
  CapturedLog log;
  kvf_set_log_sink(Capture, &log);
  ASSERT_EQ(kvf_set_log_level(KVF_LOG_OFF), KVF_OK);
  kvfabric::client::Log().error("an error line");
  kvfabric::client::Log().critical("a critical line");
  EXPECT_TRUE(log.Take().empty());
}

TEST(KvfabricCTest, SetLogLevelRefusesAnUnknownLevelAndKeepsTheOldOne) {
  RestoreLogDefaults restore;
  ASSERT_EQ(kvf_set_log_level(KVF_LOG_ERROR), KVF_OK);
  EXPECT_EQ(kvf_set_log_level(6), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(LastError().rfind("kvf_set_log_level: InvalidArgument: level is 6: use KVF_LOG_TRACE "
                              "(0)",
                              0),
            0u)
      << LastError();
  EXPECT_EQ(kvf_set_log_level(-1), KVF_INVALID_ARGUMENT);
  EXPECT_EQ(kvfabric::client::Log().level(), spdlog::level::err);
}

TEST(KvfabricCTest, NullLogSinkRestoresStderr) {
  RestoreLogDefaults restore;
  CapturedLog log;
  kvf_set_log_sink(Capture, &log);
  kvf_set_log_sink(nullptr, &log);  // user is ignored
  testing::internal::CaptureStderr();
  kvfabric::client::Log().warn("a line for stderr");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(log.Take().empty());
  EXPECT_NE(err.find(" warning tid="), std::string::npos) << err;
  EXPECT_NE(err.find(" kvfabric: a line for stderr\n"), std::string::npos) << err;
}

// The library's own lines come through the sink: kvf_client_open lays the
// arena out (an info line naming the settings it used) before it finds
// placement missing.
TEST(KvfabricCTest, TheLibrarysLinesReachTheSinkWithTheSettingsUsed) {
  RestoreLogDefaults restore;
  CapturedLog log;
  kvf_set_log_sink(Capture, &log);
  kvf_options o = ValidOptions();
  o.device_staging_pages = 6;
  o.device_context_floor_pages = 5;
  kvf_client* client = nullptr;
  EXPECT_EQ(kvf_client_open(&o, &client), KVF_UNAVAILABLE) << LastError();
  for (const LogLine& line : log.Take()) {
    EXPECT_GE(line.level, KVF_LOG_WARN) << line.text;  // nothing below the level
  }

  ASSERT_EQ(kvf_set_log_level(KVF_LOG_INFO), KVF_OK);
  EXPECT_EQ(kvf_client_open(&o, &client), KVF_UNAVAILABLE) << LastError();
  bool layout = false;
  for (const LogLine& line : log.Take()) {
    if (line.level != KVF_LOG_INFO || line.text.rfind("device arena: ", 0) != 0) continue;
    layout = true;
    EXPECT_NE(line.text.find(" + staging 6 pages + pool "), std::string::npos) << line.text;
    EXPECT_NE(line.text.find("contexts at floor 5 pages"), std::string::npos) << line.text;
  }
  EXPECT_TRUE(layout) << "no \"device arena: \" line at KVF_LOG_INFO";
}

// Library threads log while the engine swaps sinks: lines never overlap in a
// sink, and a replaced sink is never called after kvf_set_log_sink returned.
TEST(KvfabricCTest, ReplacedLogSinkIsNeverCalledAgain) {
  RestoreLogDefaults restore;
  struct Counting {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<bool> inside{false};
    std::atomic<bool> overlapped{false};
  };
  kvf_log_fn count = [](void* user, kvf_log_level, const char*) {
    auto* c = static_cast<Counting*>(user);
    if (c->inside.exchange(true)) c->overlapped = true;
    ++c->calls;
    c->inside = false;
  };
  auto wait_for_calls = [](const Counting& c, std::uint64_t n) {
    while (c.calls.load() < n) std::this_thread::yield();
  };

  Counting first, second, third;
  kvf_set_log_sink(count, &first);
  std::atomic<bool> stop{false};
  std::vector<std::thread> loggers;
  for (int t = 0; t < 4; ++t) {
    loggers.emplace_back([&stop, t] {
      while (!stop.load()) kvfabric::client::Log().warn("logger {}", t);
    });
  }
  wait_for_calls(first, 1000);
  kvf_set_log_sink(count, &second);
  const std::uint64_t first_calls = first.calls.load();
  wait_for_calls(second, 1000);
  kvf_set_log_sink(count, &third);
  const std::uint64_t second_calls = second.calls.load();
  wait_for_calls(third, 1000);
  stop = true;
  for (std::thread& t : loggers) t.join();

  EXPECT_EQ(first.calls.load(), first_calls);
  EXPECT_EQ(second.calls.load(), second_calls);
  EXPECT_FALSE(first.overlapped || second.overlapped || third.overlapped);
}

}  // namespace
