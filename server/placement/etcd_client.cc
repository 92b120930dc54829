#include "server/placement/etcd_client.h"

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/placement/etcd_http.h"

namespace kvfabric::placement {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using etcd_http::Ms;
using etcd_http::ParseDecimal;

namespace {

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// "etcd <endpoint> POST <path>": the prefix of every error message.
std::string Context(const std::string& endpoint, std::string_view path) {
  return "etcd " + endpoint + " POST " + std::string(path);
}

Status Malformed(const std::string& context, std::string_view what) {
  return Status::Unavailable(context + ": malformed reply: " + std::string(what));
}

// etcd's gRPC code, as the gateway reports it, to ours.
Status EtcdError(const std::string& context, std::int64_t code, const std::string& message) {
  const std::string m = context + ": " + message + " (etcd gRPC code " + std::to_string(code) + ")";
  switch (code) {
    case 3:
      return Status::InvalidArgument(m);
    case 4:
      return Status::DeadlineExceeded(m);
    case 5:
      return Status::NotFound(m);
    case 8:
      return Status::ResourceExhausted(m);
    case 11:
      return Status::OutOfRange(m);
    case 14:
      return Status::Unavailable(m);
    default:
      return Status::FailedPrecondition(m);
  }
}

StatusOr<Json> ParseObject(const std::string& context, std::string_view text) {
  if (!etcd_http::NestingWithin(text, etcd_http::kMaxJsonDepth)) {
    return Malformed(context, "JSON nests deeper than " + std::to_string(etcd_http::kMaxJsonDepth));
  }
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Malformed(context, "not a JSON object");
  return j;
}

// Field readers: proto3 JSON leaves out defaults, so a missing field is 0 / ""
// / false; a present one of the wrong type is an error. Never throw.
StatusOr<std::int64_t> Int64Field(const std::string& context, const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return std::int64_t{0};
  std::int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() &&
        it->get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
      return Malformed(context, std::string(key) + " out of range");
    }
    return it->get<std::int64_t>();
  }
  if (!it->is_string() || !ParseDecimal(it->get_ref<const std::string&>(), &v)) {
    return Malformed(context, std::string(key) + " is not an int64");
  }
  return v;
}

StatusOr<std::string> BytesField(const std::string& context, const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return Malformed(context, std::string(key) + " is not a string");
  std::optional<std::string> bytes = Base64Decode(it->get_ref<const std::string&>());
  if (!bytes) return Malformed(context, std::string(key) + " is not base64");
  return *std::move(bytes);
}

StatusOr<bool> BoolField(const std::string& context, const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return false;
  if (!it->is_boolean()) return Malformed(context, std::string(key) + " is not a boolean");
  return it->get<bool>();
}

StatusOr<std::string> StringField(const std::string& context, const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return Malformed(context, std::string(key) + " is not a string");
  return it->get<std::string>();
}

const Json& ObjectField(const Json& obj, const char* key) {
  static const Json* const kEmpty = new Json(Json::object());  // never destroyed
  const auto it = obj.find(key);
  return it != obj.end() && it->is_object() ? *it : *kEmpty;
}

StatusOr<std::int64_t> HeaderRevision(const std::string& context, const Json& obj) {
  return Int64Field(context, ObjectField(obj, "header"), "revision");
}

StatusOr<EtcdKeyValue> ParseKv(const std::string& context, const Json& j) {
  if (!j.is_object()) return Malformed(context, "kv is not an object");
  EtcdKeyValue kv;
  KVF_ASSIGN_OR_RETURN(kv.key, BytesField(context, j, "key"));
  KVF_ASSIGN_OR_RETURN(kv.value, BytesField(context, j, "value"));
  KVF_ASSIGN_OR_RETURN(kv.create_revision, Int64Field(context, j, "create_revision"));
  KVF_ASSIGN_OR_RETURN(kv.mod_revision, Int64Field(context, j, "mod_revision"));
  KVF_ASSIGN_OR_RETURN(kv.version, Int64Field(context, j, "version"));
  KVF_ASSIGN_OR_RETURN(kv.lease, Int64Field(context, j, "lease"));
  return kv;
}

