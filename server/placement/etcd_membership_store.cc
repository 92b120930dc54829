#include "server/placement/etcd_membership_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "core/mutex.h"

namespace kvfabric::placement {

StatusOr<std::unique_ptr<EtcdMembershipStore>> EtcdMembershipStore::Create(
    const EtcdMembershipStoreOptions& options) {
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return Status::InvalidArgument("etcd membership prefix \"" + options.prefix +
                                   "\": must be non-empty and end with '/'");
  }
  if (options.watch_retry_interval.count() <= 0) {
    return Status::InvalidArgument("etcd membership watch_retry_interval " +
                                   std::to_string(options.watch_retry_interval.count()) +
                                   " ms: must be > 0");
  }
  EtcdClientOptions client_options;
  client_options.endpoint = options.endpoint;
  client_options.tls = options.tls;
  client_options.max_reconnect_backoff = options.max_reconnect_backoff;
  client_options.request_timeout = options.request_timeout;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(client_options));
  return std::unique_ptr<EtcdMembershipStore>(new EtcdMembershipStore(options, std::move(client)));
}

EtcdMembershipStore::EtcdMembershipStore(const EtcdMembershipStoreOptions& options,
                                         std::unique_ptr<EtcdClient> client)
    : options_(options),
      client_(std::move(client)),
      members_prefix_(options.prefix + "members/"),
      config_prefix_(options.prefix + "config/") {}

EtcdMembershipStore::~EtcdMembershipStore() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (rewatch_thread_.joinable()) rewatch_thread_.join();
  watch_.reset();  // cancels the stream and joins its reader
}

std::string EtcdMembershipStore::MemberKey(const std::string& host_id) const {
  return members_prefix_ + host_id;
}

std::optional<MemberRecord> EtcdMembershipStore::DecodeMember(const EtcdKeyValue& kv) const {
  const std::string host_id = kv.key.substr(std::min(kv.key.size(), members_prefix_.size()));
  StatusOr<MemberRecord> record = DecodeMemberRecord(kv.value);
  if (!record.ok()) {
    spdlog::warn("membership {}: skipping the record at {}: {}", name(), kv.key,
                 record.status().ToString());
    return std::nullopt;
  }
  if (record->host_id != host_id) {
    spdlog::warn("membership {}: skipping the record at {}: it names host_id \"{}\"", name(),
                 kv.key, record->host_id);
    return std::nullopt;
  }
  return *std::move(record);
}

// ---- Members ----

StatusOr<std::uint64_t> EtcdMembershipStore::Join(const MemberRecord& record,
                                                  std::chrono::milliseconds ttl) {
  KVF_RETURN_IF_ERROR(ValidateMemberRecord(record));
  KVF_RETURN_IF_ERROR(ValidateMemberTtl(ttl));
  const std::int64_t ttl_seconds = (ttl.count() + 999) / 1000;  // etcd leases are whole seconds
  const std::string key = MemberKey(record.host_id);
  KVF_ASSIGN_OR_RETURN(const EtcdRangeResult old, client_->Range(key));
  KVF_ASSIGN_OR_RETURN(const EtcdLease lease, client_->LeaseGrant(ttl_seconds));
  const Status put = client_->Put(key, EncodeMemberRecord(record), lease.id).status();
  if (!put.ok()) {
    // The new lease holds nothing; revoking it is tidiness (it would expire).
    client_->LeaseRevoke(lease.id).IgnoreError();
    return put;
  }
  if (!old.kvs.empty() && old.kvs[0].lease != 0 && old.kvs[0].lease != lease.id) {
    // The previous incarnation's lease now holds no key; end it so its
    // KeepAlive fails at once instead of renewing an orphan.
    const Status revoke = client_->LeaseRevoke(old.kvs[0].lease);
    if (!revoke.ok() && !revoke.IsNotFound()) {
      spdlog::warn(
          "membership {}: host_id \"{}\" rejoined; revoking its old lease {} failed "
          "(it expires on its own): {}",
          name(), record.host_id, old.kvs[0].lease, revoke.ToString());
    }
  }
  return static_cast<std::uint64_t>(lease.id);
}

