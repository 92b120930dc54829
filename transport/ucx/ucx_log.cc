#include "transport/ucx/ucx_log.h"

#include <spdlog/spdlog.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/mutex.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx {
namespace {

Mutex sink_mu;
std::shared_ptr<const UcxLogSink> sink KVF_GUARDED_BY(sink_mu);

std::shared_ptr<const UcxLogSink> CurrentSink() {
  MutexLock lock(&sink_mu);
  return sink;
}

spdlog::level::level_enum LevelOf(ucs_log_level_t level) {
  switch (level) {
    case UCS_LOG_LEVEL_FATAL:
      return spdlog::level::critical;
    case UCS_LOG_LEVEL_ERROR:
      return spdlog::level::err;
    case UCS_LOG_LEVEL_WARN:
      return spdlog::level::warn;
    case UCS_LOG_LEVEL_DIAG:
    case UCS_LOG_LEVEL_INFO:
    case UCS_LOG_LEVEL_PRINT:
      return spdlog::level::info;
    case UCS_LOG_LEVEL_DEBUG:
      return spdlog::level::debug;
    default:
      return spdlog::level::trace;
  }
}

// UCX's own warning about a transport list naming what this machine lacks:
// UcxCore has already logged CheckUcxTransports' warning naming the same.
bool RepeatsTheTransportCheck(std::string_view message) {
  return message.find("are not available, please use one or more of") != std::string_view::npos ||
         message.find("is not available, please use one or more of") != std::string_view::npos;
}

ucs_log_func_rc_t Handler(const char* file, unsigned line, const char* /*function*/,
                          ucs_log_level_t level, const ucs_log_component_config_t* /*comp*/,
                          const char* format, va_list ap) {
  std::array<char, 1024> buf;
  va_list copy;
  va_copy(copy, ap);
  const int n = std::vsnprintf(buf.data(), buf.size(), format, copy);
  va_end(copy);
  std::string_view message(buf.data(), n < 0 ? 0 : std::min<std::size_t>(n, buf.size() - 1));
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.remove_suffix(1);
  }
  spdlog::level::level_enum l = LevelOf(level);
  if (l == spdlog::level::warn && RepeatsTheTransportCheck(message)) l = spdlog::level::debug;
  const char* base = file == nullptr ? "?" : file;
  if (const char* slash = std::strrchr(base, '/'); slash != nullptr) base = slash + 1;
  LogUcx(l, "ucx: " + std::string(message) + " (" + base + ":" + std::to_string(line) + ")");
  return UCS_LOG_FUNC_RC_STOP;
}

// UCX's transport aliases (ucp_context.c's table, UCX 1.13): a list item
// matches if the machine has any of its transports.
struct Alias {
  std::string_view name;
  std::array<std::string_view, 5> transports;
};
constexpr Alias kAliases[] = {
    {"mm", {"posix", "sysv", "xpmem"}},
    {"sm", {"posix", "sysv", "xpmem", "knem", "cma"}},
    {"shm", {"posix", "sysv", "xpmem", "knem", "cma"}},
    {"ib", {"rc_verbs", "ud_verbs", "rc_mlx5", "ud_mlx5", "dc_mlx5"}},
    {"ud_v", {"ud_verbs"}},
    {"ud_x", {"ud_mlx5"}},
    {"ud", {"ud_mlx5", "ud_verbs"}},
    {"rc_v", {"rc_verbs"}},
    {"rc_x", {"rc_mlx5"}},
    {"rc", {"rc_mlx5", "rc_verbs"}},
    {"dc", {"dc_mlx5"}},
    {"dc_x", {"dc_mlx5"}},
    {"ugni", {"ugni_smsg", "ugni_rdma"}},
    {"cuda", {"cuda_copy", "cuda_ipc", "gdr_copy"}},
    {"rocm", {"rocm_copy", "rocm_ipc", "rocm_gdr"}},
};

bool Has(const std::vector<std::string>& available, std::string_view name) {
  return std::find(available.begin(), available.end(), name) != available.end();
}

