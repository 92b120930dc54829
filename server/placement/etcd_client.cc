#include "server/placement/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>
#include <climits>
#include <system_error>
#include <utility>

#include "core/socket_address.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"

namespace kvfabric::placement {

namespace pb = etcdserverpb;

namespace {

// A cluster of more members than this is not an etcd cluster anyone runs
// (etcd recommends 3, 5 or 7).
constexpr std::size_t kMaxMembers = 16;

// HTTP/2 keepalive on every channel, so that a watch on a member that went
// silent (partitioned, its host frozen) ends within ~kKeepaliveTime +
// kKeepaliveTimeout instead of waiting forever. etcd refuses pings more often
// than every 5 s (--grpc-keepalive-min-time).
constexpr int kKeepaliveTimeMs = 10'000;
constexpr int kKeepaliveTimeoutMs = 5'000;

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// "etcd <url> <Service.Method>": the prefix of every error message.
std::string Context(const std::string& url, std::string_view method) {
  return "etcd " + url + " " + std::string(method);
}

// Whether a call's own deadline has (about) passed. gRPC's timers fire on
// their own clock, rounded: its DEADLINE_EXCEEDED can come a little before
// system_clock reaches the deadline it was given.
bool PastDeadline(std::chrono::system_clock::time_point deadline) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(100) >= deadline;
}

// A failed call's status, ours. `timed_out`: the call's own deadline
// (request_timeout) had passed, so a DEADLINE_EXCEEDED is ours, not etcd's.
Status FromEtcd(const std::string& context, const grpc::Status& s, bool timed_out,
                std::chrono::milliseconds request_timeout) {
  const std::string m = context + ": " + s.error_message() + " (gRPC code " +
                        std::to_string(static_cast<int>(s.error_code())) + ")";
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return Status::InvalidArgument(m);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (timed_out) {
        return Status::Unavailable(context + ": no answer within request_timeout " +
                                   Ms(request_timeout));
      }
      return Status::DeadlineExceeded(m);
    case grpc::StatusCode::NOT_FOUND:
      return Status::NotFound(m);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return Status::ResourceExhausted(m);
    case grpc::StatusCode::OUT_OF_RANGE:
      return Status::OutOfRange(m);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:  // the channel or the connection went away
      return Status::Unavailable(m);
    default:
      return Status::FailedPrecondition(m);
  }
}

EtcdKeyValue ToKv(const mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

EtcdRangeResult ToRange(const pb::RangeResponse& r) {
  EtcdRangeResult out;
  out.revision = r.header().revision();
  out.more = r.more();
  out.count = r.count();
  out.kvs.reserve(static_cast<std::size_t>(r.kvs_size()));
  for (const mvccpb::KeyValue& kv : r.kvs()) out.kvs.push_back(ToKv(kv));
  return out;
}

void ToOp(const EtcdOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut: {
      pb::PutRequest* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      return;
    }
    case EtcdOp::Kind::kRange: {
      pb::RangeRequest* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      return;
    }
    case EtcdOp::Kind::kDeleteRange: {
      pb::DeleteRangeRequest* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      return;
    }
  }
}

void ToCompare(const EtcdCompare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.result) {
    case EtcdCompare::Result::kEqual:
      out->set_result(pb::Compare::EQUAL);
      break;
    case EtcdCompare::Result::kNotEqual:
      out->set_result(pb::Compare::NOT_EQUAL);
      break;
    case EtcdCompare::Result::kGreater:
      out->set_result(pb::Compare::GREATER);
      break;
    case EtcdCompare::Result::kLess:
      out->set_result(pb::Compare::LESS);
      break;
  }
  switch (c.target) {
    case EtcdCompare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case EtcdCompare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case EtcdCompare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

// Why etcd cancelled a watch (r.canceled() is true).
Status WatchCancelled(const std::string& context, const pb::WatchResponse& r) {
  if (r.compact_revision() != 0) {
    return Status::OutOfRange(context + ": the watch's start revision was compacted (etcd kept " +
                              "revisions from " + std::to_string(r.compact_revision()) + ")");
  }
  return Status::FailedPrecondition(
      context + ": etcd cancelled the watch: " +
      (r.cancel_reason().empty() ? "no reason given" : r.cancel_reason()));
}

// "http://host:port", "https://host:port" (*tls set) or "host:port" to the
// gRPC target "host:port"; empty for anything else, with `why` saying what.
std::string ParseMemberUrl(std::string_view url, bool* tls, std::string* why) {
  std::string_view authority = url;
  *tls = false;
  if (authority.rfind("https://", 0) == 0) {
    *tls = true;
    authority.remove_prefix(8);
  }
  if (authority.rfind("http://", 0) == 0) authority.remove_prefix(7);
  if (!authority.empty() && authority.back() == '/') authority.remove_suffix(1);
  if (authority.find('/') != std::string_view::npos) {
    *why = "has a path or an unknown scheme";
    return {};
  }
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority[0] == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos || authority.substr(close + 1, 1) != ":") {
      *why = "bad IPv6 address or no port";
      return {};
    }
    host = authority.substr(1, close - 1);
    port = authority.substr(close + 2);
  } else {
    const std::size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos) {
      *why = "no port";
      return {};
    }
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  int number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (host.empty() || port.empty() || port[0] == '+' || ec != std::errc() ||
      end != port.data() + port.size() || number < 1 || number > 65535) {
    *why = "bad host or port";
    return {};
  }
  return std::string(authority);
}

}  // namespace

