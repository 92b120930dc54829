// ClientPrometheus: libkvfabric's Prometheus view, for an engine to serve
// from its own /metrics (Client::metrics_collectable) or from the client's
// own port (ClientOptions::metrics_address). Names are catalogued in
// docs/metrics.md (prefix kvfabric_client_).
//
// Two sources, so nothing is counted twice:
//  - Collected: at every scrape the snapshot source (Client::metrics() and the
//    device arena's metrics) becomes counter and gauge families; the client's
//    own counters are the truth.
//  - Observed: per-transfer, per-load and per-prefill histograms, fed by the
//    loader and saver threads (ObserveTransfer, ObserveLoad, ObserveRecompute).
//    Every series is created in the constructor, so observing allocates
//    nothing (the request path stays allocation-free).
//
// Labels are bounded: path (the two the client drives), direction
// (fetch/save), kind (the four plan kinds).
//
// Threads: every method may be called from any thread, concurrently.
#ifndef KVFABRIC_CLIENT_CLIENT_PROMETHEUS_H_
#define KVFABRIC_CLIENT_CLIENT_PROMETHEUS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "client/device_arena.h"
#include "client/kvfabric_client.h"
#include "core/mutex.h"

namespace kvfabric::client {

// Plan kinds as labelled ("recompute_all", "fetch_all", "split", "mixed");
// index 0..3, or -1 for another name.
int PlanKindIndex(std::string_view kind);

class ClientPrometheus final : public prometheus::Collectable {
 public:
  struct Snapshot {
    ClientMetrics client;
    DeviceArenaMetrics arena;
    std::uint64_t block_bytes = 0;  // bytes of one history pool page
  };
  using SnapshotSource = std::function<Snapshot()>;

  explicit ClientPrometheus(SnapshotSource source);
  ~ClientPrometheus() override;
  ClientPrometheus(const ClientPrometheus&) = delete;
  ClientPrometheus& operator=(const ClientPrometheus&) = delete;

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Stops calling the snapshot source (the client it reads is closing);
  // waits for a Collect that is calling it. Collect serves the observed
  // families from then on.
  void Detach();

  // One data-plane batch: a fetch (daemon -> this host) or a save (this
  // host -> daemon) of `bytes` taking `micros`.
  void ObserveTransfer(bool save, std::uint64_t bytes, double micros);
  // One load finished: its plan kind, placement's prediction and the
  // measured time, in microseconds. Locally planned loads (placement
  // unreachable) have no prediction: `predicted_us` < 0 leaves the predicted
  // and ratio families alone.
  void ObserveLoad(std::string_view kind, double predicted_us, double measured_us);
  // One call of the engine's prefill (the recompute callback).
  void ObserveRecompute(double micros);

 private:
  struct Direction {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Counter* bytes = nullptr;
  };
  struct Kind {
    prometheus::Histogram* measured = nullptr;
    prometheus::Counter* predicted_total = nullptr;
    prometheus::Counter* measured_total = nullptr;
    prometheus::Histogram* ratio = nullptr;
  };

  // Held while the source is called, so Detach cannot pass a running call.
  mutable Mutex source_mu_;
  SnapshotSource source_ KVF_GUARDED_BY(source_mu_);
  const std::shared_ptr<prometheus::Registry> registry_;
  Direction fetch_;
  Direction save_;
  std::array<Kind, 4> kinds_{};
  prometheus::Histogram* recompute_ = nullptr;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_CLIENT_PROMETHEUS_H_
