// Coordinator over MPI. Every operation is a gather at rank 0 followed by
// rank 0's answer to each rank, sent point to point on a tag of its own (the
// operation's sequence number), and every wait is a poll against a deadline:
// MPI's blocking collectives cannot time out, name a missing rank, or notice
// two ranks calling different operations, and hoist must do all three.
//
// Messages (bytes, on the coordinator's private duplicate communicator):
//   request, rank r -> 0: u32 kind | i32 root | u32 name length | name |
//                          payload
//   answer,  rank 0 -> r: u8 ok | ok: the result (AllGather, and Gather to
//                          its root: for each rank u64 length | bytes;
//                          Broadcast: root's bytes; Scatter: r's piece;
//                          Barrier, and Gather to any other rank: nothing)
//                          | not ok: the error's message
// (A Scatter's root sends its pieces, for each rank u64 length | bytes, as
// its request's payload.)
// A rank that arrives after rank 0 gave up gets no answer and fails after
// twice the timeout; its late request stays unmatched under a tag no later
// operation uses.
//
// Exchange is point to point between the two peers, under the operation's
// tag: a header (u64 total bytes | name), then the data in pieces of at
// most 64 MiB, each sent from a copy this coordinator owns (so that a send
// abandoned at a timeout never reads the caller's memory after it
// returned), at most three sends in flight.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/coord/mpi_board.h"
#include "hoist/coord/mpi_status.h"
#include "hoist/coord/pieces.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

enum class Kind : uint32_t {
  kBarrier = 0,
  kAllGather = 1,
  kBroadcast = 2,
  kGather = 3,
  kScatter = 4
};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kBarrier:
      return "Barrier";
    case Kind::kAllGather:
      return "AllGather";
    case Kind::kBroadcast:
      return "Broadcast";
    case Kind::kGather:
      return "Gather";
    case Kind::kScatter:
      return "Scatter";
  }
  return "?";
}

void AppendU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void AppendU64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Reads a fixed-size value at `at`; false if the message is too short.
template <typename T>
bool Take(const std::string& in, size_t& at, T& out) {
  if (in.size() - at < sizeof out || at > in.size()) return false;
  std::memcpy(&out, in.data() + at, sizeof out);
  at += sizeof out;
  return true;
}

struct Request {
  Kind kind;
  int32_t root;
  std::string name;
  std::string payload;
};

std::string EncodeRequest(const Request& r) {
  std::string out;
  AppendU32(out, static_cast<uint32_t>(r.kind));
  AppendU32(out, static_cast<uint32_t>(r.root));
  AppendU32(out, static_cast<uint32_t>(r.name.size()));
  out += r.name;
  out += r.payload;
  return out;
}

