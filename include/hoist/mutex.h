// hoist's mutex: the Mutex interface hoist uses (Await on a
// Condition, MutexLock, CondVar, Notification), with clang's thread-safety
// annotations, built on std::mutex and std::condition_variable. Why not
// Mutex itself: the abseil that Debian ships is not built with
// ThreadSanitizer annotations, so TSan cannot see its happens-before edges
// and reports false races; std::mutex it understands.
//
// Await(condition) re-evaluates the condition, with the mutex held, after
// every Unlock by any thread, so conditions must depend only on state that
// this mutex guards.
#ifndef HOIST_MUTEX_H_
#define HOIST_MUTEX_H_

#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hoist {

// A predicate over state guarded by a Mutex.
class Condition {
 public:
  // object->method(), for a const method.
  template <typename T>
  Condition(const T* object, bool (T::*method)() const)
      : eval_([object, method] { return (object->*method)(); }) {}
  // function(arg).
  template <typename T>
  Condition(bool (*function)(T*), T* arg)
      : eval_([function, arg] { return function(arg); }) {}

  bool Eval() const { return eval_(); }

 private:
  std::function<bool()> eval_;
};

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    changed_.notify_all();
  }

  // Blocks until `condition` holds. The mutex must be held; it is released
  // while waiting and held again on return.
  void Await(const Condition& condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    changed_.wait(lock, [&] { return condition.Eval(); });
    lock.release();
  }

  // As Await, for at most `timeout`; true if `condition` holds on return.
  bool AwaitWithTimeout(const Condition& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool held =
        timeout == absl::InfiniteDuration()
            ? (changed_.wait(lock, [&] { return condition.Eval(); }), true)
            : changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                [&] { return condition.Eval(); });
    lock.release();
    return held;
  }

 private:
  friend class CondVar;
  std::mutex mu_;
  std::condition_variable changed_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  Mutex* const mu_;
};

// Waiting for a signal under a Mutex.
class CondVar {
 public:
  // Waits for SignalAll() (or a spurious wake-up) or `deadline`, releasing
  // `mu` meanwhile. True if the deadline passed. `mu` must be held.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool timed_out = false;
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(lock);
    } else {
      timed_out = cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
                  std::cv_status::timeout;
    }
    lock.release();
    return timed_out;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A one-shot event.
class Notification {
 public:
  void Notify() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  bool HasBeenNotified() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return notified_;
  }
  void WaitForNotification() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    mu_.Await(Condition(this, &Notification::Notified));
  }
  // True if notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(Condition(this, &Notification::Notified),
                                timeout);
  }

 private:
  bool Notified() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; }
  mutable Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hoist

#endif  // HOIST_MUTEX_H_
