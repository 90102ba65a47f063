// Restore, step by step:
//   1. Read and validate the manifest; match every target against it.
//   2. For every saved extent that intersects some destination: one read task
//      listing the destinations it feeds. Data paths are checked so none
//      leaves the step directory through a symlink.
//   3. Reader threads take tasks in turn: read the whole extent, verify its
//      XXH3, copy each intersection into its destination (host memory
//      directly; device destinations through a host image of their box).
//   4. Per device, one CopyFromHost moving every host image to its device.
#include "hoist/checkpoint/restore.h"

#include <xxhash.h>

#include <atomic>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "hoist/array/box_copy.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/save.h"

namespace hoist {
namespace {

struct Sink {
  Box box;
  uint8_t* host = nullptr;  // where intersections are copied to
};

struct ReadTask {
  const ManifestArray* array;
  int extent;
  std::vector<int> sinks;  // indices into the sinks vector
};

// Every directory between `step_dir` and a data file must be a real
// directory, not a symlink that could lead out of the checkpoint.
absl::Status CheckDataPath(Storage& storage, const std::string& step_dir,
                           const std::string& file,
                           absl::flat_hash_set<std::string>& checked) {
  std::string dir = step_dir;
  size_t at = 0;
  while (true) {
    const size_t slash = file.find('/', at);
    if (slash == std::string::npos) break;
    dir = JoinPath(dir, file.substr(at, slash - at));
    at = slash + 1;
    if (checked.contains(dir)) continue;
    ASSIGN_OR_RETURN(bool is_dir, storage.IsDir(dir));
    if (!is_dir) {
      return absl::DataLossError(absl::StrFormat(
          "%s: not a directory inside the checkpoint (missing, or a link)",
          dir));
    }
    checked.insert(dir);
  }
  return absl::OkStatus();
}

class FirstError {
 public:
  void Record(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  absl::Status Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, const RestoreOptions& options) {
  const absl::Time start = absl::Now();
  RestoreStats stats;
  // 1.
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(storage, step_dir));
  std::vector<Sink> sinks;
  std::vector<std::vector<uint8_t>> images;  // host images of device boxes
  struct DeviceCopy {
    Device* device;
    std::vector<CopyOp> ops;
  };
  std::vector<DeviceCopy> device_copies;
  absl::flat_hash_map<Device*, int> copy_of_device;
  std::vector<ReadTask> tasks;
  absl::flat_hash_set<std::string> checked_dirs;
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
    const int64_t item = ItemSize(array->dtype);
    const int first_sink = static_cast<int>(sinks.size());
    for (const RestoreDestination& dest : target.destinations) {
      if (!whole.Contains(dest.box) || dest.box.rank() != whole.rank() ||
          (dest.data == nullptr && !dest.box.empty())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': destination box %s lies outside %s or has no memory",
            target.name, dest.box.ToString(), ShapeToString(array->shape)));
      }
      Sink sink{dest.box, static_cast<uint8_t*>(dest.data)};
      const int64_t bytes = dest.box.num_elements() * item;
      if (dest.device != nullptr && bytes > 0) {
        images.emplace_back(bytes);
        sink.host = images.back().data();
        auto [it, inserted] = copy_of_device.emplace(
            dest.device, static_cast<int>(device_copies.size()));
        if (inserted) device_copies.push_back({dest.device, {}});
        device_copies[it->second].ops.push_back(
            {sink.host, bytes, dest.data, bytes, bytes, 1});
      }
      sinks.push_back(sink);
    }
    // 2.
    for (int e = 0; e < static_cast<int>(array->extents.size()); ++e) {
      ReadTask task{array, e, {}};
      for (int s = first_sink; s < static_cast<int>(sinks.size()); ++s) {
        if (!array->extents[e].box.Intersect(sinks[s].box).empty()) {
          task.sinks.push_back(s);
        }
      }
      if (task.sinks.empty()) continue;
      RETURN_IF_ERROR(CheckDataPath(storage, step_dir, array->extents[e].file,
                                    checked_dirs));
      tasks.push_back(std::move(task));
    }
  }

  // 3.
  FirstError error;
  std::atomic<size_t> next{0};
  std::atomic<int64_t> bytes_read{0};
  const auto reader = [&] {
    absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
    std::vector<uint8_t> buffer;
    for (size_t t = next.fetch_add(1); t < tasks.size() && error.Get().ok();
         t = next.fetch_add(1)) {
      const ReadTask& task = tasks[t];
      const ManifestExtent& extent = task.array->extents[task.extent];
      std::unique_ptr<ReadableFile>& file = files[extent.file];
      if (file == nullptr) {
        absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
            storage.OpenReadable(JoinPath(step_dir, extent.file));
        if (!opened.ok()) {
          error.Record(opened.status());
          return;
        }
        file = *std::move(opened);
      }
      buffer.resize(extent.length_bytes);
      if (absl::Status s =
              file->ReadAt(extent.offset_bytes, absl::MakeSpan(buffer));
          !s.ok()) {
        error.Record(absl::Status(
            s.code(),
            absl::StrFormat("array '%s': extent %d of %d: %s", task.array->name,
                            task.extent, task.array->extents.size(),
                            s.message())));
        return;
      }
      if (XXH3_64bits(buffer.data(), buffer.size()) != extent.xxh3) {
        error.Record(absl::DataLossError(absl::StrFormat(
            "array '%s': extent %d of %d: xxh3 mismatch in %s @ %d",
            task.array->name, task.extent, task.array->extents.size(),
            extent.file, extent.offset_bytes)));
        return;
      }
      bytes_read.fetch_add(extent.length_bytes);
      const int64_t item = ItemSize(task.array->dtype);
      for (int s : task.sinks) {
        CopyBox(buffer.data(), extent.box, sinks[s].host, sinks[s].box,
                extent.box.Intersect(sinks[s].box), item);
      }
    }
  };
  const int threads = std::max(
      1, std::min<int>(options.reader_threads, static_cast<int>(tasks.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(reader);
  reader();
  for (std::thread& t : pool) t.join();
  RETURN_IF_ERROR(error.Get());
  stats.extents_read = static_cast<int64_t>(tasks.size());
  stats.bytes_read = bytes_read.load();

  // 4.
  std::vector<Future<>> copies;
  for (DeviceCopy& copy : device_copies) {
    copies.push_back(copy.device->CopyFromHost(copy.ops));
    ++stats.dispatches;
  }
  RETURN_IF_ERROR(WhenAll(copies).Wait());
  stats.elapsed = absl::Now() - start;
  return stats;
}

absl::StatusOr<ShardBuffers> AllocateShards(const ArraySpec& spec,
                                            absl::Span<Device* const> devices) {
  ASSIGN_OR_RETURN(ShardLayout layout, spec.sharding.Layout(spec.shape));
  ShardBuffers out;
  out.target = {spec.name, spec.dtype, spec.shape, {}};
  for (const DeviceShard& shard : layout.shards) {
    for (Device* device : devices) {
      if (device->id() != shard.device) continue;
      ASSIGN_OR_RETURN(
          MemoryBlock block,
          device->Allocate(shard.box.num_elements() * ItemSize(spec.dtype)));
      out.target.destinations.push_back({shard.box, device, block.data()});
      out.memory.push_back(std::move(block));
    }
  }
  return out;
}

}  // namespace hoist
