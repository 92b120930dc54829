#include "cli/calibrate_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "core/config/unit_flags.h"
#include "core/units.h"

#ifdef KVF_HAVE_UCX
#include <grpcpp/grpcpp.h>

#include "client/data_plane_client.h"
#include "core/crc32c.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "proto/grpc_status.h"
#include "transport/ucx/ucx_transport.h"
#endif
#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace kvfabric::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;

double MicrosSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
}

std::string PathLabel(BusPath path, const std::string& host_id) {
  std::string label(BusPathArrowName(path));
  return host_id.empty() ? label : label + " " + host_id;
}

// ---------------------------------------------------------------- device copies

// Host -> device or device -> host: one copy between a pinned buffer and the arena's start,
// timed until an event recorded after it completes.
class DeviceCopyProbe final : public PathProbe {
 public:
  static StatusOr<std::unique_ptr<PathProbe>> Create(gpu::Device* device, bool to_device,
                                                     std::uint64_t max_bytes) {
    if (device->arena_bytes() < max_bytes) {
      return Status::FailedPrecondition(
          "device " + device->name() + ": arena of " + FormatBytes(device->arena_bytes()) +
          " cannot hold the largest probe, --max-bytes " + FormatBytes(max_bytes));
    }
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::PinnedHostBuffer> pinned,
                         device->AllocatePinnedHost(max_bytes));
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> event, device->CreateEvent());
    return std::unique_ptr<PathProbe>(
        new DeviceCopyProbe(device, to_device, std::move(pinned), std::move(event)));
  }

  StatusOr<double> Measure(std::uint64_t bytes) override {
    const std::span<std::byte> host = pinned_->bytes().subspan(0, bytes);
    const gpu::DeviceRange range{0, bytes};
    const auto start = SteadyClock::now();
    Status s = to_device_ ? device_->CopyHostToDevice(host, range)
                          : device_->CopyDeviceToHost(range, host);
    if (s.ok()) {
      s = device_->Record(*event_,
                          to_device_ ? gpu::Queue::kHostToDevice : gpu::Queue::kDeviceToHost);
    }
    if (s.ok()) s = event_->Wait(start + std::chrono::seconds(60));
    const double us = MicrosSince(start);
    if (!s.ok()) return s.WithContext("device " + device_->name());
    return us;
  }

 private:
  DeviceCopyProbe(gpu::Device* device, bool to_device,
                  std::unique_ptr<gpu::PinnedHostBuffer> pinned, std::unique_ptr<gpu::Event> event)
      : device_(device),
        to_device_(to_device),
        pinned_(std::move(pinned)),
        event_(std::move(event)) {}

  gpu::Device* const device_;
  const bool to_device_;
  std::unique_ptr<gpu::PinnedHostBuffer> pinned_;
  std::unique_ptr<gpu::Event> event_;
};

// ---------------------------------------------------------------- cache hosts

#ifdef KVF_HAVE_UCX

constexpr char kProbeNamespace[] = "kvfabric.calibrate";
constexpr std::uint32_t kRegionId = 1;
// Probe blocks are exact blocks of 16 tokens x 2 (K, V) x 1 head x 64 dims x fp16 = 4 KiB per
// layer, so any multiple of 4 KiB is a valid block (layer_count = bytes / 4 KiB).
constexpr std::uint64_t kBytesPerLayer = 4096;
constexpr std::uint64_t kMaxProbeBlockBytes = std::uint64_t{64} << 20;
constexpr std::uint32_t kProbeTtlMs = 120000;
constexpr auto kTransferTimeout = std::chrono::seconds(120);

Status FromEntry(const v1::EntryStatus& e, const std::string& what) {
  if (e.code() == 0) return Status::OK();
  return Status(static_cast<StatusCode>(e.code()), e.message()).WithContext(what);
}

// The client side shared by every cache host: one UCX transport, one staging region of
// max_bytes exported to each daemon, one data-plane client.
struct ClientFabric {
  // Declared in the order of creation, so that each is destroyed before what it borrows.
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::MemoryRegion> staging;
  std::unique_ptr<client::DataPlaneClient> data;

  static StatusOr<std::unique_ptr<ClientFabric>> Create(std::uint64_t staging_bytes) {
    auto f = std::make_unique<ClientFabric>();
    KVF_ASSIGN_OR_RETURN(f->transport, ucx::CreateUcxTransport(ucx::UcxTransportOptions{}));
    KVF_ASSIGN_OR_RETURN(f->staging,
                         f->transport->AllocateMemory(staging_bytes, transport::MemoryKind::kHost));
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    std::span<std::byte> bytes = f->staging->bytes();
    for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(bytes.data() + i, &x, 8);
    }
    KVF_ASSIGN_OR_RETURN(f->data, client::DataPlaneClient::Create(f->transport.get()));
    return f;
  }
};

