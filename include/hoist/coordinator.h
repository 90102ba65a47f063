// Coordinator: what hoist needs from the job's distributed runtime. hoist
// never spawns processes or opens sockets itself; a job supplies one of these
// (single-process, MPI, or an adapter over torch.distributed or JAX's
// distributed client).
//
// Every rank must call the same operations in the same order with the same
// names. Implementations are thread-compatible: one call at a time. The
// bulk Exchange is for replication; the others carry small messages. The
// notice board (Post, ReadBoard) is the exception: no collective, any rank
// at any time, from another thread than the collectives'.
#ifndef HOIST_COORDINATOR_H_
#define HOIST_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

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
  // Every rank contributes `bytes`; `root` gets all contributions, indexed
  // by rank, and every other rank an empty vector: what only one rank needs
  // (a save's extent hashes, for the manifest rank 0 writes), so that the
  // other ranks' cost does not grow with the job. kInvalidArgument for a
  // root that does not exist. Default: an AllGather that only `root` keeps.
  virtual absl::StatusOr<std::vector<std::string>> Gather(std::string_view name,
                                                          std::string bytes,
                                                          int root);
  // `root` sends each rank its own piece: every rank gets pieces[rank()]
  // (`pieces` of the root, one per rank; the others' are ignored), so that
  // what rank 0 decides for each rank reaches it without the others'.
  // kInvalidArgument for a root that does not exist, or on the root for
  // pieces that are not one per rank. Default: a Broadcast of every piece,
  // of which each rank keeps its own.
  virtual absl::StatusOr<std::string> Scatter(std::string_view name,
                                              std::vector<std::string> pieces,
                                              int root);
  // `root`'s bytes, on every rank (the others' arguments are ignored).
  virtual absl::StatusOr<std::string> Broadcast(std::string_view name,
                                                std::string bytes,
                                                int root) = 0;

  // Takes the pieces an Exchange receives, in order; each is valid during
  // the call only. Its error stops the exchange, which returns it.
  using ReceivePiece = std::function<absl::Status(absl::Span<const uint8_t>)>;

  // Bulk point to point, for replicating data between processes: this rank
  // sends `data` to rank `to` while rank `from` sends this rank its data,
  // which arrives through `receive` in pieces of at most 64 MiB, in order
  // (nothing for empty data). Every rank takes part, under the same name, in
  // the same order as its other operations, so a job calls it as a shift
  // (each rank sends to rank + k, receives from rank - k); to == from ==
  // rank() copies to itself. Errors: kInvalidArgument for a rank that does
  // not exist; kFailedPrecondition when `from` sent under another name;
  // kDeadlineExceeded, naming the peer, when no byte moves either way for
  // the coordinator's timeout; the receiver's error as is; kUnimplemented
  // where the coordinator cannot move bulk data.
  absl::Status Exchange(std::string_view name, absl::Span<const uint8_t> data,
                        int to, int from, const ReceivePiece& receive) {
    return ExchangeGathered(name, {&data, 1}, to, from, receive);
  }

  // Exchange of the concatenation of `pieces`, which need not be contiguous
  // (a sender gathers them as it sends: no copy of the whole is made). They
  // must stay valid until it returns. What a coordinator implements (the
  // default: kUnimplemented).
  virtual absl::Status ExchangeGathered(
      std::string_view name, absl::Span<const absl::Span<const uint8_t>> pieces,
      int to, int from, const ReceivePiece& receive) {
    (void)pieces, (void)to, (void)from, (void)receive;
    return absl::UnimplementedError(
        "exchange '" + std::string(name) +
        "': this coordinator cannot move bulk data");
  }

  // What this rank has moved through the coordinator's collectives and
  // exchanges since it was made (its notice board aside): messages and
  // bytes as its transport carries them. For measuring how a job's cost
  // grows with its ranks (bench/scale.py); zeros from a coordinator that
  // does not count.
  struct Traffic {
    int64_t messages_sent = 0;
    int64_t bytes_sent = 0;
    int64_t messages_received = 0;
    int64_t bytes_received = 0;
  };
  virtual Traffic traffic() const { return {}; }

  // What a notice board holds (ReadBoard).
  struct BoardView {
    int posted = 0;  // ranks that have posted
    // Every rank's value, by rank, once every rank has posted (else empty).
    std::vector<std::string> values;
    // The view of a board that holds `by_rank` (nullopt: not posted).
    static BoardView Of(
        const std::vector<std::optional<std::string>>& by_rank) {
      BoardView view;
      for (const auto& value : by_rank) view.posted += value.has_value();
      if (view.posted == static_cast<int>(by_rank.size())) {
        for (const auto& value : by_rank) view.values.push_back(*value);
      }
      return view;
    }
  };

  // The notice board: small values that ranks post outside the collective
  // order, for a notice any rank may raise at any time (a preemption).
  // Thread-safe against the collectives: a background thread polls the
  // board while the saver's collectives run. Each rank posts once per
  // board; a second post to the same board is kAlreadyExists. Post returns
  // without waiting for any other rank. ReadBoard never waits for one
  // either: it returns what has arrived (one request to the job's store, or
  // a local check). Default: kUnimplemented (a coordinator without a board
  // cannot agree on a preemption).
  virtual absl::Status Post(std::string_view board, std::string value) {
    (void)value;
    return absl::UnimplementedError("notice board '" + std::string(board) +
                                    "': this coordinator has none");
  }
  virtual absl::StatusOr<BoardView> ReadBoard(std::string_view board) {
    return absl::UnimplementedError("notice board '" + std::string(board) +
                                    "': this coordinator has none");
  }

 protected:
  // OK, or kInvalidArgument naming `operation` `name` when `root` is no
  // rank of the job.
  absl::Status CheckRoot(std::string_view operation, std::string_view name,
                         int root) const;
  // OK, or kInvalidArgument naming scatter `name` when `pieces` is not one
  // per rank.
  absl::Status CheckPieces(std::string_view name, size_t pieces) const;
};

