// MemoryStorage: a Storage in RAM that models durability the way POSIX
// promises it, for crash tests: a file's bytes survive Crash() only up to its
// last Sync(), and a name (file or directory, created, renamed or removed)
// only as of the last SyncDir() of the directory holding it. Directories are
// objects, so renaming one carries what is durable inside it.
#ifndef HOIST_IO_MEMORY_STORAGE_H_
#define HOIST_IO_MEMORY_STORAGE_H_

#include <map>
#include <memory>
#include <set>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "hoist/mutex.h"
#include "hoist/storage.h"

namespace hoist {

class MemoryStorage final : public Storage {
 public:
  MemoryStorage();

  // Drops everything that was not durable, as a power cut would. Open files
  // keep working on the reverted state.
  void Crash() ABSL_LOCKS_EXCLUDED(mu_);

  // Locks are this object's: a second LockFile of a path fails until the
  // first lock is destroyed (as for two processes over one filesystem).
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<bool> IsDir(const std::string& path) override;

  struct File {
    std::vector<uint8_t> data;
    std::vector<uint8_t> durable;
  };
  struct Dir;
  using Node = std::variant<std::shared_ptr<File>, std::shared_ptr<Dir>>;
  struct Dir {
    std::map<std::string, Node> entries;
    std::map<std::string, Node> durable;
  };

 private:
  struct Where {
    Dir* parent = nullptr;
    std::string name;
  };
  // The directory holding `path`'s last component.
  absl::StatusOr<Where> Locate(const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Node> Find(const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Files share it: one lock for the whole tree.
  std::shared_ptr<Mutex> mu_holder_ = std::make_shared<Mutex>();
  Mutex& mu_ = *mu_holder_;
  std::shared_ptr<Dir> root_ ABSL_GUARDED_BY(mu_);
  // Locked paths, shared with the locks (which may outlive a Crash()).
  std::shared_ptr<std::set<std::string>> locked_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<std::set<std::string>>();
};

}  // namespace hoist

#endif  // HOIST_IO_MEMORY_STORAGE_H_