StatusOr<EtcdRangeResult> ParseRange(const std::string& context, const Json& j) {
  EtcdRangeResult r;
  KVF_ASSIGN_OR_RETURN(r.revision, HeaderRevision(context, j));
  KVF_ASSIGN_OR_RETURN(r.more, BoolField(context, j, "more"));
  KVF_ASSIGN_OR_RETURN(r.count, Int64Field(context, j, "count"));
  const auto kvs = j.find("kvs");
  if (kvs != j.end()) {
    if (!kvs->is_array()) return Malformed(context, "kvs is not an array");
    for (const Json& e : *kvs) {
      KVF_ASSIGN_OR_RETURN(EtcdKeyValue kv, ParseKv(context, e));
      r.kvs.push_back(std::move(kv));
    }
  }
  return r;
}

// An error object: {"error":"..","message":"..","code":5} from a unary call,
// or {"grpc_code":5,"message":".."} inside a stream's {"error":{...}}.
Status ErrorFromObject(const std::string& context, const Json& j) {
  std::int64_t code = 2;
  for (const char* key : {"code", "grpc_code"}) {
    const auto it = j.find(key);
    if (it != j.end() && it->is_number_integer()) code = it->get<std::int64_t>();
  }
  std::string message = "unknown error";
  for (const char* key : {"error", "message"}) {
    const auto it = j.find(key);
    if (it != j.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      message = it->get<std::string>();
    }
  }
  return EtcdError(context, code, message);
}

// A streamed message: {"result": {...}} -> the result; {"error": ...} -> Status.
StatusOr<Json> StreamResult(const std::string& context, const std::string& text) {
  KVF_ASSIGN_OR_RETURN(Json j, ParseObject(context, text));
  const auto error = j.find("error");
  if (error != j.end()) {
    return ErrorFromObject(context, error->is_object() ? *error : j);
  }
  const auto result = j.find("result");
  if (result == j.end() || !result->is_object()) return Malformed(context, "no result");
  return Json(std::move(*result));
}

Json KvRequest(std::string_view key, std::string_view range_end) {
  Json j;
  j["key"] = Base64Encode(key);
  if (!range_end.empty()) j["range_end"] = Base64Encode(range_end);
  return j;
}

Json OpToJson(const EtcdOp& op) {
  Json j = KvRequest(op.key, op.kind == EtcdOp::Kind::kPut ? std::string_view() : op.range_end);
  switch (op.kind) {
    case EtcdOp::Kind::kPut:
      j["value"] = Base64Encode(op.value);
      if (op.lease != 0) j["lease"] = std::to_string(op.lease);
      return Json{{"request_put", j}};
    case EtcdOp::Kind::kRange:
      return Json{{"request_range", j}};
    case EtcdOp::Kind::kDeleteRange:
      return Json{{"request_delete_range", j}};
  }
  return Json::object();
}

Json CompareToJson(const EtcdCompare& c) {
  static constexpr const char* kTargets[] = {"VALUE", "VERSION", "CREATE", "MOD", "LEASE"};
  static constexpr const char* kFields[] = {"value", "version", "create_revision", "mod_revision",
                                            "lease"};
  static constexpr const char* kResults[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  const auto target = static_cast<std::size_t>(c.target);
  Json j;
  j["key"] = Base64Encode(c.key);
  j["target"] = kTargets[target];
  j["result"] = kResults[static_cast<std::size_t>(c.result)];
  if (c.target == EtcdCompare::Target::kValue) {
    j["value"] = Base64Encode(c.value);
  } else {
    j[kFields[target]] = std::to_string(c.number);
  }
  return j;
}

// One watch response: events appended to `events`; `created` set for the
// creation confirmation; an error if etcd cancelled the watch.
Status ParseWatchResult(const std::string& context, const Json& r, bool* created,
                        std::int64_t* revision, std::vector<EtcdEvent>* events) {
  KVF_ASSIGN_OR_RETURN(*created, BoolField(context, r, "created"));
  KVF_ASSIGN_OR_RETURN(*revision, HeaderRevision(context, r));
  KVF_ASSIGN_OR_RETURN(const bool canceled, BoolField(context, r, "canceled"));
  if (canceled) {
    KVF_ASSIGN_OR_RETURN(const std::int64_t compacted, Int64Field(context, r, "compact_revision"));
    if (compacted != 0) {
      return Status::OutOfRange(context + ": the watch's start revision was compacted (etcd " +
                                "kept revisions from " + std::to_string(compacted) + ")");
    }
    KVF_ASSIGN_OR_RETURN(const std::string reason, StringField(context, r, "cancel_reason"));
    return Status::FailedPrecondition(context + ": etcd cancelled the watch: " + reason);
  }
  const auto list = r.find("events");
  if (list == r.end()) return Status::OK();
  if (!list->is_array()) return Malformed(context, "events is not an array");
  for (const Json& e : *list) {
    if (!e.is_object()) return Malformed(context, "event is not an object");
    EtcdEvent event;
    KVF_ASSIGN_OR_RETURN(const std::string type, StringField(context, e, "type"));
    if (type == "DELETE") {
      event.type = EtcdEvent::Type::kDelete;
    } else if (!type.empty() && type != "PUT") {
      return Malformed(context, "unknown event type " + type.substr(0, 20));
    }
    KVF_ASSIGN_OR_RETURN(event.kv, ParseKv(context, ObjectField(e, "kv")));
    if (const auto prev = e.find("prev_kv"); prev != e.end()) {
      KVF_ASSIGN_OR_RETURN(event.prev_kv, ParseKv(context, *prev));
    }
    events->push_back(std::move(event));
  }
  return Status::OK();
}

}  // namespace

