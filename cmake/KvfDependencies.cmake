# Required system libraries and optional parts, found the same way by the
# build and by kvfabricConfig.cmake (the installed package).
#
# Required: missing ones stop the configure step with a message naming the
# setup script. Optional: each missing part is skipped with one line.

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto SSL)
find_package(fmt CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
# The synthetic transformer of the demo and the benchmarks (not libkvfabric).
pkg_check_modules(KVF_OPENBLAS IMPORTED_TARGET openblas)
if(NOT KVF_OPENBLAS_FOUND)
  message(FATAL_ERROR "kvfabric: OpenBLAS not found (pkg-config openblas): run tools/setup.sh "
                      "(Debian package libopenblas-dev)")
endif()

# Optional parts. KVF_WITH_<PART>=OFF turns a detected part off.
foreach(part UCX VERBS URING LEVEL_ZERO CUDA)
  option(KVF_WITH_${part} "Build the ${part} part when its toolkit is found" ON)
endforeach()

macro(_kvf_optional_pkg part package)
  set(KVF_HAVE_${part} OFF)
  set(KVF_${part}_MODULES ${ARGN})  # for the package config (cmake/KvfPackage.cmake)
  if(KVF_WITH_${part})
    pkg_check_modules(KVF_${part} QUIET IMPORTED_TARGET ${ARGN})
    if(KVF_${part}_FOUND)
      set(KVF_HAVE_${part} ON)
    endif()
  endif()
  if(NOT KVF_HAVE_${part})
    message(STATUS "kvfabric: optional part skipped: ${part} (install ${package})")
  endif()
endmacro()

_kvf_optional_pkg(UCX "libucx-dev" ucx)
_kvf_optional_pkg(VERBS "libibverbs-dev librdmacm-dev" libibverbs librdmacm)
_kvf_optional_pkg(URING "liburing-dev" liburing)
_kvf_optional_pkg(LEVEL_ZERO "libze-dev" level-zero)
