// Object stores as a Storage (see object_storage.h): Arrow's filesystem
// calls, one per Storage call where it can, with Arrow's errors turned into
// the Storage contract's codes.
#include "hoist/io/object_store/object_storage.h"

#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>
#include <arrow/util/future.h>
#include <arrow/util/iterator.h>

#include <algorithm>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

using arrow::fs::FileInfo;
using arrow::fs::FileType;

// Arrow's error for `what` (an operation) on `url`, as the Storage contract
// codes it: an unreachable or timed-out server is kUnavailable (retry the
// call), a refused credential kPermissionDenied, a missing bucket or object
// kNotFound, anything else kAborted (an I/O error: retry the checkpoint).
// Arrow's messages name the bucket and key, never a credential.
absl::Status FromArrow(const arrow::Status& status, std::string_view what,
                       const std::string& url) {
  if (status.ok()) return absl::OkStatus();
  const std::string message =
      absl::StrFormat("%s: %s failed: %s", url, what, status.message());
  const std::string text = absl::AsciiStrToLower(std::string(status.message()));
  const auto has = [&](std::string_view needle) {
    return absl::StrContains(text, absl::AsciiStrToLower(std::string(needle)));
  };
  if (has("ACCESS_DENIED") || has("InvalidAccessKeyId") ||
      has("SignatureDoesNotMatch") || has("403")) {
    return absl::PermissionDeniedError(message);
  }
  if (has("NoSuchBucket") || has("NO_SUCH_BUCKET") || has("NoSuchKey") ||
      status.IsKeyError()) {
    return absl::NotFoundError(message);
  }
  if (has("NETWORK_CONNECTION") || has("connect") || has("timeout") ||
      has("timed out") || has("SLOW_DOWN") || has("Service Unavailable") ||
      has("503")) {
    return absl::UnavailableError(message);
  }
  if (status.IsInvalid()) return absl::InvalidArgumentError(message);
  return absl::AbortedError(message);
}

class ObjectStorage;

// An object being uploaded (see object_storage.h): sequential, completed
// by Sync, aborted by Close without Sync or by destruction. `remove`
// deletes what an abort leaves (GCS makes the object of an aborted upload).
class ObjectWritableFile final : public WritableFile {
 public:
  ObjectWritableFile(std::string url,
                     std::shared_ptr<arrow::io::OutputStream> stream,
                     std::function<absl::Status()> remove)
      : url_(std::move(url)),
        stream_(std::move(stream)),
        remove_(std::move(remove)) {}
  ~ObjectWritableFile() override {
    MutexLock lock(&mu_);
    if (stream_ != nullptr) {
      const arrow::Status aborted = stream_->Abort();
      (void)aborted;  // Close() reports it; a destructor cannot
      remove_().IgnoreError();
    }
  }

  absl::Status WriteAt(int64_t offset,
                       absl::Span<const uint8_t> data) override {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckWrite(offset));
    RETURN_IF_ERROR(FromArrow(
        stream_->Write(data.data(), static_cast<int64_t>(data.size())),
        absl::StrFormat("uploading %d bytes at %d", data.size(), offset),
        url_));
    written_ += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status WriteAtv(
      int64_t offset,
      absl::Span<const absl::Span<const uint8_t>> pieces) override {
    for (absl::Span<const uint8_t> piece : pieces) {
      RETURN_IF_ERROR(WriteAt(offset, piece));
      offset += static_cast<int64_t>(piece.size());
    }
    return absl::OkStatus();
  }
  bool sequential() const override { return true; }
  absl::Status Sync() override {
    MutexLock lock(&mu_);
    if (stream_ == nullptr) {
      return synced_ ? absl::OkStatus()
                     : absl::FailedPreconditionError(
                           absl::StrCat(url_, ": sync after close"));
    }
    const arrow::Status closed = stream_->Close();
    stream_ = nullptr;
    RETURN_IF_ERROR(FromArrow(closed, "completing the upload", url_));
    synced_ = true;
    return absl::OkStatus();
  }
  absl::Status Close() override {
    MutexLock lock(&mu_);
    if (stream_ == nullptr) return absl::OkStatus();
    const arrow::Status aborted = stream_->Abort();
    stream_ = nullptr;
    RETURN_IF_ERROR(FromArrow(aborted, "aborting the upload", url_));
    return remove_();
  }

