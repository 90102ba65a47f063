// Test helper: the ranks of a job as threads of one process, sharing a
// notice board (Coordinator::Post, ReadBoard) in memory; their collectives
// are not there (kUnimplemented). For PreemptionWatch's tests.
#ifndef HOIST_TESTING_SHARED_BOARD_H_
#define HOIST_TESTING_SHARED_BOARD_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"

namespace hoist::testing {

class SharedBoard {
 public:
  explicit SharedBoard(int size) : size_(size) {}
  int size() const { return size_; }
  absl::Status Post(int rank, std::string_view board, std::string value) {
    MutexLock lock(&mu_);
    std::vector<std::optional<std::string>>& values =
        boards_[std::string(board)];
    values.resize(size_);
    if (values[rank].has_value()) {
      return absl::AlreadyExistsError(
          absl::StrFormat("rank %d posted twice on '%s'", rank, board));
    }
    values[rank] = std::move(value);
    return absl::OkStatus();
  }
  Coordinator::BoardView Read(std::string_view board) {
    MutexLock lock(&mu_);
    auto it = boards_.find(std::string(board));
    if (it == boards_.end()) return {};
    return Coordinator::BoardView::Of(it->second);
  }

 private:
  const int size_;
  Mutex mu_;
  std::map<std::string, std::vector<std::optional<std::string>>, std::less<>>
      boards_ ABSL_GUARDED_BY(mu_);
};

class BoardCoordinator final : public Coordinator {
 public:
  BoardCoordinator(SharedBoard& board, int rank) : board_(board), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return board_.size(); }
  absl::Status Barrier(std::string_view) override { return Missing(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view,
                                                     std::string) override {
    return Missing();
  }
  absl::StatusOr<std::string> Broadcast(std::string_view, std::string,
                                        int) override {
    return Missing();
  }
  absl::Status Post(std::string_view board, std::string value) override {
    return board_.Post(rank_, board, std::move(value));
  }
  absl::StatusOr<BoardView> ReadBoard(std::string_view board) override {
    return board_.Read(board);
  }

 private:
  static absl::Status Missing() {
    return absl::UnimplementedError("a board-only coordinator");
  }
  SharedBoard& board_;
  const int rank_;
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_SHARED_BOARD_H_
