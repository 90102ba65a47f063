#include "hoist/io/memory_storage.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hoist {
namespace {

using File = MemoryStorage::File;
using Dir = MemoryStorage::Dir;

class MemoryWritableFile final : public WritableFile {
 public:
  MemoryWritableFile(std::string path, std::shared_ptr<Mutex> mu,
                     std::shared_ptr<File> file)
      : path_(std::move(path)), mu_(std::move(mu)), file_(std::move(file)) {}

  absl::Status WriteAt(int64_t offset,
                       absl::Span<const uint8_t> data) override {
    if (offset < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative write offset %d", path_, offset));
    }
    MutexLock lock(mu_.get());
    if (!file_) return Closed();
    const size_t end = static_cast<size_t>(offset) + data.size();
    if (file_->data.size() < end) file_->data.resize(end);
    if (!data.empty())
      std::memcpy(&file_->data[offset], data.data(), data.size());
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    MutexLock lock(mu_.get());
    if (!file_) return Closed();
    file_->durable = file_->data;
    return absl::OkStatus();
  }

  absl::Status Close() override {
    MutexLock lock(mu_.get());
    file_.reset();
    return absl::OkStatus();
  }

 private:
  absl::Status Closed() const {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: file is closed", path_));
  }
  const std::string path_;
  const std::shared_ptr<Mutex> mu_;
  std::shared_ptr<File> file_;
};

class MemoryReadableFile final : public ReadableFile {
 public:
  MemoryReadableFile(std::string path, std::shared_ptr<Mutex> mu,
                     std::shared_ptr<File> file)
      : path_(std::move(path)), mu_(std::move(mu)), file_(std::move(file)) {}

  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    MutexLock lock(mu_.get());
    const int64_t size = static_cast<int64_t>(file_->data.size());
    if (offset < 0 || offset > size ||
        static_cast<int64_t>(out.size()) > size - offset) {
      return absl::DataLossError(absl::StrFormat(
          "%s: truncated: needed %d bytes at offset %d, the file ends at %d",
          path_, out.size(), offset, size));
    }
    if (!out.empty()) std::memcpy(out.data(), &file_->data[offset], out.size());
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() override {
    MutexLock lock(mu_.get());
    return static_cast<int64_t>(file_->data.size());
  }

 private:
  const std::string path_;
  const std::shared_ptr<Mutex> mu_;
  const std::shared_ptr<File> file_;
};

void Revert(Dir& dir) {
  dir.entries = dir.durable;
  for (auto& [name, node] : dir.entries) {
    if (auto* file = std::get_if<std::shared_ptr<File>>(&node)) {
      (*file)->data = (*file)->durable;
    } else {
      Revert(*std::get<std::shared_ptr<Dir>>(node));
    }
  }
}

}  // namespace

MemoryStorage::MemoryStorage() : root_(std::make_shared<Dir>()) {}

void MemoryStorage::Crash() {
  MutexLock lock(&mu_);
  Revert(*root_);
}

absl::StatusOr<MemoryStorage::Where> MemoryStorage::Locate(
    const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s': the root has no parent", path));
  }
  Dir* dir = root_.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = dir->entries.find(parts[i]);
    if (it == dir->entries.end() ||
        !std::holds_alternative<std::shared_ptr<Dir>>(it->second)) {
      return absl::NotFoundError(
          absl::StrFormat("%s: no directory '%s' on the way", path, parts[i]));
    }
    dir = std::get<std::shared_ptr<Dir>>(it->second).get();
  }
  return Where{dir, parts.back()};
}

absl::StatusOr<MemoryStorage::Node> MemoryStorage::Find(
    const std::string& path) {
  if (path.find_first_not_of('/') == std::string::npos) return Node(root_);
  absl::StatusOr<Where> where = Locate(path);
  if (!where.ok()) return where.status();
  auto it = where->parent->entries.find(where->name);
  if (it == where->parent->entries.end()) {
    return absl::NotFoundError(absl::StrFormat("%s: no such file", path));
  }
  return it->second;
}

namespace {

class MemoryFileLock final : public FileLock {
 public:
  MemoryFileLock(std::shared_ptr<Mutex> mu,
                 std::shared_ptr<std::set<std::string>> locked,
                 std::string path)
      : mu_(std::move(mu)),
        locked_(std::move(locked)),
        path_(std::move(path)) {}
  ~MemoryFileLock() override {
    MutexLock lock(mu_.get());
    locked_->erase(path_);
  }