// One daemon under measurement: its control stub, its limits, and the probe blocks it holds.
class CacheHostSession {
 public:
  // Health (serving, host_id, limits) and Stats (room in the host pool); no data moves yet.
  static StatusOr<std::unique_ptr<CacheHostSession>> Open(const std::string& address,
                                                          std::span<const std::uint64_t> sizes,
                                                          int timeout_ms) {
    auto s = std::unique_ptr<CacheHostSession>(new CacheHostSession(address, timeout_ms));
    grpc::ChannelArguments ch;
    ch.SetMaxReceiveMessageSize(16 << 20);
    ch.SetMaxSendMessageSize(16 << 20);
    s->stub_ = v1::CacheHost::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), ch));
    v1::HealthResponse health;
    KVF_RETURN_IF_ERROR(
        s->Call("Health", s->stub_->Health(s->Context().get(), v1::HealthRequest(), &health)));
    if (health.status() != v1::SERVING_STATUS_SERVING) {
      return Status::Unavailable("--cache-host " + address + " is not serving (status " +
                                 std::to_string(health.status()) + "): " + health.detail());
    }
    if (health.server_id().empty()) {
      return Status::FailedPrecondition("--cache-host " + address +
                                        ": Health reports no server_id (host_id)");
    }
    s->host_id_ = health.server_id();
    s->limits_ = health.limits();
    s->max_block_bytes_ = std::min(kMaxProbeBlockBytes, s->limits_.max_block_bytes());
    std::uint64_t needed = 0;
    for (std::uint64_t bytes : sizes) {
      KVF_RETURN_IF_ERROR(s->Split(bytes).status());
      needed += bytes;
    }
    needed += sizes.back();  // the largest put, alongside every size's get blocks
    v1::StatsResponse stats;
    KVF_RETURN_IF_ERROR(
        s->Call("Stats", s->stub_->Stats(s->Context().get(), v1::StatsRequest(), &stats)));
    for (const v1::TierUsage& t : stats.tiers()) {
      if (t.tier() == v1::TIER_HOST && t.free_bytes() < needed) {
        return Status::FailedPrecondition(
            "--cache-host " + address + " (" + s->host_id_ + "): " + FormatBytes(t.free_bytes()) +
            " free in its host pool, the probe needs " + FormatBytes(needed) +
            " (every size once for reads + the largest write): lower --max-bytes or free the "
            "pool");
      }
    }
    return s;
  }

  ~CacheHostSession() {
    // Best effort: the blocks also expire with the daemon's eviction; nothing to report to.
    for (auto& [bytes, keys] : get_keys_) DeleteKeys(keys).IgnoreError();
  }

  const std::string& host_id() const { return host_id_; }
  const std::string& address() const { return address_; }

  // Puts one set of blocks per size, read by TimedGet.
  Status PrepareGets(ClientFabric* fabric, std::span<const std::uint64_t> sizes) {
    fabric_ = fabric;
    for (std::uint64_t bytes : sizes) {
      KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
      std::vector<std::string> keys = NewKeys(split.blocks);
      KVF_RETURN_IF_ERROR(Put(split, keys, Crcs(split)));
      get_keys_[bytes] = std::move(keys);
    }
    return Status::OK();
  }

  // Lease + kGet, timed; then (untimed) Release and a CRC check of every block read.
  // REQUIRES: PrepareGets succeeded (also for TimedPut, which uses its fabric).
  StatusOr<double> TimedGet(std::uint64_t bytes) {
    auto it = get_keys_.find(bytes);
    if (it == get_keys_.end()) return Status::Internal("no probe blocks put for this size");
    KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
    std::span<std::byte> staging = fabric_->staging->bytes();
    // Marks every block so that a transfer that wrote nothing fails the CRC check.
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      std::memset(staging.data() + k * split.block_bytes, 0xa5, 8);
    }
    const auto start = SteadyClock::now();
    v1::LeaseRequest req;
    req.set_namespace_(kProbeNamespace);
    req.set_ttl_ms(TtlMs());
    for (const std::string& key : it->second) req.add_keys(key);
    v1::LeaseResponse resp;
    KVF_RETURN_IF_ERROR(Call("Lease", stub_->Lease(Context().get(), req, &resp)));
    if (resp.results_size() != static_cast<int>(split.blocks)) {
      return Status::Internal("Lease answered " + std::to_string(resp.results_size()) +
                              " results for " + std::to_string(split.blocks) + " keys");
    }
    std::vector<wire::TransferRange> ranges;
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      const v1::LeaseResult& r = resp.results(static_cast<int>(k));
      KVF_RETURN_IF_ERROR(FromEntry(r.status(), "Lease of probe block " + std::to_string(k)));
      if (r.tier() != v1::TIER_HOST) {
        return Status::FailedPrecondition(
            "--cache-host " + address_ +
            " served a probe block from NVMe, not its host pool: "
            "the pool is too small (or its watermarks demote the probe blocks); lower "
            "--max-bytes or give the daemon a larger --host-pool-bytes");
      }
      AppendRanges(r.extents(), k * split.block_bytes, &ranges);
    }
    KVF_RETURN_IF_ERROR(Move(client::DataOp::kGet, resp.lease_id(), resp.grant(), ranges));
    const double us = MicrosSince(start);
    v1::ReleaseRequest rel;
    rel.set_namespace_(kProbeNamespace);
    rel.add_entries()->set_lease_id(resp.lease_id());
    v1::ReleaseResponse rel_resp;
    KVF_RETURN_IF_ERROR(Call("Release", stub_->Release(Context().get(), rel, &rel_resp)));
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      const auto got = staging.subspan(k * split.block_bytes, split.block_bytes);
      if (crc32c::Value(got) != resp.results(static_cast<int>(k)).block().crc32c()) {
        return Status::DataLoss("--cache-host " + address_ + ": probe block " + std::to_string(k) +
                                " of " + FormatBytes(bytes) + " read back with a CRC32C mismatch");
      }
    }
    return us;
  }

  // Reserve + kPut + Commit of fresh blocks, timed; then (untimed) Delete.
  StatusOr<double> TimedPut(std::uint64_t bytes) {
    KVF_ASSIGN_OR_RETURN(BlockSplit split, Split(bytes));
    const std::vector<std::uint32_t>& crcs = Crcs(split);
    const std::vector<std::string> keys = NewKeys(split.blocks);
    const auto start = SteadyClock::now();
    KVF_RETURN_IF_ERROR(Put(split, keys, crcs));
    const double us = MicrosSince(start);
    KVF_RETURN_IF_ERROR(DeleteKeys(keys));
    return us;
  }

 private:
  CacheHostSession(std::string address, int timeout_ms)
      : address_(std::move(address)), timeout_ms_(timeout_ms), rng_(std::random_device{}()) {}

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
    return ctx;
  }

  // Long enough for the largest transfer, within the daemon's max_ttl_ms.
  std::uint32_t TtlMs() const {
    const std::uint32_t most = limits_.max_ttl_ms();
    return most == 0 ? kProbeTtlMs : std::min(kProbeTtlMs, most);
  }

  Status Call(const char* rpc, const grpc::Status& g) const {
    if (g.ok()) return Status::OK();
    return FromGrpcStatus(g).WithContext(std::string(rpc) + " on --cache-host " + address_);
  }

  StatusOr<BlockSplit> Split(std::uint64_t bytes) const {
    if (bytes > limits_.max_batch_payload_bytes()) {
      return Status::InvalidArgument("--max-bytes " + FormatBytes(bytes) + " exceeds " + address_ +
                                     "'s max_batch_payload_bytes " +
                                     FormatBytes(limits_.max_batch_payload_bytes()));
    }
    KVF_ASSIGN_OR_RETURN(BlockSplit split,
                         SplitIntoBlocks(bytes, max_block_bytes_, kBytesPerLayer));
    if (split.blocks > limits_.max_keys_per_batch()) {
      return Status::InvalidArgument(
          FormatBytes(bytes) + " in blocks of " + FormatBytes(split.block_bytes) + " is " +
          std::to_string(split.blocks) + " blocks, above " + address_ + "'s max_keys_per_batch " +
          std::to_string(limits_.max_keys_per_batch()) +
          ": choose --min-bytes/--max-bytes that are multiples of 64 KiB");
    }
    return split;
  }

  std::vector<std::string> NewKeys(std::uint64_t n) {
    std::vector<std::string> keys(n, std::string(32, '\0'));
    for (std::string& key : keys) {
      for (int w = 0; w < 4; ++w) {
        const std::uint64_t v = rng_();
        std::memcpy(key.data() + 8 * w, &v, 8);
      }
    }
    return keys;
  }

  // CRC32C of each block of `split` as laid out in the staging region (its bytes never change:
  // gets read back what was put from it).
  const std::vector<std::uint32_t>& Crcs(const BlockSplit& split) {
    std::vector<std::uint32_t>& crcs = crcs_[{split.block_bytes, split.blocks}];
    if (crcs.empty()) {
      const std::span<const std::byte> staging = fabric_->staging->bytes();
      for (std::uint64_t k = 0; k < split.blocks; ++k) {
        crcs.push_back(crc32c::Value(staging.subspan(k * split.block_bytes, split.block_bytes)));
      }
    }
    return crcs;
  }

  static void AppendRanges(const google::protobuf::RepeatedPtrField<v1::Extent>& extents,
                           std::uint64_t region_offset, std::vector<wire::TransferRange>* out) {
    for (const v1::Extent& x : extents) {
      out->push_back({x.offset_bytes(), x.length_bytes(), region_offset});
      region_offset += x.length_bytes();
    }
  }

  // Connects on first use (the transport address comes with the first grant), then moves
  // `ranges` under the grant.
  Status Move(client::DataOp op, std::uint64_t lease_id, const v1::TransportGrant& grant,
              std::span<const wire::TransferRange> ranges) {
    if (grant.access_token().size() != 16) {
      return Status::Internal("--cache-host " + address_ + ": grant token of " +
                              std::to_string(grant.access_token().size()) + " bytes, not 16");
    }
    const auto deadline = SteadyClock::now() + kTransferTimeout;
    if (conn_ == nullptr) {
      StatusOr<client::DaemonConnection*> conn =
          fabric_->data->Connect(grant.transport_address(), deadline);
      if (!conn.ok()) {
        return conn.status().WithContext("data plane of --cache-host " + address_ + " at " +
                                         grant.transport_address());
      }
      KVF_RETURN_IF_ERROR(
          fabric_->data->ExportRegion(*conn, kRegionId, *fabric_->staging, deadline));
      conn_ = *conn;
    }
    std::array<std::uint8_t, 16> token{};
    std::memcpy(token.data(), grant.access_token().data(), token.size());
    Status s = fabric_->data->Transfer(conn_, op, lease_id, token, kRegionId, ranges, deadline);
    return s.WithContext(std::string(op == client::DataOp::kGet ? "kGet" : "kPut") +
                         " from --cache-host " + address_);
  }

  Status Put(const BlockSplit& split, const std::vector<std::string>& keys,
             const std::vector<std::uint32_t>& crcs) {
    v1::ReserveRequest req;
    req.set_namespace_(kProbeNamespace);
    req.set_ttl_ms(TtlMs());
    v1::ModelFingerprint* f = req.mutable_fingerprint();
    f->set_model_id("kvfabric/calibrate@1");
    f->set_first_layer(0);
    f->set_layer_count(static_cast<std::uint32_t>(split.block_bytes / kBytesPerLayer));
    f->set_dtype(v1::DTYPE_FP16);
    f->set_kv_heads(1);
    f->set_head_dim(64);
    f->set_tokens_per_block(16);
    f->set_tp_rank(0);
    f->set_tp_size(1);
    f->set_layout_version(1);
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      v1::BlockDescriptor* b = req.add_blocks();
      b->set_key(keys[k]);
      b->set_payload_bytes(split.block_bytes);
      b->set_representation(v1::REPRESENTATION_EXACT);
      b->set_format_version(1);
      b->set_token_count(16);
      b->set_prefix_tokens(16 * k);
    }
    v1::ReserveResponse resp;
    KVF_RETURN_IF_ERROR(Call("Reserve", stub_->Reserve(Context().get(), req, &resp)));
    if (resp.results_size() != static_cast<int>(split.blocks)) {
      return Status::Internal("Reserve answered " + std::to_string(resp.results_size()) +
                              " results for " + std::to_string(split.blocks) + " blocks");
    }
    std::vector<wire::TransferRange> ranges;
    v1::CommitRequest commit;
    commit.set_namespace_(kProbeNamespace);
    commit.set_lease_id(resp.lease_id());
    commit.set_release_uncommitted(true);
    for (std::uint64_t k = 0; k < split.blocks; ++k) {
      const v1::ReserveResult& r = resp.results(static_cast<int>(k));
      KVF_RETURN_IF_ERROR(FromEntry(r.status(), "Reserve of probe block " + std::to_string(k) +
                                                    " on --cache-host " + address_));
      AppendRanges(r.extents(), k * split.block_bytes, &ranges);
      v1::CommitEntry* c = commit.add_entries();
      c->set_key(keys[k]);
      c->set_crc32c(crcs[k]);
    }
    KVF_RETURN_IF_ERROR(Move(client::DataOp::kPut, resp.lease_id(), resp.grant(), ranges));
    v1::CommitResponse cresp;
    KVF_RETURN_IF_ERROR(Call("Commit", stub_->Commit(Context().get(), commit, &cresp)));
    for (int k = 0; k < cresp.results_size(); ++k) {
      KVF_RETURN_IF_ERROR(
          FromEntry(cresp.results(k).status(), "Commit of probe block " + std::to_string(k)));
    }
    return Status::OK();
  }

  Status DeleteKeys(const std::vector<std::string>& keys) {
    const std::size_t batch = std::max<std::uint32_t>(1, limits_.max_keys_per_batch());
    for (std::size_t first = 0; first < keys.size(); first += batch) {
      v1::DeleteRequest req;
      req.set_namespace_(kProbeNamespace);
      for (std::size_t i = first; i < std::min(keys.size(), first + batch); ++i) {
        req.add_keys(keys[i]);
      }
      v1::DeleteResponse resp;
      KVF_RETURN_IF_ERROR(Call("Delete", stub_->Delete(Context().get(), req, &resp)));
      for (const v1::DeleteResult& r : resp.results()) {
        if (r.status().code() != 0 &&
            r.status().code() != static_cast<int>(StatusCode::kNotFound)) {
          return FromEntry(r.status(), "Delete of a probe block on --cache-host " + address_);
        }
      }
    }
    return Status::OK();
  }

  const std::string address_;
  const int timeout_ms_;
  std::string host_id_;
  v1::Limits limits_;
  std::uint64_t max_block_bytes_ = kMaxProbeBlockBytes;
  std::unique_ptr<v1::CacheHost::Stub> stub_;
  ClientFabric* fabric_ = nullptr;  // set by PrepareGets
  client::DaemonConnection* conn_ = nullptr;
  std::mt19937_64 rng_;
  std::map<std::uint64_t, std::vector<std::string>> get_keys_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::uint32_t>> crcs_;
};

