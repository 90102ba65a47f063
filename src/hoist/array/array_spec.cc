#include "hoist/array_spec.h"

#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hoist {

absl::StatusOr<Topology> Topology::Create(
    std::vector<std::vector<DeviceId>> process_devices) {
  if (process_devices.empty()) {
    return absl::InvalidArgumentError("topology has no processes");
  }
  Topology topology;
  for (size_t p = 0; p < process_devices.size(); ++p) {
    for (DeviceId device : process_devices[p]) {
      if (device < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "process %d lists negative device id %d", p, device));
      }
      auto [it, inserted] = topology.owner_.emplace(device, p);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrFormat("device %d is owned by both process %d and %d",
                            device, it->second, p));
      }
    }
  }
  topology.process_devices_ = std::move(process_devices);
  return topology;
}

Topology Topology::Uniform(int processes, int devices_per_process) {
  assert(processes >= 1 && devices_per_process >= 1);
  std::vector<std::vector<DeviceId>> process_devices(processes);
  for (int p = 0; p < processes; ++p) {
    for (int d = 0; d < devices_per_process; ++d) {
      process_devices[p].push_back(int64_t{p} * devices_per_process + d);
    }
  }
  return *Create(std::move(process_devices));
}

std::optional<int> Topology::ProcessOf(DeviceId device) const {
  auto it = owner_.find(device);
  if (it == owner_.end()) return std::nullopt;
  return it->second;
}

}  // namespace hoist
