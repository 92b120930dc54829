#include "server/cache_host/io_engine.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
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
    std::unique_lock<std::mutex> lock(mu_);
    batch.remaining = requests.size();
    for (IoRequest& r : requests) queue_.push_back({&r, &batch});
    work_cv_.notify_all();
    // Help with the queue (any batch's requests) until it is empty, then wait
    // for the requests that workers still hold.
    while (batch.remaining > 0) {
      if (!queue_.empty()) {
        Item item = queue_.front();
        queue_.pop_front();
        lock.unlock();
        Execute(*item.request);
        lock.lock();
        FinishLocked(item);
      } else {
        batch.done.wait(lock);
      }
    }
  }

 private:
  struct Batch {
    size_t remaining = 0;  // guarded by mu_
    std::condition_variable done;
  };
  struct Item {
    IoRequest* request;
    Batch* batch;
  };

  void FinishLocked(const Item& item) {
    // Notified under mu_: the batch lives on its caller's stack until the
    // caller, holding mu_, sees remaining == 0.
    if (--item.batch->remaining == 0) item.batch->done.notify_all();
  }

  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      Item item = queue_.front();
      queue_.pop_front();
      lock.unlock();
      Execute(*item.request);
      lock.lock();
      FinishLocked(item);
    }
  }

  Env* const env_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> NewThreadPoolIoEngine(Env* env, int threads) {
  return std::make_unique<ThreadPoolIoEngine>(env, threads < 0 ? 0 : threads);
}

}  // namespace kvfabric::cache_host
