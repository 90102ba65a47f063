// One rank of bench/scale.py's MPI job: how a save's and a restore's cost
// on each rank grows with the job's ranks. Run under mpirun; each rank
// writes its figures to OUT/rank_NNNNN.json, which scale.py reads.
//
//   mpirun -np N scale_bench --root DIR --out OUT [--local-root DIR/{rank}]
//
// The state: --arrays float32 arrays, each sharded over every rank's one
// device, --shard-bytes per rank (bench/scale.py: 100 x 64 KiB). The job:
//   save           step 1, every byte written
//   save_delta     step 2, the same values: every extent a reference
//   restore        the newest step, each rank reading for itself
//   restore_shared the same, each extent read once and passed on
// With --local-root the saves go to the local tier (replicas 2) and the
// restore comes from it. Each phase is bracketed by barriers, and records
// per rank: wall and blocked time, the coordinator's messages and bytes
// each way, CPU seconds, peak RSS, storage requests, and on rank 0 the
// manifest's bytes. A restore checks every byte it placed.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/bench_util.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/coordinator.h"
#include "hoist/host_backend.h"
#include "hoist/storage.h"
#include "nlohmann/json.hpp"

namespace hoist::bench {
namespace {

// Counts every request a save or restore makes of its storage: each
// namespace call, each write, read, sync and close of a file.
class CountingStorage final : public StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  int64_t requests() const { return requests_.load(); }

  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    ++requests_;
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        base().OpenWritable(path);
    if (!file.ok()) return file.status();
    return std::unique_ptr<WritableFile>(
        new CountedWritable(*std::move(file), requests_));
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    ++requests_;
    return Counted(base().OpenReadable(path));
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative) override {
    ++requests_;
    return Counted(base().OpenReadableBeneath(dir, relative));
  }
  absl::Status CreateDir(const std::string& path) override {
    ++requests_;
    return base().CreateDir(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    ++requests_;
    return base().Rename(from, to);
  }
  absl::Status SyncDir(const std::string& path) override {
    ++requests_;
    return base().SyncDir(path);
  }
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override {
    ++requests_;
    return base().List(path);
  }
  absl::Status RemoveAll(const std::string& path) override {
    ++requests_;
    return base().RemoveAll(path);
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    ++requests_;
    return base().Exists(path);
  }
  absl::StatusOr<bool> IsDir(const std::string& path) override {
    ++requests_;
    return base().IsDir(path);
  }

 private:
  class CountedWritable final : public WritableFile {
   public:
    CountedWritable(std::unique_ptr<WritableFile> file,
                    std::atomic<int64_t>& requests)
        : file_(std::move(file)), requests_(requests) {}
    absl::Status WriteAt(int64_t offset,
                         absl::Span<const uint8_t> data) override {
      ++requests_;
      return file_->WriteAt(offset, data);
    }
    absl::Status WriteAtv(
        int64_t offset,
        absl::Span<const absl::Span<const uint8_t>> pieces) override {
      ++requests_;
      return file_->WriteAtv(offset, pieces);
    }
    absl::Status Reserve(int64_t offset, int64_t bytes) override {
      return file_->Reserve(offset, bytes);
    }
    bool sequential() const override { return file_->sequential(); }
    absl::Status Sync() override {
      ++requests_;
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    std::unique_ptr<WritableFile> file_;
    std::atomic<int64_t>& requests_;
  };
  class CountedReadable final : public ReadableFile {
   public:
    CountedReadable(std::unique_ptr<ReadableFile> file,
                    std::atomic<int64_t>& requests)
        : file_(std::move(file)), requests_(requests) {}
    absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
      ++requests_;
      return file_->ReadAt(offset, out);
    }
    absl::StatusOr<int64_t> Size() override { return file_->Size(); }

   private:
    std::unique_ptr<ReadableFile> file_;
    std::atomic<int64_t>& requests_;
  };

  absl::StatusOr<std::unique_ptr<ReadableFile>> Counted(
      absl::StatusOr<std::unique_ptr<ReadableFile>> file) {
    if (!file.ok()) return file.status();
    return std::unique_ptr<ReadableFile>(
        new CountedReadable(*std::move(file), requests_));
  }

  std::atomic<int64_t> requests_{0};
};

double CpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// What one phase cost this rank, from its start.
class PhaseMeter {
 public:
  PhaseMeter(Coordinator& coordinator, const CountingStorage& storage)
      : coordinator_(coordinator),
        storage_(storage),
        traffic_(coordinator.traffic()),
        cpu_(CpuSeconds()),
        requests_(storage.requests()),
        start_(std::chrono::steady_clock::now()) {}

