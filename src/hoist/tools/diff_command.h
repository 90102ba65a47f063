// `hoist diff`: what changed between two committed steps.
#ifndef HOIST_TOOLS_DIFF_COMMAND_H_
#define HOIST_TOOLS_DIFF_COMMAND_H_

#include <CLI/CLI.hpp>

#include "hoist/storage.h"
#include "hoist/tools/progress_line.h"

namespace hoist {

// `storage` and `progress`: the CLI's flags, read when the command runs.
void AddDiffCommand(CLI::App& app, const StorageOptions& storage,
                    const ProgressFlags& progress);

}  // namespace hoist

#endif  // HOIST_TOOLS_DIFF_COMMAND_H_