class CacheHostProbe final : public PathProbe {
 public:
  CacheHostProbe(CacheHostSession* session, bool get) : session_(session), get_(get) {}
  StatusOr<double> Measure(std::uint64_t bytes) override {
    return get_ ? session_->TimedGet(bytes) : session_->TimedPut(bytes);
  }

 private:
  CacheHostSession* const session_;
  const bool get_;
};

#endif  // KVF_HAVE_UCX

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// Measures one path and appends its outcome.
class Calibrator {
 public:
  Calibrator(const std::vector<std::uint64_t>& sizes, int repeats,
             const std::function<void(const std::string&)>& progress, CalibrationReport* report)
      : sizes_(sizes), repeats_(repeats), progress_(progress), report_(report) {}

  void Progress(const std::string& line) const {
    if (progress_) progress_(line);
  }

  Status Measure(PathProbe& probe, BusPath path, const std::string& host_id,
                 const std::string& where) {
    Progress("measuring " + PathLabel(path, host_id) + ": " + std::to_string(sizes_.size()) +
             " sizes " + FormatBytes(sizes_.front()) + ".." + FormatBytes(sizes_.back()) + " x " +
             std::to_string(repeats_) + " repeats x 2 runs, " +
             FormatBytes(ProbeBytesPerPath(sizes_, repeats_)) + " in all");
    ProbeRunOptions o;
    o.repeats = repeats_;
    o.label = PathLabel(path, host_id);
    o.progress = progress_;
    KVF_ASSIGN_OR_RETURN(TwoProbeRuns runs, RunTwoProbeRuns(probe, sizes_, o));
    JudgeOptions judge;
    StatusOr<PathFit> fit = FitAndJudge(runs.a, runs.b, judge);
    if (!fit.ok()) return fit.status().WithContext(o.label);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s: alpha %.2f us, beta %s; out of sample: median %.2f%%, worst %.2f%% (%s)",
                  o.label.c_str(), fit->final_parameters.alpha_us,
                  FormatRate(fit->final_parameters.beta_bytes_per_s).c_str(),
                  100 * fit->median_abs_error, 100 * fit->worst_abs_error,
                  fit->target_met ? "target met" : "target NOT met");
    Progress(line);
    PathOutcome out;
    out.path = path;
    out.host_id = host_id;
    out.where = where;
    out.measured = true;
    out.fit = std::move(*fit);
    report_->paths.push_back(std::move(out));
    return Status::OK();
  }

  void NotMeasured(BusPath path, const std::string& where, const std::string& reason) {
    PathOutcome out;
    out.path = path;
    out.where = where;
    out.not_measured_reason = reason;
    Progress(std::string(BusPathArrowName(path)) + ": not measured: " + reason);
    report_->paths.push_back(std::move(out));
  }

 private:
  const std::vector<std::uint64_t>& sizes_;
  const int repeats_;
  const std::function<void(const std::string&)>& progress_;
  CalibrationReport* const report_;
};

