// Restore, step by step:
//   1. Read and validate the manifest; match every target against it; plan
//      (PlanRestore, restore_plan.h): which images (host destinations in
//      place; device boxes, or parts of them, in leases shared by replicas),
//      in which waves, reading which extents.
//   2. Per wave: acquire its leases all at once; reader threads (at most
//      options.reader_threads, started per wave and joined before it ends)
//      take the wave's reads in turn, read each extent whole (O_DIRECT where
//      aligned) straight into its lease when it is one contiguous run of
//      it, else (and for every host destination, unless
//      options.stage_host_reads is false) into a buffer and then copy each
//      intersection (a Prefaulter faults in the host destinations ahead of
//      the copies), opening data
//      files below the step directory without following links; verify its
//      XXH3; then ONE CopyFromHost per device, and one call of the
//      receiver (for destinations without device or memory), carry all of
//      the wave's images, and the wave's leases return to the pool when the
//      copies landed.
//   3. Wait for every copy.
#include "hoist/checkpoint/restore.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/box.h"
#include "hoist/checkpoint/extent_reader.h"
#include "hoist/checkpoint/io_sizes.h"
#include "hoist/checkpoint/prefault.h"
#include "hoist/checkpoint/save.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/huge_pages.h"
#include "hoist/restore_plan.h"

namespace hoist {
namespace {

// Threads faulting in fresh destinations ahead of the reads (prefault.h):
// one per four cores, from one to four. On this project's 2-core VM one
// thread took the first restore of 2 GiB into new memory in a process from
// 2.69 s to 2.26 s (medians of 8, alternated; CPU 2.95 to 2.38 s), and two
// did no better than one, with more CPU.
int PrefaultThreads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 4, 1, 4);
}

struct ReadTask {
  const ManifestArray* array;
  int extent;
  std::vector<int> images;  // indices into the wave's images
};

// Where one image's intersections go during a wave.
struct WaveImage {
  Box box;
  uint8_t* host;  // the host destination itself, or the image's lease
  bool in_place;  // the destination itself: memory perhaps never touched
};

