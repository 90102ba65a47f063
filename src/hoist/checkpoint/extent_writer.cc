#include "hoist/checkpoint/extent_writer.h"

#include <xxhash.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hoist {

ExtentWriter::ExtentWriter(const SavePlan& plan) : plan_(plan) {
  absl::MutexLock lock(&mu_);
  hashes_.assign(plan.slices.size(), 0);
}

absl::StatusOr<std::unique_ptr<ExtentWriter>> ExtentWriter::Open(
    Storage& storage, const std::string& dir, const SavePlan& plan,
    int process) {
  std::unique_ptr<ExtentWriter> writer(new ExtentWriter(plan));
  const int streams = plan.options.writer_streams;
  writer->first_file_ = process * streams;
  for (int f = writer->first_file_; f < writer->first_file_ + streams; ++f) {
    auto stream = std::make_unique<Stream>();
    stream->owner = writer.get();
    stream->path = JoinPath(dir, plan.files[f].path);
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage.OpenWritable(stream->path);
    if (!file.ok()) return file.status();  // started threads: none yet
    stream->file = *std::move(file);
    writer->streams_.push_back(std::move(stream));
  }
  for (auto& stream : writer->streams_) {
    Stream* s = stream.get();
    s->thread = std::thread([w = writer.get(), s] { w->Run(s); });
  }
  return writer;
}

ExtentWriter::~ExtentWriter() { StopThreads(); }

void ExtentWriter::StopThreads() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  for (auto& stream : streams_) {
    if (stream->thread.joinable()) stream->thread.join();
  }
}

void ExtentWriter::OnStaged(StagedExtent extent) {
  const int file = plan_.slices[extent.slice].file;
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return;  // the save failed: drop, releasing the lease
  streams_[file - first_file_]->queue.push_back(std::move(extent));
}

bool ExtentWriter::StreamHasWork(Stream* stream) {
  // Await evaluates this with mu_ held.
  return stream->owner->closing_ || !stream->queue.empty();
}

void ExtentWriter::Run(Stream* stream) {
  while (true) {
    StagedExtent extent;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ExtentWriter::StreamHasWork, stream));
      if (stream->queue.empty()) return;  // closing and drained
      extent = std::move(stream->queue.front());
      stream->queue.pop_front();
    }
    const PlannedSlice& slice = plan_.slices[extent.slice];
    const absl::Span<const uint8_t> bytes(extent.lease.data(),
                                          extent.lease.size_bytes());
    const uint64_t hash = XXH3_64bits(bytes.data(), bytes.size());
    absl::Status status = stream->file->WriteAt(slice.offset_bytes, bytes);
    extent.lease.Release();
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      if (error_.ok()) error_ = status;
      for (auto& s : streams_) s->queue.clear();  // drop what is left
    } else {
      hashes_[extent.slice] = hash;
    }
  }
}

absl::StatusOr<std::vector<uint64_t>> ExtentWriter::Finish() {
  StopThreads();  // drains every queue first
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = error_;
  }
  for (auto& stream : streams_) {
    if (status.ok()) status = stream->file->Sync();
    absl::Status closed = stream->file->Close();
    if (status.ok()) status = closed;
  }
  if (!status.ok()) return status;
  absl::MutexLock lock(&mu_);
  return std::move(hashes_);
}

}  // namespace hoist
