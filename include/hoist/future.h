// Future / Promise: the one completion type hoist uses everywhere (device
// copies, staging, writes, commits).
//
// A Promise<T> is set exactly once with a result: absl::Status for
// Promise<void>, absl::StatusOr<T> otherwise. Futures are cheap, copyable
// handles on the same shared state; any number of threads may wait on them.
//
// Callbacks registered with OnReady run exactly once:
// - on the thread that sets the promise, after the result is visible to
//   waiters, if the future was not ready at registration; or
// - on the registering thread, before OnReady returns, if it was.
// So a callback registered late may run while earlier ones are still
// running on the setting thread: to wait for a callback's work, have it set
// a promise of its own when done, and wait on that.
// Callbacks must not block for long: they run on device copy workers and
// writer threads.
//
// A Promise destroyed without being set completes its future with
// kCancelled, so no waiter hangs on an abandoned operation.
#ifndef HOIST_FUTURE_H_
#define HOIST_FUTURE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/mutex.h"

namespace hoist {

namespace future_internal {

template <typename T>
struct ResultOf {
  using type = absl::StatusOr<T>;
};
template <>
struct ResultOf<void> {
  using type = absl::Status;
};

template <typename T>
class State {
 public:
  using Result = typename ResultOf<T>::type;
  using Callback = absl::AnyInvocable<void(const Result&) &&>;

  // Returns false if a result was already set (the new one is dropped).
  bool Set(Result result) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Callback> callbacks;
    const Result* set = nullptr;
    {
      MutexLock lock(&mu_);
      if (result_.has_value()) return false;
      result_.emplace(std::move(result));
      set = &*result_;
      callbacks.swap(callbacks_);
    }
    // A result, once set, never changes: reading it unlocked is safe.
    for (Callback& callback : callbacks) std::move(callback)(*set);
    return true;
  }

  bool ready() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return result_.has_value();
  }

  const Result& Wait() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    mu_.Await(Condition(this, &State::HasResult));
    return *result_;
  }

  bool WaitFor(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(Condition(this, &State::HasResult), timeout);
  }

  void OnReady(Callback callback) ABSL_LOCKS_EXCLUDED(mu_) {
    const Result* set = nullptr;
    {
      MutexLock lock(&mu_);
      if (!result_.has_value()) {
        callbacks_.push_back(std::move(callback));
        return;
      }
      set = &*result_;
    }
    std::move(callback)(*set);
  }

 private:
  bool HasResult() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return result_.has_value();
  }

  mutable Mutex mu_;
  std::optional<Result> result_ ABSL_GUARDED_BY(mu_);
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace future_internal

template <typename T = void>
class Future;

// The producing side. Move-only.
template <typename T = void>
class Promise {
 public:
  using Result = typename future_internal::ResultOf<T>::type;

  Promise() : state_(std::make_shared<future_internal::State<T>>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&& other) noexcept {
    Abandon();
    state_ = std::move(other.state_);
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { Abandon(); }

  // Completes the future; runs the callbacks on this thread. A second call is
  // ignored. Precondition: this promise was not moved from.
  void Set(Result result) { state_->Set(std::move(result)); }

  // A future on this promise. Call any number of times.
  Future<T> future() const { return Future<T>(state_); }

 private:
  void Abandon() {
    if (state_ != nullptr) {
      state_->Set(absl::CancelledError(
          "promise destroyed before its operation completed"));
    }
  }

  std::shared_ptr<future_internal::State<T>> state_;
};

// The consuming side. Copyable; all copies see the same result.
template <typename T>
class Future {
 public:
  using Result = typename future_internal::ResultOf<T>::type;

  // A future that is already complete with `result`.
  static Future Ready(Result result) {
    Promise<T> promise;
    Future future = promise.future();
    promise.Set(std::move(result));
    return future;
  }

  // True once a result is set.
  bool ready() const { return state_->ready(); }

  // Blocks until the result is set and returns it. The reference lives as
  // long as any Future or Promise on this state.
  const Result& Wait() const { return state_->Wait(); }

  // Blocks at most `timeout`; true if the result is set.
  [[nodiscard]] bool WaitFor(absl::Duration timeout) const {
    return state_->WaitFor(timeout);
  }

  // Runs `callback(result)` once the result is set (see the file comment for
  // which thread runs it).
  void OnReady(absl::AnyInvocable<void(const Result&) &&> callback) const {
    state_->OnReady(std::move(callback));
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<future_internal::State<T>> state)
      : state_(std::move(state)) {}

  std::shared_ptr<future_internal::State<T>> state_;
};

// Completes when every future in `futures` has completed: OK if all are OK,
// else the error of the first failed future in `futures` order. Waiting for
// all (not only the first error) means no operation is still running when it
// completes. `futures` may be destroyed once this returns.
inline Future<> WhenAll(absl::Span<const Future<>> futures) {
  if (futures.empty()) return Future<>::Ready(absl::OkStatus());
  struct Join {
    explicit Join(size_t n) : statuses(n), remaining(n) {}
    Promise<> promise;
    std::vector<absl::Status> statuses;  // each slot written by one callback
    std::atomic<size_t> remaining;
  };
  auto join = std::make_shared<Join>(futures.size());
  Future<> result = join->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnReady([join, i](const absl::Status& status) {
      join->statuses[i] = status;
      if (join->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        absl::Status first;
        for (const absl::Status& s : join->statuses) {
          if (!s.ok()) {
            first = s;
            break;
          }
        }
        join->promise.Set(std::move(first));
      }
    });
  }
  return result;
}

}  // namespace hoist

#endif  // HOIST_FUTURE_H_
