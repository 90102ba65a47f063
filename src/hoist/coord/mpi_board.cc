// A post's message: u32 board name length | board name | value.
#include "hoist/coord/mpi_board.h"

#include <cstdint>
#include <cstring>
#include <iterator>

#include "absl/strings/str_format.h"
#include "hoist/coord/mpi_status.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<MpiBoard>> MpiBoard::Create(MPI_Comm parent) {
  int level = 0;
  HOIST_MPI(MPI_Query_thread(&level));
  if (level < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "MPI coordinator: MPI runs at thread level %d; its notice board (a "
        "preemption's agreement) runs beside the saver's collectives and "
        "needs MPI_THREAD_MULTIPLE (%d)",
        level, MPI_THREAD_MULTIPLE));
  }
  MPI_Comm comm;
  HOIST_MPI(MPI_Comm_dup(parent, &comm));
  HOIST_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  HOIST_MPI(MPI_Comm_rank(comm, &rank));
  HOIST_MPI(MPI_Comm_size(comm, &size));
  return std::unique_ptr<MpiBoard>(new MpiBoard(comm, rank, size));
}

MpiBoard::~MpiBoard() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MutexLock lock(&mu_);
  (void)Drain();
  for (Send& send : sends_) {
    for (MPI_Request& request : send.requests) {
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    }
    // MPI may still read the bytes of a send no one received.
    new std::string(std::move(send.bytes));
  }
  MPI_Comm_free(&comm_);
}

absl::Status MpiBoard::Post(std::string_view board, std::string value) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(Drain());
  if (!posted_.emplace(std::string(board)).second) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "notice board '%s': rank %d has already posted", board, rank_));
  }
  Send& send = sends_.emplace_back();
  const uint32_t length = static_cast<uint32_t>(board.size());
  send.bytes.append(reinterpret_cast<const char*>(&length), sizeof length);
  send.bytes.append(board);
  send.bytes.append(value);
  send.requests.resize(size_, MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    HOIST_MPI(MPI_Isend(send.bytes.data(), static_cast<int>(send.bytes.size()),
                        MPI_BYTE, r, kTag, comm_, &send.requests[r]));
  }
  return absl::OkStatus();
}

absl::StatusOr<Coordinator::BoardView> MpiBoard::Read(std::string_view board) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(Drain());
  auto it = boards_.find(std::string(board));
  if (it == boards_.end()) return Coordinator::BoardView{};
  return Coordinator::BoardView::Of(it->second);
}

absl::Status MpiBoard::Drain() {
  while (true) {
    int flag = 0;
    MPI_Status status;
    HOIST_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &status));
    if (!flag) break;
    int count = 0;
    HOIST_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
    std::string message(count, '\0');
    HOIST_MPI(MPI_Recv(message.data(), count, MPI_BYTE, status.MPI_SOURCE, kTag,
                       comm_, MPI_STATUS_IGNORE));
    uint32_t length = 0;
    if (message.size() < sizeof length) continue;  // not a board's message
    std::memcpy(&length, message.data(), sizeof length);
    if (message.size() - sizeof length < length) continue;
    std::vector<std::optional<std::string>>& values =
        boards_[message.substr(sizeof length, length)];
    values.resize(size_);
    values[status.MPI_SOURCE] = message.substr(sizeof length + length);
  }
  for (auto send = sends_.begin(); send != sends_.end();) {
    int done = 0;
    HOIST_MPI(MPI_Testall(static_cast<int>(send->requests.size()),
                          send->requests.data(), &done, MPI_STATUSES_IGNORE));
    send = done ? sends_.erase(send) : std::next(send);
  }
  return absl::OkStatus();
}

}  // namespace hoist
