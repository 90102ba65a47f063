#include "hoist/restore_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"

namespace hoist {
namespace {

// Leases of the staging pool are 4 KiB-aligned (StagingPool::kAlignment;
// restore checks that the two agree).
constexpr int64_t kLeaseAlignment = 4096;

int64_t Leased(int64_t bytes) { return AlignUp(bytes, kLeaseAlignment); }

// `box` (of `bytes`) as parts that each fit in `max_part` bytes of lease:
// consecutive ranges of its first axis longer than 1, each a contiguous run
// of the box's memory.
absl::StatusOr<std::vector<Box>> Parts(const SavedArray& array, const Box& box,
                                       int64_t bytes, int64_t max_part) {
  if (Leased(bytes) <= max_part) return std::vector<Box>{box};
  int axis = 0;
  while (axis < box.rank() && box.shape()[axis] == 1) ++axis;
  const int64_t row_bytes =
      axis < box.rank() ? bytes / box.shape()[axis] : bytes;
  if (axis == box.rank() || Leased(row_bytes) > max_part) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "array '%s': box %s needs at least %s of staging at a time but half "
        "the pool is %s; raise the pool capacity",
        array.name, box.ToString(), FormatBytes(row_bytes),
        FormatBytes(max_part)));
  }
  const int64_t rows_per_part =
      std::max<int64_t>(1, (max_part - kLeaseAlignment) / row_bytes);
  return box.Split(axis,
                   (box.shape()[axis] + rows_per_part - 1) / rows_per_part);
}

}  // namespace

absl::StatusOr<RestorePlan> PlanRestore(
    absl::Span<const SavedArray> saved,
    absl::Span<const DestinationBox> destinations, int64_t pool_bytes) {
  RestorePlan plan;
  // Images of device boxes, by (array, box): replicas share one.
  absl::flat_hash_map<std::pair<int, Box>, int> image_of;
  const int64_t max_part = pool_bytes / 2;
  for (int i = 0; i < static_cast<int>(destinations.size()); ++i) {
    const DestinationBox& d = destinations[i];
    if (d.array < 0 || d.array >= static_cast<int>(saved.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "destination %d names array %d of %d", i, d.array, saved.size()));
    }
    const SavedArray& array = saved[d.array];
    const Box whole = Box::FromShape(array.shape);
    if (d.box.rank() != whole.rank() || !whole.Contains(d.box) ||
        d.box.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array '%s': destination box %s is empty or lies outside %s",
          array.name, d.box.ToString(), ShapeToString(array.shape)));
    }
    const int64_t bytes = d.box.num_elements() * array.item_bytes;
    if (!d.on_device) {
      plan.images.push_back({d.array, d.box, bytes, true, {{i, 0}}});
      continue;
    }
    absl::StatusOr<std::vector<Box>> parts =
        Parts(array, d.box, bytes, max_part);
    if (!parts.ok()) return parts.status();
    for (const Box& part : *parts) {
      const int64_t offset =
          *ContiguousByteOffset(d.box, part, array.item_bytes);
      auto [it, inserted] = image_of.emplace(
          std::make_pair(d.array, part), static_cast<int>(plan.images.size()));
      if (inserted) {
        plan.images.push_back(
            {d.array, part, part.num_elements() * array.item_bytes, false, {}});
      }
      plan.images[it->second].destinations.emplace_back(i, offset);
    }
  }

  // Waves: in-place images ride in the first; device images all together if
  // they fit in the pool, else in waves of at most half of it.
  int64_t device_bytes = 0;
  for (const RestoreImage& image : plan.images) {
    if (!image.in_place) device_bytes += Leased(image.bytes);
  }
  const int64_t budget = device_bytes <= pool_bytes ? pool_bytes : max_part;
  plan.waves.emplace_back();
  for (int i = 0; i < static_cast<int>(plan.images.size()); ++i) {
    if (plan.images[i].in_place) plan.waves.back().images.push_back(i);
  }
  for (int i = 0; i < static_cast<int>(plan.images.size()); ++i) {
    const RestoreImage& image = plan.images[i];
    if (image.in_place) continue;
    const int64_t bytes = Leased(image.bytes);
    RestoreWave* wave = &plan.waves.back();
    if (wave->lease_bytes > 0 && wave->lease_bytes + bytes > budget) {
      wave = &plan.waves.emplace_back();
    }
    wave->images.push_back(i);
    wave->lease_bytes += bytes;
  }
  if (plan.waves.back().images.empty()) plan.waves.pop_back();

  // Each wave reads every extent that meets one of its images, once.
  for (RestoreWave& wave : plan.waves) {
    absl::flat_hash_map<std::pair<int, int>, int> read_of;
    for (int i : wave.images) {
      const RestoreImage& image = plan.images[i];
      const std::vector<Box>& extents = saved[image.array].extents;
      for (int e = 0; e < static_cast<int>(extents.size()); ++e) {
        if (extents[e].Intersect(image.box).empty()) continue;
        auto [it, inserted] =
            read_of.emplace(std::make_pair(image.array, e),
                            static_cast<int>(wave.reads.size()));
        if (inserted) wave.reads.push_back({image.array, e, {}});
        wave.reads[it->second].images.push_back(i);
      }
    }
  }
  return plan;
}

}  // namespace hoist