std::string Percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", 100 * ratio);
  return buf;
}

}  // namespace

int CalibrationReport::measured_paths() const {
  return static_cast<int>(
      std::count_if(paths.begin(), paths.end(), [](const PathOutcome& p) { return p.measured; }));
}

int CalibrationReport::targets_met() const {
  return static_cast<int>(std::count_if(paths.begin(), paths.end(), [](const PathOutcome& p) {
    return p.measured && p.fit.target_met;
  }));
}

CLI::App* AddCalibrateSubcommand(CLI::App& app, CalibrateArgs* args) {
  CLI::App* sub = app.add_subcommand(
      "calibrate", "measure the bus paths, fit the cost model, write the calibration file");
  sub->add_option("--out", args->out_path, "calibration file to write (JSON)")->required();
  sub->add_option("--cache-host", args->cache_hosts,
                  "gRPC address HOST:PORT of a cache-host daemon to measure; repeatable")
      ->take_all();
  sub->add_option("--nvme-dir", args->nvme_dir,
                  "directory on the NVMe device: O_DIRECT reads of a scratch file made there");
  AddBytesOption(*sub, "--min-bytes", &args->min_bytes, "smallest probe (a multiple of 4 KiB)");
  AddBytesOption(*sub, "--max-bytes", &args->max_bytes,
                 "largest probe; sizes go up by 4x from --min-bytes");
  sub->add_option("--repeats", args->repeats, "timed transfers per size and run (median taken)")
      ->default_val(args->repeats);
  AddBytesOption(*sub, "--cache-scrub-bytes", &args->cache_scrub_bytes,
                 "bytes read before each timed memcpy to make it cold; 0 = warm copies");
  sub->add_flag("--json", args->json, "machine-readable output");
  return sub;
}

