#include "server/cache_host/io_engine.h"

#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace kvfabric::cache_host {

std::string_view IoEngineKindName(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kUring:
      return "uring";
    case IoEngineKind::kThreads:
      return "threads";
  }
  return "unknown";
}

StatusOr<IoEngineKind> ParseIoEngineKind(std::string_view name) {
  if (name == "auto") return IoEngineKind::kAuto;
  if (name == "uring") return IoEngineKind::kUring;
  if (name == "threads") return IoEngineKind::kThreads;
  return Status::InvalidArgument("unknown I/O engine \"" + std::string(name) +
                                 "\": valid values are auto, uring, threads");
}

namespace {

// An Env file seen as an IoFile.
class EnvIoFile final : public IoFile {
 public:
  explicit EnvIoFile(std::unique_ptr<RandomRWFile> file) : file_(std::move(file)) {}
  StatusOr<uint64_t> Size() override { return file_->Size(); }
  RandomRWFile& file() { return *file_; }

 private:
  std::unique_ptr<RandomRWFile> file_;
};

void Execute(IoRequest& request) {
  RandomRWFile& file = static_cast<EnvIoFile*>(request.file)->file();
  request.bytes_done = 0;
  switch (request.op) {
    case IoRequest::Op::kRead: {
      StatusOr<size_t> n = file.Read(request.offset, request.buffer);
      if (n.ok()) {
        request.bytes_done = *n;
        request.status = Status::OK();
      } else {
        request.status = n.status();
      }
      return;
    }
    case IoRequest::Op::kWrite:
      request.status = file.Write(request.offset, request.buffer);
      if (request.status.ok()) request.bytes_done = request.buffer.size();
      return;
    case IoRequest::Op::kSync:
      request.status = file.Sync();
      return;
  }
  request.status = Status::InvalidArgument("unknown I/O request op");
}

// Worker threads and the caller of Run() pull requests from one queue; each
// batch counts its unfinished requests and the caller sleeps until it is zero.
class ThreadPoolIoEngine final : public IoEngine {
 public:
  ThreadPoolIoEngine(Env* env, int threads) : env_(env) {
    workers_.reserve(static_cast<size_t>(threads));
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~ThreadPoolIoEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    work_cv_.NotifyAll();
    for (std::thread& t : workers_) t.join();
  }

  std::string_view name() const override { return "threads"; }

  StatusOr<std::unique_ptr<IoFile>> Open(const std::string& path,
                                         const FileOptions& options) override {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, env_->NewRandomRWFile(path, options));
    return std::unique_ptr<IoFile>(std::make_unique<EnvIoFile>(std::move(file)));
  }

  void Run(std::span<IoRequest> requests) override {
    if (requests.empty()) return;
    if (requests.size() == 1 || workers_.empty()) {
      for (IoRequest& r : requests) Execute(r);
      return;
    }
    Batch batch;
    MutexLock lock(&mu_);
    batch.remaining = requests.size();
    for (IoRequest& r : requests) queue_.push_back({&r, &batch});
    work_cv_.NotifyAll();
    // Help with the queue (any batch's requests) until it is empty, then wait
    // for the requests that workers still hold.
    while (batch.remaining > 0) {
      if (!queue_.empty()) {
        Item item = queue_.front();
        queue_.pop_front();
        lock.Unlock();
        Execute(*item.request);
        lock.Lock();
        FinishLocked(item);
      } else {
        batch.done.Wait(&mu_);
      }
    }
  }

 private:
  struct Batch {
    size_t remaining = 0;  // guarded by the engine's mu_ (the analysis cannot name it here)
    CondVar done;
  };
  struct Item {
    IoRequest* request;
    Batch* batch;
  };

  void FinishLocked(const Item& item) KVF_REQUIRES(mu_) {
    // Notified under mu_: the batch lives on its caller's stack until the
    // caller, holding mu_, sees remaining == 0.
    if (--item.batch->remaining == 0) item.batch->done.NotifyAll();
  }

  void WorkerLoop() {
    MutexLock lock(&mu_);
    for (;;) {
      work_cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      Item item = queue_.front();
      queue_.pop_front();
      lock.Unlock();
      Execute(*item.request);
      lock.Lock();
      FinishLocked(item);
    }
  }

  Env* const env_;
  Mutex mu_;
  CondVar work_cv_;
  std::deque<Item> queue_ KVF_GUARDED_BY(mu_);
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> NewThreadPoolIoEngine(Env* env, int threads) {
  return std::make_unique<ThreadPoolIoEngine>(env, threads < 0 ? 0 : threads);
}

}  // namespace kvfabric::cache_host
