#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/coord/launch.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

class SingleProcessCoordinator final : public Coordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status Barrier(std::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view, std::string bytes) override {
    return std::vector<std::string>{std::move(bytes)};
  }
  absl::StatusOr<std::string> Broadcast(std::string_view name,
                                        std::string bytes, int root) override {
    if (root != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "broadcast '%s': root %d does not exist in a job of 1 process", name,
          root));
    }
    return bytes;
  }
  absl::Status ExchangeGathered(
      std::string_view name, absl::Span<const absl::Span<const uint8_t>> pieces,
      int to, int from, const ReceivePiece& receive) override {
    if (to != 0 || from != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "exchange '%s': ranks %d and %d do not both exist in a job of 1 "
          "process",
          name, to, from));
    }
    constexpr size_t kPiece = size_t{64} << 20;
    for (absl::Span<const uint8_t> data : pieces) {
      for (size_t at = 0; at < data.size(); at += kPiece) {
        absl::Status s = receive(data.subspan(at, kPiece));
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Post(std::string_view board, std::string value) override {
    MutexLock lock(&mu_);
    if (!boards_.try_emplace(std::string(board), std::move(value)).second) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "notice board '%s': rank 0 has already posted", board));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<BoardView> ReadBoard(std::string_view board) override {
    MutexLock lock(&mu_);
    auto it = boards_.find(std::string(board));
    if (it == boards_.end()) return BoardView{};
    return BoardView{1, {it->second}};
  }

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, std::string> boards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Coordinator> MakeSingleProcessCoordinator() {
  return std::make_unique<SingleProcessCoordinator>();
}

absl::StatusOr<std::unique_ptr<Coordinator>> MakeJobCoordinator(
    const MpiCoordinatorOptions& options) {
  if (LaunchedByMpiWithSeveralRanks()) return MakeMpiCoordinator(options);
  return MakeSingleProcessCoordinator();
}

bool LaunchedByMpiWithSeveralRanks() {
  // Open MPI's mpirun, and PMI launchers (MPICH's hydra, srun --mpi=pmi2).
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 1) return true;
  }
  return false;
}

}  // namespace hoist