StatusOr<std::vector<std::uint64_t>> ValidateCalibrateArgs(const CalibrateArgs& args) {
  if (args.out_path.empty()) {
    return Status::InvalidArgument("--out: required (the calibration file to write)");
  }
  std::set<std::string> seen;
  for (const std::string& host : args.cache_hosts) {
    if (host.empty()) return Status::InvalidArgument("--cache-host: empty address");
    if (!seen.insert(host).second) {
      return Status::InvalidArgument("--cache-host " + host + ": given twice");
    }
  }
  if (args.rpc_timeout_ms <= 0) {
    return Status::InvalidArgument("rpc_timeout_ms " + std::to_string(args.rpc_timeout_ms) +
                                   ": must be > 0");
  }
  return PlanProbeSizes(args.min_bytes, args.max_bytes, args.repeats);
}

StatusOr<CalibrationReport> RunCalibrate(const CalibrateArgs& args,
                                         const CalibrateContext& context) {
  KVF_ASSIGN_OR_RETURN(std::vector<std::uint64_t> sizes, ValidateCalibrateArgs(args));
  Env* env = context.env != nullptr ? context.env : Env::Default();
  // Found now rather than after minutes of measuring.
  if (const std::string dir = DirName(args.out_path); !env->FileExists(dir)) {
    return Status::InvalidArgument("--out " + args.out_path + ": directory " + dir +
                                   " does not exist");
  }
  CalibrationReport report;
  report.sizes = sizes;
  report.repeats = args.repeats;
  report.judge_from_bytes = std::min(JudgeOptions{}.judge_from_bytes, sizes.back());
  report.target_error_ratio = JudgeOptions{}.target_error_ratio;
  report.out_path = args.out_path;
  Calibrator calibrator(sizes, args.repeats, context.progress, &report);

#ifdef KVF_HAVE_UCX
  // Every daemon is checked before anything is measured: a typo in the last --cache-host
  // should not cost the minutes the others take.
  std::vector<std::unique_ptr<CacheHostSession>> sessions;
  std::map<std::string, std::string> host_ids;  // host_id -> address
  for (const std::string& address : args.cache_hosts) {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<CacheHostSession> session,
                         CacheHostSession::Open(address, sizes, args.rpc_timeout_ms));
    auto [it, fresh] = host_ids.emplace(session->host_id(), address);
    if (!fresh) {
      return Status::InvalidArgument("--cache-host " + address + " and " + it->second +
                                     " are the same daemon (host_id " + it->first + ")");
    }
    calibrator.Progress("cache host " + address + ": host_id " + session->host_id());
    sessions.push_back(std::move(session));
  }
