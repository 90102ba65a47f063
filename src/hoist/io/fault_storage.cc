#include "hoist/io/fault_storage.h"

#include "absl/status/status.h"
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
    if (absl::Status s = storage_.CheckAlive(path_); !s.ok()) return s;
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
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_.OpenWritable(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyWritableFile>(*this, path, *std::move(file));
}

absl::StatusOr<std::unique_ptr<ReadableFile>>
FaultInjectingStorage::OpenReadable(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ReadableFile>> file = base_.OpenReadable(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyReadableFile>(*this, path, *std::move(file));
}

absl::Status FaultInjectingStorage::CreateDir(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.CreateDir(path);
}

absl::Status FaultInjectingStorage::Rename(const std::string& from,
                                           const std::string& to) {
  if (absl::Status s = CheckAlive(from); !s.ok()) return s;
  return base_.Rename(from, to);
}

absl::Status FaultInjectingStorage::SyncDir(const std::string& path) {
  if (absl::Status s = BeforeSync(path); !s.ok()) return s;
  return base_.SyncDir(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingStorage::List(
    const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.List(path);
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultInjectingStorage::LockFile(
    const std::string& path, const std::string& holder) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.LockFile(path, holder);
}

absl::Status FaultInjectingStorage::RemoveAll(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.RemoveAll(path);
}

absl::StatusOr<bool> FaultInjectingStorage::Exists(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.Exists(path);
}

absl::StatusOr<bool> FaultInjectingStorage::IsDir(const std::string& path) {
  if (absl::Status s = CheckAlive(path); !s.ok()) return s;
  return base_.IsDir(path);
}

}  // namespace hoist
