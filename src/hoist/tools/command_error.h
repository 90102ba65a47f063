// How a CLI command ends on an error: the message on stderr, exit status 1.
#ifndef HOIST_TOOLS_COMMAND_ERROR_H_
#define HOIST_TOOLS_COMMAND_ERROR_H_

#include <CLI/CLI.hpp>
#include <iostream>

#include "absl/status/status.h"

namespace hoist {

// Prints "hoist COMMAND: MESSAGE" on stderr and ends the command (CLI11
// exits with status 1).
[[noreturn]] inline void FailCommand(const char* command,
                                     const absl::Status& status) {
  std::cerr << "hoist " << command << ": " << status.message() << "\n";
  throw CLI::RuntimeError(1);
}

}  // namespace hoist

#endif  // HOIST_TOOLS_COMMAND_ERROR_H_