 private:
  absl::Status CheckWrite(int64_t offset) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stream_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(url_, ": write after sync or close"));
    }
    if (offset != written_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: a write at %d, but an object is written from start to end "
          "(next offset %d)",
          url_, offset, written_));
    }
    return absl::OkStatus();
  }

  const std::string url_;
  Mutex mu_;
  std::shared_ptr<arrow::io::OutputStream> stream_ ABSL_GUARDED_BY(mu_);
  const std::function<absl::Status()> remove_;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
};

class ObjectReadableFile final : public ReadableFile {
 public:
  ObjectReadableFile(std::string url,
                     std::shared_ptr<arrow::io::RandomAccessFile> file,
                     int64_t size)
      : url_(std::move(url)), file_(std::move(file)), size_(size) {}

  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    const int64_t bytes = static_cast<int64_t>(out.size());
    if (offset < 0 || offset + bytes > size_) {
      return absl::DataLossError(absl::StrFormat(
          "%s: %d bytes at %d, but the object has %d (truncated)", url_, bytes,
          offset, size_));
    }
    if (bytes == 0) return absl::OkStatus();
    arrow::Result<int64_t> read = file_->ReadAt(offset, bytes, out.data());
    RETURN_IF_ERROR(FromArrow(
        read.status(), absl::StrFormat("reading %d bytes at %d", bytes, offset),
        url_));
    if (*read != bytes) {
      return absl::DataLossError(absl::StrFormat(
          "%s: %d bytes at %d, but only %d came (the object is shorter "
          "than it was: replaced?)",
          url_, bytes, offset, *read));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Size() override { return size_; }

 private:
  const std::string url_;
  const std::shared_ptr<arrow::io::RandomAccessFile> file_;
  const int64_t size_;
};

// The lock object: removed when the lock is destroyed, if it still holds
// this holder's name.
class ObjectLock final : public FileLock {
 public:
  ObjectLock(Storage& storage, std::string url, std::string holder)
      : storage_(storage), url_(std::move(url)), holder_(std::move(holder)) {}
  ~ObjectLock() override;

 private:
  Storage& storage_;
  const std::string url_;
  const std::string holder_;
};

absl::StatusOr<std::string> ReadSmallObject(Storage& storage,
                                            const std::string& url,
                                            int64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(url));
  ASSIGN_OR_RETURN(int64_t size, file->Size());
  std::string text(static_cast<size_t>(std::min(size, max_bytes)), '\0');
  RETURN_IF_ERROR(file->ReadAt(
      0, absl::MakeSpan(reinterpret_cast<uint8_t*>(text.data()), text.size())));
  return text;
}

ObjectLock::~ObjectLock() {
  absl::StatusOr<std::string> held = ReadSmallObject(storage_, url_, 4096);
  if (held.ok() && *held == holder_) storage_.RemoveAll(url_).IgnoreError();
}

class ObjectStorage final : public Storage {
 public:
  ObjectStorage(std::shared_ptr<arrow::fs::FileSystem> fs, std::string scheme,
                int writer_streams)
      : fs_(std::move(fs)),
        scheme_(std::move(scheme)),
        writer_streams_(writer_streams) {}

