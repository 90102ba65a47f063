#include "hoist/checkpoint/tier/file_stream.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "hoist/base/status_macros.h"
#include "hoist/manifest.h"

namespace hoist {

FileStream::FileStream(std::vector<std::unique_ptr<WritableFile>> files,
                       std::vector<std::string> paths,
                       std::vector<int64_t> sizes, ReceivedBytes seen)
    : files_(std::move(files)),
      paths_(std::move(paths)),
      sizes_(std::move(sizes)),
      seen_(std::move(seen)) {}

FileStream::~FileStream() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
}

absl::Status FileStream::Append(absl::Span<const uint8_t> piece) {
  while (!piece.empty()) {
    while (file_ < sizes_.size() && in_file_ == sizes_[file_]) {
      RETURN_IF_ERROR(Flush());
      ++file_, in_file_ = 0;
    }
    if (file_ == sizes_.size()) {
      return absl::DataLossError("more bytes than its files hold");
    }
    if (staging_ == nullptr) {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &FileStream::HasFree));
      RETURN_IF_ERROR(error_);
      if (!free_.empty()) {
        staging_ = std::move(free_.back());
        free_.pop_back();
      } else {
        staging_.reset(static_cast<uint8_t*>(
            std::aligned_alloc(kExtentAlignmentBytes, kStagingBytes)));
        if (staging_ == nullptr) {
          return absl::ResourceExhaustedError(
              "no memory for a staging buffer of the files received");
        }
        ++allocated_;
      }
    }
    const size_t take = static_cast<size_t>(std::min<int64_t>(
        {static_cast<int64_t>(piece.size()), sizes_[file_] - in_file_,
         static_cast<int64_t>(kStagingBytes - staged_)}));
    std::memcpy(staging_.get() + staged_, piece.data(), take);
    staged_ += take;
    in_file_ += static_cast<int64_t>(take);
    piece.remove_prefix(take);
    if (staged_ == kStagingBytes) RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status FileStream::Flush() {
  if (staged_ == 0) return absl::OkStatus();
  Write write{.file = file_,
              .offset = in_file_ - static_cast<int64_t>(staged_),
              .buffer = std::move(staging_),
              .bytes = std::exchange(staged_, 0)};
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(error_);
  queue_.push_back(std::move(write));
  if (!writer_.joinable()) writer_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void FileStream::Run() {
  while (true) {
    Write write;
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &FileStream::HasWork));
      if (queue_.empty()) return;  // stopping, nothing left
      write = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const absl::Span<const uint8_t> bytes(write.buffer.get(), write.bytes);
    absl::Status status;
    {
      MutexLock lock(&mu_);
      status = error_;
    }
    if (status.ok()) {  // after an error, buffers only come back
      if (seen_) seen_(paths_[write.file], write.offset, bytes);
      status = files_[write.file]->WriteAt(write.offset, bytes);
    }
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = status;
    free_.push_back(std::move(write.buffer));
    writing_ = false;
  }
}

absl::Status FileStream::WaitIdle() {
  MutexLock lock(&mu_);
  mu_.Await(Condition(this, &FileStream::Idle));
  return error_;
}

absl::Status FileStream::Finish() {
  RETURN_IF_ERROR(Flush());
  RETURN_IF_ERROR(WaitIdle());
  for (std::unique_ptr<WritableFile>& file : files_) {
    RETURN_IF_ERROR(file->Sync());
  }
  return absl::OkStatus();
}

absl::Status FileStream::Close() {
  absl::Status first = WaitIdle();
  for (std::unique_ptr<WritableFile>& file : files_) {
    if (absl::Status closed = file->Close(); first.ok()) first = closed;
  }
  return first;
}

}  // namespace hoist
