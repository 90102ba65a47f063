#include "hoist/io/fault_storage.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "hoist/io/errno_status.h"

namespace hoist {
namespace {

class FaultyWritableFile final : public WritableFile {
 public:
  FaultyWritableFile(FaultInjectingStorage& storage, std::string path,
                     std::unique_ptr<WritableFile> base)
      : storage_(storage), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status WriteAt(int64_t offset,
                       absl::Span<const uint8_t> data) override {
    bool torn = false;
    absl::Status fault = storage_.BeforeWrite(path_, &torn);
    if (!fault.ok()) {
      if (torn)
        base_->WriteAt(offset, data.first(data.size() / 2)).IgnoreError();
      return fault;
    }
    return base_->WriteAt(offset, data);
  }
  absl::Status Reserve(int64_t offset, int64_t bytes) override {
    if (absl::Status s = storage_.BeforeReserve(path_); !s.ok()) return s;
    return base_->Reserve(offset, bytes);
  }
  absl::Status Sync() override {
    if (absl::Status fault = storage_.BeforeSync(path_); !fault.ok()) {
      return fault;
    }
    return base_->Sync();
  }
  absl::Status Close() override { return base_->Close(); }

 private:
  FaultInjectingStorage& storage_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
};

class FaultyReadableFile final : public ReadableFile {
 public:
  FaultyReadableFile(FaultInjectingStorage& storage, std::string path,
                     std::unique_ptr<ReadableFile> base)
      : storage_(storage), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    if (absl::Status s = storage_.BeforeRead(path_); !s.ok()) return s;
    return base_->ReadAt(offset, out);
  }
  absl::StatusOr<int64_t> Size() override { return base_->Size(); }

 private:
  FaultInjectingStorage& storage_;
  const std::string path_;
  std::unique_ptr<ReadableFile> base_;
};

}  // namespace

absl::Status FaultInjectingStorage::CheckAlive(const std::string& path) const {
  if (crashed_.load()) {
    return absl::AbortedError(
        absl::StrFormat("%s: simulated crash: the process is gone", path));
  }
  return absl::OkStatus();
}

absl::Status FaultInjectingStorage::BeforeRead(const std::string& path) {
  {
    MutexLock lock(&stall_mu_);
    if (reads_stalled_ && absl::StrContains(path, stalled_reads_matching_)) {
      ++waiting_;
      stall_mu_.Await(Condition(this, &FaultInjectingStorage::ReadsNotStalled));
      --waiting_;
    }
  }
  return CheckAlive(path);
}

void FaultInjectingStorage::WaitWhileStalled() {
  MutexLock lock(&stall_mu_);
  ++waiting_;
  stall_mu_.Await(Condition(this, &FaultInjectingStorage::NotStalled));
  --waiting_;
}

absl::Status FaultInjectingStorage::BeforeWrite(const std::string& path,
                                                bool* torn) {
  WaitWhileStalled();
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  if (writes_.fetch_add(1) == plan_.fail_write) {
    *torn = plan_.torn;
    return ErrnoStatus(plan_.error, "injected write failure", path);
  }
  return absl::OkStatus();
}

absl::Status FaultInjectingStorage::BeforeReserve(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  if (reserves_.fetch_add(1) == plan_.fail_reserve) {
    return ErrnoStatus(plan_.error, "injected reserve failure", path);
  }
  return absl::OkStatus();
}

absl::Status FaultInjectingStorage::BeforeSync(const std::string& path) {
  WaitWhileStalled();
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  const int n = syncs_.fetch_add(1);
  if (n == plan_.crash_at_sync) {
    crashed_.store(true);
    return CheckAlive(path);
  }
  if (n == plan_.fail_sync) {
    return ErrnoStatus(plan_.error, "injected sync failure", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>>
FaultInjectingStorage::OpenWritable(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      base().OpenWritable(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyWritableFile>(*this, path, *std::move(file));
}

absl::StatusOr<std::unique_ptr<ReadableFile>>
FaultInjectingStorage::OpenReadable(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ReadableFile>> file =
      base().OpenReadable(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyReadableFile>(*this, path, *std::move(file));
}

absl::Status FaultInjectingStorage::CreateDir(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().CreateDir(path);
}

absl::Status FaultInjectingStorage::Rename(const std::string& from,
                                           const std::string& to) {
  if (absl::Status s = CheckAlive(from); !s.ok()) return s;
  return base().Rename(from, to);
}

absl::Status FaultInjectingStorage::SyncDir(const std::string& path) {
  if (absl::Status s = BeforeSync(path); !s.ok()) return s;
  return base().SyncDir(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingStorage::List(
    const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().List(path);
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectingStorage::LockFile(
    const std::string& path, const std::string& holder) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().LockFile(path, holder);
}

absl::Status FaultInjectingStorage::RemoveAll(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().RemoveAll(path);
}

absl::StatusOr<bool> FaultInjectingStorage::Exists(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().Exists(path);
}

absl::StatusOr<bool> FaultInjectingStorage::IsDir(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().IsDir(path);
}

absl::StatusOr<std::unique_ptr<ReadableFile>>
FaultInjectingStorage::OpenReadableBeneath(const std::string& dir,
                                           const std::string& relative) {
  if (OwnCommit()) return Storage::OpenReadableBeneath(dir, relative);
  if (absl::Status s = CheckAlive(dir); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ReadableFile>> file =
      base().OpenReadableBeneath(dir, relative);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyReadableFile>(*this, JoinPath(dir, relative),
                                              *std::move(file));
}

absl::Status FaultInjectingStorage::CreateDirs(const std::string& path) {
  if (OwnCommit()) return Storage::CreateDirs(path);
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base().CreateDirs(path);
}

absl::StatusOr<std::string> FaultInjectingStorage::BeginDir(
    const std::string& dir, const std::string& tmp,
    absl::Span<const std::string> subdirs, const std::string& marker,
    bool replace) {
  if (OwnCommit()) {
    return Storage::BeginDir(dir, tmp, subdirs, marker, replace);
  }
  if (absl::Status s = CheckAlive(dir); !s.ok()) return s;
  return base().BeginDir(dir, tmp, subdirs, marker, replace);
}

absl::Status FaultInjectingStorage::CommitDir(const std::string& written,
                                              const std::string& dir,
                                              const std::string& marker,
                                              std::string_view marker_bytes,
                                              const std::string& aside) {
  if (OwnCommit()) {
    return Storage::CommitDir(written, dir, marker, marker_bytes, aside);
  }
  if (absl::Status s = BeforeSync(dir); !s.ok()) return s;
  return base().CommitDir(written, dir, marker, marker_bytes, aside);
}

absl::StatusOr<bool> FaultInjectingStorage::HasMarker(
    const std::string& dir, const std::string& marker) {
  if (OwnCommit()) return Storage::HasMarker(dir, marker);
  if (absl::Status s = CheckAlive(dir); !s.ok()) return s;
  return base().HasMarker(dir, marker);
}

absl::Status FaultInjectingStorage::RemoveCommitted(const std::string& dir,
                                                    const std::string& aside,
                                                    const std::string& marker) {
  if (OwnCommit()) return Storage::RemoveCommitted(dir, aside, marker);
  if (absl::Status s = CheckAlive(dir); !s.ok()) return s;
  return base().RemoveCommitted(dir, aside, marker);
}

}  // namespace hoist
