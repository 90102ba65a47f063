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
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "hoist/mutex.h"
#include "hoist/option_names.h"
#include "hoist/predict.h"
#include "hoist/tools/command_error.h"
#include "hoist/tools/demo_job.h"

namespace hoist {
namespace demo {

namespace {

// The flags that the parser cannot check alone: --steps against
// --save-every, --step-time's duration, --lose-local's --local-root.
absl::StatusOr<absl::Duration> CheckFlags(const DemoFlags& flags) {
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
  return step_time;
}

// The root's storage, opened once for the job (the CLI's storage flags and
// --io), and the writer streams it chooses when --writers is 0.
absl::Status OpenRootStorage(DemoFlags& flags, DemoJob& job) {
  ASSIGN_OR_RETURN(flags.storage.io, ParseIoEngine(flags.io));
  ASSIGN_OR_RETURN(job.storage, OpenStorage(job.root, flags.storage));
  if (flags.writers == 0) {  // the root's storage chooses, as for any job
    flags.writers = job.storage->preferred_writer_streams();
  }
  if (flags.lose_local >= job.processes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--lose-local %d: the job has ranks 0 to %d",
                        flags.lose_local, job.processes - 1));
  }
  return absl::OkStatus();
}

CheckpointManagerOptions ManagerOptions(const DemoFlags& flags,
                                        const DemoJob& job, int64_t pool,
                                        int64_t persist_every) {
  CheckpointManagerOptions options;
  options.pool_bytes = pool;
  options.host_memory_budget = job.host_memory_budget;
  options.plan.writer_streams = flags.writers;
  options.keep_last = flags.keep;
  options.metrics_path = flags.metrics;
  options.io = flags.storage.io;  // the local tier's
  options.persist_every = persist_every;
  options.local.root = flags.local_root;
  options.local.replicas = flags.replicas;
  return options;
}

void PrintHeader(const DemoFlags& flags, const DemoJob& job, int64_t pool) {
  std::cout << absl::StrFormat(
      "hoist demo: GPT-style model, %d layers x d_model %d, bf16 weights + "
      "fp32 Adam moments: %s in %d arrays\n"
      "%s over %d %s devices in %d process%s; %s staging pool (%s of host "
      "memory) per process; %d writer streams; %s I/O; root %s\n\n"
      "%5s %-11s %11s %11s %11s %9s %11s\n",
      job.config.layers, job.config.d_model, FormatBytes(job.model_bytes),
      job.model.size(), job.mesh_name, job.mesh_devices, job.backend->name(),
      job.processes, job.processes == 1 ? "" : "es", FormatBytes(pool),
      FormatBytes(job.host_memory_budget), flags.writers, flags.io, job.root,
      "step", "mode", "blocked", "staged", "committed", "GB/s", "dispatches");
}

// With a local tier: the job stops, a lost node takes its local root with
// it (replicas it kept for others included), the job restarts (its pool
// pinned before it restores, so that neither restore timed pays for it)
// and restores from each tier.
absl::StatusOr<Restored> RestartAndRestoreTiers(
    const DemoFlags& flags, DemoJob& job, CheckpointManagerOptions options,
    std::unique_ptr<CheckpointManager>& manager) {
  manager.reset();
  const std::string local_root = absl::StrReplaceAll(
      flags.local_root, {{"{rank}", absl::StrCat(job.rank)}});
  if (job.rank == flags.lose_local) {
    std::filesystem::remove_all(local_root);
    std::cerr << absl::StrFormat("hoist demo: rank %d lost %s\n", job.rank,
                                 local_root);
  }
  if (flags.cold) {
    EvictFromPageCache(job.root);
    EvictFromPageCache(local_root);
  }
  RETURN_IF_ERROR(job.coordinator->Barrier("local tier lost"));
  options.pool_pinning = CheckpointManagerOptions::PoolPinning::kAtOpen;
  ASSIGN_OR_RETURN(
      manager, CheckpointManager::Open(job.root, *job.backend, *job.coordinator,
                                       options, job.storage.get()));
  return RestoreTiersAndCheck(job, *manager);
}

// The job's end: the manager closed on every rank, the trace written, the
// default root removed.
absl::Status Finish(const DemoFlags& flags, const DemoJob& job,
                    std::unique_ptr<CheckpointManager> manager,
                    const Tracer& tracer) {
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
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDemo(const DemoFlags& given) {
  DemoFlags flags = given;
  ASSIGN_OR_RETURN(const int64_t size, ParseBytes(flags.size));
  ASSIGN_OR_RETURN(const absl::Duration step_time, CheckFlags(flags));
  const int64_t persist_every =
      flags.persist_every > 0
          ? flags.persist_every
          : (flags.local_root.empty() ? 1 : 2 * int64_t{flags.save_every});
  ASSIGN_OR_RETURN(DemoJob job, SetUp(flags, size));
  RETURN_IF_ERROR(OpenRootStorage(flags, job));
  ASSIGN_OR_RETURN(const int64_t pool, PoolBytes(flags, job.model_bytes));
  CheckpointManagerOptions options =
      ManagerOptions(flags, job, pool, persist_every);
  Tracer tracer;
  if (!flags.trace.empty()) options.tracer = &tracer;
  ASSIGN_OR_RETURN(
      Predicted predicted,
      Predict(flags, job, pool, job.host_memory_budget, options.plan));
  ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointManager> manager,
      CheckpointManager::Open(job.root, *job.backend, *job.coordinator, options,
                              job.storage.get()));
  const bool print = job.lead && !flags.json;
  if (print) PrintHeader(flags, job, pool);

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
    ASSIGN_OR_RETURN(restored,
                     RestartAndRestoreTiers(flags, job, options, manager));
  }
  RETURN_IF_ERROR(Finish(flags, job, std::move(manager), tracer));
  Report(flags, job, trained, restored, predicted, *latest, persist_every,
         print);
  if (!restored.verified) {
    return absl::DataLossError("restored arrays differ from the saved ones");
  }
  return absl::OkStatus();
}

}  // namespace demo

// The demo's flags, one statement each (a list, not logic: longer than
// the other functions by nature).
void AddDemoCommand(CLI::App& app, const StorageOptions& storage,
                    const ProgressFlags& progress) {
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
      ->check(CLI::IsMember(IoEngineNames()));
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
  cmd->add_option("--metrics", flags->metrics,
                  "Append each save's and restore's phases to this file, one "
                  "JSON line per phase per rank ({rank} is replaced by the "
                  "rank; docs/observability.md)");
  cmd->callback([flags, &storage, &progress] {
    flags->storage = storage;
    flags->quiet = progress.quiet;
    absl::Status status = demo::RunDemo(*flags);
    if (!status.ok()) FailCommand("demo", status);
  });
}

}  // namespace hoist
