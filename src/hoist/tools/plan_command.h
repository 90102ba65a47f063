// `hoist plan`: plans a save of the GPT-style sample model and prints how
// each replica rule divides it.
#ifndef HOIST_TOOLS_PLAN_COMMAND_H_
#define HOIST_TOOLS_PLAN_COMMAND_H_

#include <CLI/CLI.hpp>

namespace hoist {

// Adds the `plan` subcommand to `app`; it runs when parsed.
void AddPlanCommand(CLI::App& app);

}  // namespace hoist

#endif  // HOIST_TOOLS_PLAN_COMMAND_H_
