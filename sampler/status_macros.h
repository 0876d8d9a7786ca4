// Status propagation helpers for samplerd (Debian's Abseil 20220623 predates absl's own).
//
//   absl::StatusOr<int> ParseRow(...);
//   absl::Status Use() {
//     ASSIGN_OR_RETURN(int row, ParseRow(...));
//     RETURN_IF_ERROR(CheckRow(row));
//     return absl::OkStatus();
//   }
#ifndef SAMPLERD_SAMPLER_STATUS_MACROS_H_
#define SAMPLERD_SAMPLER_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SAMPLERD_CONCAT_INNER(a, b) a##b
#define SAMPLERD_CONCAT(a, b) SAMPLERD_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    const absl::Status _status_ = (expr);      \
    if (!_status_.ok()) return _status_;       \
  } while (false)

// Evaluates `rexpr` (a StatusOr); returns its status when not OK, else moves the value into `lhs`.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  SAMPLERD_ASSIGN_OR_RETURN_IMPL(SAMPLERD_CONCAT(_status_or_, __LINE__), lhs, rexpr)

#define SAMPLERD_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return statusor.status();              \
  lhs = std::move(statusor).value()

#endif  // SAMPLERD_SAMPLER_STATUS_MACROS_H_
