// Helpers written against the Env interface, so they behave the same over the
// POSIX Env and over test Envs (fault injection sees every step).
#include "core/env.h"

#include <cstddef>
#include <memory>
#include <string>

namespace kvfabric {

std::string DirName(std::string_view path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" names "a/b"
  size_t slash = path.substr(0, end).rfind('/');
  if (slash == std::string_view::npos) return ".";
  while (slash > 0 && path[slash - 1] == '/') --slash;  // "a//b" -> "a"
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

namespace {

Status WriteAndSync(Env* env, std::string_view data, const std::string& path) {
  FileOptions options;
  options.create = true;
  options.truncate = true;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, env->NewRandomRWFile(path, options));
  KVF_RETURN_IF_ERROR(file->Write(0, std::as_bytes(std::span(data.data(), data.size()))));
  KVF_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

Status WriteStringToFileSync(Env* env, std::string_view data, const std::string& path) {
  const std::string tmp = path + ".tmp";
  Status s = WriteAndSync(env, data, tmp);
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    // Best effort: the error that matters is `s`; a leftover temporary file is
    // overwritten by the next attempt.
    env->DeleteFile(tmp).IgnoreError();
    return s;
  }
  return env->SyncDir(DirName(path));
}

StatusOr<std::string> ReadFileToString(Env* env, const std::string& path) {
  FileOptions options;
  options.read_only = true;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file, env->NewRandomRWFile(path, options));
  // Read to end of file rather than trusting a size taken before reading: the
  // file may grow meanwhile.
  constexpr size_t kChunk = 64 * 1024;
  std::string out;
  while (true) {
    size_t old_size = out.size();
    out.resize(old_size + kChunk);
    auto dst = std::as_writable_bytes(std::span(out.data() + old_size, kChunk));
    KVF_ASSIGN_OR_RETURN(size_t n, file->Read(old_size, dst));
    out.resize(old_size + n);
    if (n < kChunk) break;
  }
  KVF_RETURN_IF_ERROR(file->Close());
  return out;
}

}  // namespace kvfabric