// Reads, verifies and scatters `tasks` with `threads` readers.
absl::Status ReadWave(const ExtentFileOpener& open, const std::string& step_dir,
                      const std::vector<ReadTask>& tasks,
                      const std::vector<WaveImage>& images, bool verify,
                      bool stage_in_place, int prefault_threads,
                      std::vector<ReadBuffer>& buffers,
                      std::atomic<int64_t>& bytes_read) {
  FirstError error;
  std::atomic<size_t> next{0};
  // An extent that is one contiguous run of its only image, starting
  // 4 KiB-aligned there, and not small (kMinDirectReadBytes) is read
  // straight into it, unless the image is a host destination and
  // `stage_in_place`: a buffer of huge pages takes reads faster than memory
  // of the caller's (RestoreOptions::stage_host_reads). The others are
  // read into a buffer, in runs of
  // extents that follow each other in one file (each at the next 4 KiB
  // boundary after the previous one): one read per run, up to 16 MiB.
  const auto extent_of = [&](int t) -> const ManifestExtent& {
    return tasks[t].array->extents[tasks[t].extent];
  };
  std::vector<std::optional<int64_t>> direct_at(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    const ReadTask& task = tasks[t];
    const ManifestExtent& extent = extent_of(static_cast<int>(t));
    if (task.images.size() != 1 || extent.length_bytes < kMinDirectReadBytes ||
        !images[task.images[0]].box.Contains(extent.box)) {
      continue;
    }
    const WaveImage& image = images[task.images[0]];
    if (image.in_place && stage_in_place) continue;
    const std::optional<int64_t> at = ContiguousByteOffset(
        image.box, extent.box, ItemSize(task.array->dtype));
    if (at &&
        reinterpret_cast<uintptr_t>(image.host + *at) % kExtentAlignmentBytes ==
            0) {
      direct_at[t] = at;
    }
  }
  std::vector<int> order(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) order[t] = static_cast<int>(t);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const ManifestExtent& x = extent_of(a);
    const ManifestExtent& y = extent_of(b);
    return std::tie(x.step, x.file, x.offset_bytes) <
           std::tie(y.step, y.file, y.offset_bytes);
  });
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) of `order`
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    const ManifestExtent& first = extent_of(order[i]);
    while (!direct_at[order[i]] && j < order.size() && !direct_at[order[j]]) {
      const ManifestExtent& prev = extent_of(order[j - 1]);
      const ManifestExtent& next = extent_of(order[j]);
      if (next.file != first.file || next.step != first.step ||
          next.offset_bytes != AlignUp(prev.offset_bytes + prev.length_bytes,
                                       kExtentAlignmentBytes) ||
          next.offset_bytes + next.length_bytes - first.offset_bytes >
              kMaxIoRunBytes) {
        break;
      }
      ++j;
    }
    runs.emplace_back(i, j);
    i = j;
  }

  // The in-place bytes each run writes, faulted in ahead of the readers.
  std::vector<PrefaultRange> fresh;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (size_t i = runs[r].first; i < runs[r].second; ++i) {
      const ReadTask& task = tasks[order[i]];
      const Box& box = extent_of(order[i]).box;
      for (int k : task.images) {
        if (!images[k].in_place) continue;
        const Box part = box.Intersect(images[k].box);
        if (part.empty()) continue;
        const auto [first, end] =
            ByteSpan(images[k].box, part, ItemSize(task.array->dtype));
        fresh.push_back({r, images[k].host + first, end - first});
      }
    }
  }
  const Prefaulter prefaulter(std::move(fresh), next, prefault_threads);

  const auto reader = [&](ReadBuffer& buffer) {
    absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
    for (size_t r = next.fetch_add(1); r < runs.size() && error.Get().ok();
         r = next.fetch_add(1)) {
      const auto [begin, end] = runs[r];
      const ReadTask& head = tasks[order[begin]];
      const ManifestExtent& first = extent_of(order[begin]);
      const ManifestExtent& last = extent_of(order[end - 1]);
      const std::string where =
          absl::StrFormat("array '%s': extent %d of %d", head.array->name,
                          head.extent, head.array->extents.size());
      const ExtentPlace place = PlaceOfExtent(step_dir, first);
      std::unique_ptr<ReadableFile>& file = files[place.path];
      if (file == nullptr) {
        absl::StatusOr<std::unique_ptr<ReadableFile>> opened = open(place);
        if (!opened.ok()) {
          error.Record(absl::Status(
              opened.status().code(),
              absl::StrCat(where, ": ", opened.status().message())));
          return;
        }
        file = *std::move(opened);
      }
      const std::optional<int64_t> direct = direct_at[order[begin]];
      const int64_t span =
          last.offset_bytes + last.length_bytes - first.offset_bytes;
      if (!direct && span > kMaxIoRunBytes) {
        // One extent larger than a run, scattered: read it in pieces so
        // the buffer stays bounded whatever the extent's size.
        const int64_t item = ItemSize(head.array->dtype);
        absl::Status s = ReadExtentInPieces(
            *file, first, item, kMaxIoRunBytes, buffer,
            [&](const Box& piece, const uint8_t* bytes) {
              for (int k : head.images) {
                const Box& box = images[k].box;
                CopyBox(bytes, piece, images[k].host, box, piece.Intersect(box),
                        item);
              }
            },
            verify);
        if (!s.ok()) {
          error.Record(
              absl::Status(s.code(), absl::StrCat(where, ": ", s.message())));
          return;
        }
        bytes_read.fetch_add(first.length_bytes);
        continue;
      }
      uint8_t* data =
          direct ? images[head.images[0]].host + *direct : buffer.Get(span);
      if (absl::Status s =
              file->ReadAt(first.offset_bytes, absl::MakeSpan(data, span));
          !s.ok()) {
        error.Record(
            absl::Status(s.code(), absl::StrCat(where, ": ", s.message())));
        return;
      }
      for (size_t i = begin; i < end; ++i) {
        const ReadTask& task = tasks[order[i]];
        const ManifestExtent& extent = extent_of(order[i]);
        const uint8_t* bytes =
            data + (extent.offset_bytes - first.offset_bytes);
        if (verify && !ExtentMatches(extent.hash, bytes, extent.length_bytes)) {
          error.Record(absl::DataLossError(absl::StrFormat(
              "array '%s': extent %d of %d: xxh3 mismatch in %s @ %d",
              task.array->name, task.extent, task.array->extents.size(),
              PlaceOfExtent(step_dir, extent).relative, extent.offset_bytes)));
          return;
        }
        bytes_read.fetch_add(extent.length_bytes);
        if (direct) continue;
        for (int s : task.images) {
          const Box& box = images[s].box;
          CopyBox(bytes, extent.box, images[s].host, box,
                  extent.box.Intersect(box), ItemSize(task.array->dtype));
        }
      }
    }
  };
  const size_t threads = std::min(buffers.size(), runs.size());
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) {
    pool.emplace_back(reader, std::ref(buffers[i]));
  }
  if (threads > 0) reader(buffers[0]);
  for (std::thread& t : pool) t.join();
  return error.Get();
}

