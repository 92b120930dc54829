#include "server/placement/etcd_client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/testing/wait_for.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "server/placement/testing/etcd_process.h"

namespace kvfabric::placement {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace pb = etcdserverpb;

EtcdWatchRequest WatchOf(const std::string& key, const std::string& range_end = "",
                         bool prev_kv = false) {
  EtcdWatchRequest request;
  request.key = key;
  request.range_end = range_end;
  request.prev_kv = prev_kv;
  return request;
}

std::unique_ptr<EtcdClient> ClientFor(const std::string& endpoint,
                                      std::chrono::milliseconds request_timeout = 2000ms,
                                      size_t max_response_bytes = 1 << 20) {
  EtcdClientOptions options;
  options.endpoint = endpoint;
  options.request_timeout = request_timeout;
  options.max_response_bytes = max_response_bytes;
  return std::move(EtcdClient::Create(options)).value();
}

// A port nothing listens on: bound, then closed.
std::string DeadEndpoint() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// ---- Pure functions ----

TEST(EtcdPrefixRangeEndTest, IncrementsTheLastByteBelowFf) {
  EXPECT_EQ(EtcdPrefixRangeEnd("/kvf/"), "/kvf0");
  EXPECT_EQ(EtcdPrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(EtcdPrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdPrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdClientTest, CreateRefusesEndpointsThatAreNotHostPort) {
  for (const char* bad : {"https://127.0.0.1:2379", "http://127.0.0.1", "http://h:0",
                          "http://h:65536", "http://:2379", "http://h:2379/v3", "unix:///tmp/s",
                          "http://[::1]2379", "http://h:+80", "h:1,,h:2", "", "h:1,http://h"}) {
    EtcdClientOptions options;
    options.endpoint = bad;
    const Status s = EtcdClient::Create(options).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << bad << ": " << s;
  }
  for (const char* good : {"http://[::1]:2379", "http://localhost:2379/", "http://10.1.2.3:1",
                           "h:2379", "http://a:1, http://b:2,c:3"}) {
    EtcdClientOptions options;
    options.endpoint = good;
    EXPECT_TRUE(EtcdClient::Create(options).ok()) << good;
  }
  EtcdClientOptions options;
  options.request_timeout = 0ms;
  EXPECT_TRUE(EtcdClient::Create(options).status().IsInvalidArgument());
}

// ---- Against a scripted etcd: the same gRPC services, answers set by tests ----

class FakeEtcd final : public pb::KV::Service,
                       public pb::Lease::Service,
                       public pb::Watch::Service {
 public:
  FakeEtcd() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(static_cast<pb::KV::Service*>(this));
    builder.RegisterService(static_cast<pb::Lease::Service*>(this));
    builder.RegisterService(static_cast<pb::Watch::Service*>(this));
    builder.SetMaxSendMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
    endpoint_ = "http://127.0.0.1:" + std::to_string(port);
  }
  ~FakeEtcd() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    server_->Shutdown(std::chrono::system_clock::now() + 2s);
  }
  const std::string& endpoint() const { return endpoint_; }

  // What the next calls answer.
  std::function<grpc::Status(const pb::RangeRequest&, pb::RangeResponse*)> on_range;
  std::function<grpc::Status(const pb::TxnRequest&, pb::TxnResponse*)> on_txn;
  grpc::Status revoke_status;
  int64_t keepalive_ttl = 0;
  std::vector<pb::WatchResponse> watch_replies;  // sent in order after the create request
  bool watch_hold = false;  // keep the watch stream open (silent) after the replies

  grpc::Status Range(grpc::ServerContext* ctx, const pb::RangeRequest* request,
                     pb::RangeResponse* reply) override {
    if (!on_range) return Silent(ctx);
    return on_range(*request, reply);
  }
  grpc::Status Txn(grpc::ServerContext*, const pb::TxnRequest* request,
                   pb::TxnResponse* reply) override {
    return on_txn(*request, reply);
  }
  grpc::Status LeaseRevoke(grpc::ServerContext*, const pb::LeaseRevokeRequest*,
                           pb::LeaseRevokeResponse*) override {
    return revoke_status;
  }
  grpc::Status LeaseKeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<pb::LeaseKeepAliveResponse, pb::LeaseKeepAliveRequest>* stream)
      override {
    pb::LeaseKeepAliveRequest request;
    while (stream->Read(&request)) {
      pb::LeaseKeepAliveResponse reply;
      reply.set_id(request.id());
      reply.set_ttl(keepalive_ttl);
      stream->Write(reply);
    }
    return grpc::Status::OK;
  }
  grpc::Status Watch(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<pb::WatchResponse, pb::WatchRequest>* stream) override {
    pb::WatchRequest request;
    if (!stream->Read(&request)) return grpc::Status::OK;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_watch_ = request;
    }
    for (const pb::WatchResponse& r : watch_replies) stream->Write(r);
    if (watch_hold) return Silent(ctx);
    return grpc::Status::OK;
  }

  pb::WatchRequest last_watch() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_watch_;
  }

 private:
  // Answers nothing until the client gives up or the server stops.
  grpc::Status Silent(grpc::ServerContext* ctx) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_ && !ctx->IsCancelled()) cv_.wait_for(lock, 20ms);
    return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
  }

  std::unique_ptr<grpc::Server> server_;
  std::string endpoint_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  pb::WatchRequest last_watch_;
};

