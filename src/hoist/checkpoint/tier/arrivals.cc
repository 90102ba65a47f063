#include "hoist/checkpoint/tier/arrivals.h"

#include <algorithm>
#include <utility>

#include "hoist/checkpoint/tier/part_files.h"

namespace hoist {

Arrivals::Arrivals(const Manifest& part, absl::Span<const int> plan,
                   absl::Span<const ExtentSource> sources) {
  for (const ManifestArray& array : part.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      Landing landing;
      landing.length = extent.length_bytes;
      landing.hash = extent.hash;
      landing.matched =
          extent.length_bytes == 0 && ExtentMatches(extent.hash, nullptr, 0);
      landings_.push_back(std::move(landing));
    }
  }
  // Each source's extents packed one after another in the file it sends.
  std::map<int, std::vector<size_t>> served;  // by source, ascending
  for (size_t i = 0; i < landings_.size() && i < plan.size(); ++i) {
    served[plan[i]].push_back(i);
  }
  for (const auto& [b, indices] : served) {
    std::vector<int64_t> lengths;
    for (size_t i : indices) lengths.push_back(landings_[i].length);
    const std::vector<int64_t> offsets = PackedOffsets(lengths);
    const std::string file = CopyFileName(sources[b].rank, sources[b].origin);
    for (size_t k = 0; k < indices.size(); ++k) {
      landings_[indices[k]].file = file;
      landings_[indices[k]].offset = offsets[k];
      by_file_[file].push_back(indices[k]);
    }
  }
}

void Arrivals::See(const std::string& path, int64_t offset,
                   absl::Span<const uint8_t> bytes) {
  auto it = by_file_.find(path);
  if (it == by_file_.end()) return;  // no extent of this part is there
  Cursor& cursor = cursors_[path];
  const std::vector<size_t>& mine = it->second;
  const int64_t end = offset + static_cast<int64_t>(bytes.size());
  while (cursor.next < mine.size()) {
    Landing& landing = landings_[mine[cursor.next]];
    const int64_t from = std::max(offset, landing.offset);
    const int64_t to = std::min(end, landing.offset + landing.length);
    if (landing.length > 0 && from < to) {
      if (cursor.hasher == nullptr) {
        cursor.hasher = std::make_unique<ExtentHasher>(landing.hash);
      }
      cursor.hasher->Update(bytes.data() + (from - offset),
                            static_cast<size_t>(to - from));
    }
    if (end < landing.offset + landing.length) break;  // more to come
    if (landing.length > 0) {
      landing.matched = cursor.hasher != nullptr && cursor.hasher->Matches();
    }
    cursor.hasher.reset();
    ++cursor.next;
  }
}

}  // namespace hoist
