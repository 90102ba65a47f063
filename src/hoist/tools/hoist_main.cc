// The hoist command-line tool.
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

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
  app.set_version_flag("--version", "hoist " HOIST_VERSION);
  // Object stores, for every command (given before or after it): each flag
  // sets the variable the client reads, so it overrides the environment.
  // Keys stay in the environment or a profile: never on a command line.
  app.fallthrough();
  const auto sets = [&app](const char* flag, const char* variable,
                           const char* help) {
    app.add_option_function<std::string>(
           flag,
           [variable](const std::string& value) {
             setenv(variable, value.c_str(), 1);
           },
           help)
        ->trigger_on_parse()
        ->group("Object stores (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX)");
  };
  sets("--s3-endpoint", "AWS_ENDPOINT_URL_S3",
       "S3 endpoint URL (else AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS)");
  sets("--s3-region", "AWS_REGION",
       "S3 region (else AWS_REGION, AWS_DEFAULT_REGION, the profile's)");
  sets("--aws-profile", "AWS_PROFILE",
       "AWS profile in ~/.aws for credentials and region (else "
       "AWS_PROFILE)");
  sets("--gcs-endpoint", "STORAGE_EMULATOR_HOST",
       "GCS endpoint of an emulator, e.g. http://127.0.0.1:4443 (else "
       "STORAGE_EMULATOR_HOST; unset: Google's, with application default "
       "credentials)");
  hoist::AddDemoCommand(app);
  hoist::AddPlanCommand(app);
  hoist::AddInspectCommands(app);
  hoist::AddInteropCommands(app);
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
