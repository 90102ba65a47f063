// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef HOIST_BASE_STATUS_MACROS_H_
#define HOIST_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// RETURN_IF_ERROR(expr): returns the status of `expr` if it is not OK.
#define RETURN_IF_ERROR(expr)                                         \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (0)

// ASSIGN_OR_RETURN(decl, expr): evaluates the StatusOr `expr`; returns its
// status if not OK, else moves its value into `decl` (a declaration such as
// `Foo foo` or an lvalue).
#define ASSIGN_OR_RETURN(decl, expr) \
  HOIST_ASSIGN_OR_RETURN_IMPL(decl, expr, HOIST_CONCAT(status_or_, __LINE__))
#define HOIST_ASSIGN_OR_RETURN_IMPL(decl, expr, tmp) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  decl = *std::move(tmp)
#define HOIST_CONCAT_INNER(a, b) a##b
#define HOIST_CONCAT(a, b) HOIST_CONCAT_INNER(a, b)

#endif  // HOIST_BASE_STATUS_MACROS_H_
