// How the bindings turn absl statuses into Python errors: a failed call
// throws StatusError, which hoist._hoist's translator raises as
// hoist._hoist.Error(code, message).
#ifndef HOIST_PYTHON_PY_STATUS_H_
#define HOIST_PYTHON_PY_STATUS_H_

#include <nanobind/nanobind.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hoist {

// Carried to Python as hoist._hoist.Error(code, message).
struct StatusError {
  int code;
  std::string message;
};

inline void Check(const absl::Status& status) {
  if (!status.ok()) {
    throw StatusError{static_cast<int>(status.code()),
                      std::string(status.message())};
  }
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}

// Runs `fn`, which returns an absl::StatusOr, without the GIL (so other
// Python threads and hoist's own callbacks run meanwhile); its value, or
// its error raised.
template <typename F>
auto WithoutGil(F&& fn) {
  decltype(fn()) result;
  {
    nanobind::gil_scoped_release release;
    result = fn();
  }
  return Check(std::move(result));
}

inline void Invalid(const std::string& message) {
  Check(absl::InvalidArgumentError(message));
}

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_STATUS_H_
