/* Compiled as C99 (-std=c99 -pedantic-errors): proves kvfabric/kvfabric.h is a
 * C header, and kvfabric_c_test calls kvf_c_header_check() so the C view of
 * kvf_options_init's defaults is checked too. */
#include <stddef.h>
#include <string.h>

#include "kvfabric/kvfabric.h"

int kvf_c_header_check(void);

/* A recompute callback as a C engine writes it. */
static kvf_status ZeroFill(void* user, const kvf_recompute_request* request, uint8_t* out,
                           uint64_t out_bytes) {
  (void)user;
  (void)request;
  memset(out, 0, (size_t)out_bytes);
  return KVF_OK;
}

/* A log sink as a C engine writes it. */
static void CountLines(void* user, kvf_log_level level, const char* line) {
  (void)level;
  (void)line;
  ++*(int*)user;
}

/* 0 if the defaults read from C are the documented ones; otherwise the number
 * of the first check that failed. */
int kvf_c_header_check(void) {
  kvf_options options;
  kvf_block_key key;
  kvf_metrics metrics;
  kvf_context_report report;
  kvf_recompute_fn fn = ZeroFill;
  kvf_client* client = NULL;
  kvf_match_result* match = NULL;
  kvf_context_id context = 0;
  int lines = 0;

  memset(&options, 0xAB, sizeof(options));
  kvf_options_init(&options);
  if (options.struct_size != sizeof(kvf_options)) return 1;
  if (options.placement_address != NULL || options.model_id != NULL) return 2;
  if (options.dtype != KVF_DTYPE_BF16 || options.tokens_per_block != 16) return 3;
  if (options.tile_tokens != 256 || options.tp_size != 1) return 4;
  if (options.staging_bytes != (uint64_t)64 << 20) return 5;
  if (options.rpc_timeout_ms != 5000 || options.transfer_timeout_ms != 30000) return 6;
  if (options.ucx_tls == NULL || strcmp(options.ucx_tls, "sm,self,tcp") != 0) return 7;
  if (options.recompute != NULL || options.recompute_user != NULL) return 8;
  if (sizeof(key) != KVF_BLOCK_KEY_BYTES) return 9;
  if (options.data_transport == NULL || strcmp(options.data_transport, "ucx") != 0) return 13;
  if (options.device_kind != KVF_DEVICE_CPU || options.device_index != 0) return 14;
  if (options.device_staging_pages != 0 || options.device_context_floor_pages != 0) return 15;

  options.recompute = fn;
  (void)metrics;
  (void)report;
  (void)context;
  /* Calls the library refuses without a client, from C. */
  if (kvf_client_open(NULL, &client) != KVF_INVALID_ARGUMENT || client != NULL) return 10;
  if (kvf_match(NULL, &key, 1, 0, &match) != KVF_INVALID_ARGUMENT || match != NULL) return 11;
  if (kvf_last_error()[0] == '\0') return 12;
  /* The log settings, from C; left at their defaults (stderr, warn). */
  kvf_set_log_sink(CountLines, &lines);
  if (kvf_set_log_level(KVF_LOG_OFF) != KVF_OK) return 16;
  if (kvf_set_log_level(KVF_LOG_WARN) != KVF_OK) return 17;
  kvf_set_log_sink(NULL, NULL);
  if (lines != 0) return 18;
  return 0;
}