  int preferred_writer_streams() const override { return writer_streams_; }
  StorageCapabilities capabilities() const override {
    return {.atomic_rename = false,
            .random_writes = false,
            .local = false,
            .consistent_listing = true,
            .prefix_rate_limited = true};
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override {
    RETURN_IF_ERROR(Put(path, holder));
    return std::unique_ptr<FileLock>(new ObjectLock(*this, path, holder));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    ASSIGN_OR_RETURN(FileInfo info, Info(path));
    if (info.type() != FileType::NotFound) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, ": already exists (objects are written once)"));
    }
    ASSIGN_OR_RETURN(std::string key, Key(path));
    arrow::Result<std::shared_ptr<arrow::io::OutputStream>> stream =
        fs_->OpenOutputStream(key);
    RETURN_IF_ERROR(FromArrow(stream.status(), "starting the upload", path));
    return std::unique_ptr<WritableFile>(new ObjectWritableFile(
        path, *std::move(stream), [this, path] { return RemoveAll(path); }));
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    ASSIGN_OR_RETURN(FileInfo info, Info(path));
    if (info.type() == FileType::NotFound) {
      return absl::NotFoundError(absl::StrCat(path, ": no such object"));
    }
    if (info.type() != FileType::File) {
      return absl::DataLossError(
          absl::StrCat(path, ": not an object (a prefix of objects)"));
    }
    arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> file =
        fs_->OpenInputFile(info);
    RETURN_IF_ERROR(FromArrow(file.status(), "opening for reading", path));
    return std::unique_ptr<ReadableFile>(
        new ObjectReadableFile(path, *std::move(file), info.size()));
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative) override {
    // No links on an object store: the name is the object.
    return OpenReadable(JoinPath(dir, relative));
  }

  absl::Status CreateDir(const std::string& path) override {
    return Key(path).status();  // a prefix needs no object
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return absl::UnimplementedError(
        absl::StrFormat("%s -> %s: an object store cannot rename", from, to));
  }
  absl::Status SyncDir(const std::string& path) override {
    return Key(path).status();  // a completed upload is durable
  }

  // The names of the objects and prefixes of objects right under `path`,
  // from one recursive listing: a prefix that holds no object is not
  // listed (some servers show a directory for a while after its last
  // object is deleted; S3 has none).
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override {
    ASSIGN_OR_RETURN(std::string key, Key(path));
    arrow::fs::FileSelector selector;
    selector.base_dir = key;
    selector.allow_not_found = true;
    selector.recursive = true;
    arrow::Result<std::vector<FileInfo>> infos = fs_->GetFileInfo(selector);
    RETURN_IF_ERROR(FromArrow(infos.status(), "listing", path));
    std::vector<std::string> names;
    for (const FileInfo& info : *infos) {
      if (info.type() != FileType::File) continue;
      std::string_view rest = info.path();
      if (rest.size() <= key.size() + 1) continue;
      rest.remove_prefix(key.size() + 1);
      names.emplace_back(rest.substr(0, rest.find('/')));
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  absl::Status RemoveAll(const std::string& path) override {
    ASSIGN_OR_RETURN(std::string key, Key(path));
    ASSIGN_OR_RETURN(FileInfo info, Info(path));
    if (info.type() == FileType::File) {
      return FromArrow(fs_->DeleteFile(key), "deleting", path);
    }
    if (info.type() == FileType::Directory) {
      return FromArrow(fs_->DeleteDirContents(key, /*missing_dir_ok=*/true),
                       "deleting the objects under", path);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    ASSIGN_OR_RETURN(FileInfo info, Info(path));
    return info.type() != FileType::NotFound;
  }
  absl::StatusOr<bool> IsDir(const std::string& path) override {
    ASSIGN_OR_RETURN(FileInfo info, Info(path));
    return info.type() == FileType::Directory;
  }

  absl::Status CreateDirs(const std::string& path) override {
    ASSIGN_OR_RETURN(std::string key, Key(path));
    const std::string bucket = key.substr(0, key.find('/'));
    ASSIGN_OR_RETURN(FileInfo info, Info(scheme_ + bucket));
    if (info.type() != FileType::Directory) {
      return absl::NotFoundError(absl::StrFormat(
          "%s: no bucket '%s' (hoist does not create buckets)", path, bucket));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> BeginDir(const std::string& dir,
                                       const std::string& tmp,
                                       absl::Span<const std::string> subdirs,
                                       const std::string& marker,
                                       bool replace) override {
    (void)tmp;      // written in place: no rename to come
    (void)subdirs;  // prefixes need no objects
    // A committed `dir` goes marker first, so it is never seen half
    // removed; what an uncommitted save of it left would mix with this
    // one's objects, so it goes too.
    ASSIGN_OR_RETURN(bool committed, HasMarker(dir, marker));
    if (committed) {
      if (!replace) {
        return absl::AlreadyExistsError(
            absl::StrCat(dir, ": already committed"));
      }
      RETURN_IF_ERROR(RemoveAll(JoinPath(dir, marker)));
    }
    RETURN_IF_ERROR(RemoveAll(dir));
    return dir;
  }

  absl::Status CommitDir(const std::string& written, const std::string& dir,
                         const std::string& marker,
                         std::string_view marker_bytes,
                         const std::string& aside) override {
    if (written != dir) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: an object store commits in place, not from %s", dir, written));
    }
    if (aside.empty()) {
      ASSIGN_OR_RETURN(bool committed, HasMarker(dir, marker));
      if (committed) {
        return absl::AlreadyExistsError(absl::StrFormat(
            "%s was committed while this one was written", dir));
      }
    }
    return Put(JoinPath(dir, marker), marker_bytes);
  }

  absl::Status RemoveCommitted(const std::string& dir, const std::string& aside,
                               const std::string& marker) override {
    (void)aside;  // nothing to rename: the marker goes first
    ASSIGN_OR_RETURN(bool exists, Exists(dir));
    if (!exists) {
      return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
    }
    RETURN_IF_ERROR(RemoveAll(JoinPath(dir, marker)));
    return RemoveAll(dir);
  }

 private:
  // "bucket/key" for "s3://bucket/key".
  absl::StatusOr<std::string> Key(const std::string& url) const {
    if (!absl::StartsWith(url, scheme_)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not a %s URL", url, scheme_));
    }
    std::string key = url.substr(scheme_.size());
    while (!key.empty() && key.back() == '/') key.pop_back();
    if (key.empty() || key.front() == '/') {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: no bucket (%sBUCKET/PREFIX)", url, scheme_));
    }
    return key;
  }

  // What `url` is: an object (File), a prefix of objects (Directory), or
  // neither (NotFound). A prefix that holds no object is neither: some
  // servers show a directory for a while after its last object is deleted
  // (S3 has none), so a directory is confirmed by the first page of a
  // listing of everything under it (one request). A bucket is a directory
  // even when empty.
  absl::StatusOr<FileInfo> Info(const std::string& url) const {
    ASSIGN_OR_RETURN(std::string key, Key(url));
    arrow::Result<FileInfo> info = fs_->GetFileInfo(key);
    RETURN_IF_ERROR(FromArrow(info.status(), "looking up", url));
    if (info->type() != FileType::Directory ||
        key.find('/') == std::string::npos) {
      return *std::move(info);
    }
    arrow::fs::FileSelector selector;
    selector.base_dir = key;
    selector.allow_not_found = true;
    selector.recursive = true;
    arrow::fs::FileInfoGenerator pages = fs_->GetFileInfoGenerator(selector);
    while (true) {
      arrow::Result<std::vector<FileInfo>> page = pages().result();
      RETURN_IF_ERROR(FromArrow(page.status(), "listing", url));
      if (arrow::IsIterationEnd(*page)) break;
      for (const FileInfo& entry : *page) {
        if (entry.type() == FileType::File) return *std::move(info);
      }
    }
    return FileInfo(key, FileType::NotFound);
  }

  // Writes the small object `url` in one request.
  absl::Status Put(const std::string& url, std::string_view bytes) {
    ASSIGN_OR_RETURN(std::string key, Key(url));
    arrow::Result<std::shared_ptr<arrow::io::OutputStream>> stream =
        fs_->OpenOutputStream(key);
    RETURN_IF_ERROR(FromArrow(stream.status(), "writing", url));
    RETURN_IF_ERROR(FromArrow(
        (*stream)->Write(bytes.data(), static_cast<int64_t>(bytes.size())),
        "writing", url));
    return FromArrow((*stream)->Close(), "writing", url);
  }

  const std::shared_ptr<arrow::fs::FileSystem> fs_;
  const std::string scheme_;
  const int writer_streams_;
};

}  // namespace

bool ConsumeScheme(std::string& url, std::string_view scheme) {
  if (url.compare(0, scheme.size(), scheme) != 0) return false;
  url.erase(0, scheme.size());
  return true;
}

std::unique_ptr<Storage> MakeObjectStorage(
    std::shared_ptr<arrow::fs::FileSystem> fs, std::string scheme,
    int writer_streams) {
  return std::make_unique<ObjectStorage>(std::move(fs), std::move(scheme),
                                         writer_streams);
}

}  // namespace hoist
