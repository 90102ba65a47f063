// How a CLI command refuses bad input and ends on an error: the message on
// stderr, exit status 1.
#ifndef HOIST_TOOLS_COMMAND_ERROR_H_
#define HOIST_TOOLS_COMMAND_ERROR_H_

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/status/status.h"

namespace hoist {

// Prints "hoist COMMAND: MESSAGE" on stderr and ends the command (CLI11
// exits with status 1).
[[noreturn]] inline void FailCommand(const char* command,
                                     const absl::Status& status) {
  std::cerr << "hoist " << command << ": " << status.message() << "\n";
  throw CLI::RuntimeError(1);
}

// A check for an integer option or argument that must not be negative.
// CLI::NonNegativeNumber says "Value -1 not in range 0.000000 to 1797...";
// this says "-1: must be 0 or more". Text that is not a number passes to the
// conversion, which names it.
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (end == text.c_str() || *end != '\0' || value >= 0) return "";
        return text + ": must be 0 or more";
      },
      "NONNEGATIVE");
}

}  // namespace hoist

#endif  // HOIST_TOOLS_COMMAND_ERROR_H_
