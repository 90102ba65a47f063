// SavePlan: what every process copies off which device, and where each byte
// lands on disk, decided before any byte moves.
//
// MakeSavePlan is a pure, deterministic function of (arrays, topology,
// options): every process of a job computes the same plan without talking to
// the others, and each executes only its own share (SlicesOfProcess).
//
// Words: a unique *box* is a distinct shard of an array (replicas of it live
// on several devices); a *slice* is the part of a box one replica copies and
// saves; a slice's bytes are one *extent* of a data file.
#ifndef HOIST_SAVE_PLAN_H_
#define HOIST_SAVE_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/box.h"
#include "hoist/dtype.h"

namespace hoist {

// How a box replicated on R devices is divided among its replicas.
enum class ReplicaRule {
  // One replica (replica 0) saves the whole box. Orbax without
  // replica-parallel.
  kSingleReplica,
  // Orbax's replica-parallel rule, kept as the baseline: split into R equal
  // slices along the first axis divisible by R, replica i saving slice i;
  // save whole on replica 0 when no axis divides or a slice would be smaller
  // than min_slice_bytes. R is capped at max_replicas.
  kOrbax,
  // hoist's rule: split into n = min(R, box_bytes / min_slice_bytes) slices
  // along the first axis longer than 1, so every slice is contiguous (at most
  // that axis's length of them), sizes differing by at most one row, so no
  // axis needs to divide R; then give slices and unsplit boxes to the
  // least-loaded replicas, largest first, balancing bytes per process and per
  // device.
  kBalanced,
};

// "single", "orbax", "balanced".
std::string_view ReplicaRuleName(ReplicaRule rule);
// The inverse of ReplicaRuleName; kInvalidArgument otherwise.
absl::StatusOr<ReplicaRule> ParseReplicaRule(std::string_view name);

// Slices shorter than this are laid out first in each data file, one after
// another in slice order, and the others after them. A restore reads an
// extent this long or longer straight into its destination, and reads the
// smaller ones together, a run of neighbours in one request, then copies
// them out (restore.h). Laid out among the large extents, as arrays come
// (a model's biases and norms between its weight matrices), each small one
// cost a request of its own: on this project's VM, a 2 GiB GPT-style model
// restored onto 8 devices spent 28% of its readers' time on 446 reads under
// 64 KiB, 2.9 ms each (bench/results/save-bench-2026-12-04.txt).
inline constexpr int64_t kSmallSliceBytes = int64_t{256} << 10;

struct SavePlanOptions {
  // Default: hoist's balanced replica-parallel rule.
  ReplicaRule replica_rule = ReplicaRule::kBalanced;
  // Slices are never made smaller than this (default 1 MiB): below it the
  // per-copy cost of a dispatch and the 4 KiB file alignment dominate.
  // 0 splits regardless of size.
  int64_t min_slice_bytes = int64_t{1} << 20;
  // At most this many replicas of a box take part in saving it; 0 (default)
  // means all of them.
  int max_replicas = 0;
  // Data files per process (default 1); each file is written by one writer
  // stream. Must be in [1, 100] (CheckpointManagerOptions takes 0 too: the
  // root's storage chooses).
  int writer_streams = 1;
  // Offset alignment of every extent in its file (default 4096, the O_DIRECT
  // block and the format's alignment). A power of two >= 4096.
  int64_t alignment_bytes = 4096;
  // -1 (default): plan the whole of every array. P >= 0: plan only the
  // boxes process P's devices hold, copied and saved by those devices (a
  // box replicated within P is still divided among P's replicas): every
  // byte P holds, and no other. The local tier saves such a part per
  // process (checkpoint_manager.h); its extents do not tile the arrays.
  int part_of_process = -1;
};

// kInvalidArgument naming the option that is out of range (writer_streams
// in [1, 100], alignment_bytes a power of two >= 4096, min_slice_bytes and
// max_replicas >= 0). PlanSave checks it; CheckpointManager::Open checks
// its options.plan, so that a bad one fails at Open, not at the first save.
absl::Status ValidateSavePlanOptions(const SavePlanOptions& options);

// A 2-D copy that gathers a slice out of its shard's dense row-major buffer:
// `rows` rows of `width_bytes`, the first at `src_offset_bytes`, successive
// rows `src_pitch_bytes` apart. The destination is dense (pitch =
// width_bytes). A contiguous slice has rows == 1.
struct SliceCopy {
  int64_t src_offset_bytes = 0;
  int64_t src_pitch_bytes = 0;
  int64_t width_bytes = 0;
  int64_t rows = 0;
  friend bool operator==(const SliceCopy&, const SliceCopy&) = default;
};

// What one device copies and one writer stream saves.
struct PlannedSlice {
  int array = 0;        // index into SavePlan::arrays
  Box box;              // global index box of the slice
  Box shard_box;        // the device shard it is copied from (contains box)
  DeviceId device = 0;  // the replica that copies it
  int process = 0;      // the process owning `device`
  int file = 0;         // index into SavePlan::files
  int64_t offset_bytes = 0;  // in the file, a multiple of alignment_bytes
  int64_t length_bytes = 0;  // box elements * item size, > 0
  SliceCopy copy;
  friend bool operator==(const PlannedSlice&, const PlannedSlice&) = default;
};

struct PlannedArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  // Largest replica count among the array's boxes (1: no replication).
  int64_t replicas = 1;
  // True when some replicated box is saved whole by a single replica.
  bool unsplit = false;
  friend bool operator==(const PlannedArray&, const PlannedArray&) = default;
};

