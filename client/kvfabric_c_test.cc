// The C API's own contract, without a cluster: defaults, argument checks that
// name what was wrong, per-thread last errors, and the open that cannot reach
// placement. The calls' behaviour with a cluster is Client's (its tests and
// tests/ cover it).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "core/status.h"
#include "kvfabric/kvfabric.h"

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
  o.model_id = "kvfabric/c-api-test";
  o.layer_count = 2;
  o.dtype = KVF_DTYPE_FP16;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.num_q_heads = 4;
  o.tile_tokens = 64;
  o.device_arena_bytes = std::uint64_t{16} << 20;
  o.staging_bytes = std::uint64_t{4} << 20;
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

}  // namespace
