#include "hoist/checkpoint/delta.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"

namespace hoist {

DeltaBase MakeDeltaBase(const SavePlan& plan, const Manifest& base,
                        const std::vector<uint8_t>* frozen) {
  DeltaBase delta;
  delta.step = base.step;
  delta.extents.resize(plan.slices.size());
  if (frozen != nullptr) delta.frozen = *frozen;
  if (base.part) return delta;  // a part is never a base
  // Per planned array, the base's array when it matches, and its extents
  // by box (origin then shape).
  std::vector<const ManifestArray*> matched(plan.arrays.size(), nullptr);
  std::vector<absl::flat_hash_map<std::vector<int64_t>, int>> by_box(
      plan.arrays.size());
  for (size_t a = 0; a < plan.arrays.size(); ++a) {
    const PlannedArray& array = plan.arrays[a];
    const ManifestArray* found = base.Find(array.name);
    if (found == nullptr || found->dtype != array.dtype ||
        found->shape != array.shape) {
      continue;
    }
    matched[a] = found;
  }
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const PlannedSlice& slice = plan.slices[s];
    const ManifestArray* array = matched[slice.array];
    if (array == nullptr) continue;
    auto& boxes = by_box[slice.array];
    if (boxes.empty()) {
      for (size_t e = 0; e < array->extents.size(); ++e) {
        const Box& box = array->extents[e].box;
        std::vector<int64_t> key = box.origin();
        key.insert(key.end(), box.shape().begin(), box.shape().end());
        boxes.emplace(std::move(key), static_cast<int>(e));
      }
    }
    std::vector<int64_t> key = slice.box.origin();
    key.insert(key.end(), slice.box.shape().begin(), slice.box.shape().end());
    const auto it = boxes.find(key);
    if (it == boxes.end()) continue;
    ManifestExtent extent = array->extents[it->second];
    if (!extent.hash.wide) continue;  // XXH3-64 cannot decide it
    if (!extent.step) extent.step = base.step;
    delta.extents[s] = std::move(extent);
  }
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

void AddFilesRead(const Manifest& manifest,
                  absl::flat_hash_set<std::string>& files) {
  for (const ManifestArray& array : manifest.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      files.insert(JoinPath(StepDirName(extent.step.value_or(manifest.step)),
                            extent.file));
    }
  }
}

absl::StatusOr<absl::flat_hash_set<std::string>> FilesReadByCommitted(
    Storage& storage, const std::string& root, int64_t except) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CommittedSteps(storage, root));
  absl::flat_hash_set<std::string> files;
  for (int64_t step : steps) {
    if (step == except) continue;
    ASSIGN_OR_RETURN(
        Manifest manifest,
        ReadManifestFile(storage, JoinPath(root, StepDirName(step))));
    AddFilesRead(manifest, files);
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
    ASSIGN_OR_RETURN(
        Manifest manifest,
        ReadManifestFile(storage, JoinPath(root, StepDirName(other))));
    bool found = false;
    for (const ManifestArray& array : manifest.arrays) {
      for (const ManifestExtent& extent : array.extents) {
        found = found || extent.step == step;
      }
    }
    if (found) referencing.push_back(other);
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
    const std::string data = JoinPath(dir, kDataDirName);
    ASSIGN_OR_RETURN(bool has_data, storage.Exists(data));
    std::vector<std::string> files;
    if (has_data) {
      ASSIGN_OR_RETURN(files, storage.List(data));
    }
    int kept = 0;
    bool removed_file = false;
    for (const std::string& file : files) {
      const std::string relative = JoinPath(name, JoinPath(kDataDirName, file));
      if (live.contains(relative)) {
        ++kept;
        continue;
      }
      RETURN_IF_ERROR(storage.RemoveAll(JoinPath(data, file)));
      removed_file = true;
    }
    if (kept == 0) {
      RETURN_IF_ERROR(storage.RemoveAll(dir));
      removed_dir = true;
    } else if (removed_file) {
      RETURN_IF_ERROR(storage.SyncDir(data));
    }
  }
  if (removed_dir) RETURN_IF_ERROR(storage.SyncDir(root));
  return absl::OkStatus();
}

}  // namespace hoist
