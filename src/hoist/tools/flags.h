// Parsing the CLI's shared flags.
#ifndef HOIST_TOOLS_FLAGS_H_
#define HOIST_TOOLS_FLAGS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace hoist {

// A --mesh flag, "DATAxMODEL" ("2x4" -> {2, 4}); kInvalidArgument naming
// the flag otherwise.
absl::StatusOr<std::pair<int64_t, int64_t>> ParseMeshFlag(
    const std::string& text);

}  // namespace hoist

#endif  // HOIST_TOOLS_FLAGS_H_