// A part (manifest.h) holds only what one process held: kFailedPrecondition
// when `box` reaches outside its extents (they are disjoint, so the sizes
// of their intersections with `box` add up to `box`'s exactly when they
// cover it).
absl::Status CheckInPart(const ManifestArray& array, const Box& box,
                         const std::string& step_dir) {
  int64_t covered = 0;
  for (const ManifestExtent& extent : array.extents) {
    covered += extent.box.Intersect(box).num_elements();
  }
  if (covered == box.num_elements()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "array '%s': box %s is not all in %s, which is one process's part of a "
      "local-tier step (it holds only what that process held)",
      array.name, box.ToString(), step_dir));
}

}  // namespace

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const Manifest manifest,
                   ReadManifestFile(storage, step_dir));
  ASSIGN_OR_RETURN(
      RestoreStats stats,
      RestoreCheckpoint(manifest, step_dir, targets, pool, options, receiver,
                        [&storage](const ExtentPlace& place) {
                          return storage.OpenReadableBeneath(place.dir,
                                                             place.relative);
                        }));
  stats.elapsed = absl::Now() - start;  // the manifest's read included
  return stats;
}

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    const Manifest& manifest, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    const ExtentFileOpener& open) {
  static_assert(StagingPool::kAlignment == 4096,
                "PlanRestore assumes 4 KiB leases");
  const absl::Time start = absl::Now();
  RestoreStats stats;
  // 1. Each target matched against the manifest, and the plan.
  absl::flat_hash_map<std::string_view, const ManifestArray*> by_name;
  for (const ManifestArray& array : manifest.arrays) {
    by_name.emplace(array.name, &array);
  }
  std::vector<const ManifestArray*> arrays;  // the plan's saved arrays
  std::vector<SavedArray> saved;
  absl::flat_hash_map<const ManifestArray*, int> index_of;
  std::vector<DestinationBox> boxes;
  std::vector<const RestoreDestination*> dest_of;  // per box
  for (const RestoreTarget& target : targets) {
    auto found = by_name.find(target.name);
    if (found == by_name.end()) {
      return absl::NotFoundError(
          absl::StrFormat("array '%s' is not in %s", target.name, step_dir));
    }
    const ManifestArray* array = found->second;
    if (array->dtype != target.dtype || array->shape != target.shape) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "array '%s': requested %s %s but %s holds %s %s", target.name,
          DTypeName(target.dtype), ShapeToString(target.shape), step_dir,
          DTypeName(array->dtype), ShapeToString(array->shape)));
    }
    auto [it, inserted] =
        index_of.emplace(array, static_cast<int>(saved.size()));
    if (inserted) {
      SavedArray s{array->name, ItemSize(array->dtype), array->shape, {}};
      s.extents.reserve(array->extents.size());
      for (const ManifestExtent& extent : array->extents) {
        s.extents.push_back(extent.box);
      }
      saved.push_back(std::move(s));
      arrays.push_back(array);
    }
    const Box whole = Box::FromShape(array->shape);
    for (const RestoreDestination& dest : target.destinations) {
      const bool received = dest.data == nullptr && dest.device == nullptr;
      if (dest.box.rank() != whole.rank() || !whole.Contains(dest.box) ||
          (dest.data == nullptr && !dest.box.empty() &&
           !(received && receiver))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': destination box %s lies outside %s or has no memory "
            "(and no receiver)",
            target.name, dest.box.ToString(), ShapeToString(array->shape)));
      }
      if (dest.box.empty()) continue;
      if (manifest.part)
        RETURN_IF_ERROR(CheckInPart(*array, dest.box, step_dir));
      // Device and receiver boxes are staged through the pool.
      boxes.push_back(
          {it->second, dest.box, dest.device != nullptr || received});
      dest_of.push_back(&dest);
    }
  }
  // The readers' buffers are the pool's first bytes, up to a quarter of
  // it, where they are free now: resident and in huge pages, where buffers
  // mapped for this restore are fresh memory, and fresh huge pages cost
  // 4-9 s/GiB to fault in on this project's VM (a third of a restore's CPU
  // onto devices). The waves are then planned in the rest of the pool, and
  // always find room there once other users of the pool (a save under way)
  // are done (TryAcquireFront). Otherwise (a pool too small, busy, or still
  // to be pinned; or boxes that need all of it) each reader maps its own.
  const int readers = std::max(1, options.reader_threads);
  constexpr int64_t kLent = AlignUp(kReadBufferBytes, StagingPool::kAlignment);
  const int lent = static_cast<int>(
      std::min<int64_t>(readers, pool.capacity_bytes() / 4 / kLent));
  std::optional<Lease> lent_memory;
  if (lent > 0) lent_memory = pool.TryAcquireFront(lent * kLent);
  absl::StatusOr<RestorePlan> planned =
      PlanRestore(saved, boxes,
                  pool.capacity_bytes() -
                      (lent_memory ? lent_memory->reserved_bytes() : 0));
  if (!planned.ok() && lent_memory) {
    lent_memory.reset();
    planned = PlanRestore(saved, boxes, pool.capacity_bytes());
  }
  RETURN_IF_ERROR(planned.status());
  const RestorePlan& plan = *planned;
  for (const RestoreImage& image : plan.images) {
    stats.target_bytes += image.bytes;
  }
  std::vector<ReadBuffer> buffers;
  buffers.reserve(readers);
  for (int i = 0; i < readers; ++i) {
    if (lent_memory && i < lent) {
      buffers.emplace_back(absl::MakeSpan(lent_memory->data() + i * kLent,
                                          static_cast<size_t>(kLent)));
    } else {
      buffers.emplace_back();
    }
  }

  // 2. Each wave: its leases, its reads, then one copy per device.
  std::atomic<int64_t> bytes_read{0};
  std::vector<Future<>> copies;
  absl::Status status;
  for (const RestoreWave& wave : plan.waves) {
    std::vector<int64_t> sizes;
    for (int i : wave.images) {
      if (!plan.images[i].in_place) sizes.push_back(plan.images[i].bytes);
    }
    absl::StatusOr<std::vector<Lease>> leases = pool.AcquireAll(sizes);
    if (!leases.ok()) {
      status = leases.status();
      break;
    }
    ++stats.waves;
    // images[k] is where image wave.images[k] is assembled.
    std::vector<WaveImage> images;
    absl::flat_hash_map<int, int> image_at;
    size_t next_lease = 0;
    for (int i : wave.images) {
      const RestoreImage& image = plan.images[i];
      uint8_t* host = image.in_place
                          ? static_cast<uint8_t*>(
                                dest_of[image.destinations[0].first]->data)
                          : (*leases)[next_lease++].data();
      image_at[i] = static_cast<int>(images.size());
      images.push_back({image.box, host, image.in_place});
    }
    std::vector<ReadTask> tasks;
    tasks.reserve(wave.reads.size());
    for (const RestoreRead& read : wave.reads) {
      ReadTask task{arrays[read.array], read.extent, {}};
      for (int i : read.images) task.images.push_back(image_at.at(i));
      tasks.push_back(std::move(task));
    }
    status =
        ReadWave(open, step_dir, tasks, images, options.verify_xxh3,
                 options.stage_host_reads,
                 options.prefault ? PrefaultThreads() : 0, buffers, bytes_read);
    if (!status.ok()) break;
    stats.extents_read += static_cast<int64_t>(tasks.size());
    // One CopyFromHost per device, and one call of the receiver, carry the
    // wave's images; the wave's leases return once the copies landed.
    absl::flat_hash_map<Device*, std::vector<CopyOp>> ops;
    std::vector<StagedPart> received;
    for (int i : wave.images) {
      const RestoreImage& image = plan.images[i];
      if (image.in_place) continue;
      const uint8_t* from = images[image_at.at(i)].host;
      for (const auto& [d, offset] : image.destinations) {
        const RestoreDestination& dest = *dest_of[d];
        if (dest.device == nullptr) {
          received.push_back({&dest, image.box, offset, from, image.bytes});
          continue;
        }
        ops[dest.device].push_back({from, image.bytes,
                                    static_cast<uint8_t*>(dest.data) + offset,
                                    image.bytes, image.bytes, 1});
      }
    }
    if (!received.empty()) {
      status = receiver(received);
      if (!status.ok()) break;  // the wave's leases return as they go
    }
    std::vector<Future<>> wave_copies;
    for (auto& [device, device_ops] : ops) {
      wave_copies.push_back(device->CopyFromHost(device_ops));
      ++stats.dispatches;
    }
    // `released` completes only after the leases are back: a callback added
    // to `landed` later could otherwise run (inline) while the release is
    // still under way on the device's thread.
    Promise<> released;
    copies.push_back(released.future());
    WhenAll(wave_copies)
        .OnReady([leases = std::move(*leases), released = std::move(released)](
                     const absl::Status& status) mutable {
          leases.clear();
          released.Set(status);
        });
  }
  // 3. Every copy must be over before the destinations or leases are touched
  // again, also after an error.
  absl::Status copied = WhenAll(copies).Wait();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(copied);
  stats.bytes_read = bytes_read.load();
  stats.elapsed = absl::Now() - start;
  return stats;
}

