// Helpers the benchmarks share: a benchmark stops at the first error, with
// the error, rather than report figures from a broken run.
#ifndef HOIST_BENCH_BENCH_UTIL_H_
#define HOIST_BENCH_BENCH_UTIL_H_

#include <cstdlib>
#include <iostream>

#include "absl/status/statusor.h"

namespace hoist::bench {

// Prints "<program>: <status>" and exits 1.
[[noreturn]] inline void Die(const absl::Status& status) {
  std::cerr << program_invocation_short_name << ": " << status << "\n";
  std::exit(1);
}

// Nothing, or Die.
inline void Check(const absl::Status& status) {
  if (!status.ok()) Die(status);
}

// The value, or Die.
template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Die(value.status());
  return *std::move(value);
}

}  // namespace hoist::bench

#endif  // HOIST_BENCH_BENCH_UTIL_H_
