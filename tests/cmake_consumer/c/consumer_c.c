/* A C engine's round trip through an installed libkvfabric, using only
 * kvfabric/kvfabric.h (and docs/client.md): run by tests/cmake_consumer/run.sh
 * against a cluster it starts (placement and two kvfabric-cached daemons).
 *
 *   consumer_c PLACEMENT_ADDRESS [SEED]
 *
 * 1. Opens a client, keys a 4096-token prompt (256 blocks of 16 tokens).
 * 2. First request: a context, every block's payload written through
 *    kvf_block_payload with bytes that are a function of (seed, block,
 *    offset), every layer of every block saved; kvf_finish must return OK
 *    and report all 256 blocks saved and no save failure.
 * 3. Second request: match (the whole chain must be cached), load, wait for
 *    every layer, and compare every byte of the history with what was
 *    written. The recompute callback writes the same function of (seed,
 *    block, offset), so a block the plan recomputes matches too; at least
 *    one block must have been fetched, or the fabric was not exercised.
 * 4. Closes the client.
 *
 * Prints one line per step with its numbers; exits 0 only if every check
 * passed, 1 otherwise (naming the check and kvf_last_error()). C99. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvfabric/kvfabric.h"

enum {
  kPromptTokens = 4096,
  kTokensPerBlock = 16,
  kLayers = 4,
  kKvHeads = 2,
  kHeadDim = 64,
  kQHeads = 4,
  kTileTokens = 64,
  kDtypeBytes = 2 /* fp16 */
};
/* One block: layers x (K, V) x tokens x heads x dim x 2 bytes = 32 KiB. */
#define BLOCK_BYTES \
  ((uint64_t)kLayers * 2 * kTokensPerBlock * kKvHeads * kHeadDim * kDtypeBytes)

static uint64_t g_seed = 1;

static uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Block `block`'s payload: 8 bytes per 64-bit word of SplitMix64(seed, block,
 * word). Any bytes do: the library moves and checksums them, it does not read
 * them as fp16 unless kvf_attend is called. */
static void FillBlock(uint64_t block, uint8_t* out, uint64_t bytes) {
  uint64_t i;
  for (i = 0; i < bytes; ++i) {
    const uint64_t word = SplitMix64(g_seed ^ SplitMix64((block << 32) | (i >> 3)));
    out[i] = (uint8_t)(word >> (8 * (i & 7)));
  }
}

/* The engine's prefill: the same bytes FillBlock wrote for those blocks. */
static kvf_status Recompute(void* user, const kvf_recompute_request* request, uint8_t* out,
                            uint64_t out_bytes) {
  uint32_t i;
  (void)user;
  if (out_bytes != (uint64_t)request->block_count * BLOCK_BYTES) return KVF_INTERNAL;
  for (i = 0; i < request->block_count; ++i) {
    FillBlock((uint64_t)request->first_block + i, out + (uint64_t)i * BLOCK_BYTES, BLOCK_BYTES);
  }
  return KVF_OK;
}

static int Fail(const char* what, kvf_status s) {
  fprintf(stderr, "consumer_c: FAILED: %s: %s (%s)\n", what, kvf_status_name(s),
          kvf_last_error());
  return 1;
}

static int Check(int ok, const char* what) {
  if (!ok) fprintf(stderr, "consumer_c: FAILED: %s\n", what);
  return ok ? 0 : 1;
}

/* A call that must succeed; on failure the client is still closed. */
#define TRY(call, what)                 \
  do {                                  \
    if ((s = (call)) != KVF_OK) {       \
      failures += Fail((what), s);      \
      goto close;                       \
    }                                   \
  } while (0)
#define REQUIRE(cond, what)             \
  do {                                  \
    if (Check((cond), (what)) != 0) {   \
      ++failures;                       \
      goto close;                       \
    }                                   \
  } while (0)

