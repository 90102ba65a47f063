#include "hoist/checkpoint/save/extent_writer.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/thread_priority.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/io/io_sizes.h"

namespace hoist {

WrittenExtents::WrittenExtents(const SavePlan& plan)
    : hashes(plan.slices.size()), referenced(plan.slices.size(), 0) {
  offsets.reserve(plan.slices.size());
  for (const PlannedSlice& slice : plan.slices) {
    offsets.push_back(slice.offset_bytes);
  }
}

absl::StatusOr<std::unique_ptr<ExtentWriter>> ExtentWriter::Open(
    Storage& storage, const std::string& dir, const SavePlan& plan, int process,
    int threads_per_file, Tracer* tracer, SaveProgress* progress,
    std::function<void()> thread_setup, const DeltaBase* base) {
  std::unique_ptr<ExtentWriter> writer(
      new ExtentWriter(plan, tracer, progress, base));
  {
    MutexLock lock(&writer->mu_);
    writer->written_ = WrittenExtents(plan);
  }
  const int streams = plan.options.writer_streams;
  writer->first_file_ = process * streams;
  for (int f = writer->first_file_; f < writer->first_file_ + streams; ++f) {
    auto stream = std::make_unique<Stream>();
    stream->owner = writer.get();
    stream->path =
        JoinPath(dir, DataFileName(plan.files[f].process, plan.files[f].stream,
                                   SpreadsDataFiles(storage)));
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage.OpenWritable(stream->path);
    if (!file.ok()) return file.status();  // started threads: none yet
    stream->file = *std::move(file);
    writer->streams_.push_back(std::move(stream));
  }
  for (auto& stream : writer->streams_) {
    Stream* s = stream.get();
    const int threads =
        s->file->sequential() ? 1 : std::max(1, threads_per_file);
    for (int t = 0; t < threads; ++t) {
      s->threads.emplace_back([w = writer.get(), s, thread_setup] {
        NameThisThread("hoist-writer");
        if (thread_setup) thread_setup();
        w->Run(s);
      });
    }
  }
  return writer;
}

ExtentWriter::~ExtentWriter() { StopThreads(); }

void ExtentWriter::StopThreads() {
  {
    MutexLock lock(&mu_);
    closing_ = true;
  }
  for (auto& stream : streams_) {
    for (std::thread& thread : stream->threads) {
      if (thread.joinable()) thread.join();
    }
  }
}

void ExtentWriter::OnStaged(StagedExtent extent) {
  const int file = plan_.slices[extent.slice].file;
  MutexLock lock(&mu_);
  if (!error_.ok()) return;  // the save failed: drop, releasing the lease
  const int64_t offset = plan_.slices[extent.slice].offset_bytes;
  streams_[file - first_file_]->queue.emplace(offset, std::move(extent));
}

absl::Status ExtentWriter::FrozenChanged(int slice,
                                         const ExtentHash& hash) const {
  if (base_ == nullptr || base_->frozen.empty() || !base_->frozen[slice] ||
      !base_->extents[slice] || base_->extents[slice]->hash == hash) {
    return absl::OkStatus();
  }
  const PlannedSlice& planned = plan_.slices[slice];
  return absl::FailedPreconditionError(absl::StrFormat(
      "array '%s' is frozen, but its box %s changed since step %d, which "
      "wrote it: a frozen array must never change (leave it out of frozen, "
      "or keep it fixed)",
      plan_.arrays[planned.array].name, planned.box.ToString(),
      base_->WriterOf(slice)));
}

std::string ExtentWriter::TrackOf(const StagedExtent& extent) const {
  const PlannedFile& file = plan_.files[plan_.slices[extent.slice].file];
  return "writer " + DataFileName(file.process, file.stream);
}

bool ExtentWriter::StreamHasWork(Stream* stream) {
  // Await evaluates this with mu_ held.
  return stream->owner->closing_ || !stream->queue.empty();
}

void ExtentWriter::Run(Stream* stream) {
  std::vector<StagedExtent> run;
  std::vector<absl::Span<const uint8_t>> pieces;
  std::vector<ExtentHash> hashes;
  std::vector<uint8_t> skip;     // referenced, not written
  std::vector<int64_t> offsets;  // where each extent of the run lands
  while (true) {
    run.clear();
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(&ExtentWriter::StreamHasWork, stream));
      if (stream->queue.empty()) return;  // closing and drained
      // The lowest queued extent and those that continue it in the file
      // (in a sequential file, whatever is queued next: it is appended).
      const bool append = stream->file->sequential();
      auto it = stream->queue.begin();
      int64_t end = it->first;
      int64_t bytes = 0;
      while (it != stream->queue.end() && (append || it->first == end) &&
             (run.empty() || bytes < kMaxIoRunBytes)) {
        end = it->first + it->second.lease.reserved_bytes();
        bytes += it->second.lease.reserved_bytes();
        run.push_back(std::move(it->second));
        it = stream->queue.erase(it);
      }
    }
    // Hash each extent while it is hot; one that equals its base's is
    // referenced, not written; pad the others to whole blocks and write
    // each unbroken run of them as one write.
    const absl::Time hash_start = absl::Now();
    hashes.clear();
    skip.clear();
    for (StagedExtent& extent : run) {
      Lease& lease = extent.lease;
      hashes.push_back(HashExtent(lease.data(), lease.size_bytes()));
      const ManifestExtent* same =
          base_ != nullptr ? base_->extents[extent.slice] : nullptr;
      skip.push_back(same != nullptr && same->hash == hashes.back());
      if (!skip.back()) {
        std::memset(lease.data() + lease.size_bytes(), 0,
                    lease.reserved_bytes() - lease.size_bytes());
      }
    }
    const bool append = stream->file->sequential();
    int64_t at =
        append ? stream->end : plan_.slices[run.front().slice].offset_bytes;
    const absl::Time write_start = absl::Now();
    if (tracer_ != nullptr) {
      tracer_->Span(TrackOf(run.front()),
                    absl::StrFormat("hash %d extents", run.size()), hash_start,
                    write_start);
    }
    absl::Status status;
    offsets.assign(run.size(), 0);
    for (size_t i = 0; i < run.size() && status.ok();) {
      if (skip[i]) {  // a hole where the file is written at planned offsets
        if (!append) at += run[i].lease.reserved_bytes();
        ++i;
        continue;
      }
      pieces.clear();
      const int64_t offset = at;
      for (; i < run.size() && !skip[i]; ++i) {
        offsets[i] = at;
        at += run[i].lease.reserved_bytes();
        pieces.emplace_back(run[i].lease.data(), run[i].lease.reserved_bytes());
      }
      const absl::Time piece_start = absl::Now();
      // Allocated first, the write runs under ext4's shared inode lock:
      // one that allocates holds it exclusive until its I/O is done, and
      // the file's other writer thread waits, spinning while the holder
      // pins its pages. The writers of a 400 MB save in bench/train_loop.py
      // took 39 ms of CPU, 20 ms with this.
      if (progress_ != nullptr) progress_->writing.Set(stream->path);
      if (!append) status = stream->file->Reserve(offset, at - offset);
      if (status.ok()) status = stream->file->WriteAtv(offset, pieces);
      if (tracer_ != nullptr) {
        tracer_->Span(
            TrackOf(run.front()),
            absl::StrFormat("write %s @ %d",
                            FormatBytes(static_cast<double>(at - offset)),
                            offset),
            piece_start, absl::Now());
      }
    }
    for (StagedExtent& extent : run) extent.lease.Release();
    if (append) stream->end = at;
    MutexLock lock(&mu_);
    if (!status.ok()) {
      if (error_.ok()) error_ = status;
      for (auto& s : streams_) s->queue.clear();  // drop what is left
      continue;
    }
    for (size_t i = 0; i < run.size(); ++i) {
      if (absl::Status changed = FrozenChanged(run[i].slice, hashes[i]);
          !changed.ok() && error_.ok()) {
        error_ = std::move(changed);
      }
      written_.hashes[run[i].slice] = hashes[i];
      written_.offsets[run[i].slice] =
          skip[i] ? base_->extents[run[i].slice]->offset_bytes : offsets[i];
      written_.referenced[run[i].slice] = skip[i];
      if (progress_ != nullptr) {
        progress_->written_bytes.fetch_add(
            plan_.slices[run[i].slice].length_bytes, std::memory_order_relaxed);
      }
    }
  }
}

absl::StatusOr<WrittenExtents> ExtentWriter::Finish() {
  StopThreads();  // drains every queue first
  absl::Status status;
  {
    MutexLock lock(&mu_);
    status = error_;
  }
  for (auto& stream : streams_) {
    if (status.ok()) status = stream->file->Sync();
    absl::Status closed = stream->file->Close();
    if (status.ok()) status = closed;
  }
  if (!status.ok()) return status;
  MutexLock lock(&mu_);
  return std::move(written_);
}

}  // namespace hoist
