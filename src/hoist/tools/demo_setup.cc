// The demo's job: its processes and devices, the model sharded on the
// mesh, the training state uploaded to the devices, and the memory check.
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

int64_t ProcBytes(const char* path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0 && line.size() > key.size() &&
        line[key.size()] == ':') {
      return std::stoll(line.substr(key.size() + 1)) * 1024;
    }
  }
  return -1;
}

int64_t PeakRssBytes() { return ProcBytes("/proc/self/status", "VmHWM"); }

// A training step's change: one word in every 64 bytes.
void Mutate(uint8_t* data, int64_t bytes, uint64_t seed, int step) {
  const uint64_t delta = (seed + 1) * 0xBF58476D1CE4E5B9ull ^ step;
  for (int64_t at = 0; at + 8 <= bytes; at += 64) {
    uint64_t word;
    std::memcpy(&word, data + at, 8);
    word += delta;
    std::memcpy(data + at, &word, 8);
  }
}

uint64_t SeedOf(size_t array, const Box& box) {
  uint64_t seed = array * 1000003;
  for (int64_t v : box.origin()) seed = seed * 31 + static_cast<uint64_t>(v);
  return seed;
}

absl::Status Upload(std::vector<std::vector<Part>>& parts) {
  absl::flat_hash_map<Device*, std::vector<CopyOp>> ops;
  for (auto& array : parts) {
    for (Part& part : array) {
      const int64_t bytes = static_cast<int64_t>(part.host.size());
      for (auto& [device, memory] : part.replicas) {
        ops[device].push_back(
            {part.host.data(), bytes, memory.data(), bytes, bytes, 1});
      }
    }
  }
  std::vector<Future<>> copies;
  for (auto& [device, device_ops] : ops) {
    copies.push_back(device->CopyFromHost(device_ops));
  }
  return WhenAll(copies).Wait();
}

// The mesh the demo restores onto: the training mesh transposed.
absl::StatusOr<Mesh> OtherMesh(const DemoJob& job) {
  return Mesh::Create({"data", "model"},
                      {job.mesh_shape.second, job.mesh_shape.first});
}

// The staging pool: --pool, or "auto": room for a whole save (plus the 4
// KiB rounding of each slice), so staging never waits for storage.
absl::StatusOr<int64_t> PoolBytes(const DemoFlags& flags, int64_t model_bytes) {
  if (flags.pool != "auto") return ParseBytes(flags.pool);
  return model_bytes + model_bytes / 64 + (int64_t{16} << 20);
}

// The manager's host memory budget for --host-memory-budget and the pool
// (collective when auto).
absl::StatusOr<int64_t> BudgetBytes(const DemoFlags& flags, int64_t pool,
                                    Coordinator& coordinator) {
  CheckpointManagerOptions options;
  options.pool_bytes = pool;
  if (flags.host_memory_budget != "auto") {
    ASSIGN_OR_RETURN(options.host_memory_budget,
                     ParseBytes(flags.host_memory_budget));
  }
  return ResolveHostMemoryBudget(options, coordinator);
}