bool DecodeRequest(const std::string& in, Request& r) {
  size_t at = 0;
  uint32_t kind, root, name_size;
  if (!Take(in, at, kind) || !Take(in, at, root) || !Take(in, at, name_size) ||
      in.size() - at < name_size) {
    return false;
  }
  r.kind = static_cast<Kind>(kind);
  r.root = static_cast<int32_t>(root);
  r.name = in.substr(at, name_size);
  r.payload = in.substr(at + name_size);
  return true;
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiCoordinator final : public Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const MpiCoordinatorOptions& options) {
    if (options.timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("MPI coordinator: timeout must be > 0");
    }
    int initialized = 0, finalized = 0;
    HOIST_MPI(MPI_Initialized(&initialized));
    HOIST_MPI(MPI_Finalized(&finalized));
    if (finalized) {
      return absl::FailedPreconditionError(
          "MPI coordinator: MPI was already finalized in this process");
    }
    if (!initialized) {
      int provided = 0;
      HOIST_MPI(
          MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(FinalizeAtExit);
    }
    int level = 0;
    HOIST_MPI(MPI_Query_thread(&level));
    if (level < MPI_THREAD_SERIALIZED) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "MPI coordinator: MPI runs at thread level %d; hoist calls MPI "
          "from its saver thread and needs MPI_THREAD_SERIALIZED (%d) or "
          "more (initialize MPI with MPI_Init_thread)",
          level, MPI_THREAD_SERIALIZED));
    }
    const MPI_Comm parent =
        options.communicator != nullptr
            ? *static_cast<const MPI_Comm*>(options.communicator)
            : MPI_COMM_WORLD;
    MPI_Comm comm;
    HOIST_MPI(MPI_Comm_dup(parent, &comm));
    HOIST_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    auto coordinator = std::unique_ptr<MpiCoordinator>(
        new MpiCoordinator(comm, options.timeout));
    HOIST_MPI(MPI_Comm_rank(comm, &coordinator->rank_));
    HOIST_MPI(MPI_Comm_size(comm, &coordinator->size_));
    int* tag_ub = nullptr;
    int found = 0;
    HOIST_MPI(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found));
    coordinator->max_tag_ = found && tag_ub != nullptr ? *tag_ub : 32767;
    // Below MPI_THREAD_MULTIPLE there is no board, and Post says why.
    absl::StatusOr<std::unique_ptr<MpiBoard>> board = MpiBoard::Create(comm);
    if (board.ok()) {
      coordinator->board_ = *std::move(board);
    } else {
      coordinator->no_board_ = board.status();
    }
    return std::unique_ptr<Coordinator>(std::move(coordinator));
  }

  ~MpiCoordinator() override {
    board_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Barrier(std::string_view name) override {
    return Run(Kind::kBarrier, name, std::string(), 0).status();
  }
  absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view name, std::string bytes) override {
    return Run(Kind::kAllGather, name, std::move(bytes), 0);
  }
  absl::StatusOr<std::vector<std::string>> Gather(std::string_view name,
                                                  std::string bytes,
                                                  int root) override {
    RETURN_IF_ERROR(CheckRoot("gather", name, root));
    return Run(Kind::kGather, name, std::move(bytes), root);
  }
  absl::StatusOr<std::string> Scatter(std::string_view name,
                                      std::vector<std::string> pieces,
                                      int root) override {
    RETURN_IF_ERROR(CheckRoot("scatter", name, root));
    // A root with too few or too many pieces still takes part: rank 0
    // finds them malformed and every rank fails.
    std::string mine;
    if (rank_ == root) AppendPieces(mine, pieces);
    absl::StatusOr<std::vector<std::string>> out =
        Run(Kind::kScatter, name, std::move(mine), root);
    if (rank_ == root) RETURN_IF_ERROR(CheckPieces(name, pieces.size()));
    if (!out.ok()) return out.status();
    return std::move((*out)[0]);
  }
  absl::Status ExchangeGathered(
      std::string_view name, absl::Span<const absl::Span<const uint8_t>> pieces,
      int to, int from, const ReceivePiece& receive) override {
    if (to < 0 || to >= size_ || from < 0 || from >= size_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "exchange '%s': ranks %d and %d do not both exist in a job of %d "
          "processes",
          name, to, from, size_));
    }
    MutexLock lock(&mu_);
    const int tag = 1 + static_cast<int>(sequence_++ % (max_tag_ - 1));
    return PointToPoint(*this, name, pieces, to, from, receive, tag).Run();
  }

  absl::StatusOr<std::string> Broadcast(std::string_view name,
                                        std::string bytes, int root) override {
    RETURN_IF_ERROR(CheckRoot("broadcast", name, root));
    ASSIGN_OR_RETURN(std::vector<std::string> out,
                     Run(Kind::kBroadcast, name, std::move(bytes), root));
    return std::move(out[0]);
  }

  Traffic traffic() const override {
    return {messages_sent_.load(std::memory_order_relaxed),
            bytes_sent_.load(std::memory_order_relaxed),
            messages_received_.load(std::memory_order_relaxed),
            bytes_received_.load(std::memory_order_relaxed)};
  }

  absl::Status Post(std::string_view board, std::string value) override {
    if (board_ == nullptr) return no_board_;
    return board_->Post(board, std::move(value));
  }
  absl::StatusOr<BoardView> ReadBoard(std::string_view board) override {
    if (board_ == nullptr) return no_board_;
    return board_->Read(board);
  }

 private:
  MpiCoordinator(MPI_Comm comm, absl::Duration timeout)
      : comm_(comm), timeout_(timeout) {}

  // One operation. Barrier: an empty vector. AllGather, and Gather on its
  // root: every rank's bytes (Gather elsewhere: an empty vector).
  // Broadcast: a vector of one, the root's bytes; Scatter: of one, this
  // rank's piece.
  absl::StatusOr<std::vector<std::string>> Run(Kind kind, std::string_view name,
                                               std::string bytes, int root)
      ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    const int tag = 1 + static_cast<int>(sequence_++ % (max_tag_ - 1));
    Request mine{kind, root, std::string(name), std::move(bytes)};
    if (rank_ == 0) return Lead(tag, std::move(mine));
    return Follow(tag, mine);
  }

  // Polls `ready` until it says true or `deadline` passes (false), backing
  // off from 20 us to 1 ms between tries. A poll, not a wait: MPI has no
  // call that waits for a message or a send with a timeout (MPI_Wait and
  // MPI_Probe block for good), and the timeout is the point.
  template <typename Ready>
  absl::StatusOr<bool> PollUntil(absl::Time deadline, Ready ready) {
    absl::Duration pause = absl::Microseconds(20);
    while (true) {
      ASSIGN_OR_RETURN(bool done, ready());
      if (done) return true;
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(1));
    }
  }

  // Receives the message from `source` under `tag` if one is there.
  absl::StatusOr<bool> TryReceive(int source, int tag, std::string& out) {
    int flag = 0;
    MPI_Status status;
    HOIST_MPI(MPI_Iprobe(source, tag, comm_, &flag, &status));
    if (!flag) return false;
    int count = 0;
    HOIST_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
    out.resize(count);
    HOIST_MPI(MPI_Recv(out.data(), count, MPI_BYTE, source, tag, comm_,
                       MPI_STATUS_IGNORE));
    Count(messages_received_, bytes_received_, count);
    return true;
  }

  // Sends `bytes` to `dest` without blocking the caller past the deadline;
  // the buffer lives until the send completes or this coordinator ends.
  absl::Status Send(int dest, int tag, std::string bytes, absl::Time deadline) {
    if (bytes.size() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MPI coordinator: a message of %d bytes is over MPI's 2 GiB",
          bytes.size()));
    }
    pending_.push_back(std::move(bytes));
    std::string& buffer = pending_.back();
    MPI_Request request;
    HOIST_MPI(MPI_Isend(buffer.data(), static_cast<int>(buffer.size()),
                        MPI_BYTE, dest, tag, comm_, &request));
    Count(messages_sent_, bytes_sent_, buffer.size());
    ASSIGN_OR_RETURN(bool sent,
                     PollUntil(deadline, [&]() -> absl::StatusOr<bool> {
                       int flag = 0;
                       HOIST_MPI(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
                       return flag != 0;
                     }));
    if (sent) {
      pending_.pop_back();
      return absl::OkStatus();
    }
    MPI_Request_free(&request);  // `buffer` stays in pending_
    return absl::DeadlineExceededError(
        absl::StrFormat("rank %d did not take rank %d's message within %s",
                        dest, rank_, absl::FormatDuration(timeout_)));
  }

  absl::StatusOr<std::vector<std::string>> Lead(int tag, Request mine) {
    const absl::Time deadline = absl::Now() + timeout_;
    std::vector<std::string> payloads(size_);
    std::vector<bool> arrived(size_, false);
    payloads[0] = std::move(mine.payload);
    arrived[0] = true;
    int waiting = size_ - 1;
    absl::Status problem;
    ASSIGN_OR_RETURN(
        bool all, PollUntil(deadline, [&]() -> absl::StatusOr<bool> {
          for (int r = 1; r < size_; ++r) {
            if (arrived[r]) continue;
            std::string message;
            ASSIGN_OR_RETURN(bool got, TryReceive(r, tag, message));
            if (!got) continue;
            arrived[r] = true;
            --waiting;
            Request theirs;
            if (!DecodeRequest(message, theirs)) {
              problem.Update(absl::InternalError(absl::StrFormat(
                  "'%s': rank %d sent a malformed message", mine.name, r)));
            } else if (theirs.kind != mine.kind || theirs.name != mine.name ||
                       theirs.root != mine.root) {
              problem.Update(absl::FailedPreconditionError(absl::StrFormat(
                  "rank %d called %s('%s', root %d) while rank 0 called "
                  "%s('%s', root %d): the ranks disagree on what to do",
                  r, KindName(theirs.kind), theirs.name, theirs.root,
                  KindName(mine.kind), mine.name, mine.root)));
            } else {
              payloads[r] = std::move(theirs.payload);
            }
          }
          return waiting == 0;
        }));
    if (!all) {
      std::vector<int> missing;
      for (int r = 1; r < size_; ++r) {
        if (!arrived[r]) missing.push_back(r);
      }
      problem = absl::DeadlineExceededError(absl::StrFormat(
          "'%s': rank%s %s did not arrive within %s (dead, hung, or doing "
          "something else)",
          mine.name, missing.size() > 1 ? "s" : "",
          absl::StrJoin(missing, ", "), absl::FormatDuration(timeout_)));
    }
    // The answer, to every rank that is listening; a gather's to its root
    // alone carries every rank's bytes.
    std::vector<std::string> pieces;  // a scatter's, one per rank
    if (problem.ok() && mine.kind == Kind::kScatter) {
      absl::StatusOr<std::vector<std::string>> split =
          SplitPieces(payloads[mine.root], size_, mine.name);
      if (split.ok()) {
        pieces = *std::move(split);
      } else {
        problem = split.status();
      }
    }
    std::string answer(1, problem.ok() ? '\1' : '\0');
    std::string gathered;  // a gather's answer to its root
    std::vector<std::string> result;
    if (!problem.ok()) {
      answer += std::string(problem.message());
    } else if (mine.kind == Kind::kAllGather) {
      AppendPieces(answer, payloads);
      result = payloads;
    } else if (mine.kind == Kind::kGather && mine.root == 0) {
      result = std::move(payloads);
    } else if (mine.kind == Kind::kGather) {
      gathered = answer;
      AppendPieces(gathered, payloads);
    } else if (mine.kind == Kind::kScatter) {
      result.push_back(std::move(pieces[0]));
    } else if (mine.kind == Kind::kBroadcast) {
      answer += payloads[mine.root];
      result.push_back(std::move(payloads[mine.root]));
    }
    const absl::Time answer_deadline = absl::Now() + timeout_;
    for (int r = 1; r < size_; ++r) {
      if (!arrived[r]) continue;
      const bool gather_root =
          problem.ok() && mine.kind == Kind::kGather && r == mine.root;
      const bool scatter = problem.ok() && mine.kind == Kind::kScatter;
      if (absl::Status sent = Send(r, tag,
                                   gather_root ? gathered
                                   : scatter   ? absl::StrCat(answer, pieces[r])
                                               : answer,
                                   answer_deadline);
          !sent.ok() && problem.ok()) {
        problem = sent;
      }
    }
    if (!problem.ok()) return problem;
    return result;
  }

  absl::StatusOr<std::vector<std::string>> Follow(int tag,
                                                  const Request& mine) {
    const absl::Time deadline = absl::Now() + 2 * timeout_;
    RETURN_IF_ERROR(Send(0, tag, EncodeRequest(mine), deadline));
    std::string answer;
    ASSIGN_OR_RETURN(bool got,
                     PollUntil(deadline, [&]() -> absl::StatusOr<bool> {
                       return TryReceive(0, tag, answer);
                     }));
    if (!got) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "'%s': rank 0 did not answer rank %d within %s (rank 0 dead or "
          "hung, or it gave up on this rank as late)",
          mine.name, rank_, absl::FormatDuration(2 * timeout_)));
    }
    if (answer.empty()) {
      return absl::InternalError("MPI coordinator: empty answer from rank 0");
    }
    if (answer[0] != '\1') {
      return absl::AbortedError(
          absl::StrFormat("rank 0: %s", answer.substr(1)));
    }
    if (mine.kind == Kind::kBroadcast || mine.kind == Kind::kScatter) {
      return std::vector<std::string>{answer.substr(1)};
    }
    if (mine.kind == Kind::kAllGather ||
        (mine.kind == Kind::kGather && mine.root == rank_)) {
      return SplitPieces(std::string_view(answer).substr(1), size_,
                         "MPI coordinator: the answer from rank 0");
    }
    return std::vector<std::string>();
  }

  // One ExchangeGathered between this rank and its peers `to` and `from`,
  // under `tag`: sends the header, then the pieces (at most three sends in
  // flight, each from a buffer this coordinator owns), while receiving
  // `from`'s header and pieces; polls until both are over, or until
  // nothing has moved for the timeout.
  class PointToPoint {
   public:
    PointToPoint(MpiCoordinator& c, std::string_view name,
                 absl::Span<const absl::Span<const uint8_t>> pieces, int to,
                 int from, const ReceivePiece& receive, int tag)
        : c_(c),
          name_(name),
          pieces_(pieces),
          to_(to),
          from_(from),
          receive_(receive),
          tag_(tag) {
      for (absl::Span<const uint8_t> piece : pieces) total_ += piece.size();
    }
    // Abandoned sends keep their buffers in pending_ until the coordinator
    // ends; MPI may still read them.
    ~PointToPoint() {
      for (auto& [request, buffer] : sending_) MPI_Request_free(&request);
    }

    absl::Status Run() {
      std::string header;
      AppendU64(header, total_);
      header.append(name_);
      RETURN_IF_ERROR(
          Post([&](std::string& buffer) { buffer.append(header); }));
      absl::Time deadline = absl::Now() + c_.timeout_;
      absl::Time last_moved = absl::Now();
      absl::Duration pause = absl::Microseconds(20);
      while (true) {
        RETURN_IF_ERROR(PostPieces());
        ASSIGN_OR_RETURN(bool reaped, ReapSends());
        ASSIGN_OR_RETURN(bool received, ReceiveNext());
        if (sending_.empty() && sent_ == total_ && have_header_ &&
            received_ == expected_) {
          return absl::OkStatus();
        }
        const absl::Time now = absl::Now();
        if (reaped || received) {
          deadline = now + c_.timeout_;
          last_moved = now;
          pause = absl::Microseconds(20);
          continue;
        }
        // MPI moves a large message's fragments only inside MPI calls (the
        // shared-memory transport copies them through small buffers): while
        // pieces are in flight, and for a while after the last one moved,
        // poll without sleeping, else a 64 MiB piece crawls at a fragment
        // per nap.
        if ((!sending_.empty() || (have_header_ && received_ < expected_)) &&
            now - last_moved < kSpinAfterMove) {
          std::this_thread::yield();
          continue;
        }
        if (now >= deadline) {
          return absl::DeadlineExceededError(absl::StrFormat(
              "exchange '%s': nothing moved between rank %d and ranks %d "
              "(to) and %d (from) within %s (dead, hung, or doing something "
              "else)",
              name_, c_.rank_, to_, from_, absl::FormatDuration(c_.timeout_)));
        }
        absl::SleepFor(pause);
        pause = std::min(pause * 2, absl::Milliseconds(1));
      }
    }

   private:
    // Posts a send of the bytes `fill` appends to a (reused) buffer.
    absl::Status Post(const std::function<void(std::string&)>& fill) {
      std::string buffer_bytes;
      if (!spare_.empty()) {
        buffer_bytes = std::move(spare_.back());
        spare_.pop_back();
      }
      buffer_bytes.clear();
      fill(buffer_bytes);
      c_.pending_.push_back(std::move(buffer_bytes));
      auto buffer = std::prev(c_.pending_.end());
      MPI_Request request;
      HOIST_MPI(MPI_Isend(buffer->data(), static_cast<int>(buffer->size()),
                          MPI_BYTE, to_, tag_, c_.comm_, &request));
      Count(c_.messages_sent_, c_.bytes_sent_, buffer->size());
      sending_.emplace_back(request, buffer);
      return absl::OkStatus();
    }

    // The next pieces' sends, while fewer than three are in flight.
    absl::Status PostPieces() {
      while (sending_.size() < 3 && sent_ < total_) {
        const size_t n = std::min(kPieceBytes, total_ - sent_);
        RETURN_IF_ERROR(Post([&](std::string& buffer) {
          buffer.reserve(n);  // one allocation, not a doubling series
          while (buffer.size() < n) {
            const absl::Span<const uint8_t> from_piece =
                pieces_[piece_].subspan(in_piece_, n - buffer.size());
            buffer.append(reinterpret_cast<const char*>(from_piece.data()),
                          from_piece.size());
            in_piece_ += from_piece.size();
            if (in_piece_ == pieces_[piece_].size()) ++piece_, in_piece_ = 0;
          }
        }));
        sent_ += n;
      }
      return absl::OkStatus();
    }

    // Frees the sends that finished, in order (their buffers kept for
    // reuse: a fresh 64 MiB buffer is faulted in page by page, which costs
    // as much as the copy into it). True when one did.
    absl::StatusOr<bool> ReapSends() {
      bool moved = false;
      while (!sending_.empty()) {
        int done = 0;
        RETURN_IF_ERROR(MpiStatus(
            MPI_Test(&sending_.front().first, &done, MPI_STATUS_IGNORE),
            "MPI_Test"));
        if (!done) break;
        spare_.push_back(std::move(*sending_.front().second));
        c_.pending_.erase(sending_.front().second);
        sending_.pop_front();
        moved = true;
      }
      return moved;
    }

    // Takes `from`'s header or next piece, if one is there.
    absl::StatusOr<bool> ReceiveNext() {
      if (have_header_ && received_ >= expected_) return false;
      ASSIGN_OR_RETURN(bool got, c_.TryReceive(from_, tag_, message_));
      if (!got) return false;
      if (!have_header_) {
        size_t at = 0;
        if (!Take(message_, at, expected_)) {
          return absl::InternalError(absl::StrFormat(
              "exchange '%s': rank %d sent a malformed header", name_, from_));
        }
        if (std::string_view(message_).substr(at) != name_) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "exchange '%s': rank %d sent exchange '%s': the ranks "
              "disagree on what to do",
              name_, from_, message_.substr(at)));
        }
        have_header_ = true;
        return true;
      }
      received_ += message_.size();
      if (received_ > expected_) {
        return absl::InternalError(absl::StrFormat(
            "exchange '%s': rank %d sent more than the %d bytes it announced",
            name_, from_, expected_));
      }
      RETURN_IF_ERROR(receive_(absl::Span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(message_.data()), message_.size())));
      return true;
    }

    MpiCoordinator& c_;
    const std::string_view name_;
    const absl::Span<const absl::Span<const uint8_t>> pieces_;
    const int to_, from_;
    const ReceivePiece& receive_;
    const int tag_;
    size_t total_ = 0;
    // Sends in flight: their requests, and their buffers in pending_.
    std::deque<std::pair<MPI_Request, std::list<std::string>::iterator>>
        sending_;
    std::vector<std::string> spare_;   // buffers of finished sends
    size_t sent_ = 0;                  // bytes of the pieces posted
    size_t piece_ = 0, in_piece_ = 0;  // where the next send starts
    bool have_header_ = false;
    uint64_t expected_ = 0, received_ = 0;
    std::string message_;  // each piece received, its buffer reused
  };

  static void Count(std::atomic<int64_t>& messages, std::atomic<int64_t>& bytes,
                    size_t n) {
    messages.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }

  static constexpr size_t kPieceBytes = size_t{64} << 20;
  // How long Exchange polls without sleeping after a piece moved.
  static constexpr absl::Duration kSpinAfterMove = absl::Milliseconds(200);

  Mutex mu_;
  MPI_Comm comm_;
  const absl::Duration timeout_;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<std::string> pending_;  // send buffers MPI may still read
  // traffic(), read from any thread.
  std::atomic<int64_t> messages_sent_{0}, bytes_sent_{0};
  std::atomic<int64_t> messages_received_{0}, bytes_received_{0};
  std::unique_ptr<MpiBoard> board_;  // null: no_board_ says why
  absl::Status no_board_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> MakeMpiCoordinator(
    const MpiCoordinatorOptions& options) {
  return MpiCoordinator::Create(options);
}

}  // namespace hoist
