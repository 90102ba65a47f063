// Helpers the benchmarks share: a benchmark stops at the first error, with
// the error, rather than report figures from a broken run.
#ifndef HOIST_BENCH_BENCH_UTIL_H_
#define HOIST_BENCH_BENCH_UTIL_H_

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
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

// This process's peak resident memory so far (getrusage's maxrss).
inline int64_t PeakRssBytes() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return int64_t{usage.ru_maxrss} << 10;
}

// Seconds from `start` to now.
inline double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// The value, or Die.
template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Die(value.status());
  return *std::move(value);
}

}  // namespace hoist::bench

#endif  // HOIST_BENCH_BENCH_UTIL_H_
