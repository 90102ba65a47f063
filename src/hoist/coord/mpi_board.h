// MpiBoard: the MPI coordinator's notice board (Coordinator::Post,
// ReadBoard). A post is one message to every rank (itself included) on a
// communicator of the board's own, sent without waiting; a read receives
// whatever has arrived (MPI_Iprobe, no wait) and says what the board holds.
// Its calls run beside the coordinator's collectives on another thread, so
// it needs MPI_THREAD_MULTIPLE. Thread-safe. Private to coord/.
#ifndef HOIST_COORD_MPI_BOARD_H_
#define HOIST_COORD_MPI_BOARD_H_

#include <mpi.h>

#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"

namespace hoist {

class MpiBoard {
 public:
  // A board over a duplicate of `parent` (collective: every rank calls it
  // at once, as MPI_Comm_dup requires). kFailedPrecondition below
  // MPI_THREAD_MULTIPLE.
  static absl::StatusOr<std::unique_ptr<MpiBoard>> Create(MPI_Comm parent);
  // Frees the communicator (unless MPI was finalized). A post some rank
  // never received keeps its buffer, as MPI may still read it.
  ~MpiBoard();

  // Coordinator::Post and ReadBoard.
  absl::Status Post(std::string_view board, std::string value);
  absl::StatusOr<Coordinator::BoardView> Read(std::string_view board);

 private:
  MpiBoard(MPI_Comm comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size) {}
  // Receives every message that has arrived, and completes finished sends.
  absl::Status Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr int kTag = 1;
  Mutex mu_;
  MPI_Comm comm_;
  const int rank_;
  const int size_;
  // Posts whose messages MPI may still read.
  struct Send {
    std::string bytes;
    std::vector<MPI_Request> requests;  // one per rank
  };
  std::list<Send> sends_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> posted_ ABSL_GUARDED_BY(mu_);
  // By board, each rank's value once it arrived.
  absl::flat_hash_map<std::string, std::vector<std::optional<std::string>>>
      boards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_COORD_MPI_BOARD_H_
