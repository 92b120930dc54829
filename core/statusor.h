// StatusOr<T>: either a value of type T or a non-OK Status saying why there is
// none. Accessing the value of an error StatusOr aborts the process (a
// programming error, not a runtime condition): check ok() first.
#ifndef KVFABRIC_CORE_STATUSOR_H_
#define KVFABRIC_CORE_STATUSOR_H_

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/status.h"

namespace kvfabric {

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok(). An OK status without a value becomes Internal.
  // (Initialised, not assigned: nvcc's front end warns that assigning a
  // [[nodiscard]] Status discards operator='s result.)
  StatusOr(Status status)  // NOLINT(runtime/explicit)
      : status_(status.ok() ? Status::Internal("StatusOr constructed from OK without a value")
                            : std::move(status)) {}
  StatusOr(const T& value) : value_(value) {}  // NOLINT(runtime/explicit)
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT(runtime/explicit)
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                        !std::is_same_v<std::decay_t<U>, T> &&
                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, StatusOr<T>>>>
  StatusOr(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT(runtime/explicit)

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  const T& value() const& { Check(); return *value_; }
  T& value() & { Check(); return *value_; }
  T&& value() && { Check(); return std::move(*value_); }

  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void Check() const {
    if (!value_.has_value()) {
      std::fprintf(stderr, "kvfabric: value() of an error StatusOr: %s\n",
                   status_.ToString().c_str());
      std::abort();
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace kvfabric

#define KVF_STATUS_CONCAT_INNER_(a, b) a##b
#define KVF_STATUS_CONCAT_(a, b) KVF_STATUS_CONCAT_INNER_(a, b)

// KVF_ASSIGN_OR_RETURN(auto x, Foo()); returns Foo()'s status if it failed.
#define KVF_ASSIGN_OR_RETURN(lhs, expr) \
  KVF_ASSIGN_OR_RETURN_IMPL_(KVF_STATUS_CONCAT_(kvf_statusor_, __LINE__), lhs, expr)
#define KVF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

#endif  // KVFABRIC_CORE_STATUSOR_H_
