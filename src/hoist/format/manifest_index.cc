#include "hoist/format/manifest_index.h"

namespace hoist {

ManifestIndex::ManifestIndex(const Manifest& manifest) : manifest_(manifest) {
  by_name_.reserve(manifest.arrays.size());
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    by_name_.emplace(manifest.arrays[a].name, static_cast<int>(a));
  }
}

int ManifestIndex::IndexOf(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

const ManifestArray* ManifestIndex::Find(std::string_view name) const {
  const int a = IndexOf(name);
  return a < 0 ? nullptr : &manifest_.arrays[a];
}

}  // namespace hoist