Status EtcdMembershipStore::KeepAlive(std::uint64_t lease_id, const MemberRecord* updated) {
  if (updated != nullptr) KVF_RETURN_IF_ERROR(ValidateMemberRecord(*updated));
  if (lease_id == 0 || lease_id > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " is not an etcd lease id");
  }
  const auto id = static_cast<std::int64_t>(lease_id);
  KVF_RETURN_IF_ERROR(client_->LeaseKeepAlive(id).status());
  if (updated == nullptr) return Status::OK();
  const std::string key = MemberKey(updated->host_id);
  EtcdCompare held_by_lease;
  held_by_lease.key = key;
  held_by_lease.target = EtcdCompare::Target::kLease;
  held_by_lease.number = id;
  EtcdOp put;
  put.key = key;
  put.value = EncodeMemberRecord(*updated);
  put.lease = id;
  EtcdTxn txn;
  txn.compare.push_back(held_by_lease);
  txn.success.push_back(put);
  KVF_ASSIGN_OR_RETURN(const EtcdTxnResult result, client_->Txn(txn));
  if (!result.succeeded) {
    return Status::NotFound("lease " + std::to_string(lease_id) + " does not hold host_id \"" +
                            updated->host_id +
                            "\"'s record (it expired, or a newer incarnation joined); the member "
                            "must Join again");
  }
  return Status::OK();
}

Status EtcdMembershipStore::Leave(std::uint64_t lease_id) {
  if (lease_id == 0 || lease_id > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    return Status::OK();  // never an etcd lease: nothing to end
  }
  const Status s = client_->LeaseRevoke(static_cast<std::int64_t>(lease_id));
  return s.IsNotFound() ? Status::OK() : s;
}

StatusOr<std::vector<Member>> EtcdMembershipStore::List() {
  KVF_ASSIGN_OR_RETURN(const EtcdRangeResult listed,
                       client_->Range(members_prefix_, EtcdPrefixRangeEnd(members_prefix_)));
  std::vector<Member> members;
  members.reserve(listed.kvs.size());
  for (const EtcdKeyValue& kv : listed.kvs) {
    std::optional<MemberRecord> record = DecodeMember(kv);
    if (record) members.push_back(Member{*std::move(record), static_cast<std::uint64_t>(kv.lease)});
  }
  // etcd returns keys in byte order, which is host_id order; sort anyway so
  // the promise does not rest on the key layout.
  std::sort(members.begin(), members.end(),
            [](const Member& a, const Member& b) { return a.record.host_id < b.record.host_id; });
  return members;
}

// ---- Watch ----

void EtcdMembershipStore::Notify(MutexLock& held, const std::vector<MemberEvent>& events) {
  if (events.empty()) {
    held.Unlock(&mu_);
    return;
  }
  MutexLock watcher_lock(&watcher_mu_);
  held.Unlock(&mu_);
  if (!watcher_) return;
  for (const MemberEvent& e : events) watcher_(e);
}

void EtcdMembershipStore::Watch(MemberWatcher watcher) {
  const bool stop = !watcher;
  {
    MutexLock lock(&watcher_mu_);
    watcher_ = std::move(watcher);
  }
  {
    MutexLock lock(&mu_);
    if (watch_started_ || stop) return;  // an empty watcher starts nothing
    watch_started_ = true;
  }
  // The first watch is set up here, so that every change after Watch()
  // returns is reported; the members already there are known, not news.
  const Status s = Rewatch();
  if (!s.ok()) {
    spdlog::warn("membership {}: cannot watch members yet (retrying every {} ms): {}", name(),
                 options_.watch_retry_interval.count(), s.ToString());
    MutexLock lock(&mu_);
    watch_broken_ = true;
  }
  rewatch_thread_ = std::thread([this] { RewatchLoop(); });
}

