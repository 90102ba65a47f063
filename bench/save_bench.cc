// bench/save: hoist's save and restore against the disk itself, in one run.
//
//   disk limit   the disk as fio drives it: jobs, each its own file and a
//                queue of O_DIRECT requests in flight through io_uring,
//                writing the same number of bytes (then fsync), then reading
//                them back (bench/disk_limit.h); the best of 4 jobs x QD 16
//                x 1 MiB, 8 x 8 x 4 MiB and 4 x 4 x 16 MiB, for each
//                direction; --jobs/--depth/--block-size measure one
//   one stream   for reference: one thread, O_DIRECT, 8 MiB requests one at
//                a time, write + fsync then read
//   hoist save   a GPT-style model (weights + Adam) on 8 host devices (2 x 4
//                mesh) saved through a staging pool of a quarter of its size:
//                staged, written (O_DIRECT where aligned, XXH3 per extent),
//                fsynced and committed
//   hoist restore  the step read back onto the same sharding (page cache of
//                its files dropped first), hashes verified, every shard
//                compared with what was saved; and again without checking
//                the hashes, to measure what verification costs
//   hoist restore into host memory  every array whole into new memory
//                (allocated, never touched: the restore's first touch is in
//                the timing, as a job's is), each round; and again, one or
//                the other in turn, without prefaulting that memory ahead
//                of the reads or reading straight into it instead of
//                through the readers' buffers, to measure what each
//                default saves
//   own files    the disk limit's reads of the step's own data files right
//                after the restores (the disk limit reads files it has just
//                written: a check that age and layout do not change it)
//   read amplification  bytes read / bytes asked for, restoring onto the
//                same sharding, onto a 4 x 2 mesh, and a tenth of the arrays
//   blocked past the pool  the time Save() blocks and the peak RSS, saving
//                through a pool that holds the save, a half and a quarter of
//                it (the overflow within the default host_memory_budget
//                takes the rest), and a quarter with no overflow
//                (host_memory_budget = the pool), side by side
// and the process's peak RSS during the save above what it held before (the
// device arrays live in host memory on the host backend, so they are
// excluded): the pool plus hoist's own overhead.
//
//   build/release/bench/save_bench [--bytes 4GiB] [--dir DIR] [--json]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "bench/disk_limit.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/box.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/interop.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "hoist/save_plan.h"
#include "testing/shard_buffers.h"

namespace hoist {
namespace {

using bench::Check;
using bench::Die;

// VmRSS or VmHWM of this process, in bytes.
int64_t ProcStatusBytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      return std::stoll(line.substr(key.size() + 1)) * 1024;
    }
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0).
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

void DropCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

void DropCacheTree(const std::string& dir) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) DropCache(entry.path());
  }
}

// limit[i] / measured[i], each round's.
std::vector<double> Ratios(const std::vector<double>& limit,
                           const std::vector<double>& measured) {
  std::vector<double> out;
  for (size_t i = 0; i < limit.size(); ++i) {
    out.push_back(limit[i] / measured[i]);
  }
  return out;
}

// 0 when there are none.
double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Raw {
  double write_s = 0;
  double read_s = 0;
};

// One thread, one 8 MiB request at a time: a reference, not the limit.
Raw OneStream(const std::string& path, int64_t bytes) {
  constexpr int64_t kChunk = 8 << 20;
  void* buffer = std::aligned_alloc(4096, kChunk);
  FillSynthetic(static_cast<uint8_t*>(buffer), kChunk, 1);  // not constant
  const int64_t total = (bytes + kChunk - 1) / kChunk * kChunk;
  Raw raw;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) Die(absl::InternalError("open O_DIRECT for the raw write"));
  absl::Time t0 = absl::Now();
  for (int64_t at = 0; at < total; at += kChunk) {
    if (pwrite(fd, buffer, kChunk, at) != kChunk) {
      Die(absl::InternalError("raw write"));
    }
  }
  fsync(fd);
  raw.write_s = absl::ToDoubleSeconds(absl::Now() - t0);
  close(fd);
  fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  t0 = absl::Now();
  for (int64_t at = 0; at < total; at += kChunk) {
    if (pread(fd, buffer, kChunk, at) != kChunk) {
      Die(absl::InternalError("raw read"));
    }
  }
  raw.read_s = absl::ToDoubleSeconds(absl::Now() - t0);
  close(fd);
  std::free(buffer);
  std::filesystem::remove(path);
  return raw;
}