#else
  if (!args.cache_hosts.empty()) {
    return Status::FailedPrecondition(
        "--cache-host: this build has no UCX transport, so cache-host paths cannot be measured "
        "(build with libucx-dev)");
  }
#endif

  {
    MemcpyProbeOptions o;
    o.max_bytes = sizes.back();
    o.cache_scrub_bytes = args.cache_scrub_bytes;
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe, CreateMemcpyProbe(o));
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, BusPath::kLocalMemcpy, "", "local"));
  }

  if (args.nvme_dir.empty()) {
    calibrator.NotMeasured(BusPath::kNvmeToHost, "-", "no --nvme-dir");
  } else {
    NvmeReadProbeOptions o;
    o.dir = args.nvme_dir;
    o.max_bytes = sizes.back();
    calibrator.Progress("nvme→host: writing a " + FormatBytes(4 * o.max_bytes) +
                        " scratch file in " + o.dir);
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe, CreateNvmeReadProbe(env, o));
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, BusPath::kNvmeToHost, "", args.nvme_dir));
  }

  for (bool to_device : {true, false}) {
    const BusPath path = to_device ? BusPath::kHostToDevice : BusPath::kDeviceToHost;
    if (context.device == nullptr) {
      calibrator.NotMeasured(path, "-", context.no_device_reason);
      continue;
    }
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe,
                         DeviceCopyProbe::Create(context.device, to_device, sizes.back()));
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, path, "", context.device->name()));
  }