TEST(EtcdClientTest, RangeTranslatesRequestAndReply) {
  FakeEtcd etcd;
  pb::RangeRequest seen;
  etcd.on_range = [&](const pb::RangeRequest& request, pb::RangeResponse* reply) {
    seen = request;
    reply->mutable_header()->set_revision(9);
    mvccpb::KeyValue* kv = reply->add_kvs();
    kv->set_key(std::string("a\0b", 3));
    kv->set_value("x");
    kv->set_create_revision(2);
    kv->set_mod_revision(3);
    kv->set_version(2);
    kv->set_lease(77);
    reply->set_more(true);
    reply->set_count(5);
    return grpc::Status::OK;
  };
  StatusOr<EtcdRangeResult> r = ClientFor(etcd.endpoint())->Range("k", "l", 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(seen.key(), "k");
  EXPECT_EQ(seen.range_end(), "l");
  EXPECT_EQ(seen.limit(), 1);
  EXPECT_FALSE(seen.serializable());  // linearizable: membership must not read stale
  EXPECT_EQ(r->revision, 9);
  EXPECT_TRUE(r->more);
  EXPECT_EQ(r->count, 5);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, std::string("a\0b", 3));
  EXPECT_EQ(r->kvs[0].value, "x");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 3);
  EXPECT_EQ(r->kvs[0].version, 2);
  EXPECT_EQ(r->kvs[0].lease, 77);
}

