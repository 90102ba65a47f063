// The save planner. Steps, each deterministic:
//   1. Resolve every array's sharding into unique boxes and their replicas.
//   2. Decide per box how many slices, along which axis (the replica rule).
//   3. Assign slices to replica devices: fixed for the Orbax and single
//      rules; for the balanced rule, greedily (fixed loads first, then the
//      largest flexible box first) to the replicas whose process and device
//      carry the fewest bytes so far.
//   4. Order slices by (array, box), express each as one 2-D copy out of its
//      shard, and give it a file of its process (the least-filled writer
//      stream) and an aligned offset there.
#include "hoist/save_plan.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/utf8.h"

namespace hoist {
namespace {

// A distinct box of a layout: its replicas' devices, and their dense
// indices (Devices below).
struct LayoutBox {
  Box box;
  std::vector<DeviceId> replicas;  // replicas[r] holds replica r
  std::vector<int> indices;        // of replicas[r]
};

// The topology's devices numbered 0 .. n - 1, with their processes, so
// that the planner's inner loops index vectors instead of hashing ids.
class Devices {
 public:
  explicit Devices(const Topology& topology) {
    for (int p = 0; p < topology.num_processes(); ++p) {
      for (DeviceId device : topology.devices(p)) {
        index_.emplace(device, static_cast<int>(process_.size()));
        process_.push_back(p);
      }
    }
  }
  std::optional<int> Index(DeviceId device) const {
    auto it = index_.find(device);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }
  int ProcessOf(int index) const { return process_[index]; }
  int size() const { return static_cast<int>(process_.size()); }

 private:
  absl::flat_hash_map<DeviceId, int> index_;
  std::vector<int> process_;  // by index
};

// Sharding layouts, resolved once per distinct (shape, sharding): a large
// model repeats a few of them over thousands of arrays, and resolving one
// walks every device of its mesh.
class Layouts {
 public:
  // part_of_process >= 0 keeps only the boxes that process's devices hold,
  // with only those devices as their replicas (SavePlanOptions).
  Layouts(const Devices& devices, int part_of_process)
      : devices_(devices), part_of_process_(part_of_process) {}

  // The distinct boxes of `spec`'s layout (valid while this lives), or the
  // error of resolving it against the topology.
  absl::StatusOr<const std::vector<LayoutBox>*> Of(const ArraySpec& spec) {
    std::vector<std::pair<const Sharding*, size_t>>& seen =
        by_shape_[spec.shape];
    for (const auto& [sharding, at] : seen) {
      if (*sharding == spec.sharding) return &resolved_[at];
    }
    absl::StatusOr<ShardLayout> layout = spec.sharding.Layout(spec.shape);
    if (!layout.ok()) return layout.status();
    for (const DeviceShard& shard : layout->shards) {
      if (!devices_.Index(shard.device)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "device %d is not owned by any process of the topology (%d "
            "devices)",
            shard.device, devices_.size()));
      }
    }
    std::vector<LayoutBox> boxes;
    for (UniqueBox& unique : layout->unique_boxes) {
      LayoutBox box{std::move(unique.box), {}, {}};
      for (DeviceId device : unique.devices) {
        const int index = *devices_.Index(device);
        if (part_of_process_ >= 0 &&
            devices_.ProcessOf(index) != part_of_process_) {
          continue;
        }
        box.replicas.push_back(device);
        box.indices.push_back(index);
      }
      if (!box.replicas.empty()) boxes.push_back(std::move(box));
    }
    resolved_.push_back(std::move(boxes));
    seen.emplace_back(&spec.sharding, resolved_.size() - 1);
    return &resolved_[seen.back().second];
  }

 private:
  const Devices& devices_;
  const int part_of_process_;
  // Per shape, the shardings seen with it (they live in the caller's
  // specs) and where their layouts are.
  absl::flat_hash_map<std::vector<int64_t>,
                      std::vector<std::pair<const Sharding*, size_t>>>
      by_shape_;
  std::deque<std::vector<LayoutBox>> resolved_;  // stable addresses
};

