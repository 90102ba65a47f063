// Helpers every backend uses on CopyOps: validation and normalization.
#ifndef HOIST_DEVICE_COPY_OP_H_
#define HOIST_DEVICE_COPY_OP_H_

#include <atomic>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/device.h"

namespace hoist {

// Checks every op and returns the ones that copy something, with
// contiguous multi-row ops (both pitches == width) folded into one row.
// kInvalidArgument naming the op for negative sizes, a null pointer with
// bytes to copy, a pitch smaller than the width, or a byte count that
// overflows int64_t.
absl::StatusOr<std::vector<CopyOp>> NormalizeCopyOps(
    absl::Span<const CopyOp> ops);

// A device's DeviceCounters, updated from any thread.
class AtomicDeviceCounters {
 public:
  // One dispatch of `ops` (normalized) ops.
  void AddDispatch(absl::Span<const CopyOp> ops) {
    int64_t bytes = 0;
    for (const CopyOp& op : ops) bytes += op.bytes();
    AddDispatch(static_cast<int64_t>(ops.size()), bytes);
  }
  // The same, from a caller that has counted the ops' bytes.
  void AddDispatch(int64_t ops, int64_t bytes) {
    dispatches_.fetch_add(1, std::memory_order_relaxed);
    ops_.fetch_add(ops, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void AddBusy(absl::Duration busy) {
    busy_ns_.fetch_add(absl::ToInt64Nanoseconds(busy),
                       std::memory_order_relaxed);
  }
  DeviceCounters Snapshot() const {
    DeviceCounters c;
    c.dispatches = dispatches_.load(std::memory_order_relaxed);
    c.ops = ops_.load(std::memory_order_relaxed);
    c.bytes = bytes_.load(std::memory_order_relaxed);
    c.busy_ns = busy_ns_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  std::atomic<int64_t> dispatches_{0}, ops_{0}, bytes_{0}, busy_ns_{0};
};

}  // namespace hoist

#endif  // HOIST_DEVICE_COPY_OP_H_
