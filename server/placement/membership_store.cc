#include "server/placement/membership_store.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/mutex.h"
#include "core/secure_random.h"
#include "core/sha256.h"

namespace kvfabric::placement {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::uint64_t kRecordVersion = 1;
constexpr std::size_t kMaxHostIdBytes = 128;
constexpr std::size_t kMaxAddressBytes = 256;

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // truncated sequence
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr std::uint32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

Status CheckString(std::string_view field, const std::string& value, std::size_t max_bytes) {
  if (value.size() > max_bytes) {
    return Status::InvalidArgument("member record: " + std::string(field) + " is " +
                                   std::to_string(value.size()) + " bytes, at most " +
                                   std::to_string(max_bytes) + " allowed");
  }
  if (!IsValidUtf8(value)) {
    return Status::InvalidArgument("member record: " + std::string(field) + " is not valid UTF-8");
  }
  return Status::OK();
}

Status CheckFree(std::string_view what, std::uint64_t free, std::uint64_t capacity) {
  if (free > capacity) {
    return Status::InvalidArgument("member record: " + std::string(what) + "_free_bytes " +
                                   std::to_string(free) + " > " + std::string(what) +
                                   "_capacity_bytes " + std::to_string(capacity));
  }
  return Status::OK();
}

Status FieldError(const char* key, std::string_view what) {
  return Status::InvalidArgument("member record: field \"" + std::string(key) + "\" " +
                                 std::string(what));
}

// Field readers. None can throw: types are checked before get<>().
StatusOr<std::string> ReadString(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return FieldError(key, "is missing");
  if (!it->is_string()) return FieldError(key, "must be a string");
  return it->get<std::string>();
}

StatusOr<std::uint64_t> ReadUint(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return FieldError(key, "is missing");
  if (!it->is_number_unsigned()) return FieldError(key, "must be a non-negative integer");
  return it->get<std::uint64_t>();
}

StatusOr<std::uint64_t> ReadDecimalString(const Json& obj, const char* key) {
  KVF_ASSIGN_OR_RETURN(const std::string text, ReadString(obj, key));
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return FieldError(key, "must be a decimal string in [0, 2^64 - 1], got \"" + text + "\"");
  }
  return value;
}

StatusOr<bool> ReadBool(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return FieldError(key, "is missing");
  if (!it->is_boolean()) return FieldError(key, "must be true or false");
  return it->get<bool>();
}

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

