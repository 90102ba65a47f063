// `hoist export` and `hoist import`: a committed step as safetensors, and a
// safetensors checkpoint as a committed step.
#ifndef HOIST_TOOLS_INTEROP_COMMANDS_H_
#define HOIST_TOOLS_INTEROP_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace hoist {

void AddInteropCommands(CLI::App& app);

}  // namespace hoist

#endif  // HOIST_TOOLS_INTEROP_COMMANDS_H_
