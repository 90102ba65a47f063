// Restore, step by step:
//   1. Read and validate the manifest; match every target against it and
//      list the destinations. Host destinations are filled in place; device
//      destinations of the same box (replicas) share one host image, a lease
//      of the staging pool.
//   2. Cut the device destinations into waves: all of them if they fit in
//      the pool, else waves of at most half of it (one wave is read while
//      the previous one is copied to the devices).
//   3. Per wave: acquire its leases all at once; list every saved extent
//      that intersects a destination of the wave (checking that its path
//      stays inside the step directory); reader threads take extents in
//      turn, read each whole (O_DIRECT where aligned) straight into its
//      image when it is one contiguous run of it, else into a buffer and
//      then copy each intersection; verify its XXH3; then ONE CopyFromHost
//      per device carries all of the wave's images, and each lease returns
//      to the pool when its copy has landed.
//   4. Wait for every copy.
#include "hoist/checkpoint/restore.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/array/box_copy.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/extent_reader.h"
#include "hoist/checkpoint/io_sizes.h"
#include "hoist/checkpoint/save.h"
#include "hoist/format/manifest_file.h"

namespace hoist {
namespace {

// One box to fill, resolved against the manifest: host memory, or the
// memory of every device that holds this box (replicas share the image).
struct Destination {
  const ManifestArray* array = nullptr;
  Box box;
  uint8_t* host = nullptr;  // host destinations only
  std::vector<std::pair<Device*, uint8_t*>> devices;
  int64_t bytes = 0;
};

struct ReadTask {
  const ManifestArray* array;
  int extent;
  std::vector<int> sinks;  // indices into the wave's sinks
};

// Where a destination's intersections go during one wave.
struct Sink {
  const Destination* dest;
  uint8_t* host;  // the host destination itself, or the image's lease
};

// If `inner`'s C-order bytes form one contiguous run inside those of
// `outer` (which contains it), the run's byte offset.
std::optional<int64_t> ContiguousOffset(const Box& outer, const Box& inner,
                                        int64_t item_bytes) {
  // Leading dims of size 1 in inner, then one partial dim, then full dims.
  int d = 0;
  while (d < inner.rank() && inner.shape()[d] == 1) ++d;
  for (int e = d + 1; e < inner.rank(); ++e) {
    if (inner.shape()[e] != outer.shape()[e]) return std::nullopt;
  }
  const std::vector<int64_t> strides = CStrides(outer.shape());
  int64_t offset = 0;
  for (int e = 0; e < inner.rank(); ++e) {
    offset += (inner.origin()[e] - outer.origin()[e]) * strides[e];
  }
  return offset * item_bytes;
}

// Reads, verifies and scatters `tasks` with `threads` readers.
absl::Status ReadWave(Storage& storage, const std::string& step_dir,
                      const std::vector<ReadTask>& tasks,
                      const std::vector<Sink>& sinks,
                      std::vector<ReadBuffer>& buffers,
                      std::atomic<int64_t>& bytes_read) {
  FirstError error;
  std::atomic<size_t> next{0};
  // An extent that is one contiguous run of its only sink is read straight
  // into it. The others are read into a buffer, in runs of extents that
  // follow each other in one file (each at the next 4 KiB boundary after
  // the previous one): one read per run, up to 16 MiB.
  const auto extent_of = [&](int t) -> const ManifestExtent& {
    return tasks[t].array->extents[tasks[t].extent];
  };
  std::vector<std::optional<int64_t>> direct_at(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    const ReadTask& task = tasks[t];
    const Box& box = extent_of(static_cast<int>(t)).box;
    if (task.sinks.size() == 1 &&
        sinks[task.sinks[0]].dest->box.Contains(box)) {
      direct_at[t] = ContiguousOffset(sinks[task.sinks[0]].dest->box, box,
                                      ItemSize(task.array->dtype));
    }
  }
  std::vector<int> order(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) order[t] = static_cast<int>(t);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const ManifestExtent& x = extent_of(a);
    const ManifestExtent& y = extent_of(b);
    return std::tie(x.file, x.offset_bytes) < std::tie(y.file, y.offset_bytes);
  });
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) of `order`
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    const ManifestExtent& first = extent_of(order[i]);
    while (!direct_at[order[i]] && j < order.size() && !direct_at[order[j]]) {
      const ManifestExtent& prev = extent_of(order[j - 1]);
      const ManifestExtent& next = extent_of(order[j]);
      if (next.file != first.file ||
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
      std::unique_ptr<ReadableFile>& file = files[first.file];
      if (file == nullptr) {
        absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
            storage.OpenReadableBeneath(step_dir, first.file);
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
        absl::Status s =
            ReadExtentInPieces(*file, first, item, kMaxIoRunBytes, buffer,
                               [&](const Box& piece, const uint8_t* bytes) {
                                 for (int k : head.sinks) {
                                   const Box& box = sinks[k].dest->box;
                                   CopyBox(bytes, piece, sinks[k].host, box,
                                           piece.Intersect(box), item);
                                 }
                               });
        if (!s.ok()) {
          error.Record(
              absl::Status(s.code(), absl::StrCat(where, ": ", s.message())));
          return;
        }
        bytes_read.fetch_add(first.length_bytes);
        continue;
      }
      uint8_t* data =
          direct ? sinks[head.sinks[0]].host + *direct : buffer.Get(span);
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
        if (XXH3_64bits(bytes, extent.length_bytes) != extent.xxh3) {
          error.Record(absl::DataLossError(absl::StrFormat(
              "array '%s': extent %d of %d: xxh3 mismatch in %s @ %d",
              task.array->name, task.extent, task.array->extents.size(),
              extent.file, extent.offset_bytes)));
          return;
        }
        bytes_read.fetch_add(extent.length_bytes);
        if (direct) continue;
        for (int s : task.sinks) {
          const Box& box = sinks[s].dest->box;
          CopyBox(bytes, extent.box, sinks[s].host, box,
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

}  // namespace

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options) {
  const absl::Time start = absl::Now();
  RestoreStats stats;
  // 1.
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifestFile(storage, step_dir));
  std::vector<Destination> host_dests, device_dests;
  absl::flat_hash_map<std::pair<const ManifestArray*, Box>, size_t> image_of;
  for (const RestoreTarget& target : targets) {
    const ManifestArray* array = manifest.Find(target.name);
    if (array == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("array '%s' is not in %s", target.name, step_dir));
    }
    if (array->dtype != target.dtype || array->shape != target.shape) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "array '%s': requested %s %s but %s holds %s %s", target.name,
          DTypeName(target.dtype), ShapeToString(target.shape), step_dir,
          DTypeName(array->dtype), ShapeToString(array->shape)));
    }
    const Box whole = Box::FromShape(array->shape);
    for (const RestoreDestination& dest : target.destinations) {
      if (dest.box.rank() != whole.rank() || !whole.Contains(dest.box) ||
          (dest.data == nullptr && !dest.box.empty())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': destination box %s lies outside %s or has no memory",
            target.name, dest.box.ToString(), ShapeToString(array->shape)));
      }
      if (dest.box.empty()) continue;
      const int64_t bytes = dest.box.num_elements() * ItemSize(array->dtype);
      uint8_t* data = static_cast<uint8_t*>(dest.data);
      if (dest.device == nullptr) {
        host_dests.push_back({array, dest.box, data, {}, bytes});
        continue;
      }
      // A box larger than half the pool is restored in parts: consecutive
      // ranges of its first axis longer than 1, each a contiguous run of the
      // box's memory.
      const int64_t item = ItemSize(array->dtype);
      const int64_t max_part = pool.capacity_bytes() / 2;
      std::vector<Box> pieces = {dest.box};
      if (AlignUp(bytes, StagingPool::kAlignment) > max_part) {
        int axis = 0;
        while (axis < dest.box.rank() && dest.box.shape()[axis] == 1) ++axis;
        const int64_t row_bytes =
            axis < dest.box.rank() ? bytes / dest.box.shape()[axis] : bytes;
        if (axis == dest.box.rank() ||
            AlignUp(row_bytes, StagingPool::kAlignment) > max_part) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "array '%s': box %s needs at least %s of staging at a time but "
              "half the pool is %s; raise the pool capacity",
              target.name, dest.box.ToString(), FormatBytes(row_bytes),
              FormatBytes(max_part)));
        }
        const int64_t rows_per_part = std::max<int64_t>(
            1, (max_part - StagingPool::kAlignment) / row_bytes);
        pieces = dest.box.Split(
            axis, (dest.box.shape()[axis] + rows_per_part - 1) / rows_per_part);
      }
      for (const Box& piece : pieces) {
        const int64_t offset = *ContiguousOffset(dest.box, piece, item);
        auto [it, inserted] =
            image_of.emplace(std::make_pair(array, piece), device_dests.size());
        if (inserted) {
          device_dests.push_back(
              {array, piece, nullptr, {}, piece.num_elements() * item});
        }
        device_dests[it->second].devices.emplace_back(dest.device,
                                                      data + offset);
      }
    }
  }

  // 2. Waves of device destinations; host destinations ride with the first.
  int64_t device_bytes = 0;
  for (const Destination& d : device_dests) {
    device_bytes += AlignUp(d.bytes, StagingPool::kAlignment);
  }
  const int64_t budget = device_bytes <= pool.capacity_bytes()
                             ? pool.capacity_bytes()
                             : pool.capacity_bytes() / 2;
  std::vector<std::vector<const Destination*>> waves(1);
  for (const Destination& d : host_dests) waves.back().push_back(&d);
  int64_t wave_bytes = 0;
  for (const Destination& d : device_dests) {
    const int64_t bytes = AlignUp(d.bytes, StagingPool::kAlignment);
    if (wave_bytes > 0 && wave_bytes + bytes > budget) {
      waves.emplace_back();
      wave_bytes = 0;
    }
    waves.back().push_back(&d);
    wave_bytes += bytes;
  }

  // 3.
  std::vector<ReadBuffer> buffers(std::max(1, options.reader_threads));
  std::atomic<int64_t> bytes_read{0};
  std::vector<Future<>> copies;
  absl::Status status;
  for (const std::vector<const Destination*>& wave : waves) {
    if (wave.empty()) continue;
    std::vector<int64_t> sizes;
    for (const Destination* d : wave) {
      if (d->host == nullptr) sizes.push_back(d->bytes);
    }
    absl::StatusOr<std::vector<Lease>> leases = pool.AcquireAll(sizes);
    if (!leases.ok()) {
      status = leases.status();
      break;
    }
    ++stats.waves;
    std::vector<Sink> sinks;
    size_t next_lease = 0;
    for (const Destination* d : wave) {
      sinks.push_back(
          {d, d->host != nullptr ? d->host : (*leases)[next_lease++].data()});
    }
    // The extents this wave needs, each with the sinks it feeds.
    absl::flat_hash_map<std::pair<const ManifestArray*, int>, int> task_of;
    std::vector<ReadTask> tasks;
    for (int s = 0; s < static_cast<int>(sinks.size()); ++s) {
      const ManifestArray* array = sinks[s].dest->array;
      for (int e = 0; e < static_cast<int>(array->extents.size()); ++e) {
        if (array->extents[e].box.Intersect(sinks[s].dest->box).empty()) {
          continue;
        }
        auto [it, inserted] = task_of.emplace(std::make_pair(array, e),
                                              static_cast<int>(tasks.size()));
        if (inserted) tasks.push_back({array, e, {}});
        tasks[it->second].sinks.push_back(s);
      }
    }
    if (status.ok()) {
      status = ReadWave(storage, step_dir, tasks, sinks, buffers, bytes_read);
    }
    if (!status.ok()) break;
    stats.extents_read += static_cast<int64_t>(tasks.size());
    // One CopyFromHost per device; the wave's leases return when it lands.
    absl::flat_hash_map<Device*, std::vector<CopyOp>> ops;
    for (const Sink& sink : sinks) {
      const Destination& d = *sink.dest;
      for (const auto& [device, data] : d.devices) {
        ops[device].push_back({sink.host, d.bytes, data, d.bytes, d.bytes, 1});
      }
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
  // 4. Every copy must be over before the destinations or leases are touched
  // again, also after an error.
  absl::Status copied = WhenAll(copies).Wait();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(copied);
  stats.bytes_read = bytes_read.load();
  stats.elapsed = absl::Now() - start;
  return stats;
}

HostArrays WholeArraysInHost(absl::Span<const ArraySpec> specs) {
  HostArrays out;
  out.bytes.resize(specs.size());
  for (size_t a = 0; a < specs.size(); ++a) {
    const Box whole = Box::FromShape(specs[a].shape);
    out.bytes[a].resize(whole.num_elements() * ItemSize(specs[a].dtype));
    out.targets.push_back({specs[a].name,
                           specs[a].dtype,
                           specs[a].shape,
                           {{whole, nullptr, out.bytes[a].data()}}});
  }
  return out;
}

}  // namespace hoist
