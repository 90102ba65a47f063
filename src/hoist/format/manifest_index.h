// Lookups into a manifest by array name, for callers that make one per
// array (a save's delta base, a restore's targets): a scan per lookup made
// a repeated save of 100,000 arrays quadratic (issue 55).
//
// ManifestIndex borrows a manifest and indexes its arrays by name, once,
// in O(arrays); each lookup is then O(1). IndexedManifest owns a committed
// manifest (they never change once committed) together with its index, so
// the manager can keep both for the next save. Both are immutable once
// built: any number of threads may share one.
#ifndef HOIST_FORMAT_MANIFEST_INDEX_H_
#define HOIST_FORMAT_MANIFEST_INDEX_H_

#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "hoist/manifest.h"

namespace hoist {
namespace manifest_index_internal {

// ManifestIndex::name_comparisons().
inline std::atomic<int64_t> name_comparisons{0};

// String equality that counts itself.
struct CountingEq {
  bool operator()(std::string_view a, std::string_view b) const {
    name_comparisons.fetch_add(1, std::memory_order_relaxed);
    return a == b;
  }
};

}  // namespace manifest_index_internal

class ManifestIndex {
 public:
  // Indexes `manifest`'s arrays; `manifest` must outlive the index and not
  // change while it lives. Names are unique in a decoded manifest; should
  // two arrays share one, the first is found.
  explicit ManifestIndex(const Manifest& manifest);
  ManifestIndex(const ManifestIndex&) = delete;
  ManifestIndex& operator=(const ManifestIndex&) = delete;

  // The array called `name`, or null.
  const ManifestArray* Find(std::string_view name) const;
  // Its position in the manifest's `arrays`, or -1.
  int IndexOf(std::string_view name) const;

  // Name comparisons made by every ManifestIndex and by Manifest::Find in
  // this process since it started (the hash table's equality checks and
  // the scan's): a count of lookup work, which tests bound per array
  // instead of timing it.
  static int64_t name_comparisons() {
    return manifest_index_internal::name_comparisons.load(
        std::memory_order_relaxed);
  }

 private:
  const Manifest& manifest_;
  // Views of manifest_'s names, which it owns.
  absl::flat_hash_map<std::string_view, int, absl::Hash<std::string_view>,
                      manifest_index_internal::CountingEq>
      by_name_;
};

// A committed manifest and its index, built once: the manager keeps the
// last one it committed as the next save's base.
class IndexedManifest {
 public:
  explicit IndexedManifest(Manifest manifest)
      : manifest_(std::move(manifest)), index_(manifest_) {}
  IndexedManifest(const IndexedManifest&) = delete;
  IndexedManifest& operator=(const IndexedManifest&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const ManifestIndex& index() const { return index_; }
  int64_t step() const { return manifest_.step; }

 private:
  const Manifest manifest_;
  const ManifestIndex index_;  // of manifest_, declared after it
};

}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_INDEX_H_
