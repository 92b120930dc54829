#include "server/placement/etcd_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "core/testing/test_seed.h"
#include "core/testing/wait_for.h"
#include "server/placement/testing/etcd_process.h"

namespace kvfabric::placement {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

EtcdWatchRequest WatchOf(const std::string& key, const std::string& range_end = "",
                         bool prev_kv = false) {
  EtcdWatchRequest request;
  request.key = key;
  request.range_end = range_end;
  request.prev_kv = prev_kv;
  return request;
}

// ---- Pure functions ----

TEST(Base64Test, MatchesRfc4648Vectors) {
  const std::vector<std::pair<std::string, std::string>> vectors = {{"", ""},
                                                                    {"f", "Zg=="},
                                                                    {"fo", "Zm8="},
                                                                    {"foo", "Zm9v"},
                                                                    {"foob", "Zm9vYg=="},
                                                                    {"fooba", "Zm9vYmE="},
                                                                    {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    EXPECT_EQ(Base64Decode(encoded), std::optional<std::string>(plain)) << encoded;
  }
}

TEST(Base64Test, RandomBytesRoundTrip) {
  const uint64_t seed = TestSeed("Base64Test.RandomBytesRoundTrip");
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(rng() % 70, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    ASSERT_EQ(Base64Decode(Base64Encode(bytes)), std::optional<std::string>(bytes))
        << "seed " << seed;
  }
}

TEST(Base64Test, DecodeRejectsAnythingButCanonicalPaddedBase64) {
  for (const std::string& bad :
       std::vector<std::string>{"Zg=", "Zg", "Zh==", "Zm9=", "=Zg=", "Zg==Zg==", "Zm 9v", "Zm9v\n",
                                "Zm-v", "Zm_v", "====", "Z===", std::string("Zm\0v", 4)}) {
    EXPECT_FALSE(Base64Decode(bad).has_value()) << bad;
  }
}

TEST(EtcdPrefixRangeEndTest, IncrementsTheLastByteBelowFf) {
  EXPECT_EQ(EtcdPrefixRangeEnd("/kvf/"), "/kvf0");
  EXPECT_EQ(EtcdPrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(EtcdPrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdPrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdClientTest, CreateRefusesEndpointsThatAreNotHttpHostPort) {
  for (const char* bad :
       {"https://127.0.0.1:2379", "http://127.0.0.1", "http://h:0", "http://h:65536",
        "http://:2379", "http://h:2379/v3", "h:2379", "http://[::1]2379", "http://h:+80"}) {
    EtcdClientOptions options;
    options.endpoint = bad;
    EXPECT_TRUE(EtcdClient::Create(options).status().IsInvalidArgument()) << bad;
  }
  for (const char* good : {"http://[::1]:2379", "http://localhost:2379/", "http://10.1.2.3:1"}) {
    EtcdClientOptions options;
    options.endpoint = good;
    EXPECT_TRUE(EtcdClient::Create(options).ok()) << good;
  }
  EtcdClientOptions options;
  options.request_timeout = 0ms;
  EXPECT_TRUE(EtcdClient::Create(options).status().IsInvalidArgument());
}

// ---- Against a scripted HTTP server ----

// Accepts connections on 127.0.0.1 and answers each with `response`, written
// in pieces (split at random offsets when a seed is given), then closes.
// `hold` keeps the connection open after writing instead.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::string response, uint64_t split_seed = 0, bool hold = false)
      : response_(std::move(response)), rng_(split_seed), split_(split_seed != 0), hold_(hold) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    EXPECT_EQ(::listen(listen_fd_, 8), 0);
    endpoint_ = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
    for (int fd : held_) ::close(fd);
  }
  const std::string& endpoint() const { return endpoint_; }
  std::string last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }

 private:
  void Serve() {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_request_ = request;
      }
      for (size_t pos = 0; pos < response_.size();) {
        const size_t n = split_ ? 1 + rng_() % 7 : response_.size();
        ::send(fd, response_.data() + pos, std::min(n, response_.size() - pos), MSG_NOSIGNAL);
        pos += n;
      }
      if (hold_) {
        held_.push_back(fd);
      } else {
        ::close(fd);
      }
    }
  }

  const std::string response_;
  std::mt19937_64 rng_;
  const bool split_;
  const bool hold_;
  int listen_fd_ = -1;
  std::string endpoint_;
  std::vector<int> held_;  // touched by Serve, then by the destructor after join
  std::mutex mu_;
  std::string last_request_;
  std::thread thread_;
};