TEST(EtcdClientTest, TxnTranslatesComparesAndOps) {
  FakeEtcd etcd;
  pb::TxnRequest seen;
  etcd.on_txn = [&](const pb::TxnRequest& request, pb::TxnResponse* reply) {
    seen = request;
    reply->mutable_header()->set_revision(12);
    reply->set_succeeded(true);
    reply->add_responses()->mutable_response_put();
    reply->add_responses()->mutable_response_range()->add_kvs()->set_key("r");
    return grpc::Status::OK;
  };
  using T = EtcdCompare::Target;
  using R = EtcdCompare::Result;
  EtcdTxn txn;
  txn.compare = {{"a", T::kValue, R::kNotEqual, "v", 0},
                 {"b", T::kVersion, R::kGreater, "", 3},
                 {"c", T::kCreateRevision, R::kEqual, "", 0},
                 {"d", T::kModRevision, R::kLess, "", 7},
                 {"e", T::kLease, R::kEqual, "", 99}};
  txn.success = {{EtcdOp::Kind::kPut, "p", "pv", 5, ""}, {EtcdOp::Kind::kRange, "r", "", 0, "s"}};
  txn.failure = {{EtcdOp::Kind::kDeleteRange, "x", "", 0, "y"}};
  StatusOr<EtcdTxnResult> r = ClientFor(etcd.endpoint())->Txn(txn);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->succeeded);
  EXPECT_EQ(r->revision, 12);
  ASSERT_EQ(r->responses.size(), 2u);
  EXPECT_TRUE(r->responses[0].kvs.empty());
  ASSERT_EQ(r->responses[1].kvs.size(), 1u);
  EXPECT_EQ(r->responses[1].kvs[0].key, "r");

  ASSERT_EQ(seen.compare_size(), 5);
  EXPECT_EQ(seen.compare(0).target(), pb::Compare::VALUE);
  EXPECT_EQ(seen.compare(0).result(), pb::Compare::NOT_EQUAL);
  EXPECT_EQ(seen.compare(0).value(), "v");
  EXPECT_EQ(seen.compare(1).target(), pb::Compare::VERSION);
  EXPECT_EQ(seen.compare(1).result(), pb::Compare::GREATER);
  EXPECT_EQ(seen.compare(1).version(), 3);
  EXPECT_EQ(seen.compare(2).target(), pb::Compare::CREATE);
  // A compare against 0 must still carry its target field (etcd reads the
  // oneof case, not the value).
  EXPECT_EQ(seen.compare(2).target_union_case(), pb::Compare::kCreateRevision);
  EXPECT_EQ(seen.compare(3).target(), pb::Compare::MOD);
  EXPECT_EQ(seen.compare(3).result(), pb::Compare::LESS);
  EXPECT_EQ(seen.compare(3).mod_revision(), 7);
  EXPECT_EQ(seen.compare(4).target(), pb::Compare::LEASE);
  EXPECT_EQ(seen.compare(4).lease(), 99);
  ASSERT_EQ(seen.success_size(), 2);
  EXPECT_EQ(seen.success(0).request_put().key(), "p");
  EXPECT_EQ(seen.success(0).request_put().value(), "pv");
  EXPECT_EQ(seen.success(0).request_put().lease(), 5);
  EXPECT_EQ(seen.success(1).request_range().key(), "r");
  EXPECT_EQ(seen.success(1).request_range().range_end(), "s");
  ASSERT_EQ(seen.failure_size(), 1);
  EXPECT_EQ(seen.failure(0).request_delete_range().key(), "x");
  EXPECT_EQ(seen.failure(0).request_delete_range().range_end(), "y");
}

TEST(EtcdClientTest, MapsEtcdErrorCodes) {
  FakeEtcd etcd;
  const std::unique_ptr<EtcdClient> client = ClientFor(etcd.endpoint());
  const struct {
    grpc::StatusCode code;
    StatusCode want;
  } cases[] = {
      {grpc::StatusCode::NOT_FOUND, StatusCode::kNotFound},
      {grpc::StatusCode::INVALID_ARGUMENT, StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, StatusCode::kDeadlineExceeded},  // etcd's own
      {grpc::StatusCode::OUT_OF_RANGE, StatusCode::kOutOfRange},
      {grpc::StatusCode::UNAVAILABLE, StatusCode::kUnavailable},
      {grpc::StatusCode::PERMISSION_DENIED, StatusCode::kFailedPrecondition},
  };
  for (const auto& c : cases) {
    etcd.revoke_status = grpc::Status(c.code, "etcdserver: requested lease not found");
    const Status s = client->LeaseRevoke(42);
    EXPECT_EQ(s.code(), c.want) << s;
    EXPECT_NE(s.message().find("requested lease not found"), std::string::npos) << s;
    EXPECT_NE(s.message().find(etcd.endpoint() + " Lease.LeaseRevoke"), std::string::npos) << s;
  }
}