std::string EncodeMemberRecord(const MemberRecord& r) {
  Json j;
  j["v"] = kRecordVersion;
  j["host_id"] = r.host_id;
  j["incarnation"] = std::to_string(r.incarnation);
  j["grpc_address"] = r.grpc_address;
  j["transport_address"] = r.transport_address;
  j["node_name"] = r.node_name;
  j["host_capacity_bytes"] = r.host_capacity_bytes;
  j["host_free_bytes"] = r.host_free_bytes;
  j["nvme_capacity_bytes"] = r.nvme_capacity_bytes;
  j["nvme_free_bytes"] = r.nvme_free_bytes;
  j["draining"] = r.draining;
  j["joined_unix_us"] = r.joined_unix_us;
  if (!r.token_digest.empty()) j["token_digest"] = r.token_digest;
  // `replace` keeps dump() from throwing on invalid UTF-8 (see the header).
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

StatusOr<MemberRecord> DecodeMemberRecord(std::string_view json) {
  if (json.size() > kMaxMemberRecordBytes) {
    return Status::InvalidArgument("member record: " + std::to_string(json.size()) +
                                   " bytes, at most " + std::to_string(kMaxMemberRecordBytes) +
                                   " allowed");
  }
  const Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("member record: not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("member record: not a JSON object");
  KVF_ASSIGN_OR_RETURN(const std::uint64_t version, ReadUint(j, "v"));
  if (version != kRecordVersion) {
    return Status::InvalidArgument("member record: unsupported version v=" +
                                   std::to_string(version) + " (this build reads v=1)");
  }
  MemberRecord r;
  KVF_ASSIGN_OR_RETURN(r.host_id, ReadString(j, "host_id"));
  KVF_ASSIGN_OR_RETURN(r.incarnation, ReadDecimalString(j, "incarnation"));
  KVF_ASSIGN_OR_RETURN(r.grpc_address, ReadString(j, "grpc_address"));
  KVF_ASSIGN_OR_RETURN(r.transport_address, ReadString(j, "transport_address"));
  KVF_ASSIGN_OR_RETURN(r.node_name, ReadString(j, "node_name"));
  KVF_ASSIGN_OR_RETURN(r.host_capacity_bytes, ReadUint(j, "host_capacity_bytes"));
  KVF_ASSIGN_OR_RETURN(r.host_free_bytes, ReadUint(j, "host_free_bytes"));
  KVF_ASSIGN_OR_RETURN(r.nvme_capacity_bytes, ReadUint(j, "nvme_capacity_bytes"));
  KVF_ASSIGN_OR_RETURN(r.nvme_free_bytes, ReadUint(j, "nvme_free_bytes"));
  KVF_ASSIGN_OR_RETURN(r.draining, ReadBool(j, "draining"));
  KVF_ASSIGN_OR_RETURN(r.joined_unix_us, ReadUint(j, "joined_unix_us"));
  if (j.contains("token_digest")) {
    KVF_ASSIGN_OR_RETURN(r.token_digest, ReadString(j, "token_digest"));
  }
  KVF_RETURN_IF_ERROR(ValidateMemberRecord(r));
  return r;
}

Status ValidateMemberRecord(const MemberRecord& r) {
  if (r.host_id.empty()) return Status::InvalidArgument("member record: host_id is empty");
  KVF_RETURN_IF_ERROR(CheckString("host_id", r.host_id, kMaxHostIdBytes));
  KVF_RETURN_IF_ERROR(CheckString("grpc_address", r.grpc_address, kMaxAddressBytes));
  KVF_RETURN_IF_ERROR(CheckString("transport_address", r.transport_address, kMaxAddressBytes));
  KVF_RETURN_IF_ERROR(CheckString("node_name", r.node_name, kMaxAddressBytes));
  KVF_RETURN_IF_ERROR(CheckFree("host", r.host_free_bytes, r.host_capacity_bytes));
  KVF_RETURN_IF_ERROR(CheckFree("nvme", r.nvme_free_bytes, r.nvme_capacity_bytes));
  if (!r.token_digest.empty() &&
      (r.token_digest.size() != 2 * kSha256DigestSize ||
       r.token_digest.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return Status::InvalidArgument("member record: token_digest is not 64 lower-case hex digits");
  }
  return Status::OK();
}

std::string NewMembershipToken() {
  std::string token(kMembershipTokenBytes, '\0');
  SecureRandomBytes(
      std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(token.data()), token.size()));
  return token;
}

std::string MembershipTokenDigest(std::string_view token) {
  const StatusOr<Sha256Digest> digest = Sha256Of(token);
  // libcrypto failing to hash 16 bytes leaves no token to check: an empty
  // result never matches a non-empty digest, and a record never gets one.
  if (!digest.ok()) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * digest->size(), '0');
  for (std::size_t i = 0; i < digest->size(); ++i) {
    hex[2 * i] = kHex[(*digest)[i] >> 4];
    hex[2 * i + 1] = kHex[(*digest)[i] & 15];
  }
  return hex;
}

bool MembershipTokenMatches(std::string_view digest, std::string_view token) {
  if (digest.empty()) return true;
  const std::string got = MembershipTokenDigest(token);
  if (got.size() != digest.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff |= static_cast<unsigned char>(got[i] ^ digest[i]);
  }
  return diff == 0;
}

Status ValidateMemberTtl(std::chrono::milliseconds ttl) {
  if (ttl < kMinMemberTtl || ttl > kMaxMemberTtl) {
    return Status::InvalidArgument("member lease TTL " + Ms(ttl) + " is outside [" +
                                   Ms(kMinMemberTtl) + ", " + Ms(kMaxMemberTtl) + "]");
  }
  return Status::OK();
}

Status ValidateConfigKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxConfigKeyBytes) {
    return Status::InvalidArgument("config key \"" + std::string(key.substr(0, 64)) + "\" is " +
                                   std::to_string(key.size()) + " bytes, want 1.." +
                                   std::to_string(kMaxConfigKeyBytes));
  }
  return Status::OK();
}

Status ValidateConfigEntry(std::string_view key, std::string_view value) {
  KVF_RETURN_IF_ERROR(ValidateConfigKey(key));
  if (value.size() > kMaxConfigValueBytes) {
    return Status::InvalidArgument("config value of \"" + std::string(key) + "\" is " +
                                   std::to_string(value.size()) + " bytes, at most " +
                                   std::to_string(kMaxConfigValueBytes) + " allowed");
  }
  return Status::OK();
}

std::optional<MemberEvent> ClassifyMemberChange(const MemberRecord* before,
                                                const MemberRecord& after) {
  if (before == nullptr || before->incarnation != after.incarnation) {
    return MemberEvent{MemberEventKind::kJoined, after};
  }
  if (*before == after) return std::nullopt;
  return MemberEvent{MemberEventKind::kUpdated, after};
}

// ---- MemoryMembershipStore ----

MemoryMembershipStore::MemoryMembershipStore(Env* env) : env_(env) {}

void MemoryMembershipStore::ExpireLocked(std::uint64_t now_us, std::vector<MemberEvent>* events) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_at_us > now_us) {
      ++it;
      continue;
    }
    const auto member = members_.find(it->second.host_id);
    if (member != members_.end() && member->second.lease_id == it->first) {
      events->push_back({MemberEventKind::kLeft, member->second.record});
      members_.erase(member);
    }
    it = leases_.erase(it);
  }
}

void MemoryMembershipStore::Notify(MutexLock& held, const std::vector<MemberEvent>& events) {
  if (events.empty()) {
    held.Unlock(&mu_);
    return;
  }
  MutexLock watcher_lock(&watcher_mu_);
  held.Unlock(&mu_);
  if (!watcher_) return;
  for (const MemberEvent& e : events) watcher_(e);
}