// ---- Base64, range ends ----

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = (std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16) |
                            (std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8) |
                            static_cast<unsigned char>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kBase64Alphabet[(v >> shift) & 63];
  }
  if (i < bytes.size()) {
    std::uint32_t v = std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16;
    if (i + 1 < bytes.size()) v |= std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8;
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64Alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < text.size() - padding; ++i) {
    const char* p = std::strchr(kBase64Alphabet, text[i]);
    if (text[i] == '\0' || p == nullptr) return std::nullopt;  // '=' inside lands here too
    v = (v << 6) | static_cast<std::uint32_t>(p - kBase64Alphabet);
    if (i % 4 == 3) {
      out += static_cast<char>(v >> 16);
      out += static_cast<char>(v >> 8);
      out += static_cast<char>(v);
      v = 0;
    }
  }
  if (padding == 2) {  // 2 characters = 12 bits: one byte and 4 bits that must be 0
    if ((v & 0xF) != 0) return std::nullopt;
    out += static_cast<char>(v >> 4);
  } else if (padding == 1) {  // 3 characters = 18 bits: two bytes and 2 zero bits
    if ((v & 0x3) != 0) return std::nullopt;
    out += static_cast<char>(v >> 10);
    out += static_cast<char>(v >> 2);
  }
  return out;
}

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

EtcdWatch::EtcdWatch() = default;

EtcdWatch::~EtcdWatch() { Cancel(); }

void EtcdWatch::Cancel() {
  std::lock_guard<std::mutex> lock(cancel_mu_);
  cancelled_.store(true, std::memory_order_release);
  if (stream_ != nullptr) stream_->Shutdown();
  if (reader_.joinable()) reader_.join();
}

void EtcdWatch::Run() {
  const std::string& context = stream_->context();
  for (;;) {
    StatusOr<std::optional<std::string>> message = stream_->NextMessage();
    if (cancelled_.load(std::memory_order_acquire)) return;
    Status end;
    if (!message.ok()) {
      end = message.status();
    } else if (!message->has_value()) {
      end = Status::Unavailable(context + ": etcd ended the watch stream");
    } else {
      std::vector<EtcdEvent> events;
      bool created = false;
      std::int64_t revision = 0;
      StatusOr<Json> result = StreamResult(context, **message);
      end = result.ok() ? ParseWatchResult(context, *result, &created, &revision, &events)
                        : result.status();
      if (on_event_) {
        for (const EtcdEvent& e : events) on_event_(e);
      }
      if (end.ok()) continue;
    }
    ended_.store(true, std::memory_order_release);
    if (on_end_) on_end_(end);
    return;
  }
}

// ---- EtcdClient ----

EtcdClient::EtcdClient(const EtcdClientOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdClientOptions& options) {
  const std::string& url = options.endpoint;
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("etcd endpoint \"" + url + "\": " + std::string(why) +
                                   "; want http://host:port");
  };
  if (url.rfind("http://", 0) != 0) return bad("not an http:// URL (https is not supported)");
  std::string authority = url.substr(7);
  if (!authority.empty() && authority.back() == '/') authority.pop_back();
  if (authority.find('/') != std::string::npos) return bad("has a path");
  std::string host;
  std::string port;
  if (!authority.empty() && authority[0] == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string::npos || authority.compare(close + 1, 1, ":") != 0) {
      return bad("bad IPv6 address or no port");
    }
    host = authority.substr(1, close - 1);
    port = authority.substr(close + 2);
  } else {
    const std::size_t colon = authority.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  int port_number = 0;
  if (host.empty() || !ParseDecimal(port, &port_number) || port_number < 1 || port_number > 65535) {
    return bad("bad host or port");
  }
  if (options.connect_timeout.count() <= 0 || options.request_timeout.count() <= 0 ||
      options.max_response_bytes == 0) {
    return Status::InvalidArgument("etcd client: connect_timeout " + Ms(options.connect_timeout) +
                                   ", request_timeout " + Ms(options.request_timeout) +
                                   " and max_response_bytes " +
                                   std::to_string(options.max_response_bytes) + " must all be > 0");
  }
  auto client = std::unique_ptr<EtcdClient>(new EtcdClient(options));
  client->host_ = host;
  client->port_ = port;
  client->host_header_ = authority;
  return client;
}

