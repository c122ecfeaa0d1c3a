// Early-return helpers over absl::Status, named as the Abseil releases that
// ship them do (Debian's Abseil 20220623 lacks them).
#ifndef TANDEM_COMMON_BASE_STATUS_MACROS_H_
#define TANDEM_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status tandem_status_ = (expr);          \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (false)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on
// error returns its status, otherwise moves the value into `lhs`, which may be
// a declaration (`auto x`, `const Foo& y` is not allowed) or an lvalue.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __LINE__), lhs, expr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TANDEM_COMMON_BASE_STATUS_MACROS_H_
