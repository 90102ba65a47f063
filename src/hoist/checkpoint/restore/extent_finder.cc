#include "hoist/checkpoint/restore/extent_finder.h"

#include <algorithm>
#include <climits>

namespace hoist {

ExtentFinder::ExtentFinder(const Manifest& manifest,
                           const std::vector<int64_t>& first_id)
    : manifest_(manifest), first_id_(first_id) {
  by_start_.resize(manifest.arrays.size());
  widest_.assign(manifest.arrays.size(), 1);
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    const std::vector<ManifestExtent>& extents = manifest.arrays[a].extents;
    if (manifest.arrays[a].shape.empty()) continue;  // a scalar: one
    for (size_t e = 0; e < extents.size(); ++e) {
      by_start_[a].emplace_back(extents[e].box.origin()[0],
                                static_cast<int>(e));
      widest_[a] = std::max(widest_[a], extents[e].box.shape()[0]);
    }
    std::sort(by_start_[a].begin(), by_start_[a].end());
  }
}

void ExtentFinder::Find(int a, const Box& box,
                        std::vector<int64_t>& ids) const {
  const std::vector<ManifestExtent>& extents = manifest_.arrays[a].extents;
  const auto meet = [&](int e) {
    if (!extents[e].box.Intersect(box).empty()) {
      ids.push_back(first_id_[a] + e);
    }
  };
  if (box.rank() == 0) {
    for (size_t e = 0; e < extents.size(); ++e) meet(static_cast<int>(e));
    return;
  }
  // Extents start at most widest_ before the box's start to reach it.
  const int64_t begin = box.origin()[0], end = begin + box.shape()[0];
  for (auto it =
           std::lower_bound(by_start_[a].begin(), by_start_[a].end(),
                            std::make_pair(begin - widest_[a] + 1, INT32_MIN));
       it != by_start_[a].end() && it->first < end; ++it) {
    meet(it->second);
  }
}

}  // namespace hoist