StatusOr<std::unique_ptr<EtcdHttpStream>> EtcdClient::Open(std::string_view path,
                                                           const std::string& body) const {
  KVF_ASSIGN_OR_RETURN(
      std::unique_ptr<EtcdHttpStream> stream,
      EtcdHttpStream::Connect(host_, port_, options_.connect_timeout,
                              Context(options_.endpoint, path), options_.max_response_bytes));
  stream->SetDeadline(Clock::now() + options_.request_timeout, options_.request_timeout);
  const std::string request =
      "POST " + std::string(path) + " HTTP/1.1\r\nHost: " + host_header_ +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  KVF_RETURN_IF_ERROR(stream->Send(request));
  KVF_RETURN_IF_ERROR(stream->ReadHead());
  if (stream->status_code() != 200) {
    KVF_ASSIGN_OR_RETURN(const std::string text, stream->ReadAll());
    const StatusOr<Json> j = ParseObject(stream->context(), text);
    if (j.ok() && (j->contains("code") || j->contains("error"))) {
      return ErrorFromObject(stream->context(), *j);
    }
    return Status::Unavailable(stream->context() + ": HTTP " +
                               std::to_string(stream->status_code()) + ": " + text.substr(0, 200));
  }
  return stream;
}

StatusOr<std::string> EtcdClient::Call(std::string_view path, const std::string& body) const {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<EtcdHttpStream> stream, Open(path, body));
  return stream->ReadAll();
}

StatusOr<std::int64_t> EtcdClient::Put(std::string_view key, std::string_view value,
                                       std::int64_t lease) {
  constexpr std::string_view kPath = "/v3/kv/put";
  Json request = KvRequest(key, {});
  request["value"] = Base64Encode(value);
  if (lease != 0) request["lease"] = std::to_string(lease);
  KVF_ASSIGN_OR_RETURN(const std::string text, Call(kPath, request.dump()));
  const std::string context = Context(options_.endpoint, kPath);
  KVF_ASSIGN_OR_RETURN(const Json reply, ParseObject(context, text));
  return HeaderRevision(context, reply);
}

StatusOr<EtcdRangeResult> EtcdClient::Range(std::string_view key, std::string_view range_end,
                                            std::int64_t limit) {
  constexpr std::string_view kPath = "/v3/kv/range";
  Json request = KvRequest(key, range_end);
  if (limit != 0) request["limit"] = std::to_string(limit);
  KVF_ASSIGN_OR_RETURN(const std::string text, Call(kPath, request.dump()));
  const std::string context = Context(options_.endpoint, kPath);
  KVF_ASSIGN_OR_RETURN(const Json reply, ParseObject(context, text));
  return ParseRange(context, reply);
}

StatusOr<std::int64_t> EtcdClient::DeleteRange(std::string_view key, std::string_view range_end) {
  constexpr std::string_view kPath = "/v3/kv/deleterange";
  KVF_ASSIGN_OR_RETURN(const std::string text, Call(kPath, KvRequest(key, range_end).dump()));
  const std::string context = Context(options_.endpoint, kPath);
  KVF_ASSIGN_OR_RETURN(const Json reply, ParseObject(context, text));
  return Int64Field(context, reply, "deleted");
}

StatusOr<EtcdTxnResult> EtcdClient::Txn(const EtcdTxn& txn) {
  constexpr std::string_view kPath = "/v3/kv/txn";
  Json request = Json::object();
  for (const EtcdCompare& c : txn.compare) request["compare"].push_back(CompareToJson(c));
  for (const EtcdOp& op : txn.success) request["success"].push_back(OpToJson(op));
  for (const EtcdOp& op : txn.failure) request["failure"].push_back(OpToJson(op));
  KVF_ASSIGN_OR_RETURN(const std::string text, Call(kPath, request.dump()));
  const std::string context = Context(options_.endpoint, kPath);
  KVF_ASSIGN_OR_RETURN(const Json reply, ParseObject(context, text));
  EtcdTxnResult result;
  KVF_ASSIGN_OR_RETURN(result.succeeded, BoolField(context, reply, "succeeded"));
  KVF_ASSIGN_OR_RETURN(result.revision, HeaderRevision(context, reply));
  const auto responses = reply.find("responses");
  if (responses != reply.end()) {
    if (!responses->is_array()) return Malformed(context, "responses is not an array");
    for (const Json& r : *responses) {
      // Only ranges have kvs; a put or delete yields an empty result.
      KVF_ASSIGN_OR_RETURN(EtcdRangeResult one,
                           ParseRange(context, ObjectField(r, "response_range")));
      result.responses.push_back(std::move(one));
    }
  }
  return result;
}

