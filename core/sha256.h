// Sha256: an incremental SHA-256 hasher over libcrypto (OpenSSL's EVP API), and
// StatusFromOpenSsl, the one conversion of a libcrypto failure to a Status.
//
// Nothing else in kvfabric calls EVP_* or ERR_* directly: code that needs a
// SHA-256 (block keys, model fingerprints) hashes through this file, so the
// error conversion and the digest-context lifetime live in one place.
//
// Usage:
//   KVF_ASSIGN_OR_RETURN(Sha256 hasher, Sha256::Create());
//   hasher.Update(header);
//   hasher.Update(payload.data(), payload.size());
//   KVF_ASSIGN_OR_RETURN(Sha256Digest digest, hasher.Finish());
// or, for a message already in one buffer, Sha256Of(bytes).
//
// A Sha256 owns one EVP_MD_CTX (freed by its destructor); it is movable, not
// copyable. Update() returns nothing: the first libcrypto failure is remembered
// and every later Update() is skipped, and Finish() reports it. Finish() resets
// the hasher, so one Sha256 may hash many messages in turn without allocating.
//
// Thread safety: one Sha256 must not be used by two threads at once; distinct
// objects may be used concurrently. Sha256Of and StatusFromOpenSsl may be called
// from any thread (libcrypto's error queue is per thread).
#ifndef KVFABRIC_CORE_SHA256_H_
#define KVFABRIC_CORE_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "core/status.h"
#include "core/statusor.h"

// libcrypto's EVP_MD_CTX (openssl/types.h), declared here so that this header
// does not pull OpenSSL into every includer.
struct evp_md_ctx_st;

namespace kvfabric {

inline constexpr std::size_t kSha256DigestSize = 32;
using Sha256Digest = std::array<std::uint8_t, kSha256DigestSize>;

// The one conversion of a libcrypto failure to a Status. Call it right after a
// libcrypto call reported failure, on the same thread. Returns Internal with the
// message "<context> failed: <ERR_error_string_n text of the earliest queued
// error>", or "<context> failed: no OpenSSL error queued" if the queue is empty.
// Clears this thread's error queue, so a stale entry never explains a later
// failure.
Status StatusFromOpenSsl(std::string_view context);

class Sha256 {
 public:
  // A hasher ready for the first Update(). Internal if libcrypto cannot
  // allocate or initialise a digest context.
  static StatusOr<Sha256> Create();

  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  // Appends bytes to the message. An empty input is a no-op.
  // REQUIRES: *this was not moved from.
  void Update(std::span<const std::byte> data);
  // REQUIRES: data points to size readable bytes (data may be null if size == 0).
  void Update(const void* data, std::size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }

  // The digest of everything passed to Update() since Create() or the previous
  // Finish(); the hasher then starts a new, empty message. Internal if any
  // libcrypto call on this hasher has failed (that failure is reported again
  // by every later Finish(): a failed hasher is not reused).
  // REQUIRES: *this was not moved from.
  StatusOr<Sha256Digest> Finish();

 private:
  struct CtxDeleter {
    void operator()(evp_md_ctx_st* ctx) const;
  };

  explicit Sha256(std::unique_ptr<evp_md_ctx_st, CtxDeleter> ctx) : ctx_(std::move(ctx)) {}

  // Starts a new message on ctx_; records a failure in status_.
  void Init();

  std::unique_ptr<evp_md_ctx_st, CtxDeleter> ctx_;
  // The first libcrypto failure on this hasher; OK until then.
  Status status_;
};

// SHA-256 of one buffer. Internal if libcrypto fails.
StatusOr<Sha256Digest> Sha256Of(std::span<const std::byte> data);
// REQUIRES: data points to size readable bytes (data may be null if size == 0).
StatusOr<Sha256Digest> Sha256Of(const void* data, std::size_t size);
inline StatusOr<Sha256Digest> Sha256Of(std::string_view data) {
  return Sha256Of(data.data(), data.size());
}

// HMAC-SHA256 of `data` under `key` (RFC 2104). Internal if libcrypto fails.
StatusOr<Sha256Digest> HmacSha256(std::span<const std::uint8_t> key, std::string_view data);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_SHA256_H_