StatusOr<std::uint64_t> MemoryMembershipStore::Join(const MemberRecord& record,
                                                    std::chrono::milliseconds ttl) {
  KVF_RETURN_IF_ERROR(ValidateMemberRecord(record));
  KVF_RETURN_IF_ERROR(ValidateMemberTtl(ttl));
  MutexLock lock(&mu_);
  const std::uint64_t now = env_->NowMicros();
  std::vector<MemberEvent> events;
  ExpireLocked(now, &events);
  const std::uint64_t ttl_us = static_cast<std::uint64_t>(ttl.count()) * 1000;
  // Random, not sequential: a lease id is what Heartbeat (which may change a
  // member's addresses) and Deregister act on, so one member must not be able
  // to guess another's from its own.
  std::uint64_t lease_id = 0;
  while (lease_id == 0 || leases_.contains(lease_id)) lease_id = SecureRandomU64();
  leases_[lease_id] = Lease{record.host_id, ttl_us, now + ttl_us};
  auto it = members_.find(record.host_id);
  std::optional<MemberEvent> event;
  if (it == members_.end()) {
    event = ClassifyMemberChange(nullptr, record);
    members_[record.host_id] = Member{record, lease_id};
  } else {
    leases_.erase(it->second.lease_id);  // the old lease ends with the old record
    event = ClassifyMemberChange(&it->second.record, record);
    it->second = Member{record, lease_id};
  }
  if (event) events.push_back(*std::move(event));
  Notify(lock, events);
  return lease_id;
}

Status MemoryMembershipStore::KeepAlive(std::uint64_t lease_id, const MemberRecord* updated) {
  if (updated != nullptr) KVF_RETURN_IF_ERROR(ValidateMemberRecord(*updated));
  MutexLock lock(&mu_);
  const std::uint64_t now = env_->NowMicros();
  std::vector<MemberEvent> events;
  ExpireLocked(now, &events);
  Status status;
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) {
    status = Status::NotFound("lease " + std::to_string(lease_id) +
                              " is unknown or expired; the member must Join again");
  } else if (updated != nullptr && updated->host_id != lease->second.host_id) {
    status =
        Status::InvalidArgument("lease " + std::to_string(lease_id) + " belongs to host_id \"" +
                                lease->second.host_id + "\", not \"" + updated->host_id + "\"");
  } else {
    lease->second.expires_at_us = now + lease->second.ttl_us;
    if (updated != nullptr) {
      Member& member = members_[updated->host_id];
      std::optional<MemberEvent> event = ClassifyMemberChange(&member.record, *updated);
      member.record = *updated;
      if (event) events.push_back(*std::move(event));
    }
  }
  Notify(lock, events);
  return status;
}

Status MemoryMembershipStore::Leave(std::uint64_t lease_id) {
  MutexLock lock(&mu_);
  std::vector<MemberEvent> events;
  ExpireLocked(env_->NowMicros(), &events);
  auto lease = leases_.find(lease_id);
  if (lease != leases_.end()) {
    const auto member = members_.find(lease->second.host_id);
    if (member != members_.end() && member->second.lease_id == lease_id) {
      events.push_back({MemberEventKind::kLeft, member->second.record});
      members_.erase(member);
    }
    leases_.erase(lease);
  }
  Notify(lock, events);
  return Status::OK();
}

StatusOr<std::vector<Member>> MemoryMembershipStore::List() {
  MutexLock lock(&mu_);
  std::vector<MemberEvent> events;
  ExpireLocked(env_->NowMicros(), &events);
  std::vector<Member> members;
  members.reserve(members_.size());
  for (const auto& [host_id, member] : members_) members.push_back(member);  // sorted: a map
  Notify(lock, events);
  return members;
}

void MemoryMembershipStore::ExpireNow() {
  MutexLock lock(&mu_);
  std::vector<MemberEvent> events;
  ExpireLocked(env_->NowMicros(), &events);
  Notify(lock, events);
}

void MemoryMembershipStore::Watch(MemberWatcher watcher) {
  MutexLock lock(&watcher_mu_);
  watcher_ = std::move(watcher);
}

StatusOr<std::optional<std::string>> MemoryMembershipStore::Get(const std::string& key) {
  KVF_RETURN_IF_ERROR(ValidateConfigKey(key));
  MutexLock lock(&mu_);
  const auto it = config_.find(key);
  if (it == config_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

StatusOr<bool> MemoryMembershipStore::CompareAndSwap(const std::string& key,
                                                     const std::optional<std::string>& expected,
                                                     const std::string& value) {
  KVF_RETURN_IF_ERROR(ValidateConfigEntry(key, value));
  MutexLock lock(&mu_);
  const auto it = config_.find(key);
  const bool matches =
      expected.has_value() ? (it != config_.end() && it->second == *expected) : it == config_.end();
  if (!matches) return false;
  config_[key] = value;
  return true;
}

}  // namespace kvfabric::placement
