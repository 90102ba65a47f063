// The hoist command-line tool.
#include <CLI/CLI.hpp>

#include "hoist/tools/demo_command.h"
#include "hoist/tools/inspect_commands.h"
#include "hoist/tools/interop_commands.h"
#include "hoist/tools/plan_command.h"

int main(int argc, char** argv) {
  CLI::App app(
      "hoist: asynchronous checkpointing of sharded accelerator arrays.\n"
      "Run 'hoist COMMAND --help' for a command's options.",
      "hoist");
  app.require_subcommand(1);
  app.set_version_flag("--version", "hoist 0.1.0");
  hoist::AddDemoCommand(app);
  hoist::AddPlanCommand(app);
  hoist::AddInspectCommands(app);
  hoist::AddInteropCommands(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
