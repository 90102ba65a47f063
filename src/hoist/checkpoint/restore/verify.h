// Verifying a committed step: the manifest is valid, every data file it
// names is there, and every extent reads back whole with its XXH3-64.
#ifndef HOIST_CHECKPOINT_RESTORE_VERIFY_H_
#define HOIST_CHECKPOINT_RESTORE_VERIFY_H_

#include <string>
#include <vector>

#include "hoist/checkpoint_types.h"
#include "hoist/storage.h"

namespace hoist {

// Never fails as a call: what is wrong is in the report. `progress` (when
// set) counts the bytes read, of every extent's, and names the array.
VerifyReport VerifyCheckpoint(Storage& storage, const std::string& step_dir,
                              OperationProgress* progress = nullptr);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_VERIFY_H_
