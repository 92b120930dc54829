#include "core/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>

namespace kvfabric {

Status StatusFromOpenSsl(std::string_view context) {
  std::string msg(context);
  msg += " failed: ";
  // The earliest entry is the root cause; later ones are usually wrappers.
  const unsigned long err = ERR_get_error();  // NOLINT(runtime/int): libcrypto's type
  if (err == 0) {
    msg += "no OpenSSL error queued";
  } else {
    char buf[256];
    ERR_error_string_n(err, buf, sizeof(buf));
    msg += buf;
  }
  ERR_clear_error();
  return Status::Internal(msg);
}

void Sha256::CtxDeleter::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

StatusOr<Sha256> Sha256::Create() {
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr) return StatusFromOpenSsl("EVP_MD_CTX_new");
  Sha256 hasher(std::move(ctx));
  hasher.Init();
  if (!hasher.status_.ok()) return hasher.status_;
  return hasher;
}

Sha256::Sha256(Sha256&& other) noexcept = default;
Sha256& Sha256::operator=(Sha256&& other) noexcept = default;
Sha256::~Sha256() = default;

void Sha256::Init() {
  if (EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) {
    status_ = StatusFromOpenSsl("EVP_DigestInit_ex(SHA-256)");
  }
}

void Sha256::Update(std::span<const std::byte> data) { Update(data.data(), data.size()); }

void Sha256::Update(const void* data, std::size_t size) {
  if (!status_.ok() || size == 0) return;
  if (ctx_ == nullptr) {
    status_ = Status::FailedPrecondition("Sha256::Update on a moved-from hasher");
    return;
  }
  if (EVP_DigestUpdate(ctx_.get(), data, size) != 1) {
    status_ = StatusFromOpenSsl("EVP_DigestUpdate(SHA-256)");
  }
}

StatusOr<Sha256Digest> Sha256::Finish() {
  if (!status_.ok()) return status_;
  if (ctx_ == nullptr) return Status::FailedPrecondition("Sha256::Finish on a moved-from hasher");
  Sha256Digest digest;
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_.get(), digest.data(), &len) != 1) {
    status_ = StatusFromOpenSsl("EVP_DigestFinal_ex(SHA-256)");
    return status_;
  }
  if (len != digest.size()) {
    status_ = Status::Internal("SHA-256 returned " + std::to_string(len) + " bytes, expected " +
                               std::to_string(digest.size()));
    return status_;
  }
  // Ready for the next message; a failure here surfaces at the next Finish().
  Init();
  return digest;
}

StatusOr<Sha256Digest> Sha256Of(std::span<const std::byte> data) {
  return Sha256Of(data.data(), data.size());
}

StatusOr<Sha256Digest> Sha256Of(const void* data, std::size_t size) {
  Sha256Digest digest;
  unsigned int len = 0;
  if (EVP_Digest(data, size, digest.data(), &len, EVP_sha256(), nullptr) != 1) {
    return StatusFromOpenSsl("EVP_Digest(SHA-256)");
  }
  if (len != digest.size()) {
    return Status::Internal("SHA-256 returned " + std::to_string(len) + " bytes, expected " +
                            std::to_string(digest.size()));
  }
  return digest;
}

StatusOr<Sha256Digest> HmacSha256(std::span<const std::uint8_t> key, std::string_view data) {
  Sha256Digest digest;
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data(),
           &len) == nullptr) {
    return StatusFromOpenSsl("HMAC(SHA-256)");
  }
  if (len != digest.size()) {
    return Status::Internal("HMAC-SHA-256 returned " + std::to_string(len) + " bytes");
  }
  return digest;
}

}  // namespace kvfabric
