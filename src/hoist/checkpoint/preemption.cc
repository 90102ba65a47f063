#include "hoist/checkpoint/preemption.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<PreemptionWatch>> PreemptionWatch::Start(
    Coordinator& coordinator, Options options, Warn warn) {
  if (options.poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("preemption: the poll must be > 0");
  }
  std::unique_ptr<SignalNotice> signals;
  if (!options.signals.empty()) {
    ASSIGN_OR_RETURN(signals, SignalNotice::Install(options.signals));
  }
  if (coordinator.size() > 1) {
    absl::StatusOr<Coordinator::BoardView> board =
        coordinator.ReadBoard(options.board);
    if (!board.ok()) {
      return absl::Status(
          board.status().code(),
          absl::StrCat("preemption needs the coordinator's notice board, "
                       "for the ranks to agree on a step: ",
                       board.status().message()));
    }
  }
  return std::unique_ptr<PreemptionWatch>(new PreemptionWatch(
      coordinator, std::move(options), std::move(warn), std::move(signals)));
}

PreemptionWatch::PreemptionWatch(Coordinator& coordinator, Options options,
                                 Warn warn,
                                 std::unique_ptr<SignalNotice> signals)
    : coordinator_(coordinator),
      options_(std::move(options)),
      warn_(std::move(warn)),
      signals_(std::move(signals)),
      signals_at_start_(SignalNotice::count()),
      thread_([this] { Run(); }) {}

PreemptionWatch::~PreemptionWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void PreemptionWatch::Run() {
  bool replaced_warned = false;
  while (!Look()) {
    if (signals_ != nullptr && !replaced_warned && !signals_->installed()) {
      replaced_warned = true;
      EmitWarning(warn_,
                  "hoist: warning: a handler installed after the checkpoint "
                  "manager replaced hoist's for a preemption signal: this "
                  "rank no longer notices that signal (install your own "
                  "handlers before opening the manager; hoist calls them)");
    }
    MutexLock lock(&mu_);
    // Once this rank has posted, the others' posts are awaited sooner: the
    // training loop waits for them, within a grace period.
    mu_.AwaitWithTimeout(Condition(this, &PreemptionWatch::Woken),
                         noticed_
                             ? std::min(options_.poll, absl::Milliseconds(100))
                             : options_.poll);
    if (stopping_) return;
  }
}

bool PreemptionWatch::Look() {
  const bool signalled = SignalNotice::count() > signals_at_start_;
  absl::StatusOr<Coordinator::BoardView> board =
      coordinator_.ReadBoard(options_.board);
  std::optional<std::string> post;  // this rank's, when it posts now
  {
    MutexLock lock(&mu_);
    if (!board.ok()) {
      error_ = board.status();
      return true;
    }
    if (!noticed_ && (signalled || board->posted > 0)) NoticeNow();
    if (noticed_ && !posted_self_) {
      posted_self_ = true;
      post = post_;
    }
  }
  if (post.has_value()) {
    absl::Status posted = coordinator_.Post(options_.board, *std::move(post));
    if (posted.ok()) board = coordinator_.ReadBoard(options_.board);
    if (!posted.ok() || !board.ok()) {
      MutexLock lock(&mu_);
      error_ = !posted.ok() ? posted : board.status();
      return true;
    }
  }
  {
    MutexLock lock(&mu_);
    posted_ = board->posted;
  }
  if (board->posted < coordinator_.size()) return false;
  // Every rank has posted: the step after the highest any answered.
  int64_t agreed = 0;
  for (int rank = 0; rank < static_cast<int>(board->values.size()); ++rank) {
    const std::string& value = board->values[rank];
    int64_t step = 0;
    if (value.empty()) continue;
    if (!absl::SimpleAtoi(value, &step)) {
      MutexLock lock(&mu_);
      error_ = absl::DataLossError(absl::StrFormat(
          "preemption board '%s': rank %d posted '%s', not a step",
          options_.board, rank, value));
      return true;
    }
    agreed = std::max(agreed, step + 1);
  }
  MutexLock lock(&mu_);
  agreed_ = agreed;
  return true;
}

absl::StatusOr<bool> PreemptionWatch::Reached(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("preemption: step %d is negative", step));
  }
  MutexLock lock(&mu_);
  if (agreed_.has_value()) return step >= *agreed_;
  if (!error_.ok()) return error_;
  if (step <= last_step_) return false;  // answered already
  if (!noticed_) {
    last_step_ = step;
    return false;
  }
  // This rank has posted (or is about to) its last step: every rank's post
  // decides whether `step` is the one.
  if (!mu_.AwaitWithTimeout(Condition(this, &PreemptionWatch::Settled),
                            options_.agree_timeout)) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "preemption: %d of %d ranks posted their step on board '%s' within "
        "%s; the others did not (lost, or not polling)",
        posted_, coordinator_.size(), options_.board,
        absl::FormatDuration(options_.agree_timeout)));
  }
  if (!error_.ok()) return error_;
  return step >= *agreed_;
}

void PreemptionWatch::Notice() {
  MutexLock lock(&mu_);
  if (!noticed_) NoticeNow();
}

void PreemptionWatch::NoticeNow() {
  noticed_ = true;
  noticed_at_ = absl::Now();
  post_ = last_step_ == INT64_MIN ? "" : absl::StrCat(last_step_);
}

std::optional<int64_t> PreemptionWatch::agreed_step() const {
  MutexLock lock(&mu_);
  return agreed_;
}

absl::Time PreemptionWatch::noticed_at() const {
  MutexLock lock(&mu_);
  return noticed_at_;
}

}  // namespace hoist