#ifdef KVF_HAVE_UCX
  if (!sessions.empty()) {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<ClientFabric> fabric, ClientFabric::Create(sizes.back()));
    for (std::unique_ptr<CacheHostSession>& session : sessions) {
      calibrator.Progress("cache host " + session->host_id() + ": putting the read probes");
      KVF_RETURN_IF_ERROR(session->PrepareGets(fabric.get(), sizes));
      for (bool get : {true, false}) {
        const BusPath path =
            get ? BusPath::kRemoteHostToLocalHost : BusPath::kLocalHostToRemoteHost;
        CacheHostProbe probe(session.get(), get);
        KVF_RETURN_IF_ERROR(
            calibrator.Measure(probe, path, session->host_id(), session->address()));
      }
    }
    sessions.clear();  // deletes the read probes while the fabric is still up
  }
#endif
  if (args.cache_hosts.empty()) {
    calibrator.NotMeasured(BusPath::kRemoteHostToLocalHost, "-", "no --cache-host");
    calibrator.NotMeasured(BusPath::kLocalHostToRemoteHost, "-", "no --cache-host");
  }

  BusCalibration& calibration = report.calibration;
  calibration.created_unix_us = env->WallMicros();
  calibration.machine = args.machine.empty() ? HostName() : args.machine;
  for (const PathOutcome& p : report.paths) {
    if (p.measured) calibration.paths.push_back(ToPathCalibration(p.path, p.host_id, p.fit));
  }
  Status saved = SaveBusCalibration(env, calibration, args.out_path);
  if (!saved.ok()) return saved.WithContext("--out " + args.out_path);
  return report;
}

