// The demo, in order:
//   1. Build a GPT-style model (bf16 weights, fp32 Adam moments) on a
//      2 (data) x 4 (model) mesh of 8 host devices; every device holds its
//      own shards, replicas included.
//   2. Train: each step changes every shard (identically on replicas) and
//      waits --step-time, standing in for the devices' forward and backward
//      pass (the host is idle meanwhile, as it is on a GPU job); every
//      --save-every steps it saves, alternating the two modes:
//      staged (Save returns once the arrays are copied off the devices) and
//      dispatched (Save returns once the copies are enqueued; the loop does
//      its forward/backward work, then waits for staging before the next
//      change). Time blocked = time the loop spent inside hoist's calls.
//   3. Restore the latest step onto a 4 x 2 mesh and into host memory and
//      compare every byte with the training state of that step.
//      With a local tier (--local-root), the job instead stops, loses one
//      rank's local root if asked (--lose-local), restarts, and restores
//      the latest step (local) onto the training mesh, compared with the
//      training state, then the newest durable step onto the same mesh for
//      comparison: a local step holds each process's own shards, so it
//      restores the sharding it was saved with.
// Under mpirun (or with --coordinator mpi) the job's processes share the
// mesh's devices: each holds mesh/size of them, saves its share into the
// common root, restores its own shards, and rank 0 prints the summary.
#include "hoist/tools/demo_command.h"

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
#include "hoist/mutex.h"
#include "hoist/predict.h"
#include "hoist/tools/command_error.h"
#include "hoist/tools/demo_job.h"
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"

namespace hoist {
namespace demo {
namespace {

// The "KEY: N kB" line of a /proc file, in bytes, or -1.
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

// A status line redrawn every 100 ms on a terminal, showing the newest save:
// bytes staged and written, rate and ETA. Owns its drawing thread; draws
// nothing when disabled (stdout is not a terminal, or --json).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) {
    if (enabled) thread_ = std::thread([this] { Run(); });
  }
  ~ProgressLine() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void Track(const SaveHandle& handle) {
    MutexLock lock(&mu_);
    handle_ = handle;
  }

 private:
  bool Stopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; }

  void Run() {
    MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(Condition(this, &ProgressLine::Stopped),
                                 absl::Milliseconds(100))) {
      if (!handle_) continue;
      const SaveProgress& p = handle_->progress();
      const double total =
          static_cast<double>(std::max<int64_t>(1, p.total_bytes));
      const double staged = static_cast<double>(p.staged_bytes.load());
      const double written = static_cast<double>(p.written_bytes.load());
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - p.start);
      const double rate = elapsed > 0 ? written / elapsed : 0;
      constexpr int kWidth = 24;
      const int done = static_cast<int>(kWidth * written / total);
      std::string bar(done, '#');
      bar.resize(kWidth, '-');
      const bool finished = handle_->status().ok() || written >= total;
      std::cout << absl::StrFormat(
                       "\r\033[Kstep %d [%s] staged %s, written %s of %s, "
                       "%.2f GB/s%s",
                       handle_->step(), bar, FormatBytes(staged),
                       FormatBytes(written), FormatBytes(total), rate / 1e9,
                       finished
                           ? ", committing"
                           : absl::StrFormat(
                                 ", ETA %.1fs",
                                 rate > 0 ? (total - written) / rate : 0.0))
                << std::flush;
    }
    if (handle_) std::cout << "\r\033[K" << std::flush;
  }

  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<SaveHandle> handle_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Copies every part's host bytes to its replicas: one dispatch per device.
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