// A unique box of one array, and how it will be divided.
struct Unit {
  int array = 0;
  int64_t item_bytes = 0;
  const LayoutBox* layout;  // the box and its replicas
  int64_t bytes = 0;
  int axis = 0;
  int64_t parts = 1;
  const Box& box() const { return layout->box; }
  int64_t replicas() const {
    return static_cast<int64_t>(layout->replicas.size());
  }
};

absl::Status ForArray(const ArraySpec& spec, const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrFormat("array '%s': %s", spec.name, status.message()));
}

int64_t CappedReplicas(const Unit& unit, const SavePlanOptions& options) {
  const int64_t r = unit.replicas();
  return options.max_replicas > 0 ? std::min<int64_t>(r, options.max_replicas)
                                  : r;
}

// Orbax: R equal slices along the first axis divisible by R, or none.
void DivideOrbax(Unit& unit, const SavePlanOptions& options) {
  const int64_t r = CappedReplicas(unit, options);
  if (r <= 1 || unit.bytes / r < options.min_slice_bytes) return;
  for (int d = 0; d < unit.box().rank(); ++d) {
    if (unit.box().shape()[d] % r == 0) {
      unit.axis = d;
      unit.parts = r;
      return;
    }
  }
}

// hoist: as many slices as replicas allow and min_slice_bytes permits, along
// the first axis longer than 1, uneven if need be. All dimensions before that
// axis have size 1, so every slice is one contiguous run of bytes; a box whose
// first such axis is shorter than the replica count gets fewer slices (the
// balancing of whole boxes across replicas makes up for it).
void DivideBalanced(Unit& unit, const SavePlanOptions& options) {
  int64_t n = CappedReplicas(unit, options);
  if (options.min_slice_bytes > 0) {
    n = std::min(n, unit.bytes / options.min_slice_bytes);
  }
  const std::vector<int64_t>& shape = unit.box().shape();
  auto axis = std::find_if(shape.begin(), shape.end(),
                           [](int64_t size) { return size > 1; });
  if (axis == shape.end()) return;  // a single element
  n = std::min(n, *axis);
  if (n <= 1) return;
  unit.axis = static_cast<int>(axis - shape.begin());
  unit.parts = n;
}

// The copy of `slice` out of the dense row-major buffer of `shard`. The two
// differ along at most one axis, so this is one 2-D copy.
SliceCopy CopyFor(const Box& shard, const Box& slice, int64_t item_bytes) {
  const Box rel = slice.RelativeTo(shard);
  int axis = 0;
  while (axis < shard.rank() && rel.shape()[axis] == shard.shape()[axis]) {
    ++axis;
  }
  SliceCopy copy;
  if (axis == shard.rank()) {  // the whole shard
    copy.rows = 1;
    copy.width_bytes = shard.num_elements() * item_bytes;
    copy.src_pitch_bytes = copy.width_bytes;
    return copy;
  }
  int64_t rows = 1;
  for (int d = 0; d < axis; ++d) rows *= shard.shape()[d];
  int64_t inner_bytes = item_bytes;
  for (int d = axis + 1; d < shard.rank(); ++d) inner_bytes *= shard.shape()[d];
  copy.rows = rows;
  copy.width_bytes = rel.shape()[axis] * inner_bytes;
  copy.src_offset_bytes = rel.origin()[axis] * inner_bytes;
  copy.src_pitch_bytes =
      rows == 1 ? copy.width_bytes : shard.shape()[axis] * inner_bytes;
  return copy;
}

// Running bytes per device and per process, for balancing, by dense
// device index.
class Loads {
 public:
  Loads(const Topology& topology, const Devices& devices)
      : devices_(devices),
        device_bytes_(devices.size(), 0),
        process_bytes_(topology.num_processes(), 0),
        process_devices_(topology.num_processes(), 0) {
    for (int p = 0; p < topology.num_processes(); ++p) {
      process_devices_[p] = static_cast<double>(topology.devices(p).size());
    }
  }

