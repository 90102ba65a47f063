// Parsing a mesh shape flag ("DATAxMODEL"), as the CLI, the benchmarks
// and the crash tests take it.
#ifndef HOIST_MODEL_MESH_FLAG_H_
#define HOIST_MODEL_MESH_FLAG_H_

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

#endif  // HOIST_MODEL_MESH_FLAG_H_