Status EtcdMembershipStore::Rewatch() {
  watch_.reset();  // no event of the old stream arrives after this
  const std::string range_end = EtcdPrefixRangeEnd(members_prefix_);
  KVF_ASSIGN_OR_RETURN(const EtcdRangeResult listed, client_->Range(members_prefix_, range_end));
  std::map<std::string, MemberRecord> current;
  for (const EtcdKeyValue& kv : listed.kvs) {
    if (std::optional<MemberRecord> record = DecodeMember(kv)) {
      current[record->host_id] = *std::move(record);
    }
  }
  MutexLock lock(&mu_);
  std::vector<MemberEvent> events;
  if (listed_) {  // the first listing is the starting point, not news
    for (const auto& [host_id, record] : known_) {
      if (current.count(host_id) == 0) events.push_back({MemberEventKind::kLeft, record});
    }
    for (const auto& [host_id, record] : current) {
      const auto it = known_.find(host_id);
      std::optional<MemberEvent> e =
          ClassifyMemberChange(it == known_.end() ? nullptr : &it->second, record);
      if (e) events.push_back(*std::move(e));
    }
  }
  known_ = std::move(current);
  listed_ = true;
  Notify(lock, events);

  EtcdWatchRequest request;
  request.key = members_prefix_;
  request.range_end = range_end;
  request.start_revision = listed.revision + 1;
  KVF_ASSIGN_OR_RETURN(watch_, client_->Watch(
                                   request, [this](const EtcdEvent& e) { OnEvent(e); },
                                   [this](const Status& s) { OnWatchEnd(s); }));
  return Status::OK();
}

void EtcdMembershipStore::OnEvent(const EtcdEvent& event) {
  if (event.kv.key.compare(0, members_prefix_.size(), members_prefix_) != 0) return;
  const std::string host_id = event.kv.key.substr(members_prefix_.size());
  MutexLock lock(&mu_);
  std::vector<MemberEvent> events;
  const auto it = known_.find(host_id);
  if (event.type == EtcdEvent::Type::kPut) {
    std::optional<MemberRecord> record = DecodeMember(event.kv);
    if (!record) return;
    std::optional<MemberEvent> e =
        ClassifyMemberChange(it == known_.end() ? nullptr : &it->second, *record);
    known_[host_id] = *std::move(record);
    if (e) events.push_back(*std::move(e));
  } else if (it != known_.end()) {  // a delete of a record never reported is no news
    events.push_back({MemberEventKind::kLeft, it->second});
    known_.erase(it);
  }
  Notify(lock, events);
}

void EtcdMembershipStore::OnWatchEnd(const Status& status) {
  spdlog::warn("membership {}: member watch ended, re-listing and watching again: {}", name(),
               status.ToString());
  MutexLock lock(&mu_);
  watch_broken_ = true;
  cv_.NotifyAll();
}

void EtcdMembershipStore::RewatchLoop() {
  MutexLock lock(&mu_);
  for (;;) {
    cv_.Wait(&mu_, [this]() KVF_REQUIRES(mu_) { return stopping_ || watch_broken_; });
    if (stopping_) return;
    watch_broken_ = false;  // before Rewatch: an end of the new watch sets it again
    lock.Unlock();
    const Status s = Rewatch();
    lock.Lock();
    if (!s.ok()) {
      spdlog::warn("membership {}: re-watching members failed (next try in {} ms): {}", name(),
                   options_.watch_retry_interval.count(), s.ToString());
      watch_broken_ = true;
      cv_.WaitFor(&mu_, options_.watch_retry_interval,
                  [this]() KVF_REQUIRES(mu_) { return stopping_; });
    }
  }
}

// ---- Configuration ----

StatusOr<std::optional<std::string>> EtcdMembershipStore::Get(const std::string& key) {
  KVF_RETURN_IF_ERROR(ValidateConfigKey(key));
  KVF_ASSIGN_OR_RETURN(const EtcdRangeResult r, client_->Range(config_prefix_ + key));
  if (r.kvs.empty()) return std::optional<std::string>();
  return std::optional<std::string>(r.kvs[0].value);
}

StatusOr<bool> EtcdMembershipStore::CompareAndSwap(const std::string& key,
                                                   const std::optional<std::string>& expected,
                                                   const std::string& value) {
  KVF_RETURN_IF_ERROR(ValidateConfigEntry(key, value));
  EtcdCompare compare;
  compare.key = config_prefix_ + key;
  if (expected.has_value()) {
    compare.target = EtcdCompare::Target::kValue;
    compare.value = *expected;
  } else {
    compare.target = EtcdCompare::Target::kCreateRevision;
    compare.number = 0;  // a missing key has create_revision 0
  }
  EtcdOp put;
  put.key = compare.key;
  put.value = value;
  EtcdTxn txn;
  txn.compare.push_back(compare);
  txn.success.push_back(put);
  KVF_ASSIGN_OR_RETURN(const EtcdTxnResult result, client_->Txn(txn));
  return result.succeeded;
}

}  // namespace kvfabric::placement
