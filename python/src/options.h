// Reading the Python package's keyword arguments into the C++ options
// (python/kvfabric/client.py passes them as one dict). The names are the C++
// option names (client/kvfabric_client.h, core/model_fingerprint.h); a name
// not listed is refused with the list of accepted ones, so a typo is never
// silently a default.
#ifndef KVFABRIC_PYTHON_SRC_OPTIONS_H_
#define KVFABRIC_PYTHON_SRC_OPTIONS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "client/kvfabric_client.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "gpu/device.h"

namespace kvfabric::python {

// A Status carried across pybind11 as a C++ exception; the module's
// translator raises the matching kvfabric.errors class (kvfabric.Unavailable,
// ...) with the code and message.
struct StatusError {
  explicit StatusError(Status s, std::shared_ptr<client::ContextReport> r = nullptr)
      : status(std::move(s)), report(std::move(r)) {}

  Status status;
  // Set by Finish: the report, attached to the exception as `.report`. (No
  // Python object here: a StatusError may be made while the GIL is released.)
  std::shared_ptr<client::ContextReport> report;
};

// Throws StatusError for a non-OK status, with `what` before its message.
void ThrowIfError(const Status& status, const char* what);

// `value` as a dict: a dict, or an object with as_dict() (the dataclasses
// kvfabric.ModelFingerprint and kvfabric.Security). InvalidArgument naming
// `what` otherwise.
pybind11::dict AsDict(const pybind11::handle& value, const std::string& what);

// `model` as a dict of ModelFingerprint fields; dtype as its name ("bf16").
ModelFingerprint ParseFingerprint(const pybind11::dict& model);

// The device the client creates: "cpu" (default) or "cuda" (a library built
// with CUDA), and its arena.
struct DeviceChoice {
  std::string kind = "cpu";
  gpu::DeviceOptions options;
};

// Every ClientOptions field but `recompute` and `device` from `options`;
// `device`, `device_index` and `device_arena_bytes` into *device. Throws
// StatusError (InvalidArgument naming the key) for an unknown key or a value
// of the wrong type or range.
client::ClientOptions ParseClientOptions(const pybind11::dict& options, DeviceChoice* device);

}  // namespace kvfabric::python

#endif  // KVFABRIC_PYTHON_SRC_OPTIONS_H_