std::string EtcdPrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// ---- EtcdWatch ----

struct EtcdWatch::Call {
  std::unique_ptr<pb::Watch::Stub> stub;  // its own, so the watch may outlive the client
  pb::WatchRequest create;
  std::chrono::milliseconds request_timeout{0};
  grpc::ClientContext ctx;  // TryCancel from Cancel; everything else on the reader
};

EtcdWatch::EtcdWatch() = default;

EtcdWatch::~EtcdWatch() { Cancel(); }

void EtcdWatch::Cancel() {
  std::lock_guard<std::mutex> lock(cancel_mu_);
  cancelled_.store(true, std::memory_order_release);
  if (call_ != nullptr) call_->ctx.TryCancel();  // also cancels a call not started yet
  if (reader_.joinable()) reader_.join();
}

void EtcdWatch::Run() {
  Call& c = *call_;
  const std::unique_ptr<grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>> stream =
      c.stub->Watch(&c.ctx);
  bool confirmed = false;
  Status end;  // OK while the stream runs
  if (!stream->Write(c.create)) {
    end = Status::Unavailable(context_ + ": the create request could not be sent");
  } else {
    pb::WatchResponse r;
    while (stream->Read(&r)) {
      if (r.canceled()) {
        end = WatchCancelled(context_, r);
        break;
      }
      if (!confirmed) {
        if (!r.created()) {
          end = Status::Unavailable(context_ + ": events before etcd confirmed the watch");
          break;
        }
        created_revision_ = r.header().revision();
        confirmed = true;
        std::lock_guard<std::mutex> lock(create_mu_);
        create_done_ = true;
        create_status_ = Status::OK();
        create_cv_.notify_all();
        continue;
      }
      if (cancelled_.load(std::memory_order_acquire)) break;
      if (!on_event_) continue;
      for (const mvccpb::Event& e : r.events()) {
        EtcdEvent event;
        event.type =
            e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
        event.kv = ToKv(e.kv());
        if (e.has_prev_kv()) event.prev_kv = ToKv(e.prev_kv());
        on_event_(event);
      }
    }
  }
  if (!end.ok()) c.ctx.TryCancel();  // we stop reading: end the call before Finish
  const grpc::Status finish = stream->Finish();
  if (end.ok()) {
    end = finish.ok() ? Status::Unavailable(context_ + ": etcd ended the watch stream")
                      : FromEtcd(context_, finish, /*timed_out=*/false, c.request_timeout);
  }
  if (!confirmed) {
    std::lock_guard<std::mutex> lock(create_mu_);
    create_done_ = true;
    create_status_ = end;
    create_cv_.notify_all();
    return;
  }
  if (cancelled_.load(std::memory_order_acquire)) return;
  ended_.store(true, std::memory_order_release);
  if (on_end_) on_end_(end);
}

// ---- EtcdClient ----

struct EtcdClient::Member {
  std::string url;  // as listed
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
};

EtcdClient::EtcdClient(const EtcdClientOptions& options) : options_(options) {}

EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdClientOptions& options) {
  if (options.max_reconnect_backoff.count() <= 0 || options.request_timeout.count() <= 0 ||
      options.max_response_bytes == 0) {
    return Status::InvalidArgument("etcd client: max_reconnect_backoff " +
                                   Ms(options.max_reconnect_backoff) + ", request_timeout " +
                                   Ms(options.request_timeout) + " and max_response_bytes " +
                                   std::to_string(options.max_response_bytes) + " must all be > 0");
  }
  KVF_ASSIGN_OR_RETURN(const std::vector<std::string> urls,
                       SplitAddressList(options.endpoint, "etcd endpoint", kMaxMembers));
  auto client = std::unique_ptr<EtcdClient>(new EtcdClient(options));
  for (const std::string& url : urls) {
    std::string why;
    bool tls = false;
    const std::string target = ParseMemberUrl(url, &tls, &why);
    if (target.empty()) {
      return Status::InvalidArgument("etcd endpoint \"" + url + "\": " + why +
                                     "; want http://host:port, https://host:port or host:port");
    }
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (tls) {
      if (options.tls.ca_file.empty()) {
        return Status::InvalidArgument("etcd endpoint \"" + url +
                                       "\" is https: give --etcd-ca (the CA that signs etcd's "
                                       "certificate), and --etcd-cert/--etcd-key if etcd "
                                       "requires client certificates");
      }
      GrpcSecurityOptions t = options.tls;
      t.insecure = false;
      KVF_ASSIGN_OR_RETURN(creds, MakeChannelCredentials(t, target));
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(
        static_cast<int>(std::min<std::size_t>(options.max_response_bytes, INT_MAX)));
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // a member is reached directly
    // Connecting is bounded by each call's deadline; GRPC_ARG_MIN_RECONNECT_
    // BACKOFF_MS is left alone (below its 20 s default, gRPC 1.51 cut every
    // later connection attempt short and never reconnected).
    const int backoff_ms =
        static_cast<int>(std::min<std::int64_t>(options.max_reconnect_backoff.count(), INT_MAX));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, backoff_ms));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // an idle watch keeps pinging
    if (tls) ApplyChannelSecurityArgs(options.tls, &args);
    auto member = std::make_unique<Member>();
    member->url = url;
    member->channel = grpc::CreateCustomChannel(target, creds, args);
    member->kv = pb::KV::NewStub(member->channel);
    member->lease = pb::Lease::NewStub(member->channel);
    client->members_.push_back(std::move(member));
  }
  return client;
}

std::string EtcdClient::current_member() const { return members_[CurrentIndex()]->url; }

void EtcdClient::MemberFailed(std::size_t index) {
  std::size_t expected = index;
  current_.compare_exchange_strong(expected, (index + 1) % members_.size(),
                                   std::memory_order_relaxed);
}

template <typename Invoke>
Status EtcdClient::Unary(std::string_view method, Invoke invoke) {
  const std::size_t index = CurrentIndex();
  const Member& member = *members_[index];
  grpc::ClientContext ctx;
  const auto deadline = std::chrono::system_clock::now() + options_.request_timeout;
  ctx.set_deadline(deadline);
  const grpc::Status s = invoke(member, &ctx);
  if (s.ok()) return Status::OK();
  Status status = FromEtcd(Context(member.url, method), s,
                           PastDeadline(deadline), options_.request_timeout);
  if (status.IsUnavailable()) MemberFailed(index);
  return status;
}

StatusOr<std::int64_t> EtcdClient::Put(std::string_view key, std::string_view value,
                                       std::int64_t lease) {
  pb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  pb::PutResponse reply;
  KVF_RETURN_IF_ERROR(Unary("KV.Put", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.kv->Put(ctx, request, &reply);
  }));
  return reply.header().revision();
}

StatusOr<EtcdRangeResult> EtcdClient::Range(std::string_view key, std::string_view range_end,
                                            std::int64_t limit) {
  pb::RangeRequest request;
  request.set_key(std::string(key));
  request.set_range_end(std::string(range_end));
  request.set_limit(limit);
  pb::RangeResponse reply;
  KVF_RETURN_IF_ERROR(Unary("KV.Range", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.kv->Range(ctx, request, &reply);
  }));
  return ToRange(reply);
}

StatusOr<std::int64_t> EtcdClient::DeleteRange(std::string_view key, std::string_view range_end) {
  pb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  request.set_range_end(std::string(range_end));
  pb::DeleteRangeResponse reply;
  KVF_RETURN_IF_ERROR(Unary("KV.DeleteRange", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.kv->DeleteRange(ctx, request, &reply);
  }));
  return reply.deleted();
}

StatusOr<EtcdTxnResult> EtcdClient::Txn(const EtcdTxn& txn) {
  pb::TxnRequest request;
  for (const EtcdCompare& c : txn.compare) ToCompare(c, request.add_compare());
  for (const EtcdOp& op : txn.success) ToOp(op, request.add_success());
  for (const EtcdOp& op : txn.failure) ToOp(op, request.add_failure());
  pb::TxnResponse reply;
  KVF_RETURN_IF_ERROR(Unary("KV.Txn", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.kv->Txn(ctx, request, &reply);
  }));
  EtcdTxnResult result;
  result.succeeded = reply.succeeded();
  result.revision = reply.header().revision();
  result.responses.reserve(static_cast<std::size_t>(reply.responses_size()));
  for (const pb::ResponseOp& r : reply.responses()) {
    // Only ranges have kvs; a put or delete yields an empty result.
    result.responses.push_back(r.has_response_range() ? ToRange(r.response_range())
                                                      : EtcdRangeResult{});
  }
  return result;
}

