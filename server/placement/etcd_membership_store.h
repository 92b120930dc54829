// EtcdMembershipStore: MembershipStore (membership_store.h) over etcd v3, so
// that every placement replica sees the same members and configuration.
//
// Layout under Options::prefix (default "/kvfabric/v1/"):
//   <prefix>members/<host_id>  EncodeMemberRecord JSON, attached to the
//                              member's lease: when the lease expires or is
//                              revoked, etcd deletes the key.
//   <prefix>config/<key>       configuration values.
//
// Operations:
//   Join          lease grant (TTL rounded up to whole seconds) + put; if the
//                 stored record of that host_id was under another lease, that
//                 lease is revoked afterwards (best effort: it expires anyway).
//   KeepAlive     lease keep-alive (a reply without TTL: NotFound); with a
//                 record, a txn that puts it only if the key is still under
//                 this lease. Otherwise NotFound: the record expired, a newer
//                 incarnation replaced it, or (a caller bug the memory store
//                 reports as InvalidArgument) the record names another host.
//   Leave         lease revoke; NotFound counts as done.
//   List          a range over <prefix>members/; a value that does not decode
//                 (or names another host_id than its key) is skipped and
//                 logged.
//   CompareAndSwap  a txn: value == expected, or create_revision == 0 for
//                 "absent".
//   Watch         on first use: a range of the members (remembered as "known"),
//                 then an etcd watch from the next revision. PUT events become
//                 kJoined / kUpdated by comparing with the known record
//                 (ClassifyMemberChange), DELETE events kLeft with the known
//                 record. If the watch breaks (etcd restarted, compaction,
//                 network), a store thread re-lists every
//                 Options::watch_retry_interval until it succeeds, reports the
//                 difference from the known records as events, and watches
//                 again, so watchers converge on etcd's state without gaps.
//
// Threads: every method may be called from any thread. Watch callbacks run on
// the etcd watch's reader thread or on the store's re-watch thread, one at a
// time and in order; when Watch() returns, the previous watcher is not running
// and will not be called again. Destroying the store stops both threads.
//
// Ownership: the store owns its EtcdClient and threads.
#ifndef KVFABRIC_SERVER_PLACEMENT_ETCD_MEMBERSHIP_STORE_H_
#define KVFABRIC_SERVER_PLACEMENT_ETCD_MEMBERSHIP_STORE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/placement/etcd_client.h"
#include "server/placement/membership_store.h"

namespace kvfabric::placement {

struct EtcdMembershipStoreOptions {
  // Client URLs of the etcd cluster's members, comma-separated
  // (EtcdClientOptions::endpoint).
  std::string endpoint = "http://127.0.0.1:2379";
  // TLS for https:// members (EtcdClientOptions::tls).
  GrpcSecurityOptions tls;

  // Key prefix of everything this store writes; must end with '/'. Default
  // "/kvfabric/v1/". Clusters sharing one etcd use different prefixes.
  std::string prefix = "/kvfabric/v1/";

  // Longest wait between attempts to reconnect to an etcd member. Default
  // 1 s (EtcdClientOptions).
  std::chrono::milliseconds max_reconnect_backoff{1000};

  // Bound on one etcd call. Default 5 s (EtcdClientOptions). A store call
  // makes at most three etcd calls (Join: range, grant, put, then a revoke).
  std::chrono::milliseconds request_timeout{5000};

  // Wait between attempts to re-establish a broken watch. Default 1 s:
  // watchers hear of changes at most about this much later than they would
  // have, and a down etcd sees one range call per interval per replica.
  std::chrono::milliseconds watch_retry_interval{1000};
};

class EtcdMembershipStore final : public MembershipStore {
 public:
  // InvalidArgument for bad options (endpoint, prefix, non-positive times).
  // Does not contact etcd: the first call does.
  static StatusOr<std::unique_ptr<EtcdMembershipStore>> Create(
      const EtcdMembershipStoreOptions& options);

  EtcdMembershipStore(const EtcdMembershipStore&) = delete;
  EtcdMembershipStore& operator=(const EtcdMembershipStore&) = delete;
  ~EtcdMembershipStore() override;

  std::string name() const override { return "etcd(" + options_.endpoint + ")"; }
  StatusOr<std::uint64_t> Join(const MemberRecord& record, std::chrono::milliseconds ttl) override;
  Status KeepAlive(std::uint64_t lease_id, const MemberRecord* updated) override;
  Status Leave(std::uint64_t lease_id) override;
  StatusOr<std::vector<Member>> List() override;
  void Watch(MemberWatcher watcher) override;
  StatusOr<std::optional<std::string>> Get(const std::string& key) override;
  StatusOr<bool> CompareAndSwap(const std::string& key, const std::optional<std::string>& expected,
                                const std::string& value) override;

 private:
  EtcdMembershipStore(const EtcdMembershipStoreOptions& options,
                      std::unique_ptr<EtcdClient> client);

  std::string MemberKey(const std::string& host_id) const;
  // Decodes a members/ key-value; nullopt (logged) if it does not decode.
  std::optional<MemberRecord> DecodeMember(const EtcdKeyValue& kv) const;

  // Lists the members, makes them known_ (reporting the difference from the
  // previous known_ to the watcher, except for the first listing), and starts
  // watch_ from the listed revision + 1.
  // REQUIRES: called by the thread that owns watch_ (see below).
  Status Rewatch();
  void OnEvent(const EtcdEvent& event);
  void OnWatchEnd(const Status& status);
  void RewatchLoop();
  // As MemoryMembershipStore::Notify: takes watcher_mu_ before releasing
  // `held` (a lock on mu_) so events keep their order.
  void Notify(MutexLock& held, const std::vector<MemberEvent>& events) KVF_RELEASE(mu_);

  const EtcdMembershipStoreOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  const std::string members_prefix_;  // <prefix>members/
  const std::string config_prefix_;   // <prefix>config/

  Mutex mu_;
  CondVar cv_;
  bool watch_started_ KVF_GUARDED_BY(mu_) = false;
  bool listed_ KVF_GUARDED_BY(mu_) = false;  // known_ is valid
  bool watch_broken_ KVF_GUARDED_BY(mu_) = false;
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  std::map<std::string, MemberRecord> known_ KVF_GUARDED_BY(mu_);  // what watchers were told
  // Owned by the first Watch() call until it starts rewatch_thread_, then by
  // that thread, then by the destructor after joining it.
  std::unique_ptr<EtcdWatch> watch_;
  std::thread rewatch_thread_;

  Mutex watcher_mu_ KVF_ACQUIRED_AFTER(mu_);  // after mu_ when both are held
  MemberWatcher watcher_ KVF_GUARDED_BY(watcher_mu_);
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_ETCD_MEMBERSHIP_STORE_H_
