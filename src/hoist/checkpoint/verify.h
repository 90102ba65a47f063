// Verifying a committed step: the manifest is valid, every data file it
// names is there, and every extent reads back whole with its XXH3-64.
#ifndef HOIST_CHECKPOINT_VERIFY_H_
#define HOIST_CHECKPOINT_VERIFY_H_

#include <string>
#include <vector>

#include "hoist/storage.h"

namespace hoist {

struct VerifyReport {
  int64_t arrays = 0;
  int64_t extents = 0;                // extents checked
  int64_t bytes = 0;                  // bytes read
  std::vector<std::string> problems;  // every one found, not only the first
  bool ok() const { return problems.empty(); }
};

// Never fails as a call: what is wrong is in the report.
VerifyReport VerifyCheckpoint(Storage& storage, const std::string& step_dir);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_VERIFY_H_
