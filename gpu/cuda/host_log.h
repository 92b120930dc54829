// Logging for code compiled by nvcc. nvcc's front end rejects fmt 9's
// consteval format strings, so .cu files cannot include spdlog; they build the
// line themselves and hand it to these functions, compiled by the host
// compiler, which log it through spdlog's default logger (core/logging.h).
//
// Thread safety: any thread, as spdlog.
#ifndef KVFABRIC_GPU_CUDA_HOST_LOG_H_
#define KVFABRIC_GPU_CUDA_HOST_LOG_H_

#include <string_view>

namespace kvfabric::cuda {

void LogInfo(std::string_view line);
void LogError(std::string_view line);

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_HOST_LOG_H_
