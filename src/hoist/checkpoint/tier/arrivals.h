// The extents of a lost local-tier part as they arrive from the processes
// that serve them (local_tier_restore.cc's rebuild): where each lands (the
// file its source sends, CopyFileName, and its offset there, PackedOffsets
// of what that source serves), and whether the bytes that arrived there
// hash to it. They are hashed as they arrive (ShiftFiles' `seen`), before
// they are written: reading the files back once written took longer than
// the transfer itself (docs/tiers.md).
#ifndef HOIST_CHECKPOINT_TIER_ARRIVALS_H_
#define HOIST_CHECKPOINT_TIER_ARRIVALS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "hoist/checkpoint/tier/replica_plan.h"
#include "hoist/format/extent_hash.h"
#include "hoist/manifest.h"

namespace hoist {

class Arrivals {
 public:
  // `part`: the lost part's manifest; `plan[i]`: the index into `sources`
  // of the source serving its i-th extent (PartExtents' order), as
  // PlanRecovery made it.
  Arrivals(const Manifest& part, absl::Span<const int> plan,
           absl::Span<const ExtentSource> sources);

  // ShiftFiles' `seen`: bytes of `path` at `offset`, each file's in order.
  void See(const std::string& path, int64_t offset,
           absl::Span<const uint8_t> bytes);

  // Extent `i` of the part: its file and offset, and whether all its bytes
  // arrived and hash to it.
  const std::string& file(size_t i) const { return landings_[i].file; }
  int64_t offset(size_t i) const { return landings_[i].offset; }
  bool matched(size_t i) const { return landings_[i].matched; }

 private:
  struct Landing {
    std::string file;
    int64_t offset = 0, length = 0;
    ExtentHash hash;
    bool matched = false;
  };
  struct Cursor {
    size_t next = 0;  // into by_file_[path]: the extent being received
    std::unique_ptr<ExtentHasher> hasher;
  };
  std::vector<Landing> landings_;
  // Each file's extents, in the order they lie there (the order served).
  std::map<std::string, std::vector<size_t>> by_file_;
  std::map<std::string, Cursor> cursors_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_ARRIVALS_H_