// Rank 0 of 1: every operation returns at once.
std::unique_ptr<Coordinator> MakeSingleProcessCoordinator();

struct MpiCoordinatorOptions {
  // How long one operation waits for the other ranks (default 10 minutes).
  // Rank 0 then fails it with kDeadlineExceeded naming every rank that did
  // not arrive, and tells the ranks that did; a rank that rank 0 never
  // answers fails after twice this, naming rank 0.
  absl::Duration timeout = absl::Minutes(10);
  // The communicator to coordinate over, as a pointer to an MPI_Comm (hoist
  // duplicates it, so its messages never meet the job's). Default
  // MPI_COMM_WORLD.
  const void* communicator = nullptr;
};

// A Coordinator over MPI. Initializes MPI (MPI_THREAD_MULTIPLE asked, at
// least MPI_THREAD_SERIALIZED needed) unless the job already has, and then
// finalizes it at exit. Its notice board is messages on a communicator of
// its own, and needs MPI_THREAD_MULTIPLE (else kFailedPrecondition). Every
// operation is a gather at rank 0 and its answer, point to point with
// per-operation tags, polled against the timeout, so a hung rank is named
// instead of hanging the job; rank 0 also checks that every rank called the
// operation of the same name. kUnimplemented when hoist was built without MPI;
// kFailedPrecondition when the job initialized MPI with too low a thread level.
absl::StatusOr<std::unique_ptr<Coordinator>> MakeMpiCoordinator(
    const MpiCoordinatorOptions& options = {});

// The coordinator of the job that started this process: over MPI when an MPI
// launcher (Open MPI's mpirun, or a PMI launcher such as MPICH's hydra or
// srun --mpi=pmi2) started it as one of several ranks, else single-process.
// Errors as MakeMpiCoordinator's.
absl::StatusOr<std::unique_ptr<Coordinator>> MakeJobCoordinator(
    const MpiCoordinatorOptions& options = {});

}  // namespace hoist

#endif  // HOIST_COORDINATOR_H_