  void Add(int device, int64_t bytes) {
    device_bytes_[device] += bytes;
    process_bytes_[devices_.ProcessOf(device)] += bytes;
  }

  // The process's mean bytes per device plus the device's own: low when both
  // the host (which writes) and the device (which copies) have little work.
  double Score(int device) const {
    const int process = devices_.ProcessOf(device);
    return static_cast<double>(device_bytes_[device]) +
           static_cast<double>(process_bytes_[process]) /
               process_devices_[process];
  }

 private:
  const Devices& devices_;
  std::vector<int64_t> device_bytes_;
  std::vector<int64_t> process_bytes_;
  std::vector<double> process_devices_;
};

struct Assigned {
  int array;
  Box box;
  const Box* shard_box;  // the unit's
  DeviceId device;
  int process;
  int64_t item_bytes;
};

std::vector<Assigned> AssignFixed(const std::vector<Unit>& units,
                                  const Devices& devices) {
  std::vector<Assigned> out;
  for (const Unit& unit : units) {
    const LayoutBox& layout = *unit.layout;
    if (unit.parts == 1) {
      out.push_back({unit.array, layout.box, &layout.box, layout.replicas[0],
                     devices.ProcessOf(layout.indices[0]), unit.item_bytes});
      continue;
    }
    std::vector<Box> parts = layout.box.Split(unit.axis, unit.parts);
    for (size_t i = 0; i < parts.size(); ++i) {
      out.push_back({unit.array, std::move(parts[i]), &layout.box,
                     layout.replicas[i], devices.ProcessOf(layout.indices[i]),
                     unit.item_bytes});
    }
  }
  return out;
}

std::vector<Assigned> AssignBalanced(const std::vector<Unit>& units,
                                     const Topology& topology,
                                     const Devices& devices) {
  std::vector<int> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  // Boxes with one replica have no choice: place them first, then the rest
  // largest first (LPT). Ties keep plan order, so the result is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool fixed_a = units[a].replicas() == 1;
    const bool fixed_b = units[b].replicas() == 1;
    if (fixed_a != fixed_b) return fixed_a;
    return units[a].bytes > units[b].bytes;
  });
  Loads loads(topology, devices);
  std::vector<Assigned> out;
  // (score, device id, replica): ties go to the lower device id.
  std::vector<std::tuple<double, DeviceId, int>> ranked;
  for (int u : order) {
    const Unit& unit = units[u];
    const LayoutBox& layout = *unit.layout;
    std::vector<Box> parts = unit.parts == 1
                                 ? std::vector<Box>{layout.box}
                                 : layout.box.Split(unit.axis, unit.parts);
    ranked.clear();
    for (size_t r = 0; r < layout.indices.size(); ++r) {
      ranked.emplace_back(loads.Score(layout.indices[r]), layout.replicas[r],
                          static_cast<int>(r));
    }
    std::partial_sort(ranked.begin(), ranked.begin() + parts.size(),
                      ranked.end());
    // Split() yields the larger parts first; they go to the idlest replicas.
    for (size_t i = 0; i < parts.size(); ++i) {
      const int r = std::get<2>(ranked[i]);
      const int64_t bytes = parts[i].num_elements() * unit.item_bytes;
      loads.Add(layout.indices[r], bytes);
      out.push_back({unit.array, std::move(parts[i]), &layout.box,
                     layout.replicas[r], devices.ProcessOf(layout.indices[r]),
                     unit.item_bytes});
    }
  }
  return out;
}

}  // namespace

absl::Status ValidateSavePlanOptions(const SavePlanOptions& options) {
  if (options.writer_streams < 1 || options.writer_streams > 100) {
    return absl::InvalidArgumentError(
        absl::StrFormat("writer_streams is %d; it must be in [1, 100]",
                        options.writer_streams));
  }
  const int64_t a = options.alignment_bytes;
  if (a < 4096 || (a & (a - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "alignment_bytes is %d; it must be a power of two >= 4096 (the "
        "format's extent alignment)",
        a));
  }
  if (options.min_slice_bytes < 0 || options.max_replicas < 0) {
    return absl::InvalidArgumentError(
        "min_slice_bytes and max_replicas must be >= 0");
  }
  return absl::OkStatus();
}