 private:
  const std::shared_ptr<Mutex> mu_;
  const std::shared_ptr<std::set<std::string>> locked_;
  const std::string path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> MemoryStorage::LockFile(
    const std::string& path, const std::string& holder) {
  MutexLock lock(&mu_);
  absl::StatusOr<Where> where = Locate(path);
  if (!where.ok()) return where.status();
  Node& node = where->parent->entries[where->name];
  auto* file = std::get_if<std::shared_ptr<File>>(&node);
  if (file == nullptr || (*file != nullptr && locked_->contains(path))) {
    std::string held = "unknown";
    if (file != nullptr && *file != nullptr) {
      held.assign((*file)->data.begin(), (*file)->data.end());
    }
    return absl::FailedPreconditionError(
        file == nullptr ? absl::StrFormat("%s must be a regular file", path)
                        : absl::StrFormat("%s is held by %s", path, held));
  }
  if (*file == nullptr) *file = std::make_shared<File>();
  (*file)->data.assign(holder.begin(), holder.end());
  locked_->insert(path);
  return std::unique_ptr<FileLock>(
      new MemoryFileLock(mu_holder_, locked_, path));
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemoryStorage::OpenWritable(
    const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Where> where = Locate(path);
  if (!where.ok()) return where.status();
  if (where->parent->entries.contains(where->name)) {
    return absl::AlreadyExistsError(absl::StrFormat("%s: exists", path));
  }
  auto file = std::make_shared<File>();
  where->parent->entries.emplace(where->name, Node(file));
  return std::make_unique<MemoryWritableFile>(path, mu_holder_, file);
}

absl::StatusOr<std::unique_ptr<ReadableFile>> MemoryStorage::OpenReadable(
    const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Node> node = Find(path);
  if (!node.ok()) return node.status();
  auto* file = std::get_if<std::shared_ptr<File>>(&*node);
  if (file == nullptr) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a regular file (a directory); hoist reads only regular files",
        path));
  }
  return std::make_unique<MemoryReadableFile>(path, mu_holder_, *file);
}

absl::Status MemoryStorage::CreateDir(const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Where> where = Locate(path);
  if (!where.ok()) return where.status();
  auto [it, inserted] = where->parent->entries.emplace(
      where->name, Node(std::make_shared<Dir>()));
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrFormat("%s: exists", path));
  }
  return absl::OkStatus();
}

absl::Status MemoryStorage::Rename(const std::string& from,
                                   const std::string& to) {
  MutexLock lock(&mu_);
  absl::StatusOr<Where> source = Locate(from);
  if (!source.ok()) return source.status();
  absl::StatusOr<Where> target = Locate(to);
  if (!target.ok()) return target.status();
  auto it = source->parent->entries.find(source->name);
  if (it == source->parent->entries.end()) {
    return absl::NotFoundError(absl::StrFormat("%s: no such file", from));
  }
  if (target->parent->entries.contains(target->name)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s: rename to %s: target exists", from, to));
  }
  Node node = std::move(it->second);
  source->parent->entries.erase(it);
  target->parent->entries.emplace(target->name, std::move(node));
  return absl::OkStatus();
}

absl::Status MemoryStorage::SyncDir(const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Node> node = Find(path);
  if (!node.ok()) return node.status();
  auto* dir = std::get_if<std::shared_ptr<Dir>>(&*node);
  if (dir == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: not a directory", path));
  }
  (*dir)->durable = (*dir)->entries;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemoryStorage::List(
    const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Node> node = Find(path);
  if (!node.ok()) return node.status();
  auto* dir = std::get_if<std::shared_ptr<Dir>>(&*node);
  if (dir == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%s: not a directory", path));
  }
  std::vector<std::string> names;
  for (const auto& [name, child] : (*dir)->entries) names.push_back(name);
  return names;
}

absl::Status MemoryStorage::RemoveAll(const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Where> where = Locate(path);
  if (absl::IsNotFound(where.status())) return absl::OkStatus();
  if (!where.ok()) return where.status();
  where->parent->entries.erase(where->name);
  return absl::OkStatus();
}

absl::StatusOr<bool> MemoryStorage::Exists(const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Node> node = Find(path);
  if (absl::IsNotFound(node.status())) return false;
  if (!node.ok()) return node.status();
  return true;
}

absl::StatusOr<bool> MemoryStorage::IsDir(const std::string& path) {
  MutexLock lock(&mu_);
  absl::StatusOr<Node> node = Find(path);
  if (absl::IsNotFound(node.status())) return false;
  if (!node.ok()) return node.status();
  return std::holds_alternative<std::shared_ptr<Dir>>(*node);
}

}  // namespace hoist