std::unique_ptr<EtcdClient> ClientFor(const std::string& endpoint,
                                      std::chrono::milliseconds request_timeout = 2000ms,
                                      size_t max_response_bytes = 1 << 20) {
  EtcdClientOptions options;
  options.endpoint = endpoint;
  options.request_timeout = request_timeout;
  options.max_response_bytes = max_response_bytes;
  return std::move(EtcdClient::Create(options)).value();
}

std::string Chunked(const std::vector<std::string>& chunks, const std::string& head_extra = "") {
  std::string r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head_extra +
                  "Transfer-Encoding: chunked\r\n\r\n";
  for (const std::string& c : chunks) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx", c.size());
    r += std::string(size) + "\r\n" + c + "\r\n";
  }
  return r + "0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n";
}

const char kRangeReply[] =
    R"({"header":{"revision":"9"},"kvs":[{"key":"YQ==","create_revision":"2",)"
    R"("mod_revision":"3","version":"2","value":"eA==","lease":"77"}],"count":"1"})";

TEST(EtcdClientTest, ParsesChunkedReplyDeliveredInRandomPieces) {
  const uint64_t seed = TestSeed("EtcdClientTest.ParsesChunkedReplyDeliveredInRandomPieces");
  const std::string body = kRangeReply;
  ScriptedServer server(Chunked({body.substr(0, 10), body.substr(10, 50), body.substr(60)}),
                        seed | 1);
  StatusOr<EtcdRangeResult> r = ClientFor(server.endpoint())->Range("a");
  ASSERT_TRUE(r.ok()) << r.status() << " seed " << seed;
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "a");
  EXPECT_EQ(r->kvs[0].value, "x");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].version, 2);
  EXPECT_EQ(r->kvs[0].lease, 77);
  EXPECT_NE(server.last_request().find("POST /v3/kv/range HTTP/1.1\r\n"), std::string::npos);
}

TEST(EtcdClientTest, RefusesMalformedOrOversizedResponses) {
  const std::string ok_head = "HTTP/1.1 200 OK\r\n";
  const auto with_length = [&](const std::string& body) {
    return ok_head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::vector<std::string> bad = {
      ok_head + "Content-Length: 2000000\r\n\r\n{}",  // over max_response_bytes
      ok_head + "Content-Length: -1\r\n\r\n{}",
      ok_head + "Content-Length: +2\r\n\r\n{}",
      ok_head + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
      ok_head + "Transfer-Encoding: gzip\r\n\r\n{}",
      ok_head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
      ok_head + "Transfer-Encoding: chunked\r\n\r\n200000\r\n",  // chunk over the limit
      ok_head + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
      ok_head + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",  // closed: no last chunk
      ok_head + "Content-Length: 10\r\n\r\n{}",                   // closed before the end
      with_length("nope!"),
      with_length("[]"),
      with_length(R"({"header":"x","k":})"),
      with_length(R"({"kvs":[{"key":"Z"}]})"),  // not base64
      with_length(R"({"kvs":{}})"),
      with_length(R"({"count":"12345678901234567890"})"),  // over int64
      with_length(R"({"count":"1e3"})"),
      with_length(R"({"more":"yes"})"),
      with_length("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}"),
      "HTTP/2 200 OK\r\n\r\n",
      "garbage\r\n\r\n",
      ok_head + "NoColonHere\r\n\r\n",
  };
  for (const std::string& response : bad) {
    ScriptedServer server(response);
    const Status s = ClientFor(server.endpoint())->Range("a").status();
    EXPECT_TRUE(s.IsUnavailable()) << s << " for " << response;
    EXPECT_NE(s.message().find(server.endpoint()), std::string::npos) << s;
  }
}

TEST(EtcdClientTest, MapsEtcdErrorCodes) {
  const std::string body = R"({"error":"etcdserver: requested lease not found",)"
                           R"("message":"etcdserver: requested lease not found","code":5})";
  ScriptedServer server("HTTP/1.1 404 Not Found\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\n\r\n" + body);
  const Status s = ClientFor(server.endpoint())->LeaseRevoke(42);
  EXPECT_TRUE(s.IsNotFound()) << s;
  EXPECT_NE(s.message().find("requested lease not found"), std::string::npos) << s;
}

TEST(EtcdClientTest, NonJsonHttpErrorIsUnavailable) {
  ScriptedServer server("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad");
  const Status s = ClientFor(server.endpoint())->Put("k", "v").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("HTTP 502"), std::string::npos) << s;
}

