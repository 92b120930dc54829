# kvfabric's CMake target functions, the twins of tools/bazel/kvf.bzl.
#
# A target declared as kvf_cc_library(NAME status ...) in core/CMakeLists.txt is
# //core:status in Bazel and `core_status` here (kvfabric::core_status in the
# tree). tools/check_build_drift.py compares the sources both builds compile,
# so a file added to one build only fails CI.
#
# These per-part libraries are build steps, not what the package ships:
# cmake/KvfPackage.cmake folds the client's closure of them into libkvfabric
# (shared and static); only binaries are installed from here. TESTONLY C++
# libraries exist only with BUILD_TESTING (most link GoogleTest); TESTONLY
# CUDA libraries always do (a benchmark uses one).

set(KVF_COPTS -Wall -Wextra -Wno-unused-parameter)

# core/testing -> core_testing
function(_kvf_target_name out name)
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}")
  string(REPLACE "/" "_" prefix "${rel}")
  set(${out} "${prefix}_${name}" PARENT_SCOPE)
endfunction()

# kvf_cc_library(NAME n [SRCS ...] [HDRS ...] [DEPS ...] [DEFINES ...] [COPTS ...] [TESTONLY])
function(kvf_cc_library)
  cmake_parse_arguments(A "TESTONLY" "NAME" "SRCS;HDRS;DEPS;DEFINES;COPTS" ${ARGN})
  if(A_TESTONLY AND NOT BUILD_TESTING)
    return()
  endif()
  _kvf_target_name(target ${A_NAME})
  if(A_SRCS)
    add_library(${target} STATIC ${A_SRCS})
    set(scope PUBLIC)
    target_compile_options(${target} PRIVATE ${KVF_COPTS} ${A_COPTS})
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                               OUTPUT_NAME kvfabric_${target})
  else()
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(kvfabric::${target} ALIAS ${target})
  if(A_HDRS)
    target_sources(${target} ${scope} FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}"
                   FILES ${A_HDRS})
  endif()
  if(NOT A_SRCS AND A_HDRS)
    # CMake 3.25's file API lists no sources for INTERFACE libraries; this
    # target carries the headers so tools/check_build_drift.py sees them.
    add_custom_target(${target}_headers SOURCES ${A_HDRS})
  endif()
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:include/kvfabric>)
  target_link_libraries(${target} ${scope} ${A_DEPS})
  if(A_DEFINES)
    target_compile_definitions(${target} ${scope} ${A_DEFINES})
  endif()
endfunction()

# kvf_cc_binary(NAME n SRCS ... [DEPS ...] [OUTPUT_NAME name] [DEFINES ...] [TESTONLY]):
# installed into bin/ unless TESTONLY (a helper that tests start; built only
# with BUILD_TESTING).
function(kvf_cc_binary)
  cmake_parse_arguments(A "TESTONLY" "NAME;OUTPUT_NAME" "SRCS;DEPS;DEFINES" ${ARGN})
  if(A_TESTONLY AND NOT BUILD_TESTING)
    return()
  endif()
  _kvf_target_name(target ${A_NAME})
  add_executable(${target} ${A_SRCS})
  target_compile_options(${target} PRIVATE ${KVF_COPTS})
  target_link_libraries(${target} PRIVATE ${A_DEPS})
  if(A_DEFINES)
    target_compile_definitions(${target} PRIVATE ${A_DEFINES})
  endif()
  if(A_OUTPUT_NAME)
    set_target_properties(${target} PROPERTIES OUTPUT_NAME ${A_OUTPUT_NAME})
  endif()
  if(NOT A_TESTONLY)
    install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    set_property(GLOBAL APPEND PROPERTY KVF_INSTALLED_TARGETS ${target})
  endif()
endfunction()

# kvf_cc_test(NAME n SRCS ... [DEPS ...]): a GoogleTest binary registered with
# ctest as <package>_<name>, run from the source root (as Bazel runs tests from
# the runfiles root) so tests find checked-in data by its repository path.
function(kvf_cc_test)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS;DATA" ${ARGN})
  if(NOT BUILD_TESTING)
    return()
  endif()
  _kvf_target_name(target ${A_NAME})
  add_executable(${target} ${A_SRCS})
  target_compile_options(${target} PRIVATE ${KVF_COPTS})
  target_link_libraries(${target} PRIVATE ${A_DEPS} GTest::gmock GTest::gtest_main)
  add_test(NAME ${target} COMMAND ${target} WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}")
endfunction()

# kvf_proto_library(NAME n SRCS a.proto ...): messages and gRPC stubs generated
# by the system protoc and grpc_cpp_plugin, included as "kvfabric/v1/a.pb.h".
function(kvf_proto_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  _kvf_target_name(target ${A_NAME})
  set(gen_root "${CMAKE_CURRENT_BINARY_DIR}")
  set(gen_srcs)
  set(gen_hdrs)
  set(proto_paths)
  foreach(src ${A_SRCS})
    string(REGEX REPLACE "\\.proto$" "" base "${src}")
    list(APPEND gen_srcs "${gen_root}/${base}.pb.cc" "${gen_root}/${base}.grpc.pb.cc")
    list(APPEND gen_hdrs "${gen_root}/${base}.pb.h" "${gen_root}/${base}.grpc.pb.h")
    list(APPEND proto_paths "${CMAKE_CURRENT_SOURCE_DIR}/${src}")
  endforeach()
  add_custom_command(
    OUTPUT ${gen_srcs} ${gen_hdrs}
    COMMAND ${KVF_PROTOC} -I "${CMAKE_CURRENT_SOURCE_DIR}" --cpp_out "${gen_root}"
            --grpc_out "${gen_root}" --plugin=protoc-gen-grpc=${KVF_GRPC_CPP_PLUGIN}
            ${proto_paths}
    DEPENDS ${proto_paths}
    COMMENT "protoc ${A_SRCS}"
    VERBATIM)
  add_library(${target} STATIC ${gen_srcs} ${A_SRCS})
  set_source_files_properties(${A_SRCS} PROPERTIES HEADER_FILE_ONLY ON)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                             OUTPUT_NAME kvfabric_${target})
  add_library(kvfabric::${target} ALIAS ${target})
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS "${gen_root}" FILES ${gen_hdrs})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${gen_root}> $<INSTALL_INTERFACE:include/kvfabric>)
  target_link_libraries(${target} PUBLIC ${A_DEPS} gRPC::grpc++ protobuf::libprotobuf)
endfunction()

# kvf_cuda_library(NAME n SRCS a.cu ... [HDRS ...] [DEPS ...] [TESTONLY]): .cu
# files compiled by nvcc for sm_80 and sm_90 with the static CUDA runtime.
# Declared only when CUDA was detected (KVF_HAVE_CUDA).
function(kvf_cuda_library)
  cmake_parse_arguments(A "TESTONLY" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  _kvf_target_name(target ${A_NAME})
  add_library(${target} STATIC ${A_SRCS})
  add_library(kvfabric::${target} ALIAS ${target})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                             CUDA_ARCHITECTURES "80;90"
                                             OUTPUT_NAME kvfabric_${target})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(A_HDRS)
    target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}"
                   FILES ${A_HDRS})
  endif()
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:include/kvfabric>)
  target_link_libraries(${target} PUBLIC ${A_DEPS} CUDA::cudart_static)
endfunction()