TEST(EtcdClientTest, RefusesAReplyOverMaxResponseBytes) {
  FakeEtcd etcd;
  etcd.on_range = [](const pb::RangeRequest&, pb::RangeResponse* reply) {
    reply->add_kvs()->set_value(std::string(2 << 20, 'v'));
    return grpc::Status::OK;
  };
  const Status s = ClientFor(etcd.endpoint(), 2000ms, 1 << 20)->Range("a").status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(etcd.endpoint()), std::string::npos) << s;
}

TEST(EtcdClientTest, SilentServerTimesOutNamingTheSetting) {
  FakeEtcd etcd;  // no on_range: Range never answers
  const auto start = Clock::now();
  const Status s = ClientFor(etcd.endpoint(), 300ms)->Range("a").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("request_timeout 300 ms"), std::string::npos) << s;
  EXPECT_LT(Clock::now() - start, 10s);
}

TEST(EtcdClientTest, ConnectionRefusedIsUnavailableNamingTheEndpoint) {
  const std::string endpoint = DeadEndpoint();
  const Status s = ClientFor(endpoint)->Range("a").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find(endpoint), std::string::npos) << s;
}

TEST(EtcdClientTest, UnavailableMemberMovesCallsToTheNextOne) {
  FakeEtcd etcd;
  etcd.on_range = [](const pb::RangeRequest&, pb::RangeResponse* reply) {
    reply->mutable_header()->set_revision(4);
    return grpc::Status::OK;
  };
  const std::string dead = DeadEndpoint();
  const std::unique_ptr<EtcdClient> client = ClientFor(dead + "," + etcd.endpoint());
  EXPECT_EQ(client->current_member(), dead);
  const Status first = client->Range("a").status();
  EXPECT_TRUE(first.IsUnavailable()) << first;
  EXPECT_NE(first.message().find(dead), std::string::npos) << first;
  EXPECT_EQ(client->current_member(), etcd.endpoint());
  StatusOr<EtcdRangeResult> second = client->Range("a");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->revision, 4);
  // An error etcd answered is not the member's failure: calls stay.
  etcd.revoke_status = grpc::Status(grpc::StatusCode::NOT_FOUND, "no lease");
  EXPECT_TRUE(client->LeaseRevoke(1).IsNotFound());
  EXPECT_EQ(client->current_member(), etcd.endpoint());
}

TEST(EtcdClientTest, KeepAliveWithoutTtlIsNotFound) {
  FakeEtcd etcd;
  etcd.keepalive_ttl = 0;
  EXPECT_TRUE(ClientFor(etcd.endpoint())->LeaseKeepAlive(5).status().IsNotFound());
  etcd.keepalive_ttl = 7;
  EXPECT_EQ(ClientFor(etcd.endpoint())->LeaseKeepAlive(5).value(), 7);
}

pb::WatchResponse Created(int64_t revision) {
  pb::WatchResponse r;
  r.mutable_header()->set_revision(revision);
  r.set_created(true);
  return r;
}