// One way to hold a save larger than the pool, measured.
struct BlockedCase {
  std::string name;
  int64_t pool_bytes = 0;
  int64_t budget_bytes = 0;    // 0: the default (auto)
  double blocked_s = 0;        // median: Save() until it returned (staged)
  double committed_s = 0;      // median
  int64_t stalled_bytes = 0;   // the last save's
  int64_t peak_rss_bytes = 0;  // over what the process held before
};

// Blocked time past the pool: the same arrays saved three times (new bytes
// each) by managers of other pools, side by side: one that holds the whole
// save, a half and a quarter of it with the default host_memory_budget
// (the overflow takes the rest), and a quarter with the budget set to the
// pool (no overflow: staging waits for storage, as every save larger than
// the pool did before 2026-12-05). `arrays` are refilled for every save.
std::vector<BlockedCase> MeasureBlocked(
    Backend& backend, const std::vector<SaveArray>& save_arrays,
    std::vector<MemoryBlock>& arrays, int64_t data_bytes,
    const std::string& dir, const SavePlanOptions& plan_options) {
  const int64_t whole = AlignUp(data_bytes + data_bytes / 64, 4096);
  const int64_t half = AlignUp(data_bytes / 2, 4096);
  const int64_t quarter = AlignUp(data_bytes / 4, 4096);
  std::vector<BlockedCase> cases = {
      {.name = "pool holds the save", .pool_bytes = whole},
      {.name = "pool of half, default budget", .pool_bytes = half},
      {.name = "pool of a quarter, default budget", .pool_bytes = quarter},
      {.name = "pool of a quarter, budget = pool",
       .pool_bytes = quarter,
       .budget_bytes = quarter},
  };
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  int64_t fill = 1000;
  for (BlockedCase& c : cases) {
    CheckpointManagerOptions options;
    options.pool_bytes = c.pool_bytes;
    options.host_memory_budget = c.budget_bytes;
    options.plan = plan_options;
    options.keep_last = 1;
    const std::string root = absl::StrCat(dir, "/blocked.", getpid());
    const int64_t rss_before = ProcStatusBytes("VmRSS");
    ResetPeakRss();
    std::vector<double> blocked, committed;
    {
      std::unique_ptr<CheckpointManager> manager =
          Check(CheckpointManager::Open(root, backend, *coordinator, options));
      for (int step = 1; step <= 3; ++step) {
        for (MemoryBlock& block : arrays) {
          FillSynthetic(static_cast<uint8_t*>(block.data()), block.size_bytes(),
                        ++fill);
        }
        const absl::Time start = absl::Now();
        const SaveHandle handle = Check(manager->Save(step, save_arrays));
        blocked.push_back(absl::ToDoubleSeconds(absl::Now() - start));
        const SaveInfo info = Check(handle.WaitCommitted());
        committed.push_back(absl::ToDoubleSeconds(info.committed));
        c.stalled_bytes = info.stalled_bytes;
      }
      c.peak_rss_bytes = ProcStatusBytes("VmHWM") - rss_before;
    }
    std::filesystem::remove_all(root);
    c.blocked_s = Median(blocked);
    c.committed_s = Median(committed);
  }
  return cases;
}

