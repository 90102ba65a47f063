// The demo's shared types: its flags, its job (processes, devices, model,
// training state), and what training, the prediction and the restores
// found; demo_command.cc runs the job (demo_setup.cc, demo_train.cc and
// demo_restore.cc its steps), demo_report.cc reports it.
#ifndef HOIST_TOOLS_DEMO_JOB_H_
#define HOIST_TOOLS_DEMO_JOB_H_

#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "hoist/box.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/model/sample_model.h"
#include "hoist/predict.h"

namespace hoist::demo {

struct DemoFlags {
  std::string root;
  std::string size = "1GiB";
  std::string pool = "auto";
  std::string host_memory_budget = "auto";  // bytes, or auto (the manager's)
  int steps = 6;
  int save_every = 2;
  int writers = 0;  // 0: the root's storage chooses
  int keep = 2;
  std::string io = "posix";
  std::string host_copies = "batch";
  std::string arrays = "registered";
  std::string step_time = "250ms";
  int64_t vocab = 50257;
  std::string trace;
  std::string backend = "host";
  std::string mesh = "2x4";
  std::string coordinator = "auto";
  bool keep_files = false;
  bool json = false;
  bool predict = true;
  std::string local_root;
  int replicas = 2;
  int64_t persist_every = 0;  // 0: 2 x save_every with a local tier, else 1
  int lose_local = -1;
  bool cold = false;
  std::string metrics;  // CheckpointManagerOptions::metrics_path
  bool quiet = false;   // no status line (the CLI's --quiet)
  // The root's storage: hoist's object-store flags (io from --io).
  StorageOptions storage;
};

struct ModeStats {
  int saves = 0;
  double dispatch_s = 0;  // until the saver had enqueued every copy
  double staged_s = 0;
  double committed_s = 0;
  int64_t bytes = 0;
  int64_t dispatches = 0;
  int64_t replicated_bytes = 0;  // the job's, per save
  std::vector<double> blocked;   // each save's blocked time, in order

  double blocked_sum() const {
    return std::accumulate(blocked.begin(), blocked.end(), 0.0);
  }
};

// The training state: per array, per distinct box, the host copy that is
// the truth, and the device memory of every replica holding it. Devices are
// only reached through copies, as on a GPU.
struct Part {
  Box box;
  uint64_t seed;
  std::vector<uint8_t> host;
  std::vector<std::pair<Device*, MemoryBlock>> replicas;
};

// The demo's job: its processes, this process's devices, the model, and
// this process's shards of the training state.
struct DemoJob {
  std::unique_ptr<Coordinator> coordinator;
  int rank = 0;
  int processes = 1;
  bool lead = true;  // rank 0: prints, and owns the default root
  std::string root;
  bool own_root = false;
  std::unique_ptr<Storage> storage;  // the root's, opened once
  std::pair<int64_t, int64_t> mesh_shape;
  int64_t mesh_devices = 0;
  std::string mesh_name;
  std::unique_ptr<Backend> backend;
  absl::flat_hash_map<DeviceId, Device*> device_of;
  GptConfig config;
  std::vector<ArraySpec> model;
  int64_t model_bytes = 0;
  int64_t host_memory_budget = 0;        // resolved once, as the manager will
  std::vector<std::vector<Part>> parts;  // per array, this process's boxes
  std::vector<SaveArray> arrays;         // what Save() is given
};

// What training measured.
struct Trained {
  ModeStats modes[2];  // staged, dispatched
  ModeStats tiers[2];  // durable, local (Tier's order)
  int64_t last_saved = -1;
  // Per save, in order: its mode and when it was asked for (seconds after
  // the first step began).
  std::vector<int> mode;
  std::vector<double> requested_at;
};

// What the restores found.
struct Restored {
  bool verified = true;
  RestoreStats host;
  RestoreStats mesh;
  // With a local tier: the latest step (from whichever tier holds it) and
  // the newest durable step, both onto the training mesh.
  std::optional<RestoreStats> tiered, durable;
  std::string other_mesh;
  int64_t peak_rss = 0;  // the largest process's
};

// What the demo predicts a save will cost, from rates the lead measures on
// this machine before the pool exists (nothing else competes with it then).
struct Predicted {
  bool on = false;
  SaveRates rates;
  SavePrediction save;  // one save with nothing in flight
  double measure_s = 0;
  // The demo's saves as requested (Schedule): the staged mode's mean
  // blocked time, every save's mean time to commit, and the mean wait
  // behind an earlier save.
  double blocked_s = 0;
  double save_s = 0;
  double queued_s = 0;
};

// The demo's steps, by file. demo_setup.cc: the job (SetUp) and what the
// others share of it.
absl::StatusOr<DemoJob> SetUp(const DemoFlags& flags, int64_t size);
absl::StatusOr<int64_t> PoolBytes(const DemoFlags& flags, int64_t model_bytes);
// The restore's mesh: the training mesh's axes swapped.
absl::StatusOr<Mesh> OtherMesh(const DemoJob& job);
int64_t PeakRssBytes();
// Changes every 64th word of `data` as a training step would (`seed`: the
// shard's, so replicas change alike).
void Mutate(uint8_t* data, int64_t bytes, uint64_t seed, int step);
// Copies every part's host bytes to its replicas: one dispatch per device.
absl::Status Upload(std::vector<std::vector<Part>>& parts);

// demo_train.cc: the prediction, the training loop, and the schedule the
// prediction is held against.
absl::StatusOr<Predicted> Predict(const DemoFlags& flags, const DemoJob& job,
                                  int64_t pool, int64_t budget,
                                  const SavePlanOptions& plan_options);
absl::StatusOr<Trained> Train(const DemoFlags& flags, absl::Duration step_time,
                              DemoJob& job, CheckpointManager& manager,
                              bool print);
void Schedule(const Trained& trained, Predicted& predicted);

// demo_restore.cc: the restores, checked.
absl::StatusOr<Restored> RestoreAndCheck(DemoJob& job,
                                         CheckpointManager& manager,
                                         int64_t step);
absl::StatusOr<Restored> RestoreTiersAndCheck(DemoJob& job,
                                              CheckpointManager& manager);
// Drops `dir`'s files from the page cache (--cold).
void EvictFromPageCache(const std::string& dir);

// 4. The report: JSON (--json) or the tables, from the lead process
// (demo_report.cc).
void Report(const DemoFlags& flags, const DemoJob& job, const Trained& trained,
            const Restored& restored, const Predicted& predicted,
            int64_t latest, int64_t persist_every, bool print);

}  // namespace hoist::demo

#endif  // HOIST_TOOLS_DEMO_JOB_H_
