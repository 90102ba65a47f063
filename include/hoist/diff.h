// What changed between two committed steps, from their manifests alone (no
// data read): arrays added, removed, retyped or reshaped, and the extents
// whose bytes changed (their hashes differ). With values, the changed
// arrays are read and compared element by element. docs/observability.md.
#ifndef HOIST_DIFF_H_
#define HOIST_DIFF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/box.h"
#include "hoist/checkpoint_types.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

struct ArrayDiff {
  std::string name;
  // The array as each step has it.
  DType dtype_a = DType::kFloat32, dtype_b = DType::kFloat32;
  std::vector<int64_t> shape_a, shape_b;
  // The dtype or the shape differs: nothing else is compared.
  bool retyped = false;
  // The steps saved other boxes of it (another sharding): its extents
  // cannot be matched, so every one counts as changed.
  bool resharded = false;
  int64_t extents = 0;  // step B's
  // Step B's extents whose bytes differ from step A's of the same box
  // (an extent that references the same bytes, a delta, is unchanged).
  std::vector<Box> changed_extents;
  int64_t changed_bytes = 0;
  // With values: the largest |b - a|, and |b - a| / |a| (over elements
  // whose a is not 0), over the whole array; `values_note` says why not
  // when they were not compared.
  bool values_compared = false;
  double max_abs_diff = 0;
  double max_rel_diff = 0;
  std::string values_note;
};

struct StepDiff {
  int64_t step_a = 0, step_b = 0;
  std::vector<std::string> added;    // in B only, by name
  std::vector<std::string> removed;  // in A only
  std::vector<ArrayDiff> changed;    // in both, by name, with a difference
  int64_t unchanged = 0;             // in both, every extent the same
};

// The difference from manifest `a` to manifest `b`.
StepDiff DiffManifests(const Manifest& a, const Manifest& b);

// One side of a diff: a root (or a step directory, ROOT/step_N) and a step
// (nullopt: the step directory's, or the root's newest).
struct DiffSide {
  std::string path;
  std::optional<int64_t> step;
};

// The difference from step `a` to step `b` (roots opened for reading,
// local or on an object store). With `values`, each changed array whose
// dtype and shape are the same is read whole from both (one array at a
// time, in host memory) and compared; `progress` (optional) counts those
// bytes.
// Errors name the step whose manifest is missing or corrupt.
absl::StatusOr<StepDiff> DiffSteps(const DiffSide& a, const DiffSide& b,
                                   const StorageOptions& storage = {},
                                   bool values = false,
                                   OperationProgress* progress = nullptr);

}  // namespace hoist

#endif  // HOIST_DIFF_H_