std::string_view ReplicaRuleName(ReplicaRule rule) {
  switch (rule) {
    case ReplicaRule::kSingleReplica:
      return "single";
    case ReplicaRule::kOrbax:
      return "orbax";
    case ReplicaRule::kBalanced:
      return "balanced";
  }
  return "unknown";
}

absl::StatusOr<ReplicaRule> ParseReplicaRule(std::string_view name) {
  for (ReplicaRule rule : {ReplicaRule::kSingleReplica, ReplicaRule::kOrbax,
                           ReplicaRule::kBalanced}) {
    if (ReplicaRuleName(rule) == name) return rule;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown replica rule '%s' (expected single, orbax or balanced)", name));
}

absl::StatusOr<SavePlan> MakeSavePlan(absl::Span<const ArraySpec> arrays,
                                      const Topology& topology,
                                      const SavePlanOptions& options) {
  if (absl::Status status = ValidateSavePlanOptions(options); !status.ok()) {
    return status;
  }
  if (options.part_of_process >= topology.num_processes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "part_of_process is %d but the topology has %d processes",
        options.part_of_process, topology.num_processes()));
  }
  SavePlan plan;
  plan.options = options;
  const Devices devices(topology);
  Layouts layouts(devices, options.part_of_process);
  std::vector<Unit> units;
  absl::flat_hash_set<std::string_view> names;
  for (int i = 0; i < static_cast<int>(arrays.size()); ++i) {
    const ArraySpec& spec = arrays[i];
    if (spec.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("array %d has an empty name", i));
    }
    if (!IsValidUtf8(spec.name)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array %d: name '%s' is not valid UTF-8 (a manifest is JSON)", i,
          absl::CHexEscape(spec.name)));
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("array name '%s' appears more than once", spec.name));
    }
    if (spec.shape.size() > kMaxRank) {
      return ForArray(spec, absl::InvalidArgumentError(absl::StrFormat(
                                "rank %d is above the limit of %d",
                                spec.shape.size(), kMaxRank)));
    }
    absl::StatusOr<const std::vector<LayoutBox>*> layout = layouts.Of(spec);
    if (!layout.ok()) return ForArray(spec, layout.status());
    const int64_t item_bytes = ItemSize(spec.dtype);
    if (!CheckedMul(Box::FromShape(spec.shape).num_elements(), item_bytes)) {
      return ForArray(spec, absl::InvalidArgumentError(
                                "its size in bytes overflows int64"));
    }
    PlannedArray planned{spec.name, spec.dtype, spec.shape, 1, false};
    for (const LayoutBox& unique : **layout) {
      Unit unit;
      unit.array = i;
      unit.item_bytes = item_bytes;
      unit.layout = &unique;
      unit.bytes = unique.box.num_elements() * item_bytes;
      switch (options.replica_rule) {
        case ReplicaRule::kSingleReplica:
          break;
        case ReplicaRule::kOrbax:
          DivideOrbax(unit, options);
          break;
        case ReplicaRule::kBalanced:
          DivideBalanced(unit, options);
          break;
      }
      planned.replicas = std::max(planned.replicas, unit.replicas());
      if (unit.replicas() > 1 && unit.parts == 1) planned.unsplit = true;
      units.push_back(std::move(unit));
    }
    plan.arrays.push_back(std::move(planned));
  }

  std::vector<Assigned> assigned =
      options.replica_rule == ReplicaRule::kBalanced
          ? AssignBalanced(units, topology, devices)
          : AssignFixed(units, devices);
  std::sort(assigned.begin(), assigned.end(),
            [](const Assigned& a, const Assigned& b) {
              if (a.array != b.array) return a.array < b.array;
              return a.box < b.box;
            });

  const int streams = options.writer_streams;
  for (int p = 0; p < topology.num_processes(); ++p) {
    for (int s = 0; s < streams; ++s) {
      plan.files.push_back({p, s, 0});
    }
  }
  plan.slices.reserve(assigned.size());
  for (Assigned& a : assigned) {
    PlannedSlice slice;
    slice.array = a.array;
    slice.device = a.device;
    slice.process = a.process;
    slice.length_bytes = a.box.num_elements() * a.item_bytes;
    slice.copy = CopyFor(*a.shard_box, a.box, a.item_bytes);
    slice.box = std::move(a.box);
    slice.shard_box = *a.shard_box;
    plan.slices.push_back(std::move(slice));
  }
  // Small slices first in each file, in order, then the others: a restore
  // reads neighbouring small extents in one request, and each large one
  // straight into place (see kSmallSliceBytes).
  for (const bool small : {true, false}) {
    for (PlannedSlice& slice : plan.slices) {
      if ((slice.length_bytes < kSmallSliceBytes) != small) continue;
      // The least-filled stream of the process (lowest index on ties).
      int best = slice.process * streams;
      for (int f = best + 1; f < (slice.process + 1) * streams; ++f) {
        if (plan.files[f].size_bytes < plan.files[best].size_bytes) best = f;
      }
      PlannedFile& file = plan.files[best];
      slice.file = best;
      slice.offset_bytes = AlignUp(file.size_bytes, options.alignment_bytes);
      file.size_bytes = slice.offset_bytes + slice.length_bytes;
    }
  }
  plan.process_slices.resize(topology.num_processes());
  for (int s = 0; s < static_cast<int>(plan.slices.size()); ++s) {
    plan.process_slices[plan.slices[s].process].push_back(s);
  }
  return plan;
}

