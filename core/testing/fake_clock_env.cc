#include "core/testing/fake_clock_env.h"

namespace kvfabric {

StatusOr<std::unique_ptr<RandomRWFile>> FakeClockEnv::NewRandomRWFile(
    const std::string& path, const FileOptions& options) {
  return base_->NewRandomRWFile(path, options);
}
bool FakeClockEnv::FileExists(const std::string& path) { return base_->FileExists(path); }
StatusOr<std::vector<std::string>> FakeClockEnv::GetChildren(const std::string& dir) {
  return base_->GetChildren(dir);
}
Status FakeClockEnv::CreateDirIfMissing(const std::string& dir) {
  return base_->CreateDirIfMissing(dir);
}
Status FakeClockEnv::DeleteFile(const std::string& path) { return base_->DeleteFile(path); }
Status FakeClockEnv::DeleteDir(const std::string& dir) { return base_->DeleteDir(dir); }
Status FakeClockEnv::RenameFile(const std::string& src, const std::string& target) {
  return base_->RenameFile(src, target);
}
StatusOr<uint64_t> FakeClockEnv::GetFileSize(const std::string& path) {
  return base_->GetFileSize(path);
}
Status FakeClockEnv::SyncDir(const std::string& dir) { return base_->SyncDir(dir); }

}  // namespace kvfabric
