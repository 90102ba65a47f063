// `hoist ls`, `hoist inspect`, `hoist verify`, `hoist rm`: looking at and
// tidying checkpoints from the command line.
#ifndef HOIST_TOOLS_INSPECT_COMMANDS_H_
#define HOIST_TOOLS_INSPECT_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "hoist/storage.h"
#include "hoist/tools/progress_line.h"

namespace hoist {

// `storage`: the CLI's storage flags (storage_flags.h), and `progress` its
// --quiet, read when the command runs.
void AddInspectCommands(CLI::App& app, const StorageOptions& storage,
                        const ProgressFlags& progress);

}  // namespace hoist

#endif  // HOIST_TOOLS_INSPECT_COMMANDS_H_
