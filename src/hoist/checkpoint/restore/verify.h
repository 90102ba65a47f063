// Verifying a committed step: the manifest is valid, every data file it
// names is there, and every extent reads back whole with its XXH3-64.
#ifndef HOIST_CHECKPOINT_RESTORE_VERIFY_H_
#define HOIST_CHECKPOINT_RESTORE_VERIFY_H_

#include <string>
#include <vector>

#include "hoist/checkpoint_types.h"
#include "hoist/storage.h"

namespace hoist {

// Never fails as a call: what is wrong is in the report.
VerifyReport VerifyCheckpoint(Storage& storage, const std::string& step_dir);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_VERIFY_H_
