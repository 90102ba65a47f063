// The demo's restores: the latest step onto the other mesh and into host
// memory (or, with a local tier, from each tier onto the training mesh),
// each byte compared with the training state.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/box.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/cuda_backend.h"
#include "hoist/host_backend.h"
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "hoist/mutex.h"
#include "hoist/predict.h"
#include "hoist/tools/command_error.h"
#include "hoist/tools/demo_job.h"

namespace hoist::demo {

absl::StatusOr<RestoreTarget> DeviceTarget(const DemoJob& job,
                                           const ArraySpec& spec,
                                           std::vector<MemoryBlock>& memory) {
  ASSIGN_OR_RETURN(ShardLayout layout, spec.sharding.Layout(spec.shape));
  RestoreTarget target{spec.name, spec.dtype, spec.shape, {}};
  for (const DeviceShard& shard : layout.shards) {
    if (!job.device_of.contains(shard.device)) continue;  // another's
    Device* device = job.device_of.at(shard.device);
    ASSIGN_OR_RETURN(
        MemoryBlock block,
        device->Allocate(shard.box.num_elements() * ItemSize(spec.dtype)));
    target.destinations.push_back({shard.box, device, block.data()});
    memory.push_back(std::move(block));
  }
  return target;
}

// The job's verdict (every process's) and its largest peak memory.
absl::Status JobVerdict(DemoJob& job, Restored& restored) {
  ASSIGN_OR_RETURN(std::vector<std::string> outcomes,
                   job.coordinator->AllGather(
                       "verified", absl::StrCat(restored.verified ? 1 : 0, ",",
                                                PeakRssBytes())));
  for (const std::string& o : outcomes) {
    std::pair<std::string, std::string> fields =
        absl::StrSplit(o, absl::MaxSplits(',', 1));
    restored.verified &= fields.first == "1";
    int64_t rss = 0;
    if (absl::SimpleAtoi(fields.second, &rss)) {
      restored.peak_rss = std::max(restored.peak_rss, rss);
    }
  }
  return absl::OkStatus();
}

// 3. Restore step `latest` into host memory, compared with the training
// state; then (training over, its arrays freed) onto the transposed mesh of
// the same devices, copied back and compared with the verified host copy.
// Every process checks its own shards; the job's verdict is all of theirs.
absl::StatusOr<Restored> RestoreAndCheck(DemoJob& job,
                                         CheckpointManager& manager,
                                         int64_t latest) {
  Restored restored;
  std::vector<uint8_t> expected;
  HostArrays host = WholeArraysInHost(job.model);
  ASSIGN_OR_RETURN(restored.host, manager.Restore(latest, host.targets));
  for (size_t a = 0; a < job.model.size(); ++a) {
    const Box whole = Box::FromShape(job.model[a].shape);
    const int64_t item = ItemSize(job.model[a].dtype);
    for (const Part& part : job.parts[a]) {
      expected.assign(part.host.size(), 0);
      CopyBox(host.bytes[a].data(), whole, expected.data(), part.box, part.box,
              item);
      restored.verified &= expected == part.host;
    }
  }
  // Training is over: its arrays can go before the other mesh's come.
  job.arrays.clear();
  job.parts.clear();
  ASSIGN_OR_RETURN(Mesh other, OtherMesh(job));
  restored.other_mesh = other.ToString();
  std::vector<std::vector<MemoryBlock>> memory(job.model.size());
  std::vector<RestoreTarget> targets;
  for (size_t a = 0; a < job.model.size(); ++a) {
    ArraySpec spec = job.model[a];
    spec.sharding = NamedSharding{other, spec.sharding.named()->spec};
    ASSIGN_OR_RETURN(RestoreTarget target, DeviceTarget(job, spec, memory[a]));
    targets.push_back(std::move(target));
  }
  ASSIGN_OR_RETURN(restored.mesh, manager.Restore(latest, targets));
  std::vector<uint8_t> back;
  for (size_t a = 0; a < job.model.size(); ++a) {
    const Box whole = Box::FromShape(job.model[a].shape);
    const int64_t item = ItemSize(job.model[a].dtype);
    for (const RestoreDestination& dest : targets[a].destinations) {
      const int64_t bytes = dest.box.num_elements() * item;
      expected.assign(bytes, 0);
      back.assign(bytes, 1);
      CopyBox(host.bytes[a].data(), whole, expected.data(), dest.box, dest.box,
              item);
      const CopyOp op{dest.data, bytes, back.data(), bytes, bytes, 1};
      RETURN_IF_ERROR(dest.device->CopyToHost({&op, 1}).Wait());
      restored.verified &= expected == back;
    }
  }
  memory.clear();
  RETURN_IF_ERROR(JobVerdict(job, restored));
  return restored;
}

// Evicts every file under `dir` from the page cache (posix_fadvise
// DONTNEED: the files are synced, so their pages are clean and go), as a job
// restarted on another node finds them. Memory filesystems (/dev/shm) keep
// theirs: their files are the memory.
void EvictFromPageCache(const std::string& dir) {
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       !error && it != std::filesystem::recursive_directory_iterator();
       it.increment(error)) {
    if (!it->is_regular_file(error)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// 3 with a local tier: the latest step from the tier that holds it, then
// the newest durable step, each onto this process's shards of the training
// mesh; the first compared with the training state.
absl::StatusOr<Restored> RestoreTiersAndCheck(DemoJob& job,
                                              CheckpointManager& manager) {
  Restored restored;
  std::vector<std::vector<MemoryBlock>> memory(job.model.size());
  std::vector<RestoreTarget> targets;
  std::vector<std::vector<const Part*>> part_of(job.model.size());
  for (size_t a = 0; a < job.model.size(); ++a) {
    ASSIGN_OR_RETURN(RestoreTarget target,
                     DeviceTarget(job, job.model[a], memory[a]));
    for (const RestoreDestination& dest : target.destinations) {
      const Part* part = nullptr;
      for (const Part& p : job.parts[a]) {
        if (p.box == dest.box) part = &p;
      }
      part_of[a].push_back(part);
    }
    targets.push_back(std::move(target));
  }
  // Each restore's time is the job's: from all ranks starting to the last
  // one done.
  RETURN_IF_ERROR(job.coordinator->Barrier("restore latest"));
  absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(restored.tiered, manager.Restore(std::nullopt, targets));
  RETURN_IF_ERROR(job.coordinator->Barrier("restored latest"));
  restored.tiered->elapsed = absl::Now() - start;
  std::vector<uint8_t> back;
  for (size_t a = 0; a < job.model.size(); ++a) {
    const int64_t item = ItemSize(job.model[a].dtype);
    for (size_t d = 0; d < targets[a].destinations.size(); ++d) {
      const RestoreDestination& dest = targets[a].destinations[d];
      const int64_t bytes = dest.box.num_elements() * item;
      back.assign(bytes, 1);
      const CopyOp op{dest.data, bytes, back.data(), bytes, bytes, 1};
      RETURN_IF_ERROR(dest.device->CopyToHost({&op, 1}).Wait());
      restored.verified &=
          part_of[a][d] != nullptr && part_of[a][d]->host == back;
    }
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> durable, manager.Latest());
  if (durable) {
    RestoreOptions durable_only;
    durable_only.local_tier = false;
    RETURN_IF_ERROR(job.coordinator->Barrier("restore durable"));
    start = absl::Now();
    ASSIGN_OR_RETURN(restored.durable,
                     manager.Restore(*durable, targets, nullptr, durable_only));
    RETURN_IF_ERROR(job.coordinator->Barrier("restored durable"));
    restored.durable->elapsed = absl::Now() - start;
  }
  memory.clear();
  RETURN_IF_ERROR(JobVerdict(job, restored));
  return restored;
}

}  // namespace hoist::demo
