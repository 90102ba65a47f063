#include "hoist/checkpoint/save/delta.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/references_file.h"

namespace hoist {

namespace {

// The extent of `array` whose box is `box`, or null. `guess` is where a
// save of the same plan put it (its slices of an array are listed in plan
// order): one comparison in a training loop's saves. `by_box` is the
// array's map, made on the first guess that misses.
const ManifestExtent* FindExtent(const ManifestArray& array, const Box& box,
                                 size_t guess,
                                 absl::flat_hash_map<Box, int>& by_box) {
  const std::vector<ManifestExtent>& extents = array.extents;
  if (guess < extents.size() && extents[guess].box == box) {
    return &extents[guess];
  }
  if (by_box.empty()) {
    by_box.reserve(extents.size());
    for (size_t e = 0; e < extents.size(); ++e) {
      by_box.emplace(extents[e].box, static_cast<int>(e));
    }
  }
  const auto it = by_box.find(box);
  return it == by_box.end() ? nullptr : &extents[it->second];
}

}  // namespace

DeltaBase MakeDeltaBase(const SavePlan& plan,
                        std::shared_ptr<const IndexedManifest> indexed,
                        const std::vector<uint8_t>* frozen,
                        std::optional<int> process) {
  const Manifest& base = indexed->manifest();
  DeltaBase delta;
  delta.step = base.step;
  delta.extents.assign(plan.slices.size(), nullptr);
  if (frozen != nullptr) delta.frozen = *frozen;
  if (base.part) return delta;  // a part is never a base
  // Per planned array, the base's array when it matches: one indexed
  // lookup each (O(arrays) in all).
  std::vector<const ManifestArray*> matched(plan.arrays.size(), nullptr);
  for (size_t a = 0; a < plan.arrays.size(); ++a) {
    const PlannedArray& array = plan.arrays[a];
    const ManifestArray* found = indexed->index().Find(array.name);
    if (found == nullptr || found->dtype != array.dtype ||
        found->shape != array.shape) {
      continue;
    }
    matched[a] = found;
  }
  // Per slice, the matched array's extent of the same box.
  std::vector<int32_t> seen(plan.arrays.size(), 0);  // slices so far
  std::vector<absl::flat_hash_map<Box, int>> by_box(plan.arrays.size());
  plan.ForEachSlice(process, [&](size_t s) {
    const PlannedSlice& slice = plan.slices[s];
    const size_t guess = seen[slice.array]++;
    const ManifestArray* array = matched[slice.array];
    if (array == nullptr) return;
    const ManifestExtent* found =
        FindExtent(*array, slice.box, guess, by_box[slice.array]);
    // An XXH3-64 hash (hoist/1) cannot decide that bytes did not change.
    if (found != nullptr && found->hash.wide) delta.extents[s] = found;
  });
  delta.manifest = std::move(indexed);
  return delta;
}

absl::StatusOr<std::vector<int64_t>> CommittedSteps(Storage& storage,
                                                    const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(root));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    if (!step) continue;
    ASSIGN_OR_RETURN(bool committed,
                     storage.HasMarker(JoinPath(root, name),
                                       std::string(kManifestFileName)));
    if (committed) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::optional<int64_t>> NewestCommittedStep(
    Storage& storage, const std::string& root, int64_t except) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(root));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    if (step && *step != except) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t step : steps) {  // the newest first: usually one check
    ASSIGN_OR_RETURN(bool committed,
                     storage.HasMarker(JoinPath(root, StepDirName(step)),
                                       std::string(kManifestFileName)));
    if (committed) return std::optional<int64_t>(step);
  }
  return std::optional<int64_t>();
}

absl::StatusOr<std::vector<std::string>> FilesReadByStep(
    Storage& storage, const std::string& root, int64_t step) {
  const std::string dir = JoinPath(root, StepDirName(step));
  absl::StatusOr<std::vector<std::string>> listed =
      ReadReferencesFile(storage, dir, step);
  if (listed.ok()) return listed;
  // None (an older hoist, an import) or one that does not check: the
  // manifest says the same. Of a split manifest, only the sections of
  // arrays with references are read.
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifestReferences(storage, dir));
  return FilesReferenced(manifest);
}

absl::StatusOr<absl::flat_hash_set<std::string>> FilesReadByCommitted(
    Storage& storage, const std::string& root, int64_t except) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CommittedSteps(storage, root));
  absl::flat_hash_set<std::string> files;
  for (int64_t step : steps) {
    if (step == except) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> read,
                     FilesReadByStep(storage, root, step));
    files.insert(read.begin(), read.end());
  }
  return files;
}

absl::StatusOr<std::vector<int64_t>> StepsReferencing(Storage& storage,
                                                      const std::string& root,
                                                      int64_t step) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CommittedSteps(storage, root));
  std::vector<int64_t> referencing;
  for (int64_t other : steps) {
    if (other == step) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> read,
                     FilesReadByStep(storage, root, other));
    if (std::any_of(read.begin(), read.end(), [&](const std::string& file) {
          return StepOfReferencedFile(file) == step;
        })) {
      referencing.push_back(other);
    }
  }
  return referencing;
}

absl::Status PruneReferenced(Storage& storage, const std::string& root,
                             const std::vector<int64_t>& steps,
                             const absl::flat_hash_set<std::string>& live) {
  bool removed_dir = false;
  for (int64_t step : steps) {
    const std::string name = StepDirName(step);
    const std::string dir = JoinPath(root, name);
    ASSIGN_OR_RETURN(bool exists, storage.Exists(dir));
    if (!exists) continue;
    ASSIGN_OR_RETURN(bool committed,
                     storage.HasMarker(dir, std::string(kManifestFileName)));
    if (committed) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> files,
                     ListDataFiles(storage, dir));
    int kept = 0;
    std::set<std::string> synced;  // directories a file was removed from
    for (const std::string& file : files) {
      if (live.contains(JoinPath(name, file))) {
        ++kept;
        continue;
      }
      const std::string path = JoinPath(dir, file);
      RETURN_IF_ERROR(storage.RemoveAll(path));
      synced.insert(path.substr(0, path.rfind('/')));
    }
    if (kept == 0) {
      RETURN_IF_ERROR(storage.RemoveAll(dir));
      removed_dir = true;
    } else {
      for (const std::string& parent : synced) {
        RETURN_IF_ERROR(storage.SyncDir(parent));
      }
    }
  }
  if (removed_dir) RETURN_IF_ERROR(storage.SyncDir(root));
  return absl::OkStatus();
}

}  // namespace hoist
