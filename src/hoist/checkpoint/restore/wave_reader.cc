// A wave's reads, planned (WaveReads):
//   - An extent that is one contiguous run of its only image, starting
//     4 KiB-aligned there, and not small (kMinDirectReadBytes) is read
//     straight into it, unless the image is a host destination and
//     `stage_in_place`: a buffer of huge pages takes reads faster than
//     memory of the caller's (RestoreOptions::stage_host_reads).
//   - The others are read into a reader's buffer, in runs of extents that
//     follow each other in one file (each at the next 4 KiB boundary after
//     the previous one): one read per run, up to 16 MiB, then each
//     intersection is copied into place.
//   - A scattered extent larger than a run is read in pieces
//     (ReadExtentInPieces), so a buffer stays bounded whatever the extent's
//     size.
// The readers (ReaderCrew) take a restore's runs in the order its waves
// were added, each wave's by file and offset.
#include "hoist/checkpoint/restore/wave_reader.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/checked_math.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/io/io_sizes.h"

namespace hoist {

WaveReads::WaveReads(std::vector<ReadTask> tasks, std::vector<WaveImage> images,
                     bool stage_in_place)
    : tasks_(std::move(tasks)),
      images_(std::move(images)),
      direct_at_(tasks_.size()),
      order_(tasks_.size()) {
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const ReadTask& task = tasks_[t];
    const ManifestExtent& extent = extent_of(static_cast<int>(t));
    if (task.images.size() != 1 || extent.length_bytes < kMinDirectReadBytes ||
        !images_[task.images[0]].box.Contains(extent.box)) {
      continue;
    }
    const WaveImage& image = images_[task.images[0]];
    if (image.in_place && stage_in_place) continue;
    const std::optional<int64_t> at = ContiguousByteOffset(
        image.box, extent.box, ItemSize(task.array->dtype));
    if (at &&
        reinterpret_cast<uintptr_t>(image.host + *at) % kExtentAlignmentBytes ==
            0) {
      direct_at_[t] = at;
    }
  }
  for (size_t t = 0; t < tasks_.size(); ++t) order_[t] = static_cast<int>(t);
  std::sort(order_.begin(), order_.end(), [&](int a, int b) {
    const ManifestExtent& x = extent_of(a);
    const ManifestExtent& y = extent_of(b);
    return std::tie(x.step, x.file, x.offset_bytes) <
           std::tie(y.step, y.file, y.offset_bytes);
  });
  for (size_t i = 0; i < order_.size();) {
    size_t j = i + 1;
    const ManifestExtent& first = extent_of(order_[i]);
    while (!direct_at_[order_[i]] && j < order_.size() &&
           !direct_at_[order_[j]]) {
      const ManifestExtent& prev = extent_of(order_[j - 1]);
      const ManifestExtent& next = extent_of(order_[j]);
      if (next.file != first.file || next.step != first.step ||
          next.offset_bytes != AlignUp(prev.offset_bytes + prev.length_bytes,
                                       kExtentAlignmentBytes) ||
          next.offset_bytes + next.length_bytes - first.offset_bytes >
              kMaxIoRunBytes) {
        break;
      }
      ++j;
    }
    runs_.emplace_back(i, j);
    i = j;
  }
}

std::vector<PrefaultRange> WaveReads::FreshRanges() const {
  std::vector<PrefaultRange> fresh;
  for (size_t r = 0; r < runs_.size(); ++r) {
    for (size_t i = runs_[r].first; i < runs_[r].second; ++i) {
      const ReadTask& task = tasks_[order_[i]];
      const Box& box = extent_of(order_[i]).box;
      for (int k : task.images) {
        if (!images_[k].in_place) continue;
        const Box part = box.Intersect(images_[k].box);
        if (part.empty()) continue;
        const auto [first, end] =
            ByteSpan(images_[k].box, part, ItemSize(task.array->dtype));
        fresh.push_back({r, images_[k].host + first, end - first});
      }
    }
  }
  return fresh;
}

