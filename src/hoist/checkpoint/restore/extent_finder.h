// Finding the saved extents a box meets without scanning its array: a
// shared restore's rank 0 does it for every rank's boxes, and each box meets
// a few of an array's thousands of extents.
#ifndef HOIST_CHECKPOINT_RESTORE_EXTENT_FINDER_H_
#define HOIST_CHECKPOINT_RESTORE_EXTENT_FINDER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "hoist/box.h"
#include "hoist/manifest.h"

namespace hoist {

// An index of a manifest's extents by their first coordinate. Extents are
// named by flat id: `first_id[a]` is array a's extent 0 (the extents of all
// arrays, in manifest order). `manifest` and `first_id` must outlive it and
// not change; immutable once built, so any thread may call Find.
class ExtentFinder {
 public:
  ExtentFinder(const Manifest& manifest, const std::vector<int64_t>& first_id);

  // Appends the flat ids of array `a`'s extents that `box` meets (a box of
  // the array's rank; a scalar's one extent for a rank-0 box), in the
  // order of their first coordinate.
  void Find(int a, const Box& box, std::vector<int64_t>& ids) const;

 private:
  const Manifest& manifest_;
  const std::vector<int64_t>& first_id_;
  std::vector<std::vector<std::pair<int64_t, int>>> by_start_;  // per array
  std::vector<int64_t> widest_;  // per array: its widest extent's dim 0
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_EXTENT_FINDER_H_
