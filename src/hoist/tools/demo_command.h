// `hoist demo`: the main job. A GPT-style model sharded over 8 host devices
// trains for a few steps, saving asynchronously; the latest step is restored
// onto another mesh and onto the host and checked bit-exact.
#ifndef HOIST_TOOLS_DEMO_COMMAND_H_
#define HOIST_TOOLS_DEMO_COMMAND_H_

#include <CLI/CLI.hpp>

#include "hoist/storage.h"
#include "hoist/tools/progress_line.h"

namespace hoist {

// `storage`: the CLI's storage flags (storage_flags.h), read when the
// command runs.
void AddDemoCommand(CLI::App& app, const StorageOptions& storage,
                    const ProgressFlags& progress);

}  // namespace hoist

#endif  // HOIST_TOOLS_DEMO_COMMAND_H_