absl::StatusOr<Predicted> Predict(const DemoFlags& flags, const DemoJob& job,
                                  int64_t pool, int64_t budget,
                                  const SavePlanOptions& plan_options) {
  Predicted out;
  // The rates measured are a local disk's: no prediction for a root that
  // is not on one (an object store).
  if (!flags.predict || !job.storage->capabilities().local) return out;
  out.on = true;
  std::string measured;
  if (job.lead) {
    // Beside the root, which the manager creates (and pins its pool) later,
    // with its parents: those first, as the manager would.
    std::string dir = std::filesystem::path(job.root).parent_path().string();
    if (dir.empty()) dir = ".";
    std::error_code made;
    std::filesystem::create_directories(dir, made);
    if (made) {
      return absl::FailedPreconditionError(
          absl::StrFormat("--root %s: cannot create its parent %s: %s",
                          job.root, dir, made.message()));
    }
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(SaveRates rates,
                     MeasureSaveRates(*job.backend, *job.storage, dir,
                                      {.bytes = std::clamp<int64_t>(
                                           job.model_bytes, int64_t{32} << 20,
                                           int64_t{256} << 20),
                                       .writer_streams = flags.writers}));
    out.measure_s = absl::ToDoubleSeconds(absl::Now() - start);
    measured =
        absl::StrFormat("%a,%a,%a,%a,%a", rates.d2h_gbps, rates.host_gbps,
                        rates.write_gbps, rates.commit_s, out.measure_s);
  }
  ASSIGN_OR_RETURN(measured, job.coordinator->Broadcast("rates", measured, 0));
  std::vector<std::string> fields = absl::StrSplit(measured, ',');
  double* values[] = {&out.rates.d2h_gbps, &out.rates.host_gbps,
                      &out.rates.write_gbps, &out.rates.commit_s,
                      &out.measure_s};
  if (fields.size() != std::size(values)) {
    return absl::InternalError("the lead's rates did not arrive whole");
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    *values[i] = std::strtod(fields[i].c_str(), nullptr);
  }
  // Every process writes to the one root: the lead's rate, measured alone,
  // is taken as the job's limit too.
  if (job.processes > 1) out.rates.fs_gbps = out.rates.write_gbps;
  const Topology topology = Topology::Uniform(
      job.processes, static_cast<int>(job.backend->devices().size()));
  ASSIGN_OR_RETURN(SavePlan plan,
                   MakeSavePlan(job.model, topology, plan_options));
  ASSIGN_OR_RETURN(out.save,
                   PredictSave(plan, topology, pool, out.rates, budget));
  return out;
}

// The saves of `trained` as the model sees them: the manager's saver runs
// saves one after another, so a save asked for before the previous one has
// committed starts (and, in either mode, returns) only then.
void Schedule(const Trained& trained, Predicted& predicted) {
  if (!predicted.on || trained.requested_at.empty()) return;
  double committed = 0, blocked = 0, saved = 0, queued = 0;
  int staged = 0;
  for (size_t k = 0; k < trained.requested_at.size(); ++k) {
    const double asked = trained.requested_at[k];
    const double start = std::max(asked, committed);
    committed = start + predicted.save.save_s;
    queued += start - asked;
    saved += committed - asked;
    if (trained.mode[k] == 0) {
      blocked += start - asked + predicted.save.blocked_s;
      ++staged;
    }
  }
  const double n = static_cast<double>(trained.requested_at.size());
  predicted.blocked_s = blocked / std::max(1, staged);
  predicted.save_s = saved / n;
  predicted.queued_s = queued / n;
}