TEST(EtcdClientTest, WatchDeliversEventsInOrderAndReportsItsEnd) {
  FakeEtcd etcd;
  pb::WatchResponse events;
  events.mutable_header()->set_revision(11);
  mvccpb::Event* put = events.add_events();
  put->mutable_kv()->set_key("w1");
  put->mutable_kv()->set_value("{}");
  put->mutable_kv()->set_mod_revision(11);
  mvccpb::Event* del = events.add_events();
  del->set_type(mvccpb::Event::DELETE);
  del->mutable_kv()->set_key("w2");
  del->mutable_prev_kv()->set_value("old");
  etcd.watch_replies = {Created(10), events};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<EtcdEvent> seen;
  std::optional<Status> end;
  StatusOr<std::unique_ptr<EtcdWatch>> watch = ClientFor(etcd.endpoint())
                                                   ->Watch(
                                                       WatchOf("w", "x", /*prev_kv=*/true),
                                                       [&](const EtcdEvent& e) {
                                                         std::lock_guard<std::mutex> lock(mu);
                                                         seen.push_back(e);
                                                       },
                                                       [&](const Status& s) {
                                                         std::lock_guard<std::mutex> lock(mu);
                                                         end = s;
                                                         cv.notify_all();
                                                       });
  ASSERT_TRUE(watch.ok()) << watch.status();
  EXPECT_EQ((*watch)->created_revision(), 10);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return end.has_value(); }));
  EXPECT_TRUE(end->IsUnavailable()) << *end;  // the fake ended the stream
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(seen[0].kv.key, "w1");
  EXPECT_EQ(seen[0].kv.value, "{}");
  EXPECT_EQ(seen[0].kv.mod_revision, 11);
  EXPECT_FALSE(seen[0].prev_kv.has_value());
  EXPECT_EQ(seen[1].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(seen[1].kv.key, "w2");
  ASSERT_TRUE(seen[1].prev_kv.has_value());
  EXPECT_EQ(seen[1].prev_kv->value, "old");
  EXPECT_TRUE((*watch)->ended());
  const pb::WatchRequest sent = etcd.last_watch();
  EXPECT_EQ(sent.create_request().key(), "w");
  EXPECT_EQ(sent.create_request().range_end(), "x");
  EXPECT_TRUE(sent.create_request().prev_kv());
}

TEST(EtcdClientTest, WatchCancelledByEtcdIsAnError) {
  FakeEtcd etcd;
  pb::WatchResponse compacted = Created(3);
  compacted.set_canceled(true);
  compacted.set_compact_revision(8);
  etcd.watch_replies = {compacted};
  EXPECT_EQ(ClientFor(etcd.endpoint())->Watch(WatchOf("w"), nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
  pb::WatchResponse refused;
  refused.set_canceled(true);
  refused.set_cancel_reason("permission denied");
  etcd.watch_replies = {refused};
  const Status s = ClientFor(etcd.endpoint())->Watch(WatchOf("w"), nullptr, nullptr).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("permission denied"), std::string::npos) << s;
}

TEST(EtcdClientTest, UnconfirmedWatchTimesOutAndCallsNothing) {
  FakeEtcd etcd;
  etcd.watch_hold = true;  // reads the create request, never confirms
  std::atomic<int> calls{0};
  const Status s =
      ClientFor(etcd.endpoint(), 300ms)
          ->Watch(
              WatchOf("w"), [&](const EtcdEvent&) { ++calls; }, [&](const Status&) { ++calls; })
          .status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("request_timeout 300 ms"), std::string::npos) << s;
  EXPECT_EQ(calls.load(), 0);
}

// ---- Against a real etcd ----

class EtcdClientRealTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::EtcdProcess::SkipReason().empty()) return;
    StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd = testing::EtcdProcess::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(etcd).value().release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    const std::string reason = testing::EtcdProcess::SkipReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_NE(etcd_, nullptr);
    client_ = ClientFor(etcd_->endpoint());
    prefix_ =
        std::string("/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }

  static testing::EtcdProcess* etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};

testing::EtcdProcess* EtcdClientRealTest::etcd_ = nullptr;

TEST_F(EtcdClientRealTest, PutRangeAndDeleteRangeOverAPrefix) {
  const std::string binary("\0\xff\x80 value", 9);
  ASSERT_TRUE(client_->Put(prefix_ + "a", "1").ok());
  ASSERT_TRUE(client_->Put(prefix_ + "b", binary).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "c", "").ok());
  ASSERT_TRUE(client_->Put(prefix_ + "b", binary).ok());
  StatusOr<EtcdRangeResult> r = client_->Range(prefix_, EtcdPrefixRangeEnd(prefix_));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kvs.size(), 3u);
  EXPECT_EQ(r->kvs[0].key, prefix_ + "a");
  EXPECT_EQ(r->kvs[1].value, binary);
  EXPECT_EQ(r->kvs[1].version, 2);
  EXPECT_EQ(r->kvs[2].value, "");
  EXPECT_EQ(client_->Range(prefix_, EtcdPrefixRangeEnd(prefix_), 2)->kvs.size(), 2u);
  EXPECT_TRUE(client_->Range(prefix_ + "zz")->kvs.empty());
  EXPECT_EQ(client_->DeleteRange(prefix_, EtcdPrefixRangeEnd(prefix_)).value(), 3);
  EXPECT_TRUE(client_->Range(prefix_, EtcdPrefixRangeEnd(prefix_))->kvs.empty());
}

