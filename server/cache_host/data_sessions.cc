#include "server/cache_host/data_sessions.h"

#include <openssl/crypto.h>

#include <cstdlib>

#include "core/secure_random.h"
#include "core/sha256.h"

namespace kvfabric::cache_host {

bool DataSessionTenant::MayUse(std::string_view ns) const {
  for (const std::string& n : namespaces) {
    if (n == "*" || n == ns) return true;
  }
  return false;
}

std::array<std::uint8_t, wire::kHelloBytes> HelloProof(
    const std::array<std::uint8_t, 32>& secret,
    const std::array<std::uint8_t, wire::kHelloBytes>& nonce, std::uint64_t session_id) {
  StatusOr<Sha256Digest> d = HmacSha256(secret, wire::HelloProofInput(nonce, session_id));
  if (!d.ok()) std::abort();  // HMAC-SHA256 does not fail; nothing safe to return instead
  return *d;
}

StatusOr<OpenedDataSession> DataSessions::Open(DataSessionTenant tenant, std::uint64_t now_us) {
  OpenedDataSession out;
  SecureRandomBytes(out.secret);
  out.expires_us = now_us + options_.ttl_us;
  MutexLock lock(&mu_);
  if (sessions_.size() >= options_.max_sessions) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      it = it->second.expires_us <= now_us ? sessions_.erase(it) : std::next(it);
    }
    if (sessions_.size() >= options_.max_sessions) {
      return Status::ResourceExhausted(std::to_string(sessions_.size()) +
                                       " data-plane sessions are open, the limit "
                                       "--max-data-sessions " +
                                       std::to_string(options_.max_sessions));
    }
  }
  do {
    out.id = SecureRandomU64();
  } while (out.id == 0 || sessions_.count(out.id) != 0);
  sessions_[out.id] = Session{out.secret, out.expires_us, std::move(tenant)};
  return out;
}

StatusOr<DataSessionTenant> DataSessions::Verify(
    std::uint64_t id, const std::array<std::uint8_t, wire::kHelloBytes>& nonce,
    const std::array<std::uint8_t, wire::kHelloBytes>& proof, std::uint64_t now_us) {
  Session s;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end() && it->second.expires_us <= now_us) {
      sessions_.erase(it);
      it = sessions_.end();
    }
    if (it != sessions_.end()) s = it->second;
  }
  // An unknown session is checked against a zero secret, so the time taken
  // does not say whether the id exists.
  const std::array<std::uint8_t, wire::kHelloBytes> want = HelloProof(s.secret, nonce, id);
  const bool match = CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
  if (!match || s.expires_us == 0) {
    return Status::PermissionDenied(
        "data-plane hello: not a live session of this daemon, or a wrong proof (open one with "
        "CacheHost.OpenDataSession)");
  }
  return std::move(s.tenant);
}

std::size_t DataSessions::size() const {
  MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace kvfabric::cache_host