absl::Status WaveReads::ReadRun(size_t r, const ReadContext& context,
                                ReadBuffer& buffer, OpenFiles& files,
                                std::atomic<int64_t>& bytes_read) const {
  const auto [begin, end] = runs_[r];
  const ReadTask& head = tasks_[order_[begin]];
  const ManifestExtent& first = extent_of(order_[begin]);
  const ManifestExtent& last = extent_of(order_[end - 1]);
  const auto error = [&](const absl::Status& s) {
    return absl::Status(
        s.code(),
        absl::StrFormat("array '%s': extent %d of %d: %s", head.array->name,
                        head.extent, head.array->extents.size(), s.message()));
  };
  const ExtentPlace place = PlaceOfExtent(*context.step_dir, first);
  // What a stalled restore's warning names (StallWatch).
  if (context.progress != nullptr) context.progress->current.Set(place.path);
  std::unique_ptr<ReadableFile>& file = files[place.path];
  if (file == nullptr) {
    absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
        (*context.open)(place);
    if (!opened.ok()) return error(opened.status());
    file = *std::move(opened);
  }
  const std::optional<int64_t> direct = direct_at_[order_[begin]];
  const int64_t span =
      last.offset_bytes + last.length_bytes - first.offset_bytes;
  if (!direct && span > kMaxIoRunBytes) {
    // One extent larger than a run, scattered: read it in pieces so the
    // buffer stays bounded whatever the extent's size.
    const int64_t item = ItemSize(head.array->dtype);
    absl::Status s = ReadExtentInPieces(
        *file, first, item, kMaxIoRunBytes, buffer,
        [&](const Box& piece, const uint8_t* bytes) {
          for (int k : head.images) {
            const Box& box = images_[k].box;
            CopyBox(bytes, piece, images_[k].host, box, piece.Intersect(box),
                    item);
          }
        },
        context.verify);
    if (!s.ok()) return error(s);
    bytes_read.fetch_add(first.length_bytes);
    if (context.progress != nullptr) {
      context.progress->done.fetch_add(first.length_bytes);
    }
    return absl::OkStatus();
  }
  uint8_t* data =
      direct ? images_[head.images[0]].host + *direct : buffer.Get(span);
  if (absl::Status s =
          file->ReadAt(first.offset_bytes, absl::MakeSpan(data, span));
      !s.ok()) {
    return error(s);
  }
  absl::Duration verifying;
  for (size_t i = begin; i < end; ++i) {
    const ReadTask& task = tasks_[order_[i]];
    const ManifestExtent& extent = extent_of(order_[i]);
    const uint8_t* bytes = data + (extent.offset_bytes - first.offset_bytes);
    const absl::Time check = absl::Now();
    if (context.verify &&
        !ExtentMatches(extent.hash, bytes, extent.length_bytes)) {
      return absl::DataLossError(absl::StrFormat(
          "array '%s': extent %d of %d: xxh3 mismatch in %s @ %d",
          task.array->name, task.extent, task.array->extents.size(),
          PlaceOfExtent(*context.step_dir, extent).relative,
          extent.offset_bytes));
    }
    if (context.verify) verifying += absl::Now() - check;
    bytes_read.fetch_add(extent.length_bytes);
    if (context.progress != nullptr) {
      context.progress->done.fetch_add(extent.length_bytes);
    }
    if (direct) continue;
    for (int k : task.images) {
      const Box& box = images_[k].box;
      CopyBox(bytes, extent.box, images_[k].host, box,
              extent.box.Intersect(box), ItemSize(task.array->dtype));
    }
  }
  if (context.verify_ns != nullptr) {
    context.verify_ns->fetch_add(absl::ToInt64Nanoseconds(verifying));
  }
  return absl::OkStatus();
}

ReaderCrew::ReaderCrew(const ReadContext& context,
                       std::vector<ReadBuffer>& buffers)
    : context_(context), buffers_(buffers) {}

ReaderCrew::~ReaderCrew() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    DropQueue();
    threads = std::move(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

int ReaderCrew::Add(const WaveReads& wave) {
  MutexLock lock(&mu_);
  waves_.push_back(std::make_unique<Wave>());
  Wave* added = waves_.back().get();
  added->crew = this;
  added->reads = &wave;
  for (size_t r = 0; r < wave.runs(); ++r) queue_.emplace_back(added, r);
  queued_runs_ += wave.runs();
  // A reader per buffer at most, and no more than there are runs to read.
  while (threads_.size() < std::min(buffers_.size(), queued_runs_)) {
    threads_.emplace_back(&ReaderCrew::Read, this,
                          std::ref(buffers_[threads_.size()]));
  }
  return static_cast<int>(waves_.size() - 1);
}

absl::Status ReaderCrew::Wait(int wave) {
  MutexLock lock(&mu_);
  mu_.Await(Condition(&ReaderCrew::WaveOverOrFailed,
                      static_cast<const Wave*>(waves_[wave].get())));
  return error_;
}

const std::atomic<size_t>& ReaderCrew::taken(int wave) const {
  MutexLock lock(&mu_);
  return waves_[wave]->taken;
}

void ReaderCrew::Stop() {
  MutexLock lock(&mu_);
  DropQueue();
  mu_.Await(Condition(this, &ReaderCrew::NoneReading));
}

bool ReaderCrew::WaveOverOrFailed(const Wave* wave) {
  return !wave->crew->error_.ok() || wave->done == wave->reads->runs();
}

bool ReaderCrew::HasRunOrClosing() const { return closing_ || !queue_.empty(); }

bool ReaderCrew::NoneReading() const { return reading_ == 0; }

void ReaderCrew::DropQueue() {
  for (const auto& [wave, run] : queue_) ++wave->done;
  queue_.clear();
}

void ReaderCrew::Read(ReadBuffer& buffer) {
  OpenFiles files;  // kept across waves: a restore's waves share its files
  while (true) {
    Wave* wave;
    size_t run;
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &ReaderCrew::HasRunOrClosing));
      if (queue_.empty()) return;  // closing
      std::tie(wave, run) = queue_.front();
      queue_.pop_front();
      wave->taken.fetch_add(1);
      if (!error_.ok()) {  // a run has failed: the rest are dropped
        ++wave->done;
        continue;
      }
      ++reading_;
    }
    const absl::Status status =
        wave->reads->ReadRun(run, context_, buffer, files, bytes_read_);
    MutexLock lock(&mu_);
    --reading_;
    ++wave->done;
    if (!status.ok() && error_.ok()) error_ = status;
  }
}

}  // namespace hoist