StatusOr<EtcdLease> EtcdClient::LeaseGrant(std::int64_t ttl_seconds) {
  constexpr std::string_view kPath = "/v3/lease/grant";
  if (ttl_seconds < 1) {
    return Status::InvalidArgument("etcd lease TTL " + std::to_string(ttl_seconds) +
                                   " s: must be >= 1");
  }
  KVF_ASSIGN_OR_RETURN(const std::string text,
                       Call(kPath, Json{{"TTL", std::to_string(ttl_seconds)}}.dump()));
  const std::string context = Context(options_.endpoint, kPath);
  KVF_ASSIGN_OR_RETURN(const Json reply, ParseObject(context, text));
  KVF_ASSIGN_OR_RETURN(const std::string error, StringField(context, reply, "error"));
  if (!error.empty()) return Status::FailedPrecondition(context + ": " + error);
  EtcdLease lease;
  KVF_ASSIGN_OR_RETURN(lease.id, Int64Field(context, reply, "ID"));
  KVF_ASSIGN_OR_RETURN(lease.ttl_seconds, Int64Field(context, reply, "TTL"));
  if (lease.id == 0) return Malformed(context, "no lease ID");
  return lease;
}

StatusOr<std::int64_t> EtcdClient::LeaseKeepAlive(std::int64_t id) {
  constexpr std::string_view kPath = "/v3/lease/keepalive";
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<EtcdHttpStream> stream,
                       Open(kPath, Json{{"ID", std::to_string(id)}}.dump()));
  KVF_ASSIGN_OR_RETURN(const std::optional<std::string> message, stream->NextMessage());
  if (!message) return Malformed(stream->context(), "empty keep-alive stream");
  KVF_ASSIGN_OR_RETURN(const Json result, StreamResult(stream->context(), *message));
  KVF_ASSIGN_OR_RETURN(const std::int64_t ttl, Int64Field(stream->context(), result, "TTL"));
  if (ttl <= 0) {
    return Status::NotFound(stream->context() + ": lease " + std::to_string(id) +
                            " expired or unknown");
  }
  return ttl;
}

Status EtcdClient::LeaseRevoke(std::int64_t id) {
  return Call("/v3/lease/revoke", Json{{"ID", std::to_string(id)}}.dump()).status();
}

StatusOr<std::unique_ptr<EtcdWatch>> EtcdClient::Watch(const EtcdWatchRequest& request,
                                                       EtcdWatch::EventCallback on_event,
                                                       EtcdWatch::EndCallback on_end) {
  Json create = KvRequest(request.key, request.range_end);
  if (request.start_revision != 0)
    create["start_revision"] = std::to_string(request.start_revision);
  if (request.prev_kv) create["prev_kv"] = true;
  auto watch = std::unique_ptr<EtcdWatch>(new EtcdWatch());
  KVF_ASSIGN_OR_RETURN(watch->stream_, Open("/v3/watch", Json{{"create_request", create}}.dump()));
  EtcdHttpStream& stream = *watch->stream_;
  for (bool created = false; !created;) {  // still under request_timeout
    KVF_ASSIGN_OR_RETURN(const std::optional<std::string> message, stream.NextMessage());
    if (!message) return stream.Error("watch stream ended before etcd confirmed the watch");
    KVF_ASSIGN_OR_RETURN(const Json result, StreamResult(stream.context(), *message));
    std::vector<EtcdEvent> events;  // none come before the confirmation
    KVF_RETURN_IF_ERROR(
        ParseWatchResult(stream.context(), result, &created, &watch->created_revision_, &events));
  }
  stream.SetDeadline(std::nullopt, std::chrono::milliseconds(0));
  watch->on_event_ = std::move(on_event);
  watch->on_end_ = std::move(on_end);
  watch->reader_ = std::thread([w = watch.get()] { w->Run(); });
  return watch;
}

}  // namespace kvfabric::placement