// 2. Train: every step changes every array; every --save-every steps a save,
// alternating staged and dispatched mode; then the table of saves.
absl::StatusOr<Trained> Train(const DemoFlags& flags, absl::Duration step_time,
                              DemoJob& job, CheckpointManager& manager,
                              bool print) {
  // The devices computing: the host has nothing to do until they finish.
  const auto compute = [step_time] {
    Notification never;
    (void)never.WaitForNotificationWithTimeout(step_time);
  };
  // The device buffers stay where SetUp allocated them: registered once,
  // each save reads none of them (--arrays given: every save is handed
  // every array, as a job whose arrays move must).
  std::optional<RegisteredArrays> registered;
  if (flags.arrays == "registered") {
    ASSIGN_OR_RETURN(registered, manager.Register(job.arrays));
  }
  Trained trained;
  std::optional<ProgressLine> progress;
  progress.emplace(print && isatty(STDOUT_FILENO) != 0);
  std::vector<SaveHandle> handles;
  std::vector<int> handle_mode;
  std::vector<double> handle_blocked;
  const absl::Time began = absl::Now();
  for (int step = 1; step <= flags.steps; ++step) {
    // The optimizer step: new values, on every replica.
    for (auto& array : job.parts) {
      for (Part& part : array) {
        Mutate(part.host.data(), static_cast<int64_t>(part.host.size()),
               part.seed, step);
      }
    }
    RETURN_IF_ERROR(Upload(job.parts));
    if (step % flags.save_every != 0) {
      compute();
      continue;
    }
    const int mode = static_cast<int>(handles.size() % 2);
    const absl::Time start = absl::Now();
    trained.mode.push_back(mode);
    trained.requested_at.push_back(absl::ToDoubleSeconds(start - began));
    const ReturnWhen when =
        mode == 0 ? ReturnWhen::kStaged : ReturnWhen::kDispatched;
    std::string metadata = absl::StrFormat(R"({"step": %d})", step);
    ASSIGN_OR_RETURN(
        SaveHandle handle,
        registered ? manager.Save(step, *registered, std::move(metadata), when)
                   : manager.Save(step, job.arrays, std::move(metadata), when));
    double blocked = absl::ToDoubleSeconds(absl::Now() - start);
    // Forward and backward run while the copies proceed (dispatched mode)
    // or after them (staged mode)...
    compute();
    if (mode == 1) {
      // ...and the optimizer step waits for staging before it changes them.
      const absl::Time wait = absl::Now();
      RETURN_IF_ERROR(handle.WaitStaged());
      blocked += absl::ToDoubleSeconds(absl::Now() - wait);
    }
    progress->Track(handle);
    handles.push_back(handle);
    handle_mode.push_back(mode);
    handle_blocked.push_back(blocked);
    trained.last_saved = step;
  }
  RETURN_IF_ERROR(manager.WaitUntilFinished());
  progress.reset();  // the status line goes before the table
  // Each process knows the bytes it wrote and sent to its replica holders;
  // the job's are their sums.
  std::string mine;
  std::string blocked_reason;  // the first save's that waited for storage
  for (SaveHandle& handle : handles) {
    ASSIGN_OR_RETURN(SaveInfo info, handle.WaitCommitted());
    absl::StrAppend(&mine, info.bytes, ",", info.replicated_bytes, ",");
    if (blocked_reason.empty()) blocked_reason = info.blocked_reason;
  }
  if (!blocked_reason.empty() && !flags.json) {
    std::cerr << absl::StrFormat("hoist demo: rank %d: %s\n", job.rank,
                                 blocked_reason);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> theirs,
                   job.coordinator->AllGather("bytes", mine));
  std::vector<int64_t> job_bytes(2 * handles.size(), 0);
  for (const std::string& list : theirs) {
    size_t i = 0;
    for (absl::string_view b : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      int64_t v = 0;
      if (i < job_bytes.size() && absl::SimpleAtoi(b, &v)) job_bytes[i] += v;
      ++i;
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    ASSIGN_OR_RETURN(SaveInfo info, handles[i].WaitCommitted());
    info.bytes = job_bytes[2 * i];
    info.replicated_bytes = job_bytes[2 * i + 1];
    for (ModeStats* m : {&trained.modes[handle_mode[i]],
                         &trained.tiers[static_cast<int>(info.tier)]}) {
      ++m->saves;
      m->blocked.push_back(handle_blocked[i]);
      m->dispatch_s += absl::ToDoubleSeconds(info.dispatched);
      m->staged_s += absl::ToDoubleSeconds(info.staged);
      m->committed_s += absl::ToDoubleSeconds(info.committed);
      m->bytes = info.bytes;
      m->dispatches = info.dispatches;
      m->replicated_bytes = info.replicated_bytes;
    }
    if (print) {
      std::cout << absl::StrFormat(
          "%5d %-11s %10.3fs %10.3fs %10.3fs %9.2f %11d%s\n", info.step,
          handle_mode[i] == 0 ? "staged" : "dispatched", handle_blocked[i],
          absl::ToDoubleSeconds(info.staged),
          absl::ToDoubleSeconds(info.committed),
          info.bytes / 1e9 / absl::ToDoubleSeconds(info.committed),
          info.dispatches,
          flags.local_root.empty() ? ""
                                   : "  " + std::string(TierName(info.tier)));
    }
  }
  return trained;
}

// A restore target for `spec`: this process's devices' shards of it, each
// in device memory allocated for it (kept in `memory`).
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

absl::Status RunDemo(const DemoFlags& given) {
  DemoFlags flags = given;
  ASSIGN_OR_RETURN(int64_t size, ParseBytes(flags.size));
  if (flags.steps < 1 || flags.save_every < 1 ||
      flags.steps < flags.save_every) {
    return absl::InvalidArgumentError(
        "--steps and --save-every must be >= 1, with at least one save");
  }
  absl::Duration step_time;
  if (!absl::ParseDuration(flags.step_time, &step_time) ||
      step_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--step-time '%s' is not a duration such as 250ms", flags.step_time));
  }
  if (flags.local_root.empty() && flags.lose_local >= 0) {
    return absl::InvalidArgumentError("--lose-local needs --local-root");
  }
  const int64_t persist_every =
      flags.persist_every > 0
          ? flags.persist_every
          : (flags.local_root.empty() ? 1 : 2 * int64_t{flags.save_every});
  ASSIGN_OR_RETURN(DemoJob job, SetUp(flags, size));
  flags.storage.io =
      flags.io == "io_uring" ? IoEngine::kIoUring : IoEngine::kPosix;
  ASSIGN_OR_RETURN(job.storage, OpenStorage(job.root, flags.storage));
  if (flags.writers == 0) {  // the root's storage chooses, as for any job
    flags.writers = job.storage->preferred_writer_streams();
  }
  if (flags.lose_local >= job.processes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--lose-local %d: the job has ranks 0 to %d",
                        flags.lose_local, job.processes - 1));
  }

  ASSIGN_OR_RETURN(const int64_t pool, PoolBytes(flags, job.model_bytes));
  const int64_t budget = job.host_memory_budget;
  CheckpointManagerOptions options;
  options.pool_bytes = pool;
  options.host_memory_budget = budget;
  options.plan.writer_streams = flags.writers;
  options.keep_last = flags.keep;
  options.io = flags.storage.io;  // the local tier's
  options.persist_every = persist_every;
  options.local.root = flags.local_root;
  options.local.replicas = flags.replicas;
  Tracer tracer;
  if (!flags.trace.empty()) options.tracer = &tracer;
  ASSIGN_OR_RETURN(Predicted predicted,
                   Predict(flags, job, pool, budget, options.plan));
  ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointManager> manager,
      CheckpointManager::Open(job.root, *job.backend, *job.coordinator, options,
                              job.storage.get()));
  const bool print = job.lead && !flags.json;
  if (print) {
    std::cout << absl::StrFormat(
        "hoist demo: GPT-style model, %d layers x d_model %d, bf16 weights + "
        "fp32 Adam moments: %s in %d arrays\n"
        "%s over %d %s devices in %d process%s; %s staging pool (%s of host "
        "memory) per process; %d writer streams; %s I/O; root %s\n\n"
        "%5s %-11s %11s %11s %11s %9s %11s\n",
        job.config.layers, job.config.d_model, FormatBytes(job.model_bytes),
        job.model.size(), job.mesh_name, job.mesh_devices, job.backend->name(),
        job.processes, job.processes == 1 ? "" : "es", FormatBytes(pool),
        FormatBytes(budget), flags.writers, flags.io, job.root, "step", "mode",
        "blocked", "staged", "committed", "GB/s", "dispatches");
  }

  ASSIGN_OR_RETURN(Trained trained,
                   Train(flags, step_time, job, *manager, print));
  Schedule(trained, predicted);
  std::optional<int64_t> latest = trained.last_saved;
  Restored restored;
  if (flags.local_root.empty()) {
    ASSIGN_OR_RETURN(latest, manager->Latest());
    if (latest != trained.last_saved) {
      return absl::InternalError(
          absl::StrFormat("latest committed step is %d, expected %d",
                          latest.value_or(-1), trained.last_saved));
    }
    ASSIGN_OR_RETURN(restored, RestoreAndCheck(job, *manager, *latest));
  } else {
    // The job stops; a lost node takes its local root with it (replicas it
    // kept for others included); the job restarts and restores.
    manager.reset();
    if (job.rank == flags.lose_local) {
      const std::string lost = absl::StrReplaceAll(
          flags.local_root, {{"{rank}", absl::StrCat(job.rank)}});
      std::filesystem::remove_all(lost);
      std::cerr << absl::StrFormat("hoist demo: rank %d lost %s\n", job.rank,
                                   lost);
    }
    if (flags.cold) {
      EvictFromPageCache(job.root);
      EvictFromPageCache(absl::StrReplaceAll(
          flags.local_root, {{"{rank}", absl::StrCat(job.rank)}}));
    }
    RETURN_IF_ERROR(job.coordinator->Barrier("local tier lost"));
    // The restarted job pins its pool before it restores, so that neither
    // restore timed below pays for it.
    options.pool_pinning = CheckpointManagerOptions::PoolPinning::kAtOpen;
    ASSIGN_OR_RETURN(manager, CheckpointManager::Open(job.root, *job.backend,
                                                      *job.coordinator, options,
                                                      job.storage.get()));
    ASSIGN_OR_RETURN(restored, RestoreTiersAndCheck(job, *manager));
  }

  manager.reset();
  RETURN_IF_ERROR(job.coordinator->Barrier("done"));
  if (!flags.trace.empty()) {
    RETURN_IF_ERROR(tracer.WriteFile(
        job.processes == 1
            ? flags.trace
            : absl::StrFormat("%s.rank%d", flags.trace, job.rank)));
  }
  if (job.lead && job.own_root && !flags.keep_files) {
    std::filesystem::remove_all(job.root);
  }
  Report(flags, job, trained, restored, predicted, *latest, persist_every,
         print);
  if (!restored.verified) {
    return absl::DataLossError("restored arrays differ from the saved ones");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace demo

void AddDemoCommand(CLI::App& app, const StorageOptions& storage) {
  auto flags = std::make_shared<demo::DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "The main job: a GPT-style model sharded over 8 devices (2 x 4 mesh) "
      "trains and saves asynchronously; the latest step is restored onto a "
      "4 x 2 mesh and into host memory and checked bit-exact.");
  cmd->add_option("--backend", flags->backend,
                  "host (logical devices over host RAM) or cuda (this "
                  "machine's GPUs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "cuda"}));
  cmd->add_option("--mesh", flags->mesh,
                  "DATAxMODEL devices; the restore uses MODELxDATA")
      ->capture_default_str();
  cmd->add_option("--coordinator", flags->coordinator,
                  "single (one process), mpi (the ranks of mpirun share the "
                  "mesh's devices and one root), or auto: mpi when started "
                  "by mpirun with several ranks")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "single", "mpi"}));
  cmd->add_option("--size", flags->size, "Model size (weights + Adam)")
      ->capture_default_str();
  cmd->add_option("--vocab", flags->vocab,
                  "Vocabulary (embedding rows); small values make small models")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--pool", flags->pool,
                  "Pinned staging pool; auto: the whole save fits, so "
                  "training waits only for the device-to-host copies")
      ->capture_default_str();
  cmd->add_option("--host-memory-budget", flags->host_memory_budget,
                  "Host memory a save may hold per process, the pool "
                  "included: past the pool, waves are staged into host "
                  "memory so training waits only for the copies. Bytes "
                  "(e.g. 8GiB, at least --pool), or auto: half the memory "
                  "available, split among this host's processes")
      ->capture_default_str();
  cmd->add_option("--steps", flags->steps, "Training steps")
      ->capture_default_str();
  cmd->add_option("--save-every", flags->save_every, "Save every N steps")
      ->capture_default_str();
  cmd->add_option("--writers", flags->writers,
                  "Writer streams (data files) per process; 0: the root's "
                  "storage chooses (2 on a local disk, 4 on S3, 16 on GCS)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  cmd->add_option("--keep", flags->keep, "Keep the newest N steps (0: all)")
      ->capture_default_str()
      ->check(NonNegative());
  cmd->add_option("--io", flags->io, "I/O engine: posix or io_uring")
      ->capture_default_str()
      ->check(CLI::IsMember({"posix", "io_uring"}));
  cmd->add_option(
         "--host-copies", flags->host_copies,
         "host backend: how its devices' copy threads are scheduled (on "
         "fewer cores than devices, their CPU copies compete with the "
         "loop). batch: SCHED_BATCH, a fair share of the cores, but a save "
         "waking them never preempts the loop's thread, so a "
         "dispatched-mode save returns before its copies take the core; "
         "normal: like any thread; idle: SCHED_IDLE, only cycles no other "
         "thread wants (a busy host starves them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"batch", "normal", "idle"}));
  cmd->add_option(
         "--arrays", flags->arrays,
         "How saves are given the model. registered: once, before the "
         "first (CheckpointManager::Register; the demo's device buffers "
         "stay put, as a PyTorch job's do), so a save reads no array and "
         "dispatches copies prepared at the first; given: every save is "
         "handed every array (Save(step, arrays)), as a job whose arrays "
         "move (JAX) must")
      ->capture_default_str()
      ->check(CLI::IsMember({"registered", "given"}));
  cmd->add_option("--step-time", flags->step_time,
                  "Device compute per training step, during which the host "
                  "waits (e.g. 250ms, 1s)")
      ->capture_default_str();
  cmd->add_option("--root", flags->root,
                  "Checkpoint root (default: a new directory here, removed "
                  "at the end unless --keep-files)");
  cmd->add_flag("--keep-files", flags->keep_files,
                "Keep the default root's checkpoints");
  cmd->add_option("--trace", flags->trace,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the "
                  "saves: a track per device, per writer stream, and the "
                  "commit phases");
  cmd->add_flag("--json", flags->json,
                "Print the summary as JSON (predicted_blocked_s and "
                "predicted_save_s beside blocked_s and save_s)");
  cmd->add_option("--local-root", flags->local_root,
                  "Add a local tier: each process's own root ({rank} is "
                  "replaced by its rank; node-local disk or /dev/shm). Steps "
                  "that are not durable steps are saved there, each "
                  "process's part copied to --replicas - 1 peers; the "
                  "restore then takes the latest step from either tier onto "
                  "the training mesh (see docs/tiers.md)");
  cmd->add_option("--replicas", flags->replicas,
                  "Copies of each process's local part (its own included)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--persist-every", flags->persist_every,
                  "Only steps divisible by N go to the durable root (0: 2 x "
                  "--save-every with --local-root, else every save)")
      ->capture_default_str()
      ->check(NonNegative());
  cmd->add_option("--lose-local", flags->lose_local,
                  "Before the restore, remove rank N's local root, as a lost "
                  "node would (needs --local-root)")
      ->check(NonNegative());
  cmd->add_flag("--cold", flags->cold,
                "With --local-root: before the restores, evict every "
                "checkpoint file of both tiers from the page cache, as a job "
                "restarted on another node finds them (files in /dev/shm "
                "stay: they are memory)");
  cmd->add_flag("!--no-predict", flags->predict,
                "Skip measuring this machine's copy and write rates at "
                "start-up, and the prediction made from them (always "
                "skipped for an s3:// or gs:// root: the rates are the "
                "local disk's)");
  cmd->callback([flags, &storage] {
    flags->storage = storage;
    absl::Status status = demo::RunDemo(*flags);
    if (!status.ok()) FailCommand("demo", status);
  });
}

}  // namespace hoist