int Main(int argc, char** argv) {
  CLI::App app("hoist save/restore benchmark against raw O_DIRECT I/O");
  std::string bytes_text = "4GiB", dir = "", pool_text = "";
  int writers = 2;
  int repeats = 1;
  bool json = false;
  bool no_export = false;
  std::string io;  // empty: the library's default
  int reader_threads = RestoreOptions{}.reader_threads;
  // The disk limit is the best of several fio-style configurations (this
  // disk's best differs for reads and writes); --jobs/--depth/--block-size
  // measure just one.
  std::vector<bench::DiskLimitOptions> limit_configs = {
      {.jobs = 4, .depth = 16, .block_bytes = int64_t{1} << 20},
      {.jobs = 8, .depth = 8, .block_bytes = int64_t{4} << 20},
      {.jobs = 4, .depth = 4, .block_bytes = int64_t{16} << 20}};
  bench::DiskLimitOptions limit_options;
  std::string block_text;
  app.add_option("--bytes", bytes_text, "Model size")->capture_default_str();
  app.add_option("--pool", pool_text,
                 "Staging pool (default: a quarter of "
                 "the model)");
  app.add_option("--writers", writers, "Writer streams")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  app.add_option("--dir", dir,
                 "Directory on the disk to measure (default: a new one "
                 "under the current directory, removed after)");
  app.add_option("--io", io,
                 "I/O engine: posix (syscalls) or io_uring (default: the "
                 "library's default, as a user gets)")
      ->check(CLI::IsMember({"posix", "io_uring"}));
  app.add_option("--readers", reader_threads, "Restore reader threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--jobs", limit_options.jobs,
                 "Disk limit: jobs (files) written and read at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--depth", limit_options.depth,
                 "Disk limit: requests in flight per job")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--block-size", block_text,
                 "Disk limit: bytes per request (default 1MiB; with --jobs "
                 "or --depth, only that configuration is measured)");
  app.add_option("--repeats", repeats,
                 "Rounds of (disk limit, save, restore), then of (write "
                 "limits, exports), one after the other so each ratio "
                 "compares neighbours; medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  app.add_flag("--json", json, "Print the figures as one JSON object");
  app.add_flag("--no-export", no_export,
               "Skip the safetensors exports (their figures are 0)");
  bool no_blocked = false;
  app.add_flag("--no-blocked", no_blocked,
               "Skip the blocked-past-the-pool cases (saves through pools "
               "of the whole save, a half and a quarter of it)");
  CLI11_PARSE(app, argc, argv);
  const int64_t model_bytes = Check(ParseBytes(bytes_text));
  if (!block_text.empty()) {
    limit_options.block_bytes = Check(ParseBytes(block_text));
  }
  if (app.count("--jobs") + app.count("--depth") + app.count("--block-size")) {
    limit_configs = {limit_options};
  }
  std::string limit_description = "the best of io_uring";
  for (const bench::DiskLimitOptions& config : limit_configs) {
    absl::StrAppendFormat(&limit_description, " %d jobs x QD %d x %s,",
                          config.jobs, config.depth,
                          FormatBytes(config.block_bytes));
  }
  limit_description.back() = ' ';
  limit_description += "O_DIRECT";
  const bool own_dir = dir.empty();
  if (own_dir) dir = "hoist-save-bench." + std::to_string(getpid());
  std::filesystem::create_directories(dir);

  // The model, its plan (for its size), and its shards in (host-backend)
  // device memory; replicas alias one buffer. Saved and restored through a
  // CheckpointManager, as a training job would.
  const GptConfig config = GptConfigForBytes(model_bytes);
  const Mesh mesh = Check(Mesh::Create({"data", "model"}, {2, 4}));
  const std::vector<ArraySpec> model = Check(GptModel(config, mesh));
  SavePlanOptions plan_options;
  plan_options.writer_streams = writers;
  const Topology topology = Topology::Uniform(1, 8);
  const SavePlan plan = Check(MakeSavePlan(model, topology, plan_options));
  std::unique_ptr<Backend> backend = Check(MakeHostBackend({.num_devices = 8}));
  std::vector<SaveArray> save_arrays;
  std::vector<MemoryBlock> arrays;
  std::vector<std::pair<int, Box>> boxes;  // what each block holds
  for (size_t a = 0; a < model.size(); ++a) {
    save_arrays.push_back({model[a], {}});
    const ShardLayout layout = Check(model[a].sharding.Layout(model[a].shape));
    for (const UniqueBox& unique : layout.unique_boxes) {
      const int64_t bytes =
          unique.box.num_elements() * ItemSize(model[a].dtype);
      MemoryBlock block = Check(backend->devices()[0]->Allocate(bytes));
      for (DeviceId device : unique.devices) {
        save_arrays.back().shards.push_back({device, block.data()});
      }
      boxes.emplace_back(static_cast<int>(a), unique.box);
      arrays.push_back(std::move(block));
    }
  }
  int64_t data_bytes = 0;
  for (const PlannedSlice& slice : plan.slices)
    data_bytes += slice.length_bytes;

  // Save through a pool a quarter of the data (unless --pool).
  const int64_t pool_bytes = pool_text.empty() ? AlignUp(data_bytes / 4, 4096)
                                               : Check(ParseBytes(pool_text));
  const int64_t rss_before = ProcStatusBytes("VmRSS");
  ResetPeakRss();
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  CheckpointManagerOptions options;
  options.pool_bytes = pool_bytes;
  options.plan = plan_options;
  options.keep_last = 1;  // each round's step replaces the last
  if (!io.empty()) {
    options.io = io == "io_uring" ? IoEngine::kIoUring : IoEngine::kPosix;
  }
  io = options.io == IoEngine::kIoUring ? "io_uring" : "posix";
  options.restore.reader_threads = reader_threads;
  // A root of its own, removed at the end: a --dir may hold other runs'.
  const std::string root = dir + "/save_bench." + std::to_string(getpid());
  std::unique_ptr<CheckpointManager> manager =
      Check(CheckpointManager::Open(root, *backend, *coordinator, options));
  // The shards of every array of `specs`, allocated on the 8 devices, and
  // the targets filling them.
  const auto device_targets = [&](const std::vector<ArraySpec>& specs,
                                  std::vector<ShardBuffers>& buffers,
                                  bool one_per_box = false) {
    std::vector<RestoreTarget> targets;
    for (const ArraySpec& spec : specs) {
      buffers.push_back(
          Check(AllocateShards(spec, backend->devices(), one_per_box)));
      targets.push_back(buffers.back().target);
    }
    return targets;
  };
  // Rounds of disk limit, hoist save, hoist restore (checked, then
  // unchecked): this disk's speed drifts, so each ratio compares
  // measurements taken side by side.
  const Raw one_stream = OneStream(dir + "/raw.bin", data_bytes);
  std::vector<double> raw_write, raw_read, saves, staged, restores, unchecked,
      host_restores, unprefaulted, direct, raw_read_own;
  int64_t save_peak = 0;
  SaveInfo saved;
  RestoreStats restored;
  bool verified = true;
  for (int round = 0; round < repeats; ++round) {
    double best_write_s = 0, best_read_s = 0;
    for (const bench::DiskLimitOptions& config : limit_configs) {
      const bench::DiskLimit limit =
          Check(bench::MeasureDiskLimit(dir, data_bytes, config));
      const double write_s = limit.write_s * data_bytes / limit.bytes;
      const double read_s = limit.read_s * data_bytes / limit.bytes;
      if (best_write_s == 0 || write_s < best_write_s) best_write_s = write_s;
      if (best_read_s == 0 || read_s < best_read_s) best_read_s = read_s;
    }
    raw_write.push_back(best_write_s);
    raw_read.push_back(best_read_s);
    // New bytes in every array, as a training step changes every weight:
    // saves are deltas by default, and a round saving the last round's
    // bytes again would write nothing.
    for (size_t b = 0; b < arrays.size(); ++b) {
      FillSynthetic(static_cast<uint8_t*>(arrays[b].data()),
                    arrays[b].size_bytes(), round * arrays.size() + b);
    }
    // The save's peak, not the disk limit's buffers (freed by now).
    if (round == 0) ResetPeakRss();
    const SaveHandle handle = Check(manager->Save(round + 1, save_arrays));
    saved = Check(handle.WaitCommitted());
    if (round == 0) save_peak = ProcStatusBytes("VmHWM") - rss_before;
    saves.push_back(absl::ToDoubleSeconds(saved.committed));
    staged.push_back(absl::ToDoubleSeconds(saved.staged));

    {
      // Restore onto the same sharding, from disk.
      DropCacheTree(saved.path);
      std::vector<ShardBuffers> buffers;
      const std::vector<RestoreTarget> targets = device_targets(model, buffers);
      restored = Check(manager->Restore(saved.step, targets));
      restores.push_back(absl::ToDoubleSeconds(restored.elapsed));
      for (size_t b = 0; b < boxes.size(); ++b) {
        const auto& [a, box] = boxes[b];
        for (const RestoreDestination& dest : targets[a].destinations) {
          if (dest.box != box) continue;
          verified &= std::memcmp(dest.data, arrays[b].data(),
                                  arrays[b].size_bytes()) == 0;
        }
      }
      // The same without checking hashes: what verification costs.
      DropCacheTree(saved.path);
      RestoreOptions no_check = options.restore;
      no_check.verify_xxh3 = false;
      unchecked.push_back(absl::ToDoubleSeconds(
          Check(manager->Restore(saved.step, targets, nullptr, no_check))
              .elapsed));
    }
    // Every array whole into new host memory (WholeArraysInHost's, never
    // touched before: the first touch of its pages is the restore's), each
    // round: hoist's read path alone, no device copies.
    // And the same one more way each round, to measure what each default
    // saves: without prefaulting the new memory (the copies fault it in),
    // or reading straight into it rather than through the readers' buffers
    // (RestoreOptions::stage_host_reads). Both arrays stay until the
    // round's checks, so neither restore reuses pages the other has just
    // freed. Which goes first matters here: on this VM the second 2 GiB of
    // new memory in a row took up to 2x as long to fault in (a third, 4-7x),
    // so over 4 rounds each goes first as often as second: (default,
    // unprefaulted), (direct, default), (unprefaulted, default), (default,
    // direct).
    enum Variant { kDefault, kUnprefaulted, kDirect };
    const auto restore_into_new_memory = [&](Variant variant) {
      DropCacheTree(saved.path);
      HostArrays fresh = WholeArraysInHost(model);
      RestoreOptions restore_options = options.restore;
      restore_options.prefault = variant != kUnprefaulted;
      restore_options.stage_host_reads = variant != kDirect;
      std::vector<double>* times[] = {&host_restores, &unprefaulted, &direct};
      times[variant]->push_back(absl::ToDoubleSeconds(
          Check(manager->Restore(saved.step, fresh.targets, nullptr,
                                 restore_options))
              .elapsed));
      return fresh;
    };
    constexpr Variant kOrder[4][2] = {{kDefault, kUnprefaulted},
                                      {kDirect, kDefault},
                                      {kUnprefaulted, kDefault},
                                      {kDefault, kDirect}};
    const Variant* order = kOrder[round % 4];
    const HostArrays first = restore_into_new_memory(order[0]);
    const HostArrays second = restore_into_new_memory(order[1]);
    const HostArrays& host = order[0] == kDefault ? first : second;
    // The read limit of the step's own data files, as old as the restores
    // found them (the disk limit reads files it has just written: a check
    // that the files' age and layout do not change the limit): the best of
    // limit_configs, once more right after the restores.
    std::vector<std::string> data_files;
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(saved.path)) {
      if (entry.is_regular_file() && entry.path().extension() == ".bin") {
        data_files.push_back(entry.path());
      }
    }
    double best_own_s = 0;
    for (const bench::DiskLimitOptions& config : limit_configs) {
      for (const std::string& file : data_files) DropCache(file);
      const bench::DiskLimit limit =
          Check(bench::MeasureReadLimit(data_files, config));
      const double read_s = limit.read_s * data_bytes / limit.bytes;
      if (best_own_s == 0 || read_s < best_own_s) best_own_s = read_s;
    }
    raw_read_own.push_back(best_own_s);
    // Every saved box, cut out of its restored whole array, is what was
    // saved.
    for (size_t b = 0; b < boxes.size(); ++b) {
      const auto& [a, box] = boxes[b];
      const int64_t item = ItemSize(model[a].dtype);
      std::vector<uint8_t> cut(arrays[b].size_bytes());
      CopyBox(host.bytes[a].data(), Box::FromShape(model[a].shape), cut.data(),
              box, box, item);
      verified &= std::memcmp(cut.data(), arrays[b].data(), cut.size()) == 0;
    }
  }
  const Raw raw{Median(raw_write), Median(raw_read)};
  const double gb = data_bytes / 1e9;
  const double save_s = Median(saves);
  const double restore_s = Median(restores);
  const double unchecked_s = Median(unchecked);
  const double host_s = Median(host_restores);
  const double unprefaulted_s = Median(unprefaulted);
  const double direct_s = Median(direct);
  const double own_read_s = Median(raw_read_own);

  // Read amplification: onto a 4 x 2 mesh (another sharding), and a tenth
  // of the arrays (every tenth) onto the same sharding; one replica of each
  // box (replicas share what is read), so memory stays at the data's size.
  const auto amplification = [](const RestoreStats& stats) {
    return static_cast<double>(stats.bytes_read) /
           static_cast<double>(stats.target_bytes);
  };
  const Mesh other_mesh = Check(Mesh::Create({"data", "model"}, {4, 2}));
  const std::vector<ArraySpec> resharded = Check(GptModel(config, other_mesh));
  std::vector<ShardBuffers> other_buffers;
  const RestoreStats reshard = Check(
      manager->Restore(saved.step, device_targets(resharded, other_buffers,
                                                  /*one_per_box=*/true)));
  other_buffers.clear();
  std::vector<ArraySpec> tenth;
  for (size_t a = 0; a < model.size(); a += 10) tenth.push_back(model[a]);
  const RestoreStats partial =
      Check(manager->Restore(saved.step, device_targets(tenth, other_buffers,
                                                        /*one_per_box=*/true)));
  // The step exported to safetensors, beside the write limits it meets,
  // measured just before it: the disk's (a file per job) and one file's
  // (jobs writing parts of one file, as an export writes its one file),
  // the best of limit_configs each. From a copy of the step in /dev/shm
  // (when there is room) only the export's writes touch the disk; from the
  // disk (page cache dropped) it reads and writes the same disk, so that
  // one is compared with the read plus write time. `repeats` rounds of
  // (limits, exports); medians.
  const std::string export_dir = dir + "/export";
  const auto export_seconds = [&](const std::string& step_dir) {
    const ExportStats exported = Check(ExportSafetensors(step_dir, export_dir));
    std::filesystem::remove_all(export_dir);
    return absl::ToDoubleSeconds(exported.elapsed);
  };
  const std::string shm_root =
      absl::StrFormat("/dev/shm/hoist-save-bench.%d", getpid());
  const std::string shm_copy =
      shm_root + "/" + std::filesystem::path(saved.path).filename().string();
  std::error_code shm_error;
  const std::filesystem::space_info shm =
      std::filesystem::space("/dev/shm", shm_error);
  const bool from_memory =
      !no_export && !shm_error &&
      shm.available > 2 * static_cast<uintmax_t>(data_bytes);
  if (from_memory) {
    std::filesystem::create_directories(shm_root);
    std::filesystem::copy(saved.path, shm_copy,
                          std::filesystem::copy_options::recursive);
  }
  std::vector<double> export_writes, export_one_files, export_memories, exports;
  for (int round = 0; round < (no_export ? 0 : repeats); ++round) {
    double write_s = 0, one_file_s = 0;
    for (bench::DiskLimitOptions config : limit_configs) {
      const double s =
          Check(bench::MeasureDiskLimit(dir, data_bytes, config)).write_s;
      config.one_file = true;
      const double one =
          Check(bench::MeasureDiskLimit(dir, data_bytes, config)).write_s;
      if (write_s == 0 || s < write_s) write_s = s;
      if (one_file_s == 0 || one < one_file_s) one_file_s = one;
    }
    export_writes.push_back(write_s);
    export_one_files.push_back(one_file_s);
    if (from_memory) export_memories.push_back(export_seconds(shm_copy));
    DropCacheTree(saved.path);
    exports.push_back(export_seconds(saved.path));
  }
  std::filesystem::remove_all(shm_root);
  const double export_write_s = Median(export_writes);
  const double export_one_file_s = Median(export_one_files);
  // 0: /dev/shm lacks room for the copy, or --no-export
  const double export_memory_s = Median(export_memories);
  const double export_s = Median(exports);
  manager.reset();
  std::filesystem::remove_all(root);
  if (own_dir) std::filesystem::remove_all(dir);
  nlohmann::json out = {
      {"bytes", data_bytes},
      {"raw_write_gbps", gb / raw.write_s},
      {"raw_read_gbps", gb / raw.read_s},
      {"disk_limit", limit_description},
      {"one_stream_write_gbps", gb / one_stream.write_s},
      {"one_stream_read_gbps", gb / one_stream.read_s},
      {"save_gbps", gb / save_s},
      {"save_s", save_s},
      {"staged_s", Median(staged)},
      {"repeats", repeats},
      {"save_vs_raw_write", raw.write_s / save_s},
      {"restore_gbps", gb / restore_s},
      {"restore_s", restore_s},
      {"restore_vs_raw_read", raw.read_s / restore_s},
      {"restore_waves", restored.waves},
      {"restore_unchecked_s", unchecked_s},
      {"verification_cost", restore_s / unchecked_s - 1},
      {"read_amplification_same", amplification(restored)},
      {"read_amplification_reshard", amplification(reshard)},
      {"read_amplification_partial", amplification(partial)},
      {"partial_arrays", tenth.size()},
      {"restore_host_gbps", gb / host_s},
      {"restore_host_s", host_s},
      {"restore_host_vs_raw_read", raw.read_s / host_s},
      {"raw_read_own_files_s", own_read_s},
      {"restore_vs_own_files_read", own_read_s / restore_s},
      {"restore_host_vs_own_files_read", own_read_s / host_s},
      {"restore_vs_own_files_read_samples", Ratios(raw_read_own, restores)},
      {"restore_host_vs_own_files_read_samples",
       Ratios(raw_read_own, host_restores)},
      {"restore_host_unprefaulted_s", unprefaulted_s},
      {"restore_host_unprefaulted_vs_raw_read", raw.read_s / unprefaulted_s},
      {"restore_host_direct_s", direct_s},
      {"restore_host_direct_vs_raw_read",
       direct_s > 0 ? raw.read_s / direct_s : 0},
      // Each round's ratio against that round's limit: the spread.
      {"save_vs_raw_write_samples", Ratios(raw_write, saves)},
      {"restore_vs_raw_read_samples", Ratios(raw_read, restores)},
      {"restore_host_vs_raw_read_samples", Ratios(raw_read, host_restores)},
      {"export_write_limit_s", export_write_s},
      {"export_one_file_write_limit_s", export_one_file_s},
      {"export_from_memory_s", export_memory_s},
      {"export_from_memory_vs_write_limit",
       export_memory_s > 0 ? export_write_s / export_memory_s : 0},
      {"export_from_memory_vs_one_file_write_limit",
       export_memory_s > 0 ? export_one_file_s / export_memory_s : 0},
      {"export_s", export_s},
      {"export_gbps", export_s > 0 ? gb / export_s : 0},
      {"export_vs_raw_read_plus_write",
       export_s > 0 ? (raw.read_s + raw.write_s) / export_s : 0},
      {"pool_bytes", pool_bytes},
      {"waves", saved.waves},
      {"peak_rss_over_baseline_bytes", save_peak},
      {"peak_rss_over_pool_bytes", save_peak - pool_bytes},
      {"writer_streams", writers},
      {"io", io},
      {"verified", verified},
  };
  const std::vector<BlockedCase> blocked_cases =
      no_blocked ? std::vector<BlockedCase>()
                 : MeasureBlocked(*backend, save_arrays, arrays, data_bytes,
                                  dir, plan_options);
  for (const BlockedCase& c : blocked_cases) {
    out["blocked_past_the_pool"].push_back(
        {{"case", c.name},
         {"pool_bytes", c.pool_bytes},
         {"host_memory_budget_bytes", c.budget_bytes},
         {"blocked_s", c.blocked_s},
         {"blocked_vs_pool_holds_the_save",
          c.blocked_s / blocked_cases.front().blocked_s},
         {"committed_s", c.committed_s},
         {"stalled_bytes", c.stalled_bytes},
         {"peak_rss_over_baseline_bytes", c.peak_rss_bytes}});
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "hoist save/restore, GPT-style %d layers x d_model %d + Adam, %s in "
        "%d arrays, 8 host devices, %d writer streams, %s I/O\n\n"
        "%-44s %9s %9s %8s\n"
        "%-44s %8.2fs %6.2f GB/s %7s\n"
        "%-44s %8.2fs %6.2f GB/s %7.2fx\n"
        "%-44s %8.2fs %6.2f GB/s %7s\n"
        "%-44s %8.2fs %6.2f GB/s %7.2fx\n"
        "%-44s %8.2fs %6.2f GB/s %7.2fx\n\n"
        "disk limit: %s; one stream (8 MiB, one at a time): write %.2f "
        "GB/s, read %.2f GB/s\n"
        "verification (XXH3 of every extent) costs %.1f%% of the restore "
        "(%.2fs unchecked)\n"
        "restore into host memory without prefaulting the new memory ahead "
        "of the reads: %.2fs, %.2fx of the disk limit (%.2fs with)\n"
        "restore into host memory reading straight into it, not through the "
        "readers' buffers: %s\n"
        "the same limit reading the step's own files (as old as the "
        "restores found them): %.2fs, %.2f GB/s; restore onto devices "
        "%.2fx of it, into host memory %.2fx\n"
        "read amplification: same sharding %.3f, onto 4 x 2 %.3f, %d of %d "
        "arrays %.3f\n"
        "save staged in %.2fs through a %s pool (%d waves); peak RSS during "
        "the save: %s over what the process held before (pool + %s)\n"
        "both restores verified bit-exact: %s\n"
        "export to safetensors from /dev/shm: %s; disk's write limit "
        "%.2fs, one file's %.2fs\n"
        "export to safetensors from the disk (page cache dropped): %s\n",
        config.layers, config.d_model, FormatBytes(data_bytes), model.size(),
        writers, io, "", "time", "rate", "vs disk", "disk limit: write + fsync",
        raw.write_s, gb / raw.write_s, "",
        "hoist save (staged, written, committed)", save_s, gb / save_s,
        raw.write_s / save_s, "disk limit: read", raw.read_s, gb / raw.read_s,
        "", "hoist restore onto 8 devices (2 x 4 mesh)", restore_s,
        gb / restore_s, raw.read_s / restore_s,
        "hoist restore into host memory (whole arrays)", host_s, gb / host_s,
        raw.read_s / host_s, limit_description, gb / one_stream.write_s,
        gb / one_stream.read_s, 100 * (restore_s / unchecked_s - 1),
        unchecked_s, unprefaulted_s, raw.read_s / unprefaulted_s, host_s,
        direct_s > 0 ? absl::StrFormat("%.2fs, %.2fx of the disk limit",
                                       direct_s, raw.read_s / direct_s)
                     : std::string("not measured (from the second round)"),
        own_read_s, gb / own_read_s, own_read_s / restore_s,
        own_read_s / host_s, amplification(restored), amplification(reshard),
        tenth.size(), model.size(), amplification(partial), Median(staged),
        FormatBytes(pool_bytes), saved.waves, FormatBytes(save_peak),
        FormatBytes(save_peak - pool_bytes), verified ? "yes" : "NO",
        export_memory_s > 0
            ? absl::StrFormat(
                  "%.2fs, %.2f GB/s: %.2fx the disk's write limit, %.2fx "
                  "one file's",
                  export_memory_s, gb / export_memory_s,
                  export_write_s / export_memory_s,
                  export_one_file_s / export_memory_s)
            : std::string(no_export ? "not measured (--no-export)"
                                    : "not measured (no room)"),
        export_write_s, export_one_file_s,
        no_export
            ? std::string("not measured (--no-export)")
            : absl::StrFormat("%.2fs, %.2f GB/s: %.2fx the disk's read + write "
                              "limit",
                              export_s, gb / export_s,
                              (raw.read_s + raw.write_s) / export_s));
  }
  if (!json && !blocked_cases.empty()) {
    std::cout << absl::StrFormat(
        "\nblocked past the pool (3 saves each, medians; peak RSS over what "
        "the process held before):\n%-36s %9s %9s %9s %11s %12s\n",
        "", "pool", "blocked", "vs whole", "committed", "peak RSS");
    for (const BlockedCase& c : blocked_cases) {
      std::cout << absl::StrFormat(
          "%-36s %9s %8.3fs %8.2fx %10.2fs %12s\n", c.name,
          FormatBytes(c.pool_bytes), c.blocked_s,
          c.blocked_s / blocked_cases.front().blocked_s, c.committed_s,
          FormatBytes(c.peak_rss_bytes));
    }
  }
  return verified ? 0 : 1;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