TEST_F(EtcdClientRealTest, TxnComparesValueVersionAndCreateRevision) {
  const std::string key = prefix_ + "k";
  using T = EtcdCompare::Target;
  using R = EtcdCompare::Result;
  const auto put_if = [&](T target, R result, const std::string& value, int64_t number,
                          const std::string& new_value) {
    EtcdCompare compare;
    compare.key = key;
    compare.target = target;
    compare.result = result;
    compare.value = value;
    compare.number = number;
    EtcdOp put;
    put.key = key;
    put.value = new_value;
    EtcdOp range;
    range.kind = EtcdOp::Kind::kRange;
    range.key = key;
    EtcdTxn txn;
    txn.compare = {compare};
    txn.success = {put};
    txn.failure = {range};
    return client_->Txn(txn);
  };
  StatusOr<EtcdTxnResult> r = put_if(T::kCreateRevision, R::kEqual, "", 0, "v1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->succeeded);
  r = put_if(T::kCreateRevision, R::kEqual, "", 0, "v2");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->succeeded);
  ASSERT_EQ(r->responses.size(), 1u);
  ASSERT_EQ(r->responses[0].kvs.size(), 1u);
  EXPECT_EQ(r->responses[0].kvs[0].value, "v1");
  EXPECT_FALSE(put_if(T::kValue, R::kEqual, "v0", 0, "v2")->succeeded);
  EXPECT_TRUE(put_if(T::kValue, R::kEqual, "v1", 0, "v2")->succeeded);
  EXPECT_TRUE(put_if(T::kVersion, R::kEqual, "", 2, "v3")->succeeded);
  EXPECT_TRUE(put_if(T::kVersion, R::kGreater, "", 2, "v4")->succeeded);
  EXPECT_FALSE(put_if(T::kModRevision, R::kLess, "", 1, "v5")->succeeded);
  EXPECT_FALSE(put_if(T::kLease, R::kNotEqual, "", 0, "v5")->succeeded);
  EXPECT_EQ(client_->Range(key)->kvs[0].value, "v4");
}

TEST_F(EtcdClientRealTest, LeaseWithoutKeepAliveExpiresWithItsKeys) {
  StatusOr<EtcdLease> lease = client_->LeaseGrant(1);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put(prefix_ + "k", "v", lease->id).ok());
  StatusOr<EtcdRangeResult> r = client_->Range(prefix_ + "k");
  ASSERT_TRUE(r.ok()) << r.status();
  if (!r->kvs.empty()) {  // it may have expired already on a loaded machine
    EXPECT_EQ(r->kvs[0].lease, lease->id);
  }
  ASSERT_TRUE(WaitFor([&] { return client_->Range(prefix_ + "k")->kvs.empty(); }, 15s,
                      "etcd to expire the 1 s lease and delete its key"));
  EXPECT_TRUE(client_->LeaseKeepAlive(lease->id).status().IsNotFound());
  EXPECT_TRUE(client_->LeaseRevoke(lease->id).IsNotFound());
  EXPECT_TRUE(client_->Put(prefix_ + "k", "v", lease->id).status().IsNotFound());
}