// Refuses, before anything is allocated, a job whose processes on this
// host would need more memory at their peak than the host has available
// (the kernel's OOM killer would end the job midway, at the restore).
// A process peaks at the larger of two moments: the restore into host
// memory beside the training state (its devices' arrays on the training
// mesh, whose host copies the steps mutate, the staging pool and the
// overflow a save stages beside it, every array whole in host memory), and
// the restore onto the other mesh, once the training state is freed (that
// mesh's device arrays, the pool, the host arrays). With the host backend
// the devices' arrays are host memory too.
absl::Status CheckMemory(const DemoFlags& flags, const DemoJob& job,
                         const Mesh& other) {
  const int64_t whole = job.model_bytes;
  int64_t training = 0, parts = 0, restored = 0;
  for (const ArraySpec& spec : job.model) {
    const int64_t item = ItemSize(spec.dtype);
    // An array that does not fit a mesh is reported where the demo uses
    // that mesh (SetUp's loop, the restore), naming it; every rank alike.
    absl::StatusOr<ShardLayout> layout = spec.sharding.Layout(spec.shape);
    if (!layout.ok()) return absl::OkStatus();
    for (const UniqueBox& unique : layout->unique_boxes) {
      int64_t here = 0;
      for (DeviceId id : unique.devices) here += job.device_of.contains(id);
      if (here > 0) parts += unique.box.num_elements() * item;
      training += here * unique.box.num_elements() * item;
    }
    ArraySpec moved = spec;
    moved.sharding = NamedSharding{other, spec.sharding.named()->spec};
    absl::StatusOr<ShardLayout> other_layout =
        moved.sharding.Layout(moved.shape);
    if (!other_layout.ok()) return absl::OkStatus();
    for (const DeviceShard& shard : other_layout->shards) {
      if (job.device_of.contains(shard.device)) {
        restored += shard.box.num_elements() * item;
      }
    }
  }
  if (flags.backend != "host") training = restored = 0;  // device memory
  ASSIGN_OR_RETURN(const int64_t pool, PoolBytes(flags, whole));
  const int64_t budget = job.host_memory_budget;
  // A save holds its share (in the pool and, past it, in the overflow), at
  // most the budget.
  const int64_t staging = std::max(pool, std::min(budget, parts + pool / 2));
  const int64_t mine =
      std::max(training + parts + staging + whole, restored + pool + whole);
  // This host's processes: those whose host name is this one's.
  const std::string name = HostName();
  ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      job.coordinator->AllGather("memory", absl::StrCat(mine, " ", name)));
  int64_t need = 0;
  int here = 0;
  for (const std::string& entry : all) {
    std::pair<std::string, std::string> fields =
        absl::StrSplit(entry, absl::MaxSplits(' ', 1));
    int64_t bytes = 0;
    if (fields.second == name && absl::SimpleAtoi(fields.first, &bytes)) {
      need += bytes;
      ++here;
    }
  }
  const int64_t available = ProcBytes("/proc/meminfo", "MemAvailable");
  if (available < 0 || need <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "a %s model needs about %s of host memory at its peak (%d process%s "
      "here; per process the larger of: the host devices' arrays %s, their "
      "host copies %s, the staging pool and its overflow %s and the model "
      "restored whole into host memory %s; or, restored onto the %s mesh, its "
      "arrays %s, the pool and the host copy), but this host has %s "
      "available; use a smaller --size%s",
      FormatBytes(whole), FormatBytes(need), here, here == 1 ? "" : "es",
      FormatBytes(training), FormatBytes(parts), FormatBytes(staging),
      FormatBytes(whole), other.ToString(), FormatBytes(restored),
      FormatBytes(available), flags.pool == "auto" ? "" : " or --pool"));
}