bool Matches(std::string_view item, const std::vector<std::string>& available) {
  // ":aux" marks an auxiliary transport in UCX's syntax; the name before it counts.
  if (const std::size_t colon = item.find(':'); colon != std::string_view::npos) {
    item = item.substr(0, colon);
  }
  if (Has(available, item)) return true;
  for (const Alias& a : kAliases) {
    if (a.name != item) continue;
    for (std::string_view t : a.transports) {
      if (!t.empty() && Has(available, t)) return true;
    }
  }
  return false;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

void RouteUcxLogs(UcxLogSink new_sink) {
  static std::once_flag once;
  if (new_sink) {
    auto shared = std::make_shared<const UcxLogSink>(std::move(new_sink));
    MutexLock lock(&sink_mu);
    sink = std::move(shared);
  }
  std::call_once(once, [] { ucs_log_push_handler(&Handler); });
}

void LogUcx(spdlog::level::level_enum level, std::string_view line) {
  if (std::shared_ptr<const UcxLogSink> s = CurrentSink()) {
    (*s)(level, line);
    return;
  }
  spdlog::log(level, "{}", line);
}

StatusOr<std::vector<std::string>> AvailableUcxTransports() {
  uct_component_h* components = nullptr;
  unsigned num_components = 0;
  KVF_RETURN_IF_ERROR(
      StatusFromUcs(uct_query_components(&components, &num_components), "uct_query_components"));
  std::vector<std::string> out;
  for (unsigned c = 0; c < num_components; ++c) {
    uct_component_attr_t attr = {};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const uct_md_resource_desc_t& md_desc : mds) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      const ucs_status_t opened = uct_md_open(components[c], md_desc.md_name, config, &md);
      uct_config_release(config);
      if (opened != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned num_tls = 0;
      if (uct_md_query_tl_resources(md, &tls, &num_tls) == UCS_OK) {
        for (unsigned t = 0; t < num_tls; ++t) out.emplace_back(tls[t].tl_name);
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

UcxTransportCheck CheckUcxTransportList(const std::string& tls,
                                        const std::vector<std::string>& available) {
  UcxTransportCheck check;
  check.available = available;
  if (tls.empty() || tls.front() == '^') return check;
  std::size_t start = 0;
  while (start <= tls.size()) {
    std::size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    const std::string item = tls.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    if (item == "all" || Matches(item, available)) {
      check.usable.push_back(item);
    } else {
      check.missing.push_back(item);
    }
  }
  return check;
}

StatusOr<UcxTransportCheck> CheckUcxTransports(const std::string& tls) {
  KVF_ASSIGN_OR_RETURN(std::vector<std::string> available, AvailableUcxTransports());
  return CheckUcxTransportList(tls, available);
}

std::string UcxTransportWarning(const UcxTransportCheck& check, const std::string& tls,
                                const std::string& setting) {
  if (check.missing.empty()) return "";
  std::string out = setting + " \"" + tls + "\": " + Join(check.missing) +
                    (check.missing.size() == 1 ? " is" : " are") +
                    " not available on this machine (UCX finds: " + Join(check.available) + "); ";
  out += check.usable.empty() ? "nothing in the list is usable, so UCX cannot start"
                              : "using " + Join(check.usable) + " only";
  return out;
}

StatusOr<UcxTransportCheck> WarnAboutMissingUcxTransports(const std::string& tls,
                                                          const std::string& setting) {
  static Mutex warned_mu;
  static std::vector<std::string>* warned KVF_GUARDED_BY(warned_mu) = new std::vector<std::string>;
  StatusOr<UcxTransportCheck> check = CheckUcxTransports(tls);
  if (!check.ok()) {
    LogUcx(spdlog::level::debug,
           "ucx: cannot list this machine's transports: " + check.status().ToString());
    return check;
  }
  const std::string warning = UcxTransportWarning(*check, tls, setting);
  if (warning.empty()) return check;
  {
    MutexLock lock(&warned_mu);
    if (Has(*warned, tls)) return check;
    warned->push_back(tls);
  }
  LogUcx(spdlog::level::warn, warning);
  return check;
}

}  // namespace kvfabric::ucx
