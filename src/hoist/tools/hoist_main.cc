// The hoist command-line tool.
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "hoist/tools/demo_command.h"
#include "hoist/tools/diff_command.h"
#include "hoist/tools/inspect_commands.h"
#include "hoist/tools/interop_commands.h"
#include "hoist/tools/plan_command.h"
#include "hoist/tools/progress_line.h"
#include "hoist/tools/storage_flags.h"

int main(int argc, char** argv) {
  CLI::App app(
      "hoist: asynchronous checkpointing of sharded accelerator arrays.\n"
      "Run 'hoist COMMAND --help' for a command's options.",
      "hoist");
  app.require_subcommand(1);
  app.set_version_flag("--version", "hoist " HOIST_VERSION);
  // Storage flags, for every command (given before or after it).
  app.fallthrough();
  hoist::StorageOptions storage;
  hoist::AddStorageFlags(app, storage);
  hoist::ProgressFlags progress;
  hoist::AddProgressFlags(app, progress);
  hoist::AddDemoCommand(app, storage, progress);
  hoist::AddPlanCommand(app);
  hoist::AddInspectCommands(app, storage, progress);
  hoist::AddDiffCommand(app, storage, progress);
  hoist::AddInteropCommands(app, storage, progress);
  // CLI11 takes an unknown command for a stray argument ("A subcommand is
  // required"); say what it is instead.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string given = argv[1];
    std::string known;
    bool found = false;
    for (const CLI::App* command :
         app.get_subcommands([](const CLI::App*) { return true; })) {
      found = found || command->check_name(given);
      known += (known.empty() ? "" : ", ") + command->get_name();
    }
    if (!found) {
      std::cerr << "hoist: unknown command '" << given
                << "' (commands: " << known
                << ")\nRun with --help for more information.\n";
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag or argument and a failed
    // command exit 1, whatever CLI11's own code for the kind of error.
    return app.exit(e) == 0 ? 0 : 1;
  }
  return 0;
}
