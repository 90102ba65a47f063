// An exclusive lock on a checkpoint root: flock(2) on ROOT/.hoist.lock, held
// for the lock object's lifetime. flock locks belong to the open file, so a
// second lock on the same root fails whether it comes from another process
// or from this one. The lock file is created with mode 0600 and opened with
// O_NOFOLLOW and O_NONBLOCK; it is written only if it is a regular file with
// one name owned by this user (kFailedPrecondition otherwise), so a link
// planted in a root can never make hoist overwrite another file.
#ifndef HOIST_CHECKPOINT_ROOT_LOCK_H_
#define HOIST_CHECKPOINT_ROOT_LOCK_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace hoist {

class RootLock {
 public:
  // kFailedPrecondition naming the holder's pid when the root is locked.
  static absl::StatusOr<std::unique_ptr<RootLock>> Acquire(
      const std::string& root);
  // For the other processes of a job: kFailedPrecondition unless `root`'s
  // lock file holds `token` (rank 0's lock), which fails when this process
  // does not see the same filesystem as rank 0.
  static absl::Status Check(const std::string& root, const std::string& token);
  ~RootLock();
  // What the lock file holds: "pid PID on HOST, RANDOM".
  const std::string& token() const { return token_; }
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;

 private:
  RootLock(int fd, std::string token) : fd_(fd), token_(std::move(token)) {}
  const int fd_;
  const std::string token_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_ROOT_LOCK_H_