int main(int argc, char** argv) {
  kvf_options o;
  kvf_client* client = NULL;
  kvf_match_result* match = NULL;
  kvf_context_id first = 0, second = 0;
  kvf_context_report report;
  kvf_metrics m;
  kvf_block_key* keys = NULL;
  uint32_t* tokens = NULL;
  uint8_t* expected = NULL;
  size_t n = 0, i;
  uint32_t b, l;
  uint64_t mismatched_bytes = 0, first_bad_block = 0;
  int failures = 0;
  kvf_status s;

  if (argc < 2) {
    fprintf(stderr, "usage: consumer_c PLACEMENT_ADDRESS [SEED]\n");
    return 2;
  }
  if (argc > 2) g_seed = strtoull(argv[2], NULL, 10);
  printf("consumer_c: seed %" PRIu64 ", placement %s\n", g_seed, argv[1]);

  kvf_options_init(&o);
  o.placement_address = argv[1];
  o.insecure = 1; /* the daemons listen on 127.0.0.1 with --insecure */
  o.namespace_name = "consumer-c";
  o.model_id = "consumer-c/synthetic@1";
  o.layer_count = kLayers;
  o.dtype = KVF_DTYPE_FP16;
  o.kv_heads = kKvHeads;
  o.head_dim = kHeadDim;
  o.tokens_per_block = kTokensPerBlock;
  o.num_q_heads = kQHeads;
  o.tile_tokens = kTileTokens;
  o.device_arena_bytes = 1u << 20;
  o.staging_bytes = 1u << 20;
  o.history_pool_bytes = 8u << 20; /* two 4K-token histories */
  o.recompute = &Recompute;
  o.recompute_user = NULL;
  TRY(kvf_client_open(&o, &client), "kvf_client_open");

  /* 1. The prompt and its key chain. */
  tokens = malloc(sizeof(uint32_t) * kPromptTokens);
  REQUIRE(tokens != NULL, "malloc tokens");
  for (i = 0; i < kPromptTokens; ++i) tokens[i] = (uint32_t)(SplitMix64(g_seed + i) % 50000);
  TRY(kvf_key_tokens(client, tokens, kPromptTokens, NULL, 0, &n), "kvf_key_tokens (size)");
  REQUIRE(n == kPromptTokens / kTokensPerBlock, "4096 tokens key 256 blocks");
  keys = malloc(sizeof(kvf_block_key) * n);
  expected = malloc((size_t)(n * BLOCK_BYTES));
  REQUIRE(keys != NULL && expected != NULL, "malloc keys/expected");
  TRY(kvf_key_tokens(client, tokens, kPromptTokens, keys, n, &n), "kvf_key_tokens");
  printf("consumer_c: %zu blocks of %" PRIu64 " bytes\n", n, (uint64_t)BLOCK_BYTES);

  /* 2. First request: write the history, save every layer, finish. */
  TRY(kvf_new_context(client, kPromptTokens, &first), "kvf_new_context (first)");
  for (b = 0; b < n; ++b) {
    uint8_t* data = NULL;
    uint64_t bytes = 0;
    TRY(kvf_block_payload(client, first, b, &data, &bytes), "kvf_block_payload (first)");
    REQUIRE(bytes == BLOCK_BYTES, "block payload is one block");
    FillBlock(b, data, bytes);
    memcpy(expected + (uint64_t)b * BLOCK_BYTES, data, (size_t)bytes);
  }
  for (l = 0; l < kLayers; ++l) {
    TRY(kvf_save(client, first, l, 0, keys, n), "kvf_save");
  }
  memset(&report, 0, sizeof(report));
  TRY(kvf_finish(client, first, &report), "kvf_finish (first)");
  printf("consumer_c: saved %u blocks, %u save failures\n", report.blocks_saved,
         report.save_failures);
  /* kvf_finish returns the first failed write-back; the counts say the rest. */
  failures += Check(report.save_failures == 0, "no save failures");
  failures += Check(report.blocks_saved == n, "every block saved");
  if (failures) goto close;

  /* 3. Second request: match, load, wait for every layer, compare. The daemons
   * report committed blocks to placement in the background, so the directory
   * may trail kvf_finish by a report interval: match again (every 50 ms, up to
   * 10 s) until it lists the whole chain. */
  TRY(kvf_match(client, keys, n, 0, &match), "kvf_match");
  for (int waited_ms = 0; kvf_match_cached_blocks(match) < n && waited_ms < 10000;
       waited_ms += 50) {
    struct timespec pause = {0, 50 * 1000 * 1000};
    kvf_match_free(match);
    match = NULL;
    nanosleep(&pause, NULL);
    TRY(kvf_match(client, keys, n, 0, &match), "kvf_match (again)");
  }
  printf("consumer_c: match: %u of %u blocks cached, plan %s (id %" PRIu64 "), %.0f us predicted\n",
         kvf_match_cached_blocks(match), kvf_match_chain_blocks(match), kvf_match_kind(match),
         kvf_match_plan_id(match), kvf_match_predicted_us(match));
  failures += Check(kvf_match_cached_blocks(match) == n, "the whole chain is cached");
  TRY(kvf_new_context(client, kPromptTokens, &second), "kvf_new_context (second)");
  s = kvf_load(client, match, second);
  kvf_match_free(match);
  match = NULL;
  TRY(s, "kvf_load");
  for (l = 0; l < kLayers; ++l) {
    TRY(kvf_wait_layer(client, second, l, 60000), "kvf_wait_layer");
  }
  for (b = 0; b < n; ++b) {
    uint8_t* data = NULL;
    uint64_t bytes = 0, k;
    TRY(kvf_block_payload(client, second, b, &data, &bytes), "kvf_block_payload (second)");
    REQUIRE(bytes == BLOCK_BYTES, "block payload is one block");
    for (k = 0; k < bytes; ++k) {
      if (data[k] != expected[(uint64_t)b * BLOCK_BYTES + k]) {
        if (mismatched_bytes == 0) first_bad_block = b;
        ++mismatched_bytes;
      }
    }
  }
  memset(&report, 0, sizeof(report));
  TRY(kvf_finish(client, second, &report), "kvf_finish (second)");
  printf("consumer_c: loaded %zu blocks: %u fetched (%" PRIu64 " bytes), %u recomputed "
         "in %.0f us; %" PRIu64 " bytes differ\n",
         n, report.blocks_fetched, report.bytes_fetched, report.blocks_recomputed, report.load_us,
         mismatched_bytes);
  if (mismatched_bytes != 0) {
    fprintf(stderr, "consumer_c: FAILED: %" PRIu64 " bytes differ, first in block %" PRIu64 "\n",
            mismatched_bytes, first_bad_block);
    ++failures;
  }
  failures += Check(report.blocks_fetched + report.blocks_recomputed == n,
                    "every block fetched or recomputed");
  failures += Check(report.blocks_fetched > 0, "at least one block fetched");
  TRY(kvf_client_metrics(client, &m), "kvf_client_metrics");
  failures += Check(m.crc_failures == 0, "no CRC failures");
  failures += Check(m.save_failures == 0, "no save failures in the metrics");

close:
  /* 4. Close (after a failure too: its threads stop before the process exits). */
  kvf_match_free(match);
  if ((s = kvf_client_close(client)) != KVF_OK) failures += Fail("kvf_client_close", s);
  free(expected);
  free(keys);
  free(tokens);
  if (failures) {
    fprintf(stderr, "consumer_c: %d check(s) failed\n", failures);
    return 1;
  }
  printf("consumer_c: ok: %zu blocks saved and loaded back byte for byte\n", n);
  return 0;
}
