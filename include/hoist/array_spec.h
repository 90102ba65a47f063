// ArraySpec (what an array is) and Topology (which process owns which
// device): the inputs every process gives the planner.
#ifndef HOIST_ARRAY_SPEC_H_
#define HOIST_ARRAY_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "hoist/dtype.h"
#include "hoist/mesh.h"
#include "hoist/sharding.h"

namespace hoist {

// A global array: its name in the checkpoint ("params/layers/0/w"), element
// type, global shape, and how it is sharded.
struct ArraySpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  Sharding sharding = ExplicitSharding{};
  friend bool operator==(const ArraySpec&, const ArraySpec&) = default;
};

// Which devices each process of the job drives. Immutable, thread-compatible.
class Topology {
 public:
  // kInvalidArgument if there are no processes, or a device id is negative or
  // owned by two processes. A process may own no devices.
  static absl::StatusOr<Topology> Create(
      std::vector<std::vector<DeviceId>> process_devices);
  // `processes` processes owning devices_per_process consecutive ids each:
  // process p owns [p * devices_per_process, (p + 1) * devices_per_process).
  // Precondition: both >= 1.
  static Topology Uniform(int processes, int devices_per_process);

  int num_processes() const {
    return static_cast<int>(process_devices_.size());
  }
  int64_t num_devices() const { return static_cast<int64_t>(owner_.size()); }
  const std::vector<DeviceId>& devices(int process) const {
    return process_devices_[process];
  }
  // The process that owns `device`, if any.
  std::optional<int> ProcessOf(DeviceId device) const;

 private:
  Topology() = default;
  std::vector<std::vector<DeviceId>> process_devices_;
  absl::flat_hash_map<DeviceId, int> owner_;
};

}  // namespace hoist

#endif  // HOIST_ARRAY_SPEC_H_