TEST(EtcdClientTest, SilentServerTimesOutNamingTheSetting) {
  ScriptedServer server("", 0, /*hold=*/true);
  const Status s = ClientFor(server.endpoint(), 200ms)->Range("a").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("request_timeout"), std::string::npos) << s;
}

TEST(EtcdClientTest, ConnectionRefusedIsUnavailableNamingTheEndpoint) {
  std::string endpoint;
  {
    ScriptedServer server("");
    endpoint = server.endpoint();
  }  // closed: nothing listens on the port now
  const Status s = ClientFor(endpoint)->Range("a").status();
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find(endpoint), std::string::npos) << s;
}

TEST(EtcdClientTest, KeepAliveWithoutTtlIsNotFound) {
  ScriptedServer server(Chunked({R"({"result":{"header":{"revision":"2"},"ID":"5"}})", "\n"}));
  EXPECT_TRUE(ClientFor(server.endpoint())->LeaseKeepAlive(5).status().IsNotFound());
}

TEST(EtcdClientTest, WatchSplitsStreamIntoEventsAndReportsItsEnd) {
  const uint64_t seed = TestSeed("EtcdClientTest.WatchSplitsStreamIntoEventsAndReportsItsEnd");
  const std::string stream =
      R"({"result":{"header":{"revision":"10"},"created":true}})"
      "\n"
      R"({"result":{"header":{"revision":"11"},"events":[{"kv":{"key":"dzE=","value":"e30=",)"
      R"("mod_revision":"11"}},{"type":"DELETE","kv":{"key":"dzI=","mod_revision":"11"}}]}})"
      "\n";
  // Chunk boundaries fall inside the JSON objects.
  ScriptedServer server(Chunked({stream.substr(0, 30), stream.substr(30, 77), stream.substr(107)}),
                        seed | 1);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<EtcdEvent> events;
  std::optional<Status> end;
  StatusOr<std::unique_ptr<EtcdWatch>> watch = ClientFor(server.endpoint())
                                                   ->Watch(
                                                       WatchOf("w", "x"),
                                                       [&](const EtcdEvent& e) {
                                                         std::lock_guard<std::mutex> lock(mu);
                                                         events.push_back(e);
                                                       },
                                                       [&](const Status& s) {
                                                         std::lock_guard<std::mutex> lock(mu);
                                                         end = s;
                                                         cv.notify_all();
                                                       });
  ASSERT_TRUE(watch.ok()) << watch.status() << " seed " << seed;
  EXPECT_EQ((*watch)->created_revision(), 10);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return end.has_value(); }));
  EXPECT_TRUE(end->IsUnavailable()) << *end;
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "w1");
  EXPECT_EQ(events[0].kv.value, "{}");
  EXPECT_EQ(events[1].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(events[1].kv.key, "w2");
  EXPECT_TRUE((*watch)->ended());
}

TEST(EtcdClientTest, WatchRefusedByEtcdIsAnError) {
  ScriptedServer server(Chunked({R"({"result":{"header":{"revision":"3"},"created":true,)"
                                 R"("canceled":true,"compact_revision":"8"}})"}));
  EXPECT_EQ(ClientFor(server.endpoint())->Watch(WatchOf("w"), nullptr, nullptr).status().code(),
            StatusCode::kOutOfRange);
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
