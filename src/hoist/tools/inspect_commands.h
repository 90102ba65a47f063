// `hoist ls`, `hoist inspect`, `hoist verify`, `hoist rm`: looking at and
// tidying checkpoints from the command line.
#ifndef HOIST_TOOLS_INSPECT_COMMANDS_H_
#define HOIST_TOOLS_INSPECT_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace hoist {

void AddInspectCommands(CLI::App& app);

}  // namespace hoist

#endif  // HOIST_TOOLS_INSPECT_COMMANDS_H_