HostBuffer::HostBuffer(int64_t bytes) : size_(bytes) {
  if (bytes <= 0) return;
  constexpr int64_t kPage = 4096;
  const bool huge = bytes >= kHugePageBytes && AdviseHugePages();
  mapped_ = AlignUp(bytes, kPage) + (huge ? kHugePageBytes : 0);
  mapping_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw std::bad_alloc();
  }
  data_ = static_cast<uint8_t*>(mapping_);
  if (huge) {
    data_ = reinterpret_cast<uint8_t*>(
        AlignUp(static_cast<int64_t>(reinterpret_cast<uintptr_t>(data_)),
                kHugePageBytes));
    AdviseHugePagesFor(data_, bytes);
  }
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) munmap(mapping_, mapped_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (mapping_ != nullptr) munmap(mapping_, mapped_);
}

HostArrays WholeArraysInHost(absl::Span<const ArraySpec> specs) {
  HostArrays out;
  out.bytes.reserve(specs.size());
  for (const ArraySpec& spec : specs) {
    const Box whole = Box::FromShape(spec.shape);
    out.bytes.emplace_back(whole.num_elements() * ItemSize(spec.dtype));
    out.targets.push_back({spec.name,
                           spec.dtype,
                           spec.shape,
                           {{whole, nullptr, out.bytes.back().data()}}});
  }
  return out;
}

}  // namespace hoist