StatusOr<EtcdLease> EtcdClient::LeaseGrant(std::int64_t ttl_seconds) {
  if (ttl_seconds < 1) {
    return Status::InvalidArgument("etcd lease TTL " + std::to_string(ttl_seconds) +
                                   " s: must be >= 1");
  }
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse reply;
  const std::size_t index = CurrentIndex();
  KVF_RETURN_IF_ERROR(Unary("Lease.LeaseGrant", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseGrant(ctx, request, &reply);
  }));
  const std::string context = Context(members_[index]->url, "Lease.LeaseGrant");
  if (!reply.error().empty()) return Status::FailedPrecondition(context + ": " + reply.error());
  if (reply.id() == 0) return Status::Unavailable(context + ": malformed reply: no lease ID");
  return EtcdLease{reply.id(), reply.ttl()};
}

StatusOr<std::int64_t> EtcdClient::LeaseKeepAlive(std::int64_t id) {
  const std::size_t index = CurrentIndex();
  const Member& member = *members_[index];
  const std::string context = Context(member.url, "Lease.LeaseKeepAlive");
  grpc::ClientContext ctx;
  const auto deadline = std::chrono::system_clock::now() + options_.request_timeout;
  ctx.set_deadline(deadline);
  const std::unique_ptr<
      grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      stream = member.lease->LeaseKeepAlive(&ctx);
  pb::LeaseKeepAliveRequest request;
  request.set_id(id);
  pb::LeaseKeepAliveResponse reply;
  if (!stream->Write(request) || !stream->Read(&reply)) {
    const grpc::Status s = stream->Finish();
    Status status = s.ok() ? Status::Unavailable(context + ": the stream ended without a reply")
                           : FromEtcd(context, s, PastDeadline(deadline),
                                      options_.request_timeout);
    if (status.IsUnavailable()) MemberFailed(index);
    return status;
  }
  ctx.TryCancel();  // one renewal per call: end the stream without waiting on etcd
  (void)stream->Finish();
  if (reply.ttl() <= 0) {
    return Status::NotFound(context + ": lease " + std::to_string(id) + " expired or unknown");
  }
  return reply.ttl();
}

Status EtcdClient::LeaseRevoke(std::int64_t id) {
  pb::LeaseRevokeRequest request;
  request.set_id(id);
  pb::LeaseRevokeResponse reply;
  return Unary("Lease.LeaseRevoke", [&](const Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseRevoke(ctx, request, &reply);
  });
}

StatusOr<std::unique_ptr<EtcdWatch>> EtcdClient::Watch(const EtcdWatchRequest& request,
                                                       EtcdWatch::EventCallback on_event,
                                                       EtcdWatch::EndCallback on_end) {
  const std::size_t index = CurrentIndex();
  const Member& member = *members_[index];
  auto watch = std::unique_ptr<EtcdWatch>(new EtcdWatch());
  watch->context_ = Context(member.url, "Watch.Watch");
  watch->call_ = std::make_unique<EtcdWatch::Call>();
  watch->call_->stub = pb::Watch::NewStub(member.channel);
  watch->call_->request_timeout = options_.request_timeout;
  pb::WatchCreateRequest* create = watch->call_->create.mutable_create_request();
  create->set_key(request.key);
  create->set_range_end(request.range_end);
  create->set_start_revision(request.start_revision);
  create->set_prev_kv(request.prev_kv);
  watch->on_event_ = std::move(on_event);
  watch->on_end_ = std::move(on_end);
  watch->reader_ = std::thread([w = watch.get()] { w->Run(); });
  Status created;
  {
    std::unique_lock<std::mutex> lock(watch->create_mu_);
    if (watch->create_cv_.wait_for(lock, options_.request_timeout,
                                   [&] { return watch->create_done_; })) {
      created = watch->create_status_;
    } else {
      created = Status::Unavailable(watch->context_ + ": etcd did not confirm the watch within " +
                                    "request_timeout " + Ms(options_.request_timeout));
    }
  }
  if (!created.ok()) {
    watch->Cancel();
    if (created.IsUnavailable()) MemberFailed(index);
    return created;
  }
  return watch;
}

}  // namespace kvfabric::placement
