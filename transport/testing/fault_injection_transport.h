// FaultInjectionTransport: a Transport for tests that wraps another one and,
// from a seed, makes some of its completions fail, arrive late, never arrive,
// or carry a flipped bit. In the spirit of core/testing/fault_injection_env.h.
//
// Everything the wrapper hands out wraps the base transport's object (regions,
// remote regions, endpoints, incoming messages); pass only this transport's
// objects back to it. Each entry of a submitted batch draws its fault when it
// is submitted, from one std::mt19937_64 seeded with options.seed, so a run
// with the same seed and the same sequence of Submit calls injects the same
// faults. With every rate 0 nothing is drawn and the wrapper behaves exactly
// like the base transport.
//
// Faults, each "one entry in N" (0 = never); an entry gets at most one, tried
// in this order:
//   fail        the entry is not performed and completes with rates.fail_code
//               (default Unavailable), as if the peer had failed it.
//   fail_after  the entry is performed by the base transport, then completes
//               with rates.fail_code and 0 bytes (the data may well be there:
//               callers must not trust a failed entry either way).
//   delay       the entry completes rates.delay after the base transport
//               completed it (Cancel or Close cuts the delay short).
//   drop        the entry is not performed and never completes on its own:
//               Wait and Flush run into their deadlines. Cancel, Close and
//               destroying the batch or the transport complete it Cancelled.
//   corrupt     kRead only: after the base transport read the bytes, one bit
//               of the local destination range is flipped (the entry reports
//               OK). Also applied to incoming kSend payloads that a handler
//               Accepts through this transport: one bit of the placed bytes is
//               flipped before on_placed(OK) runs.
//   corrupt_write  kWrite only (its own rate, corrupt_write_one_in): the
//               bytes are copied into a bounce region of the base transport,
//               one bit of the copy is flipped, and the copy is written: the
//               peer receives a flipped bit in transit while the local bytes
//               stay intact (a daemon's pool page, say). Entries shorter
//               than rates.corrupt_write_min_bytes are left alone.
// Transfer::checksum goes to the base transport: a corrupt_write entry's
// landed CRC is that of the flipped bytes that landed, and a corrupt entry
// reports none (the base's was of the bytes before the flip).
// Submit validates a batch itself (transport.h's rules) before drawing, so a
// batch that the base transport would reject is rejected whole even if some of
// its entries would have been failed or dropped.
//
// Thread safety: as transport.h. Ownership: the wrapper owns the base
// transport. Endpoints and regions it returns may outlive it; destroying it
// completes every batch (dropped and delayed entries included) and then
// destroys the base transport.
#ifndef KVFABRIC_TRANSPORT_TESTING_FAULT_INJECTION_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_TESTING_FAULT_INJECTION_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/transport.h"

namespace kvfabric::transport {

struct FaultRates {
  std::uint32_t fail_one_in = 0;        // not performed, completes with fail_code
  std::uint32_t fail_after_one_in = 0;  // performed, then completes with fail_code
  std::uint32_t delay_one_in = 0;       // completes `delay` late
  std::uint32_t drop_one_in = 0;        // never completes until cancelled
  std::uint32_t corrupt_one_in = 0;     // kRead and accepted payloads: one bit flipped
  std::uint32_t corrupt_write_one_in = 0;  // kWrite: one bit of what the peer gets flipped
  // kWrite entries shorter than this are never corrupted (0: any length), so
  // a test can aim at one kind of push (a daemon's later layer groups, say).
  std::uint64_t corrupt_write_min_bytes = 0;
  // Status code of injected failures. Unavailable mimics a dead peer.
  StatusCode fail_code = StatusCode::kUnavailable;
  // Extra latency of delayed entries. Keep it well below test deadlines.
  std::chrono::milliseconds delay{20};
};

struct FaultInjectionOptions {
  // Seeds the fault draws (tests pass TestSeed(...)).
  std::uint64_t seed = 0;
  FaultRates rates;
};

// Counts since construction.
struct FaultInjectionCounters {
  std::uint64_t entries = 0;       // entries accepted by Submit
  std::uint64_t failed = 0;        // fail
  std::uint64_t failed_after = 0;  // fail_after
  std::uint64_t delayed = 0;       // delay
  std::uint64_t dropped = 0;       // drop
  std::uint64_t corrupted = 0;     // corrupt (reads and accepted payloads)
  std::uint64_t corrupted_writes = 0;  // corrupt_write
  std::uint64_t messages = 0;      // incoming messages handed to the handler
};

namespace fault_injection_internal {
struct Shared;
}  // namespace fault_injection_internal

class FaultInjectionTransport final : public Transport {
 public:
  // REQUIRES: base != nullptr.
  FaultInjectionTransport(std::unique_ptr<Transport> base, const FaultInjectionOptions& options);
  ~FaultInjectionTransport() override;

  FaultInjectionTransport(const FaultInjectionTransport&) = delete;
  FaultInjectionTransport& operator=(const FaultInjectionTransport&) = delete;

  // Changes the rates for entries submitted from now on.
  void SetRates(const FaultRates& rates);
  FaultInjectionCounters counters() const;
  // The wrapped transport (for test hooks such as LoopbackTransport's stall).
  Transport* base() const { return base_.get(); }

  std::string name() const override;
  StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(std::span<std::byte> bytes,
                                                         MemoryKind kind) override;
  StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(std::uint64_t size,
                                                         MemoryKind kind) override;
  void SetMessageHandler(MessageHandler handler) override;
  Status Listen(const std::string& address, AcceptHandler on_accept) override;
  std::string listen_address() const override { return base_->listen_address(); }
  StatusOr<std::unique_ptr<Endpoint>> Connect(const std::string& address, PeerFailureMode mode,
                                              Deadline deadline) override;

 private:
  std::shared_ptr<fault_injection_internal::Shared> shared_;
  std::unique_ptr<Transport> base_;
};

}  // namespace kvfabric::transport

#endif  // KVFABRIC_TRANSPORT_TESTING_FAULT_INJECTION_TRANSPORT_H_
