// IoEngine: how the NVMe tier moves bytes between memory and its segment files.
// Two implementations sit behind this one interface:
//  - the thread-pool engine (NewThreadPoolIoEngine): pread/pwrite/fdatasync
//    through an Env's RandomRWFile, spread over a few worker threads. It goes
//    through the Env, so tests can swap in FaultInjectionEnv;
//  - the io_uring engine (server/cache_host/uring_io_engine.h, built where
//    liburing is): submits a batch to a ring and reaps the completions. It
//    opens files with open(2) itself, so it cannot go through an Env.
//
// The shape is submit-a-batch-and-wait: Run() takes a batch of requests,
// executes them in no particular order (possibly in parallel) and returns once
// every one has finished, each with its own Status. A caller that needs order
// (writes before the fdatasync that covers them) issues two batches.
//
// Ownership: an engine owns its threads or rings. Files it opens are owned by
// the caller (std::unique_ptr<IoFile>) and must not outlive the engine.
// Thread safety: Open and Run may be called from any number of threads at once;
// requests of concurrent batches follow RandomRWFile's rules (distinct offsets).
#ifndef KVFABRIC_SERVER_CACHE_HOST_IO_ENGINE_H_
#define KVFABRIC_SERVER_CACHE_HOST_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/env.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::cache_host {

// A file opened by an IoEngine; only that engine can execute requests on it.
class IoFile {
 public:
  IoFile() = default;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;
  // Closes the file (an error from that close is dropped).
  virtual ~IoFile() = default;

  // The current size of the file in bytes.
  virtual StatusOr<uint64_t> Size() = 0;
};

// One operation of a batch. The caller fills the inputs; Run fills the outputs.
struct IoRequest {
  enum class Op : uint8_t { kRead, kWrite, kSync };

  Op op = Op::kRead;
  IoFile* file = nullptr;  // borrowed; REQUIRES: opened by the engine that runs it
  uint64_t offset = 0;     // kRead, kWrite
  // kRead: where the bytes go; kWrite: the bytes to write (not modified); kSync:
  // unused. With direct I/O the address, size and offset must be aligned.
  std::span<std::byte> buffer;

  // Outputs. kRead: bytes read (short only at end of file); kWrite: buffer.size()
  // when OK.
  Status status;
  size_t bytes_done = 0;
};

class IoEngine {
 public:
  IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;
  virtual ~IoEngine() = default;

  // "threads" or "io_uring", for logs and stats.
  virtual std::string_view name() const = 0;

  // Opens the file at `path` with the given options (see FileOptions).
  virtual StatusOr<std::unique_ptr<IoFile>> Open(const std::string& path,
                                                 const FileOptions& options) = 0;

  // Executes every request and returns when all have finished. Never fails as a
  // whole: each request carries its own status.
  // REQUIRES: no two requests of the batch overlap if either writes.
  virtual void Run(std::span<IoRequest> requests) = 0;
};

// Which engine NvmeTierOptions asks for.
enum class IoEngineKind : uint8_t {
  kAuto,     // io_uring when built in and ProbeIoUring() says it works, else threads
  kUring,    // io_uring, or fail if unavailable
  kThreads,  // pread/pwrite thread pool over an Env
};

// "auto", "uring", "threads".
std::string_view IoEngineKindName(IoEngineKind kind);
// Parses the names above; InvalidArgument lists the valid ones.
StatusOr<IoEngineKind> ParseIoEngineKind(std::string_view name);

// A pread/pwrite engine over `env` with `threads` worker threads; the calling
// thread of Run() works too, so a batch of one runs inline without a hand-off.
// REQUIRES: env outlives the engine; threads >= 0.
std::unique_ptr<IoEngine> NewThreadPoolIoEngine(Env* env, int threads);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_IO_ENGINE_H_
