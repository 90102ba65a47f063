// `hoist export` and `hoist import`: a committed step as safetensors, and a
// safetensors checkpoint as a committed step.
#ifndef HOIST_TOOLS_INTEROP_COMMANDS_H_
#define HOIST_TOOLS_INTEROP_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "hoist/storage.h"
#include "hoist/tools/progress_line.h"

namespace hoist {

// `storage`: the CLI's storage flags (storage_flags.h), and `progress` its
// --quiet, read when the command runs.
void AddInteropCommands(CLI::App& app, const StorageOptions& storage,
                        const ProgressFlags& progress);

}  // namespace hoist

#endif  // HOIST_TOOLS_INTEROP_COMMANDS_H_
