# What the CMake package ships: libkvfabric, the client library engines link,
# as a shared library (kvfabric::kvfabric) and a static one
# (kvfabric::kvfabric_static), its public headers, the package config and a
# pkg-config file. The twin of //client:libkvfabric.so in client/BUILD.
#
# Both libraries hold the objects of the client's closure: every kvfabric
# library that client_kvfabric_c (the C API) reaches through its link
# dependencies: core, proto, transport and gpu parts, never the server, CLI,
# bench or demo. The closure is computed from the targets' link libraries, so a
# dependency added to a client target in its CMakeLists.txt is picked up here.
#
# Shared: system libraries (gRPC, protobuf, spdlog, fmt, OpenSSL, UCX) are
# PRIVATE link dependencies, DT_NEEDED entries of libkvfabric.so, so a consumer
# needs their runtime packages only, no CMake package and no -dev package;
# libstdc++ is a DT_NEEDED entry too, so a C program links with `-lkvfabric`
# alone. client/libkvfabric.map exports the C API (kvf_*) and the C++ API
# (namespace kvfabric) and keeps everything else local: the generated protocol
# classes (kvfabric::v1), and the template and inline code of gRPC, protobuf,
# spdlog and the standard library instantiated in kvfabric's objects.
#
# Static: one archive, libkvfabric.a; its consumers link the same system
# libraries themselves, so kvfabricConfig.cmake finds them only when the
# `static` component is requested.
#
# CUDA: when the build has CUDA, the client's closure holds the CUDA device
# (gpu/cuda) and its kernels for sm_80 and sm_90, with the static CUDA runtime
# (CUDA::cudart_static, as every kvfabric CUDA library links it): libkvfabric.so
# then needs the driver (libcuda.so.1, opened by the runtime when a CUDA
# device is first used) but no toolkit, and has no DT_NEEDED entry for CUDA.
# Consumers of libkvfabric.a link cudart_static themselves, so the `static`
# component finds CUDAToolkit.

include(CMakePackageConfigHelpers)