// One data file: process `process`'s writer stream `stream` (format/ names
// it, "data/r00000_w00.bin").
struct PlannedFile {
  int process = 0;
  int stream = 0;
  int64_t size_bytes = 0;  // end of its last extent
  friend bool operator==(const PlannedFile&, const PlannedFile&) = default;
};

// The plan. Slices are ordered by (array, box); each array's slices tile it
// exactly once.
struct SavePlan {
  SavePlanOptions options;
  std::vector<PlannedArray> arrays;
  std::vector<PlannedSlice> slices;
  std::vector<PlannedFile> files;

  // Indices into `slices` of each process's, in order: made once by
  // MakeSavePlan, so that a save finds its process's share without a pass
  // over the whole job's slices (SlicesOfProcess).
  std::vector<std::vector<int>> process_slices;

  // Indices into `slices` copied by `device` / saved by `process`, in order.
  std::vector<int> SlicesOfDevice(DeviceId device) const;
  const std::vector<int>& SlicesOfProcess(int process) const;
  // f(s) for each slice index s, in order: every slice, or with `process`
  // that process's only.
  template <typename F>
  void ForEachSlice(std::optional<int> process, F&& f) const {
    if (process) {
      for (int s : SlicesOfProcess(*process)) f(static_cast<size_t>(s));
      return;
    }
    for (size_t s = 0; s < slices.size(); ++s) f(s);
  }

  friend bool operator==(const SavePlan& a, const SavePlan& b) {
    return a.arrays == b.arrays && a.slices == b.slices && a.files == b.files;
  }
};

// Plans a save. kInvalidArgument, naming the array, for: an empty or repeated
// array name; an invalid sharding (see Sharding::Layout); a device the
// topology does not know; an array whose bytes overflow int64_t; invalid
// options.
absl::StatusOr<SavePlan> MakeSavePlan(absl::Span<const ArraySpec> arrays,
                                      const Topology& topology,
                                      const SavePlanOptions& options = {});

// Figures that describe a plan, for the CLI, logs and benchmarks.
struct PlanSummary {
  int64_t arrays = 0;
  int64_t replicated_arrays = 0;  // arrays with some box on > 1 device
  int64_t unsplit_arrays = 0;     // of those, arrays saved whole somewhere
  int64_t slices = 0;
  int64_t strided_slices = 0;  // slices whose copy has rows > 1
  int64_t total_bytes = 0;     // sum of slice lengths = unique array bytes
  int64_t file_bytes = 0;      // sum of file sizes, alignment padding included
  int64_t max_device_bytes = 0;
  double mean_device_bytes = 0;  // over every device of the topology
  int64_t max_process_bytes = 0;
  double mean_process_bytes = 0;  // over every process
  // Copy dispatches for one save (one wave): one per slice when dispatching
  // per slice (Orbax today), one per device with work when batched (hoist).
  int64_t dispatches_per_slice = 0;
  int64_t dispatches_batched = 0;
};

PlanSummary Summarize(const SavePlan& plan, const Topology& topology);

}  // namespace hoist

#endif  // HOIST_SAVE_PLAN_H_