std::string FormatCalibrationText(const CalibrationReport& r) {
  std::string out = "kvfabric calibrate: " + std::to_string(r.sizes.size()) + " sizes " +
                    FormatBytes(r.sizes.front()) + ".." + FormatBytes(r.sizes.back()) + ", " +
                    std::to_string(r.repeats) +
                    " repeats per size and run; fitted on run A, judged on run B over " +
                    FormatBytes(r.judge_from_bytes) + ".." + FormatBytes(r.sizes.back()) +
                    " (target: worst |error| <= " + Percent(r.target_error_ratio) + "%)\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-26s %-16s %10s %10s %13s %12s  %s\n", "path", "host",
                "alpha_us", "beta GB/s", "median err %", "worst err %", "target met");
  out += line;
  for (const PathOutcome& p : r.paths) {
    const std::string host = p.host_id.empty() ? "-" : p.host_id;
    if (!p.measured) {
      std::snprintf(line, sizeof(line), "%-26s %-16s not measured: %s\n",
                    std::string(BusPathName(p.path)).c_str(), host.c_str(),
                    p.not_measured_reason.c_str());
    } else {
      std::snprintf(line, sizeof(line), "%-26s %-16s %10.2f %10.3f %13s %12s  %s\n",
                    std::string(BusPathName(p.path)).c_str(), host.c_str(),
                    p.fit.final_parameters.alpha_us, p.fit.final_parameters.beta_bytes_per_s / 1e9,
                    Percent(p.fit.median_abs_error).c_str(), Percent(p.fit.worst_abs_error).c_str(),
                    p.fit.target_met ? "yes" : "no");
    }
    out += line;
  }
  out += "wrote " + r.out_path + ": " + std::to_string(r.calibration.paths.size()) +
         " paths; target met on " + std::to_string(r.targets_met()) + " of " +
         std::to_string(r.measured_paths()) + " measured paths\n";
  return out;
}

std::string FormatCalibrationJson(const CalibrationReport& r) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["out"] = r.out_path;
  j["machine"] = r.calibration.machine;
  j["sizes_bytes"] = r.sizes;
  j["repeats"] = r.repeats;
  j["judged_from_bytes"] = r.judge_from_bytes;
  j["target_error_ratio"] = r.target_error_ratio;
  j["measured_paths"] = r.measured_paths();
  j["targets_met"] = r.targets_met();
  Json paths = Json::array();
  for (const PathOutcome& p : r.paths) {
    Json e;
    e["path"] = std::string(BusPathName(p.path));
    e["host_id"] = p.host_id;
    e["where"] = p.where;
    e["measured"] = p.measured;
    if (!p.measured) {
      e["reason"] = p.not_measured_reason;
      paths.push_back(std::move(e));
      continue;
    }
    const PathFit& f = p.fit;
    e["alpha_us"] = f.final_parameters.alpha_us;
    e["beta_bytes_per_s"] = f.final_parameters.beta_bytes_per_s;
    e["median_error_ratio"] = f.median_abs_error;
    e["worst_error_ratio"] = f.worst_abs_error;
    e["target_met"] = f.target_met;
    e["samples"] = f.samples;
    e["run_a"] = {{"alpha_us", f.run_a.alpha_us}, {"beta_bytes_per_s", f.run_a.beta_bytes_per_s}};
    Json sizes = Json::array();
    for (const SizeError& s : f.run_b) {
      sizes.push_back({{"bytes", s.bytes},
                       {"observed_b_us", s.observed_us},
                       {"predicted_us", s.predicted_us},
                       {"error_ratio", s.error},
                       {"judged", s.judged}});
    }
    e["run_b"] = std::move(sizes);
    paths.push_back(std::move(e));
  }
  j["paths"] = std::move(paths);
  return j.dump() + "\n";
}

CalibrationDevice OpenCalibrationDevice(std::uint64_t arena_bytes) {
  CalibrationDevice out;
#ifdef KVF_HAVE_CUDA
  gpu::DeviceOptions o;
  o.arena_bytes = arena_bytes;
  StatusOr<std::unique_ptr<gpu::Device>> device = gpu::CreateCudaDevice(o);
  if (device.ok()) {
    out.device = std::move(*device);
  } else if (device.status().code() == StatusCode::kFailedPrecondition) {
    out.absent_reason = "no GPU (" + std::string(device.status().message()) + ")";
  } else {
    out.absent_reason = "GPU unusable: " + device.status().ToString();
  }
#else
  (void)arena_bytes;
  out.absent_reason = "no GPU (this build has no CUDA backend)";
#endif
  return out;
}

Status RunCalibrateCommand(const CalibrateArgs& args) {
  KVF_RETURN_IF_ERROR(ValidateCalibrateArgs(args).status());
  CalibrationDevice device = OpenCalibrationDevice(args.max_bytes);
  CalibrateContext context;
  context.device = device.device.get();
  if (device.device == nullptr) context.no_device_reason = device.absent_reason;
  context.progress = [](const std::string& line) {
    std::fprintf(stderr, "kvfabric calibrate: %s\n", line.c_str());
  };
  KVF_ASSIGN_OR_RETURN(CalibrationReport report, RunCalibrate(args, context));
  const std::string out = args.json ? FormatCalibrationJson(report) : FormatCalibrationText(report);
  std::fputs(out.c_str(), stdout);
  return Status::OK();
}

}  // namespace kvfabric::cli
