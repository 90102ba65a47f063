// Test helper: a Device wrapper whose Nth dispatch fails after its copy has
// run (as a device reporting an error at completion would), or at once.
#ifndef HOIST_TESTING_FAULTY_DEVICE_H_
#define HOIST_TESTING_FAULTY_DEVICE_H_

#include <atomic>

#include "absl/status/status.h"
#include "hoist/device.h"

namespace hoist::testing {

class FaultyDevice final : public Device {
 public:
  // Dispatch number `fail_at` (0-based, counting CopyToHost and CopyFromHost)
  // completes with `error`; the others forward to `base`.
  FaultyDevice(Device& base, int fail_at, absl::Status error)
      : base_(base), fail_at_(fail_at), error_(std::move(error)) {}

  DeviceId id() const override { return base_.id(); }
  Future<> CopyToHost(absl::Span<const CopyOp> ops) override {
    return Fail(base_.CopyToHost(ops));
  }
  Future<> CopyFromHost(absl::Span<const CopyOp> ops) override {
    return Fail(base_.CopyFromHost(ops));
  }
  absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) override {
    return base_.Allocate(bytes);
  }
  DeviceCounters counters() const override { return base_.counters(); }

 private:
  Future<> Fail(Future<> copied) {
    if (next_.fetch_add(1) != fail_at_) return copied;
    Promise<> failed;
    Future<> future = failed.future();
    copied.OnReady([failed = std::move(failed), error = error_](
                       const absl::Status&) mutable { failed.Set(error); });
    return future;
  }

  Device& base_;
  const int fail_at_;
  const absl::Status error_;
  std::atomic<int> next_{0};
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_FAULTY_DEVICE_H_
