// `kvfabric demo`: the whole system on an embedded local cluster, in one
// process, in under two minutes on a 2-core machine with the defaults.
//
// It starts two cache-host daemons on loopback (small explicit host pools,
// an NVMe tier in a temporary folder), calibrates the bus cost model against
// them (`kvfabric calibrate`'s probes, small sizes) and starts placement with
// that calibration. It probes the engine stand-in's prefill (core/
// recompute_probe.h) and states the fitted t = c0 + c1 n + c2 n (p + n/2) at
// Open; placement refits it online from every measured prefill. Then it serves a
// workload through the client library: a few multi-turn conversations that
// share a system prompt, each turn's history longer than the last, the
// longest at --max-history-tokens; the device arena (CPU backend) is far
// smaller than one history. Per turn: Match (placement's plan), Load (fetch
// and recompute; recompute = a real prefill by the synthetic transformer of
// client/synthetic_transformer.h, whose stored KV is the deterministic
// generator's), Save (write-back of what was recomputed),
// one decode step over every layer through the bounded arena, and a sample of
// layers checked bit for bit against fully resident attention.
//
// It prints one progress line per turn and a summary: tokens by source
// (daemon host tier, daemon NVMe tier, recompute), plans by kind with
// predicted and measured load times, bytes and GB/s per path, peak arena use
// against its budget, exactness checks, and the /metrics URLs
// (--keep-running leaves the cluster up until SIGINT/SIGTERM). It returns
// DataLoss (exit 1) if any exactness check fails.
//
// Thread safety: call from main only.
#ifndef KVFABRIC_CLI_DEMO_COMMAND_H_
#define KVFABRIC_CLI_DEMO_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace kvfabric::cli {

struct DemoArgs {
  // Mutual TLS for every gRPC listener and connection of the embedded
  // cluster (--tls-cert, --tls-key, --tls-ca): one certificate, naming
  // IP:127.0.0.1, serves as both the daemons' and placement's identity and
  // the demo engine's client identity. Empty (default): plaintext on
  // 127.0.0.1.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  // The synthetic model (defaults: a Llama-3-8B-like shape, fp16).
  std::uint32_t layers = 32;
  std::uint32_t kv_heads = 8;
  std::uint32_t head_dim = 128;
  std::uint32_t tokens_per_block = 16;
  std::string dtype = "fp16";
  // Query heads of the decode step. Default 8 (= kv_heads): the CPU kernel's
  // cost grows with query heads; GQA shapes work with more.
  std::uint32_t num_q_heads = 8;
  // Workload.
  std::uint32_t conversations = 3;
  std::uint32_t turns = 3;
  // 16384: a real prefill of the new tokens of every turn costs
  // c2 n (p + n/2) on the CPU (about 0.25 us per token pair here).
  std::uint64_t max_history_tokens = 16384;
  std::uint64_t system_prompt_tokens = 2048;
  // Layers per turn checked against resident attention (spread evenly).
  std::uint32_t check_layers = 2;
  // The engine stand-in's prefill (client/synthetic_transformer.h): a real
  // decoder on the CPU, sized so a block near the start of a history costs
  // about what fetching it costs here.
  std::uint32_t prefill_hidden = 256;
  std::uint32_t prefill_ffn = 1024;
  std::uint32_t prefill_depth = 1;
  std::uint32_t prefill_vocab = 16384;
  // Repeats per shape of the prefill probe the demo states to placement.
  int prefill_probe_repeats = 2;
  // Cluster: per daemon.
  std::uint64_t host_pool_bytes = std::uint64_t{1} << 30;
  std::uint64_t nvme_capacity_bytes = std::uint64_t{4} << 30;
  // Data plane of the daemons and the client: "ucx" or "tcp" (kernel sockets).
  std::string data_transport = "ucx";
  // Client.
  std::uint64_t device_arena_bytes = std::uint64_t{16} << 20;
  std::uint32_t tile_tokens = 256;
  // Calibration probe sizes (kvfabric calibrate's ladder), and whether to run it.
  std::uint64_t calibrate_max_bytes = std::uint64_t{16} << 20;
  bool calibrate = true;
  // Where the NVMe tier goes (a temporary folder under it, removed at exit).
  std::string work_dir = "/tmp";
  std::uint64_t seed = 1;
  bool keep_running = false;
  bool json = false;
};

// Adds `demo` and its flags to `app`.
CLI::App* AddDemoSubcommand(CLI::App& app, DemoArgs* args);

// Runs the demo (see the file comment). InvalidArgument naming the flag for
// settings that cannot work; DataLoss when an exactness check failed.
Status RunDemo(const DemoArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_DEMO_COMMAND_H_
