// An exclusive lock on a checkpoint root: flock(2) on ROOT/.hoist.lock, held
// for the lock object's lifetime. flock locks belong to the open file, so a
// second lock on the same root fails whether it comes from another process
// or from this one.
#ifndef HOIST_CHECKPOINT_ROOT_LOCK_H_
#define HOIST_CHECKPOINT_ROOT_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace hoist {

class RootLock {
 public:
  // kFailedPrecondition naming the holder's pid when the root is locked.
  static absl::StatusOr<std::unique_ptr<RootLock>> Acquire(
      const std::string& root);
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

 private:
  explicit RootLock(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_ROOT_LOCK_H_
