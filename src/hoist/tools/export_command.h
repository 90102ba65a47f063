// `hoist export`: a committed step in another format (safetensors).
#ifndef HOIST_TOOLS_EXPORT_COMMAND_H_
#define HOIST_TOOLS_EXPORT_COMMAND_H_

#include <CLI/CLI.hpp>

namespace hoist {

void AddExportCommand(CLI::App& app);

}  // namespace hoist

#endif  // HOIST_TOOLS_EXPORT_COMMAND_H_
