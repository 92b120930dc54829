#include "gpu/cuda/host_log.h"

#include <spdlog/spdlog.h>

namespace kvfabric::cuda {

void LogInfo(std::string_view line) { spdlog::info("{}", line); }
void LogError(std::string_view line) { spdlog::error("{}", line); }

}  // namespace kvfabric::cuda
