// Value types of the checkpoint API: what a restore fills and reports, and
// what a verification finds.
#ifndef HOIST_CHECKPOINT_TYPES_H_
#define HOIST_CHECKPOINT_TYPES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/box.h"
#include "hoist/device.h"
#include "hoist/dtype.h"

namespace hoist {

// One box of an array to fill: `data` holds the box's bytes densely in C
// order, in the memory of `device`, or in host memory when `device` is null.
struct RestoreDestination {
  Box box;
  Device* device = nullptr;
  void* data = nullptr;
};

struct RestoreTarget {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // must match the checkpoint's
  std::vector<RestoreDestination> destinations;
};

// Every array of `specs` restored whole into host memory this object owns:
// targets[i] fills bytes[i] with array i, dense, in C order. The buffers are
// zero-filled (so resident) when made.
struct HostArrays {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<RestoreTarget> targets;
};
HostArrays WholeArraysInHost(absl::Span<const ArraySpec> specs);

struct RestoreOptions {
  int reader_threads = 8;  // extents read in parallel (default 8), >= 1
};

struct RestoreStats {
  int64_t extents_read = 0;
  int64_t bytes_read = 0;
  int64_t dispatches = 0;  // CopyFromHost calls
  int64_t waves = 0;
  absl::Duration elapsed;
};

// Live byte counts of one save, updated as it runs (this process's share).
struct SaveProgress {
  std::atomic<int64_t> staged_bytes{0};   // in host memory
  std::atomic<int64_t> written_bytes{0};  // handed to storage
  int64_t total_bytes = 0;
  absl::Time start;  // when Save() accepted the save
};

struct VerifyReport {
  int64_t arrays = 0;
  int64_t extents = 0;                // extents checked
  int64_t bytes = 0;                  // bytes read
  std::vector<std::string> problems;  // every one found, not only the first
  bool ok() const { return problems.empty(); }
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TYPES_H_