// 1. The job: flags checked, the coordinator, the backend, the model, and
// this process's shards on its devices.
absl::StatusOr<DemoJob> SetUp(const DemoFlags& flags, int64_t size) {
  DemoJob job;
  ASSIGN_OR_RETURN(job.mesh_shape, ParseMeshFlag(flags.mesh));
  job.mesh_devices = job.mesh_shape.first * job.mesh_shape.second;
  if (flags.coordinator == "mpi") {
    ASSIGN_OR_RETURN(job.coordinator, MakeMpiCoordinator());
  } else if (flags.coordinator == "auto") {
    ASSIGN_OR_RETURN(job.coordinator, MakeJobCoordinator());
  } else {
    job.coordinator = MakeSingleProcessCoordinator();
  }
  job.rank = job.coordinator->rank();
  job.processes = job.coordinator->size();
  job.lead = job.rank == 0;
  if (job.mesh_devices % job.processes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s mesh's %d devices do not divide among %d processes", flags.mesh,
        job.mesh_devices, job.processes));
  }
  const int64_t local_devices = job.mesh_devices / job.processes;
  job.own_root = flags.root.empty();
  ASSIGN_OR_RETURN(job.root,
                   job.coordinator->Broadcast(
                       "root",
                       job.own_root ? absl::StrFormat("hoist-demo.%d", getpid())
                                    : flags.root,
                       0));
  if (flags.backend == "cuda" && job.processes > 1) {
    return absl::UnimplementedError(
        "the demo runs --backend cuda in one process (each rank's GPUs "
        "would need job-wide device ids)");
  }
  if (flags.backend == "cuda") {
    ASSIGN_OR_RETURN(job.backend, MakeCudaBackend());
  } else {
    ASSIGN_OR_RETURN(
        job.backend,
        MakeHostBackend(
            {.num_devices = static_cast<int>(local_devices),
             .first_device_id = static_cast<DeviceId>(job.rank * local_devices),
             .copy_priority = flags.host_copies == "idle"
                                  ? HostBackendOptions::CopyPriority::kIdle
                              : flags.host_copies == "normal"
                                  ? HostBackendOptions::CopyPriority::kNormal
                                  : HostBackendOptions::CopyPriority::kBatch}));
  }
  if (job.processes == 1 &&
      static_cast<int64_t>(job.backend->devices().size()) < job.mesh_devices) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the %s mesh needs %d devices; the %s backend has %d (try --mesh "
        "1x%d)",
        flags.mesh, job.mesh_devices, flags.backend,
        job.backend->devices().size(), job.backend->devices().size()));
  }
  for (Device* device : job.backend->devices()) {
    job.device_of[device->id()] = device;
  }
  job.config = GptConfigForBytes(size, DType::kBFloat16);
  job.config.vocab = flags.vocab;
  ASSIGN_OR_RETURN(Mesh mesh,
                   Mesh::Create({"data", "model"},
                                {job.mesh_shape.first, job.mesh_shape.second}));
  job.mesh_name = mesh.ToString();
  ASSIGN_OR_RETURN(job.model, GptModel(job.config, mesh));
  for (const ArraySpec& spec : job.model) {
    job.model_bytes +=
        Box::FromShape(spec.shape).num_elements() * ItemSize(spec.dtype);
  }
  ASSIGN_OR_RETURN(Mesh other, OtherMesh(job));
  ASSIGN_OR_RETURN(const int64_t pool, PoolBytes(flags, job.model_bytes));
  ASSIGN_OR_RETURN(job.host_memory_budget,
                   BudgetBytes(flags, pool, *job.coordinator));
  RETURN_IF_ERROR(CheckMemory(flags, job, other));
  job.parts.resize(job.model.size());
  for (size_t a = 0; a < job.model.size(); ++a) {
    const ArraySpec& spec = job.model[a];
    absl::StatusOr<ShardLayout> layout = spec.sharding.Layout(spec.shape);
    if (!layout.ok()) {
      return absl::Status(
          layout.status().code(),
          absl::StrFormat("array '%s' on %s: %s", spec.name, job.mesh_name,
                          layout.status().message()));
    }
    const int64_t item = ItemSize(spec.dtype);
    SaveArray array{spec, {}};
    for (const UniqueBox& unique : layout->unique_boxes) {
      const bool here =
          std::any_of(unique.devices.begin(), unique.devices.end(),
                      [&](DeviceId id) { return job.device_of.contains(id); });
      if (!here) continue;  // another process holds it
      Part part{unique.box, SeedOf(a, unique.box), {}, {}};
      part.host.resize(unique.box.num_elements() * item);
      FillSynthetic(part.host.data(), static_cast<int64_t>(part.host.size()),
                    part.seed);
      for (DeviceId id : unique.devices) {
        if (!job.device_of.contains(id)) continue;
        Device* device = job.device_of.at(id);
        ASSIGN_OR_RETURN(
            MemoryBlock memory,
            device->Allocate(static_cast<int64_t>(part.host.size())));
        array.shards.push_back({id, memory.data()});
        part.replicas.emplace_back(device, std::move(memory));
      }
      job.parts[a].push_back(std::move(part));
    }
    job.arrays.push_back(std::move(array));
  }
  RETURN_IF_ERROR(Upload(job.parts));
  return job;
}

}  // namespace hoist::demo
