// Coordinator: what hoist needs from the job's distributed runtime. hoist
// never spawns processes or opens sockets itself; a job supplies one of these
// (single-process, MPI, or an adapter over torch.distributed or JAX's
// distributed client).
//
// Every rank must call the same operations in the same order with the same
// names. Implementations are thread-compatible: one call at a time.
#ifndef HOIST_COORDINATOR_H_
#define HOIST_COORDINATOR_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hoist {

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Returns once every rank has entered the barrier `name`.
  virtual absl::Status Barrier(std::string_view name) = 0;
  // Every rank contributes `bytes`; every rank gets all contributions,
  // indexed by rank.
  virtual absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view name, std::string bytes) = 0;
  // `root`'s bytes, on every rank (the others' arguments are ignored).
  virtual absl::StatusOr<std::string> Broadcast(std::string_view name,
                                                std::string bytes,
                                                int root) = 0;
};

// Rank 0 of 1: every operation returns at once.
std::unique_ptr<Coordinator> MakeSingleProcessCoordinator();

}  // namespace hoist

#endif  // HOIST_COORDINATOR_H_