TEST_F(EtcdClientRealTest, KeepAliveKeepsLeaseAndRevokeEndsIt) {
  StatusOr<EtcdLease> lease = client_->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put(prefix_ + "k", "v", lease->id).ok());
  // 1.5 TTLs with keep-alives every 200 ms: the key must stay. The sleep is
  // the behaviour under test: etcd expires leases on its own clock, in another
  // process, so only keep-alives paced in real time across more than a TTL
  // show that they hold the lease.
  for (auto end = Clock::now() + 3s; Clock::now() < end;) {
    StatusOr<int64_t> ttl = client_->LeaseKeepAlive(lease->id);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, 2);
    ASSERT_EQ(client_->Range(prefix_ + "k")->kvs.size(), 1u);
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(client_->LeaseRevoke(lease->id).ok());
  EXPECT_TRUE(client_->Range(prefix_ + "k")->kvs.empty());
}

TEST_F(EtcdClientRealTest, WatchDeliversPutsDeletesAndLeaseExpiry) {
  std::mutex mu;
  std::vector<EtcdEvent> events;
  StatusOr<std::unique_ptr<EtcdWatch>> watch = client_->Watch(
      WatchOf(prefix_, EtcdPrefixRangeEnd(prefix_), /*prev_kv=*/true),
      [&](const EtcdEvent& e) {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back(e);
      },
      [](const Status& s) { ADD_FAILURE() << "watch ended: " << s; });
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->Put(prefix_ + "b", "2").ok());
  ASSERT_TRUE(client_->DeleteRange(prefix_ + "b").ok());
  StatusOr<EtcdLease> lease = client_->LeaseGrant(1);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "a", "1", lease->id).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return events.size() >= 4;
      },
      15s, "4 watch events: put, delete, put, and the delete of the lease's expiry"));
  (*watch)->Cancel();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, prefix_ + "b");
  EXPECT_EQ(events[0].kv.value, "2");
  EXPECT_GT(events[0].kv.mod_revision, (*watch)->created_revision());
  EXPECT_EQ(events[1].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(events[1].kv.key, prefix_ + "b");
  ASSERT_TRUE(events[1].prev_kv.has_value());
  EXPECT_EQ(events[1].prev_kv->value, "2");
  EXPECT_EQ(events[2].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[2].kv.key, prefix_ + "a");
  EXPECT_EQ(events[2].kv.lease, lease->id);
  EXPECT_EQ(events[3].type, EtcdEvent::Type::kDelete);  // the lease expired
  EXPECT_EQ(events[3].kv.key, prefix_ + "a");
  EXPECT_GT(events[3].kv.mod_revision, events[2].kv.mod_revision);
}

TEST_F(EtcdClientRealTest, CancelledWatchCallsNothingMore) {
  std::atomic<int> calls{0};
  StatusOr<std::unique_ptr<EtcdWatch>> watch = client_->Watch(
      WatchOf(prefix_ + "k"), [&](const EtcdEvent&) { ++calls; }, [&](const Status&) { ++calls; });
  ASSERT_TRUE(watch.ok()) << watch.status();
  (*watch)->Cancel();
  (*watch)->Cancel();
  ASSERT_TRUE(client_->Put(prefix_ + "k", "v").ok());
  watch->reset();
  EXPECT_EQ(calls.load(), 0);
}

TEST(EtcdClientKillTest, EtcdGoingAwayEndsWatchAndFailsCallsAsUnavailable) {
  const std::string reason = testing::EtcdProcess::SkipReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd = testing::EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::unique_ptr<EtcdClient> client = ClientFor((*etcd)->endpoint());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> end;
  StatusOr<std::unique_ptr<EtcdWatch>> watch = client->Watch(
      WatchOf("k"), [](const EtcdEvent&) {},
      [&](const Status& s) {
        std::lock_guard<std::mutex> lock(mu);
        end = s;
        cv.notify_all();
      });
  ASSERT_TRUE(watch.ok()) << watch.status();
  (*etcd)->Kill();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return end.has_value(); }));
    EXPECT_TRUE(end->IsUnavailable()) << *end;
  }
  const Status s = client->Put("k", "v").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find((*etcd)->endpoint()), std::string::npos) << s;
}

}  // namespace
}  // namespace kvfabric::placement