std::vector<int> SavePlan::SlicesOfDevice(DeviceId device) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(slices.size()); ++i) {
    if (slices[i].device == device) out.push_back(i);
  }
  return out;
}

const std::vector<int>& SavePlan::SlicesOfProcess(int process) const {
  static const std::vector<int>& none = *new std::vector<int>();
  return process >= 0 && process < static_cast<int>(process_slices.size())
             ? process_slices[process]
             : none;
}

PlanSummary Summarize(const SavePlan& plan, const Topology& topology) {
  PlanSummary summary;
  summary.arrays = static_cast<int64_t>(plan.arrays.size());
  for (const PlannedArray& array : plan.arrays) {
    if (array.replicas > 1) ++summary.replicated_arrays;
    if (array.unsplit) ++summary.unsplit_arrays;
  }
  absl::flat_hash_map<DeviceId, int64_t> device_bytes;
  std::vector<int64_t> process_bytes(topology.num_processes(), 0);
  for (const PlannedSlice& slice : plan.slices) {
    ++summary.slices;
    if (slice.copy.rows > 1) ++summary.strided_slices;
    summary.total_bytes += slice.length_bytes;
    device_bytes[slice.device] += slice.length_bytes;
    process_bytes[slice.process] += slice.length_bytes;
  }
  for (const PlannedFile& file : plan.files) {
    summary.file_bytes += file.size_bytes;
  }
  for (const auto& [device, bytes] : device_bytes) {
    summary.max_device_bytes = std::max(summary.max_device_bytes, bytes);
  }
  for (int64_t bytes : process_bytes) {
    summary.max_process_bytes = std::max(summary.max_process_bytes, bytes);
  }
  const double total = static_cast<double>(summary.total_bytes);
  summary.mean_device_bytes =
      topology.num_devices() > 0 ? total / topology.num_devices() : 0;
  summary.mean_process_bytes = total / topology.num_processes();
  summary.dispatches_per_slice = summary.slices;
  summary.dispatches_batched = static_cast<int64_t>(device_bytes.size());
  return summary;
}

}  // namespace hoist