# _kvf_closure(<out_objects> <out_external> <targets>...): the kvfabric
# libraries reachable from <targets> (those with objects, in link order) and
# the link items outside the project (imported targets, flags) they use.
function(_kvf_closure out_objects out_external)
  set(todo ${ARGN})
  set(seen)
  set(objects)
  set(external)
  while(todo)
    list(POP_FRONT todo item)
    # Static libraries list their PRIVATE dependencies as $<LINK_ONLY:x>.
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
    if(item MATCHES "^\\$<")
      message(FATAL_ERROR "kvfabric package: cannot fold the link item '${item}' into "
                          "libkvfabric (cmake/KvfPackage.cmake)")
    endif()
    if(TARGET ${item})
      get_target_property(aliased ${item} ALIASED_TARGET)
      if(aliased)
        set(item ${aliased})
      endif()
      get_target_property(imported ${item} IMPORTED)
      if(imported)
        list(APPEND external ${item})
        continue()
      endif()
      if(item IN_LIST seen)
        continue()
      endif()
      list(APPEND seen ${item})
      get_target_property(type ${item} TYPE)
      if(type STREQUAL "STATIC_LIBRARY")
        list(APPEND objects ${item})
        get_target_property(deps ${item} LINK_LIBRARIES)
      elseif(type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
      else()
        message(FATAL_ERROR "kvfabric package: ${item} is a ${type}; the client's closure "
                            "may hold only static and interface libraries")
      endif()
      if(deps)
        list(APPEND todo ${deps})
      endif()
    else()
      list(APPEND external ${item})
    endif()
  endwhile()
  list(REMOVE_DUPLICATES external)
  set(${out_objects} ${objects} PARENT_SCOPE)
  set(${out_external} ${external} PARENT_SCOPE)
endfunction()

# _kvf_header_closure(<out> <headers>...): the headers (paths relative to the
# source root) that <headers> reach through #include "..." lines, themselves
# included. A quoted include is looked up under the source root, then under
# client/include (the C header's root); one found in neither is an error, so
# no installed header includes a header that is not installed.
function(_kvf_header_closure out)
  set(todo ${ARGN})
  set(found)
  while(todo)
    list(POP_FRONT todo h)
    if(h IN_LIST found)
      continue()
    endif()
    list(APPEND found ${h})
    file(STRINGS "${PROJECT_SOURCE_DIR}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
      if(EXISTS "${PROJECT_SOURCE_DIR}/${inc}")
        list(APPEND todo ${inc})
      elseif(EXISTS "${PROJECT_SOURCE_DIR}/client/include/${inc}")
        list(APPEND todo client/include/${inc})
      else()
        message(FATAL_ERROR "kvfabric package: ${h} includes \"${inc}\", which is not a "
                            "source header; a public header may include only public headers")
      endif()
    endforeach()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# How kvfabricConfig.cmake finds each system library a static consumer links,
# by the namespace of its imported target.
set(_kvf_find_gRPC "find_dependency(gRPC CONFIG)")
set(_kvf_find_protobuf "find_dependency(Protobuf)")
set(_kvf_find_spdlog "find_dependency(spdlog CONFIG)")
set(_kvf_find_fmt "find_dependency(fmt CONFIG)")
set(_kvf_find_OpenSSL "find_dependency(OpenSSL COMPONENTS Crypto SSL)")
set(_kvf_find_nlohmann_json "find_dependency(nlohmann_json CONFIG)")
set(_kvf_find_Threads "find_dependency(Threads)")
set(_kvf_find_prometheus-cpp "find_dependency(prometheus-cpp CONFIG)")
set(_kvf_find_CUDA "find_dependency(CUDAToolkit)")

function(_kvf_find_calls out)
  set(calls "")
  set(done)
  foreach(item ${ARGN})
    if(NOT item MATCHES "^([A-Za-z0-9_-]+)::(.*)$")
      continue()  # a plain flag or library name: nothing to find
    endif()
    set(ns ${CMAKE_MATCH_1})
    set(name ${CMAKE_MATCH_2})
    if(ns STREQUAL "PkgConfig")
      # An optional part found by _kvf_optional_pkg (cmake/KvfDependencies.cmake).
      if(NOT DEFINED ${name}_MODULES)
        message(FATAL_ERROR "kvfabric package: no pkg-config modules recorded for ${item}")
      endif()
      set(call "find_dependency(PkgConfig)\n  pkg_check_modules(${name} REQUIRED IMPORTED_TARGET ${${name}_MODULES})")
    elseif(DEFINED _kvf_find_${ns})
      set(call "${_kvf_find_${ns}}")
    else()
      message(FATAL_ERROR "kvfabric package: libkvfabric.a links ${item}; say how "
                          "kvfabricConfig.cmake finds it (_kvf_find_${ns} in cmake/KvfPackage.cmake)")
    endif()
    if(NOT call IN_LIST done)
      list(APPEND done "${call}")
      string(APPEND calls "  ${call}\n")
    endif()
  endforeach()
  set(${out} "${calls}" PARENT_SCOPE)
endfunction()

_kvf_closure(kvf_client_parts kvf_client_external client_kvfabric_c)
foreach(part ${kvf_client_parts})
  if(part MATCHES "^(server|cli|bench|tests)_")
    message(FATAL_ERROR "kvfabric package: the client library reaches ${part}; "
                        "libkvfabric must not hold server, CLI, bench or test code")
  endif()
  list(APPEND kvf_client_objects $<TARGET_OBJECTS:${part}>)
endforeach()
list(LENGTH kvf_client_parts kvf_part_count)
list(JOIN kvf_client_external ", " kvf_external_text)
message(STATUS "kvfabric: libkvfabric holds ${kvf_part_count} parts of the client's closure; "
               "links ${kvf_external_text}")

# The public headers: the C API, the C++ Client, the CPU device an engine
# hands the Client, and what they include. Installed under include/kvfabric/
# with their source paths ("client/kvfabric_client.h"); the C header as
# include/kvfabric/kvfabric.h ("kvfabric/kvfabric.h" with -I<prefix>/include).
_kvf_header_closure(kvf_public_headers
  client/include/kvfabric/kvfabric.h client/kvfabric_client.h gpu/cpu/cpu_device.h core/crc32c.h)

set(kvf_soversion ${PROJECT_VERSION_MAJOR})
set(kvf_map "${PROJECT_SOURCE_DIR}/client/libkvfabric.map")

add_library(kvfabric_shared SHARED ${kvf_client_objects})
add_library(kvfabric::kvfabric ALIAS kvfabric_shared)
set_target_properties(kvfabric_shared PROPERTIES
  OUTPUT_NAME kvfabric
  EXPORT_NAME kvfabric
  VERSION ${PROJECT_VERSION}
  SOVERSION ${kvf_soversion}
  LINKER_LANGUAGE CXX
  LINK_DEPENDS "${kvf_map}")
# --as-needed: gRPC's CMake targets name every abseil library; only those the
# objects use become DT_NEEDED. --no-undefined: the library is complete, so
# a consumer links it with nothing else.
target_link_options(kvfabric_shared PRIVATE
  "LINKER:--as-needed" "LINKER:--no-undefined" "LINKER:--version-script=${kvf_map}")
target_link_libraries(kvfabric_shared PRIVATE ${kvf_client_external}
                      INTERFACE Threads::Threads)
target_include_directories(kvfabric_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/client/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kvfabric>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

add_library(kvfabric_static STATIC ${kvf_client_objects})
add_library(kvfabric::kvfabric_static ALIAS kvfabric_static)
set_target_properties(kvfabric_static PROPERTIES OUTPUT_NAME kvfabric LINKER_LANGUAGE CXX)
# A C project links a static C++ library with the C driver: name the C++
# runtime for it (the C++ driver brings its own).
target_link_libraries(kvfabric_static INTERFACE ${kvf_client_external}
                      $<$<NOT:$<LINK_LANGUAGE:CXX>>:stdc++> $<$<NOT:$<LINK_LANGUAGE:CXX>>:m>)
target_include_directories(kvfabric_static INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/client/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kvfabric>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# The exports an engine's dynamic linker sees (the script Bazel's
# //client:libkvfabric_so_test runs too).
if(BUILD_TESTING)
  add_test(NAME client_libkvfabric_so_test
    COMMAND "${PROJECT_SOURCE_DIR}/client/libkvfabric_test.sh" $<TARGET_FILE:kvfabric_shared>
            "${PROJECT_SOURCE_DIR}/client/include/kvfabric/kvfabric.h")
endif()

# kvfabric_package: the two libraries alone (`cmake --build B --target
# kvfabric_package`), without the server, CLI and bench.
add_custom_target(kvfabric_package DEPENDS kvfabric_shared kvfabric_static)

set_property(GLOBAL APPEND PROPERTY KVF_INSTALLED_TARGETS kvfabric_shared kvfabric_static)
install(TARGETS kvfabric_shared EXPORT kvfabricTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvfabric_static EXPORT kvfabricStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(h ${kvf_public_headers})
  if(h MATCHES "^client/include/(.*)$")
    get_filename_component(dir "${CMAKE_MATCH_1}" DIRECTORY)
    install(FILES "${h}" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
  else()
    get_filename_component(dir "${h}" DIRECTORY)
    install(FILES "${h}" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvfabric/${dir})
  endif()
endforeach()

set(kvf_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvfabric)
install(EXPORT kvfabricTargets NAMESPACE kvfabric:: DESTINATION ${kvf_cmake_dir})
install(EXPORT kvfabricStaticTargets NAMESPACE kvfabric:: DESTINATION ${kvf_cmake_dir})
_kvf_find_calls(KVF_STATIC_FIND_DEPENDENCIES ${kvf_client_external})
configure_package_config_file(cmake/kvfabricConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/kvfabricConfig.cmake" INSTALL_DESTINATION ${kvf_cmake_dir})
# 0.x: a minor release may change the ABI (docs/build.md).
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/kvfabricConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/kvfabricConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/kvfabricConfigVersion.cmake"
        DESTINATION ${kvf_cmake_dir})

# pkg-config, for builds without CMake: `pkg-config --cflags --libs kvfabric`
# (shared) or `--static` (the system libraries libkvfabric.a needs).
set(kvf_pc_requires "")
set(KVF_PC_LIBS_PRIVATE "")
foreach(item ${kvf_client_external})
  if(item MATCHES "^gRPC::")
    list(APPEND kvf_pc_requires grpc++)
  elseif(item MATCHES "^protobuf::")
    list(APPEND kvf_pc_requires protobuf)
  elseif(item MATCHES "^spdlog::")
    list(APPEND kvf_pc_requires spdlog fmt)
  elseif(item MATCHES "^fmt::")
    list(APPEND kvf_pc_requires fmt)
  elseif(item STREQUAL "OpenSSL::SSL")
    list(APPEND kvf_pc_requires libssl)
  elseif(item MATCHES "^OpenSSL::")
    list(APPEND kvf_pc_requires libcrypto)
  elseif(item STREQUAL "prometheus-cpp::pull")
    list(APPEND kvf_pc_requires prometheus-cpp-pull)
  elseif(item STREQUAL "prometheus-cpp::core")
    list(APPEND kvf_pc_requires prometheus-cpp-core)
  elseif(item MATCHES "^PkgConfig::(.*)$")
    list(APPEND kvf_pc_requires ${${CMAKE_MATCH_1}_MODULES})
  elseif(item STREQUAL "CUDA::cudart_static")
    string(APPEND KVF_PC_LIBS_PRIVATE " ${CUDA_cudart_static_LIBRARY} -ldl -lrt")
  endif()
endforeach()
list(REMOVE_DUPLICATES kvf_pc_requires)
list(JOIN kvf_pc_requires ", " KVF_PC_REQUIRES_PRIVATE)
# Relocatable: prefix is found from the .pc file's own folder.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVF_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(KVF_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH kvf_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" kvf_pc_up "${kvf_pc_up}")
  set(KVF_PC_PREFIX "\${pcfiledir}/${kvf_pc_up}")
  set(KVF_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
configure_file(cmake/kvfabric.pc.in "${CMAKE_CURRENT_BINARY_DIR}/kvfabric.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/kvfabric.pc"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