  nlohmann::json End(const std::string& phase) const {
    const Coordinator::Traffic now = coordinator_.traffic();
    return {{"phase", phase},
            {"rank", coordinator_.rank()},
            {"ranks", coordinator_.size()},
            {"wall_s", Since(start_)},
            {"cpu_s", CpuSeconds() - cpu_},
            {"peak_rss_bytes", PeakRssBytes()},
            {"messages_sent", now.messages_sent - traffic_.messages_sent},
            {"bytes_sent", now.bytes_sent - traffic_.bytes_sent},
            {"messages_received",
             now.messages_received - traffic_.messages_received},
            {"bytes_received", now.bytes_received - traffic_.bytes_received},
            {"storage_requests", storage_.requests() - requests_}};
  }

 private:
  Coordinator& coordinator_;
  const CountingStorage& storage_;
  const Coordinator::Traffic traffic_;
  const double cpu_;
  const int64_t requests_;
  const std::chrono::steady_clock::time_point start_;
};

struct Flags {
  std::string root, local_root, out;
  int arrays = 100;
  int64_t shard_bytes = 64 << 10;
};

int Run(const Flags& flags) {
  std::unique_ptr<Coordinator> coordinator =
      Check(MakeJobCoordinator({.timeout = absl::Minutes(10)}));
  const int rank = coordinator->rank(), ranks = coordinator->size();
  std::unique_ptr<Backend> backend =
      Check(MakeHostBackend({.num_devices = 1, .first_device_id = rank}));
  Device* device = backend->devices()[0];
  const Mesh mesh = Check(Mesh::Create({"data"}, {ranks}));
  const int64_t elements = flags.shard_bytes / 4;

  // Each rank's shard of array a: element i holds a * 1e6 + rank * elements
  // + i (exact in float32 for the sizes here), so a misplaced byte shows.
  std::vector<std::vector<float>> shards(flags.arrays);
  std::vector<SaveArray> arrays;
  std::vector<RestoreTarget> targets;
  std::vector<std::vector<float>> restored(flags.arrays);
  for (int a = 0; a < flags.arrays; ++a) {
    shards[a].resize(elements);
    for (int64_t i = 0; i < elements; ++i) {
      shards[a][i] = static_cast<float>(
          static_cast<int64_t>(a % 64) * (1 << 18) + rank * elements + i);
    }
    const ArraySpec spec{absl::StrFormat("layer%03d", a),
                         DType::kFloat32,
                         {ranks * elements},
                         NamedSharding{mesh, {{"data"}}}};
    arrays.push_back({spec, {{device->id(), shards[a].data()}}});
    restored[a].assign(elements, -1.0f);
    targets.push_back(
        {spec.name,
         spec.dtype,
         spec.shape,
         {{Box{{rank * elements}, {elements}}, device, restored[a].data()}}});
  }

  std::unique_ptr<Storage> posix = Check(OpenStorage(flags.root));
  CountingStorage storage(*posix);
  CheckpointManagerOptions options;
  options.pool_bytes =
      std::max<int64_t>(8 << 20, 2 * flags.arrays * flags.shard_bytes);
  options.host_memory_budget = options.pool_bytes;
  options.keep_last = 0;
  options.stall_warn = absl::ZeroDuration();
  if (!flags.local_root.empty()) {
    options.local.root = flags.local_root;
    options.local.replicas = std::min(2, ranks);
    options.persist_every = 1000;  // steps 1 and 2: the local tier's
  }
  std::unique_ptr<CheckpointManager> manager = Check(CheckpointManager::Open(
      flags.root, *backend, *coordinator, options, &storage));
  RegisteredArrays registered = Check(manager->Register(arrays));

  nlohmann::json records = nlohmann::json::array();
  const auto save = [&](int64_t step, const std::string& phase) {
    Check(coordinator->Barrier("scale " + phase));
    PhaseMeter meter(*coordinator, storage);
    const auto start = std::chrono::steady_clock::now();
    SaveHandle handle = Check(manager->Save(step, registered));
    const double blocked = Since(start);
    SaveInfo info = Check(handle.WaitCommitted());
    nlohmann::json record = meter.End(phase);
    record["blocked_s"] = blocked;
    record["commit_s"] = absl::ToDoubleSeconds(info.committed);
    record["bytes"] = info.bytes;
    record["referenced_bytes"] = info.referenced_bytes;
    if (rank == 0 && flags.local_root.empty()) {
      record["manifest_bytes"] = std::filesystem::file_size(
          absl::StrFormat("%s/step_%08d/MANIFEST.json", flags.root, step));
    }
    records.push_back(std::move(record));
  };
  const auto restore = [&](const std::string& phase,
                           RestoreOptions::SharedReads shared) {
    for (auto& r : restored) std::fill(r.begin(), r.end(), -1.0f);
    Check(coordinator->Barrier("scale " + phase));
    PhaseMeter meter(*coordinator, storage);
    RestoreOptions restore_options;
    restore_options.shared_reads = shared;
    RestoreStats stats = Check(
        manager->Restore(std::nullopt, targets, nullptr, restore_options));
    nlohmann::json record = meter.End(phase);
    bool exact = true;
    for (int a = 0; a < flags.arrays; ++a) {
      exact = exact && restored[a] == shards[a];
    }
    record["exact"] = exact;
    record["step"] = stats.step;
    record["bytes_read"] = stats.bytes_read;
    record["peer_bytes_received"] = stats.bytes_received;
    records.push_back(std::move(record));
    if (!exact) {
      Die(absl::DataLossError(absl::StrFormat(
          "rank %d: %s did not restore bit-exact", rank, phase)));
    }
  };
  save(1, flags.local_root.empty() ? "save" : "save_local");
  save(2, flags.local_root.empty() ? "save_delta" : "save_local_again");
  restore(flags.local_root.empty() ? "restore" : "restore_local",
          RestoreOptions::SharedReads::kNever);
  if (flags.local_root.empty()) {
    restore("restore_shared", RestoreOptions::SharedReads::kAlways);
  }
  Check(manager->WaitUntilFinished());
  manager.reset();
  std::ofstream(absl::StrFormat("%s/rank_%05d.json", flags.out, rank))
      << records.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace hoist::bench

int main(int argc, char** argv) {
  CLI::App app{
      "One rank of bench/scale.py's MPI job: the per-rank cost of a save and "
      "a restore, by number of ranks (run under mpirun; scale.py does)."};
  hoist::bench::Flags flags;
  app.add_option("--root", flags.root, "Checkpoint root (shared by the ranks)")
      ->required();
  app.add_option("--out", flags.out, "Directory for rank_NNNNN.json")
      ->required();
  app.add_option("--local-root", flags.local_root,
                 "Save to a local tier here instead ({rank}: the rank)");
  app.add_option("--arrays", flags.arrays,
                 "Arrays, each sharded over every "
                 "rank")
      ->capture_default_str();
  app.add_option("--shard-bytes", flags.shard_bytes,
                 "Bytes of each array per rank (a multiple of 4)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return hoist::bench::Run(flags);
}
