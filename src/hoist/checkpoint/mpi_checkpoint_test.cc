// The commit protocol across processes, under mpirun (mpi_test.sh runs it):
// phase "save" on 4 ranks x 2 devices, then phase "restore" on 2 ranks x 4
// devices and on 1 rank x 8, all on the root in $HOIST_MPI_ROOT.
//   Save.*     saves steps 1 and 2 on a 2 x 4 mesh, restores them onto 4 x 2
//              on every rank, checks the per-rank balance of the sample
//              model, then fails a step on one rank and hangs another.
//   Restore.*  restores steps 1 and 2 onto another mesh bit-exact, and finds
//              no trace of the failed steps.
//   Tiers.*    the local tier on 4 ranks: a lost part restored from its
//              replica, a corrupt replica passed over, a lost part and
//              replica sending the restore to the durable tier.
//   TiersKill.*, then TiersAfterKill.*: rank 2 dies mid-save of a local
//              step (mpirun ends the job); the restarted job restores the
//              step before it, whole, and no tier holds a torn step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/format/manifest_file.h"
#include "hoist/host_backend.h"
#include "hoist/io/fault_storage.h"
#include "hoist/model/sample_model.h"
#include "testing/array_bytes.h"
#include "testing/mixed_model.h"
#include "testing/shard_buffers.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kDevices = 8;  // in the whole job, whatever the ranks

std::string Root() {
  const char* root = std::getenv("HOIST_MPI_ROOT");
  return root != nullptr ? root : "";
}

using testing::MeshOf;
using testing::Reshard;

std::vector<ArraySpec> Model(const Mesh& mesh) {
  return testing::MixedModel(mesh);
}

// One process of the job: its coordinator and its share of the 8 devices.
class Job : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Root().empty()) << "run through mpi_test.sh";
    coordinator_ = Coordinator(absl::Minutes(2));
    ASSERT_NE(coordinator_, nullptr);
    const int per_rank = kDevices / coordinator_->size();
    backend_ =
        *MakeHostBackend({.num_devices = per_rank,
                          .first_device_id = coordinator_->rank() * per_rank});
  }

  static std::unique_ptr<hoist::Coordinator> Coordinator(
      absl::Duration timeout) {
    absl::StatusOr<std::unique_ptr<hoist::Coordinator>> c =
        MakeMpiCoordinator({.timeout = timeout});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::unique_ptr<CheckpointManager> Open(hoist::Coordinator& coordinator,
                                          Storage* storage = nullptr) {
    CheckpointManagerOptions options;
    options.pool_bytes = 4 << 20;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(Root(), *backend_, coordinator, options,
                                storage);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? *std::move(manager) : nullptr;
  }

  // Restores `model` (any sharding) from `step` onto this rank's devices,
  // checks every byte, and checks what was read: with shared reads
  // (kAlways), the job read each extent its ranks' boxes need once, else
  // (kNever; kAuto, every rank being on this host) each rank read exactly
  // the extents its boxes need.
  void ExpectRestores(
      CheckpointManager& manager, const std::vector<ArraySpec>& model,
      int64_t step, uint64_t version,
      RestoreOptions::SharedReads shared = RestoreOptions::SharedReads::kAlways,
      const std::string& root = Root()) {
    std::vector<ShardBuffers> buffers;
    std::vector<RestoreTarget> targets;
    for (const ArraySpec& spec : model) {
      buffers.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers.back().target);
    }
    RestoreOptions options;
    options.shared_reads = shared;
    absl::StatusOr<RestoreStats> stats =
        manager.Restore(step, targets, nullptr, options);
    ASSERT_TRUE(stats.ok()) << stats.status();
    for (size_t a = 0; a < model.size(); ++a) {
      for (const RestoreDestination& dest : targets[a].destinations) {
        const std::vector<uint8_t> expected =
            testing::BoxBytes(model[a], static_cast<int>(a), dest.box, version);
        ASSERT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
            << "rank " << coordinator_->rank() << " step " << step << " "
            << model[a].name << " " << dest.box.ToString();
      }
    }
    // Exactly the extents that meet one of this rank's boxes.
    const Manifest manifest = *ReadManifestFile(
        *MakePosixStorage(), root + "/" + absl::StrFormat("step_%08d", step));
    int64_t needed = 0;
    std::string ids;  // "array/extent " of each extent needed
    for (const RestoreTarget& target : targets) {
      const ManifestArray& array = *manifest.Find(target.name);
      for (size_t e = 0; e < array.extents.size(); ++e) {
        for (const RestoreDestination& dest : target.destinations) {
          if (!array.extents[e].box.Intersect(dest.box).empty()) {
            needed += array.extents[e].length_bytes;
            absl::StrAppendFormat(&ids, "%s/%d %d\n", array.name, e,
                                  array.extents[e].length_bytes);
            break;
          }
        }
      }
    }
    if (coordinator_->size() == 1 ||
        shared != RestoreOptions::SharedReads::kAlways) {
      EXPECT_EQ(stats->bytes_read, needed) << "rank " << coordinator_->rank();
      EXPECT_EQ(stats->bytes_received, 0);
      return;
    }
    // The job's unique needs against what its ranks read and received.
    const std::vector<std::string> all = *coordinator_->AllGather(
        "needed " + std::to_string(step),
        absl::StrFormat("%d %d %d\n%s", stats->bytes_read,
                        stats->bytes_received, needed, ids));
    std::map<std::string, int64_t> unique;
    int64_t read = 0, received = 0, separately = 0;
    for (const std::string& rank : all) {
      std::vector<std::string> lines =
          absl::StrSplit(rank, '\n', absl::SkipEmpty());
      int64_t r = 0, got = 0, own = 0;
      ASSERT_EQ(std::sscanf(lines[0].c_str(), "%ld %ld %ld", &r, &got, &own),
                3);
      read += r;
      received += got;
      separately += own;
      for (size_t i = 1; i < lines.size(); ++i) {
        const size_t space = lines[i].rfind(' ');
        unique[lines[i].substr(0, space)] = std::stoll(lines[i].substr(space));
      }
    }
    int64_t once = 0;
    for (const auto& [id, bytes] : unique) once += bytes;
    EXPECT_GE(read, once) << "rank " << coordinator_->rank();
    EXPECT_LE(read, once + once / 10) << "rank " << coordinator_->rank();
    EXPECT_EQ(received, separately - once)
        << "each extent is received by each rank that needs it but did not "
           "read it";
    stats_ = *stats;
    job_read_ = read;
    job_once_ = once;
    job_separately_ = separately;
  }

  RestoreStats stats_;
  int64_t job_read_ = 0, job_once_ = 0, job_separately_ = 0;

  std::unique_ptr<hoist::Coordinator> coordinator_;
  std::unique_ptr<Backend> backend_;
};

using Save = Job;
using Restore = Job;

TEST_F(Save, EveryRankWritesItsShareAndRestoresOntoAnotherMesh) {
  ASSERT_EQ(coordinator_->size(), 4);
  auto manager = Open(*coordinator_);
  ASSERT_NE(manager, nullptr);
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  for (int64_t step : {1, 2}) {
    testing::DeviceShards shards =
        testing::FillShards(model, backend_->devices(), step);
    absl::StatusOr<SaveHandle> handle =
        manager->Save(step, testing::SaveArraysOf(model, shards));
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    ASSERT_TRUE(info.ok()) << "rank " << coordinator_->rank() << ": "
                           << info.status();
  }
  EXPECT_THAT(*manager->List(), ElementsAre(1, 2));
  // Every rank wrote its own files.
  const std::string data = Root() + "/step_00000002/data";
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(
        std::filesystem::exists(absl::StrFormat("%s/r%05d_w00.bin", data, r)))
        << r;
  }
  for (int64_t step : {1, 2}) {
    ExpectRestores(*manager, Reshard(model, MeshOf(4, 2)), step, step);
  }
  if (coordinator_->rank() == 0) {
    EXPECT_TRUE(manager->Verify(2)->ok());
  }
}

TEST_F(Save, ReplicaSlicesAreBalancedAcrossRanks) {
  ASSERT_EQ(coordinator_->size(), 4);
  const std::string root = Root() + "/balance";
  if (coordinator_->rank() == 0) std::filesystem::create_directories(root);
  ASSERT_TRUE(coordinator_->Barrier("balance root").ok());
  CheckpointManagerOptions options;
  options.pool_bytes = 16 << 20;
  auto manager =
      *CheckpointManager::Open(root, *backend_, *coordinator_, options);
  // The sample GPT model: weights sharded over "model" and replicated over
  // "data", so half of each rank's bytes are replica slices.
  const std::vector<ArraySpec> model =
      *GptModel(GptConfigForBytes(48 << 20), MeshOf(2, 4));
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices());
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, testing::SaveArraysOf(model, shards));
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> all =
      *coordinator_->AllGather("bytes", std::to_string(info->bytes));
  double total = 0;
  for (const std::string& b : all) total += std::stod(b);
  const double mean = total / all.size();
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(std::stod(all[r]), mean, 0.10 * mean)
        << "rank " << r << " wrote " << all[r] << " bytes; mean " << mean;
  }
  if (coordinator_->rank() == 0) {
    std::printf("per-rank bytes: %s %s %s %s (mean %.0f)\n", all[0].c_str(),
                all[1].c_str(), all[2].c_str(), all[3].c_str(), mean);
  }
}

TEST_F(Save, RankFailingMidWriteAbortsTheStepOnEveryRank) {
  ASSERT_EQ(coordinator_->size(), 4);
  std::unique_ptr<Storage> posix = MakePosixStorage();
  // Rank 2's second data write fails with EIO.
  FaultInjectingStorage faulty(*posix, {.fail_write = 1, .error = EIO});
  auto manager =
      Open(*coordinator_, coordinator_->rank() == 2 ? &faulty : nullptr);
  ASSERT_NE(manager, nullptr);
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices(), 3);
  absl::StatusOr<SaveHandle> handle =
      manager->Save(3, testing::SaveArraysOf(model, shards));
  const absl::Status status =
      handle.ok() ? handle->WaitCommitted().status() : handle.status();
  ASSERT_FALSE(status.ok());
  // Every rank, rank 2 too, says which rank failed the step.
  EXPECT_THAT(status.message(), HasSubstr("step 3 aborted: rank 2:"));
  if (coordinator_->rank() == 2) {
    EXPECT_THAT(status.message(), HasSubstr("Input/output error"));
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  }
  // The manager repeats a background error once, on the next call.
  EXPECT_FALSE(manager->WaitUntilFinished().ok());
  ASSERT_TRUE(coordinator_->Barrier("after failure").ok());
  EXPECT_THAT(*manager->List(), ElementsAre(1, 2));
  for (const auto& entry : std::filesystem::directory_iterator(Root())) {
    EXPECT_EQ(entry.path().filename().string().find(".step_00000003"),
              std::string::npos)
        << entry.path() << " left behind";
  }
  ExpectRestores(*manager, Model(MeshOf(2, 4)), 2, 2);
}

TEST_F(Save, HungRankIsNamedAndNoStepCommits) {
  ASSERT_EQ(coordinator_->size(), 4);
  auto quick = Coordinator(absl::Seconds(2));
  auto manager = Open(*quick);
  ASSERT_NE(manager, nullptr);
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices(), 4);
  // Save() waits until staged, so the error may come from it or later.
  const auto save = [&] {
    absl::StatusOr<SaveHandle> handle =
        manager->Save(4, testing::SaveArraysOf(model, shards));
    return handle.ok() ? handle->WaitCommitted().status() : handle.status();
  };
  // Rank 3 hangs: it saves only once the others have given up on it (they
  // say so on the patient coordinator), so its own request comes too late.
  absl::Status status;
  if (quick->rank() == 3) {
    ASSERT_TRUE(coordinator_->Barrier("the others gave up").ok());
    status = save();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  } else {
    status = save();
    EXPECT_THAT(status.message(), HasSubstr("rank 3 did not arrive within 2s"));
    ASSERT_TRUE(coordinator_->Barrier("the others gave up").ok());
  }
  ASSERT_FALSE(status.ok());
  ASSERT_TRUE(coordinator_->Barrier("after hang").ok());
  EXPECT_THAT(*manager->List(), ElementsAre(1, 2));
  for (const auto& entry : std::filesystem::directory_iterator(Root())) {
    EXPECT_EQ(entry.path().filename().string().find(".step_00000004"),
              std::string::npos)
        << entry.path() << " left behind";
  }
}

TEST_F(Restore, OntoAnotherTopologyBitExact) {
  const int size = coordinator_->size();
  ASSERT_TRUE(size == 1 || size == 2) << size;
  auto manager = Open(*coordinator_);
  ASSERT_NE(manager, nullptr);
  EXPECT_THAT(*manager->List(), ElementsAre(1, 2));
  const Mesh target = size == 2 ? MeshOf(4, 2) : MeshOf(1, 8);
  for (int64_t step : {1, 2}) {
    ExpectRestores(*manager, Reshard(Model(MeshOf(2, 4)), target), step, step);
  }
}

// On 2 ranks, a 2 x 4 (data x model) mesh puts each data-parallel replica
// on its own rank: both need the same boxes. Shared reads read each byte
// once per job and send the other rank its share; each rank reading for
// itself (kNever, and kAuto here: one host, a local root) reads them twice.
TEST_F(Restore, DataParallelReplicasReadEachByteOnce) {
  if (coordinator_->size() != 2) GTEST_SKIP() << "2 ranks";
  auto manager = Open(*coordinator_);
  ASSERT_NE(manager, nullptr);
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ExpectRestores(*manager, model, 2, 2);
  if (coordinator_->rank() == 0) {
    std::printf(
        "shared reads: the job read %ld bytes, needed %ld once (%ld summed "
        "over ranks); rank 0 received %ld\n",
        job_read_, job_once_, job_separately_, stats_.bytes_received);
  }
  EXPECT_GT(stats_.bytes_received, 0);
  EXPECT_LT(job_read_, job_separately_ * 3 / 4)
      << "read " << job_read_ << " of " << job_separately_;
  ExpectRestores(*manager, model, 2, 2, RestoreOptions::SharedReads::kNever);
  // The default, with every rank on this host and a local root: alone.
  ExpectRestores(*manager, model, 2, 2, RestoreOptions::SharedReads::kAuto);
}

// A split manifest (hoist/3): each rank reads its head and its own
// targets' sections, rank 0 every section to plan; shared reads still read
// each needed byte once per job, and each rank alone exactly its extents.
TEST_F(Restore, ASplitManifestIsSharedAlike) {
  CheckpointManagerOptions options;
  options.pool_bytes = 4 << 20;
  options.split_manifest_above_extents = 0;
  const std::string root = Root() + "_split";
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root, *backend_, *coordinator_, options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices(), 7);
  // Saved by the first job (2 ranks), restored by each (then 1 rank).
  if ((*manager)->List()->empty()) {
    absl::StatusOr<SaveHandle> handle =
        (*manager)->Save(7, testing::SaveArraysOf(model, shards));
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(handle->WaitCommitted().ok());
  }
  std::ifstream in(root + "/step_00000007/MANIFEST.json");
  std::string start(21, '\0');
  in.read(start.data(), 21);
  EXPECT_EQ(start, "{\"format\": \"hoist/3\",");
  const Mesh other = coordinator_->size() == 2 ? MeshOf(4, 2) : MeshOf(1, 8);
  ExpectRestores(**manager, Reshard(model, other), 7, 7,
                 RestoreOptions::SharedReads::kAlways, root);
  ExpectRestores(**manager, model, 7, 7, RestoreOptions::SharedReads::kNever,
                 root);
}

// The local tier: a durable root and per-rank local roots under `name`.
// A preemption: SIGUSR1 raised on the last rank only, in the middle of a
// training loop whose steps are in lockstep (a barrier per step, on the
// main thread, while each rank's preemption watch reads the notice board
// beside it). Every rank must stop at the same step and save it.
using Preempt = Job;

TEST_F(Preempt, OneRankSignalledEveryRankSavesTheSameStep) {
  CheckpointManagerOptions options;
  options.pool_bytes = 4 << 20;
  options.preemption.signals = {SIGUSR1};
  options.preemption.poll = absl::Milliseconds(20);
  const std::string root = Root() + "_preempt";
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root, *backend_, *coordinator_, options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  const int last = coordinator_->size() - 1;
  int64_t stopped = -1;
  for (int64_t step = 0; step < 1000000 && stopped < 0; ++step) {
    if (coordinator_->rank() == last && step == 5) {
      ASSERT_EQ(raise(SIGUSR1), 0);
    }
    absl::StatusOr<bool> reached = (*manager)->ReachedPreemption(step);
    ASSERT_TRUE(reached.ok()) << reached.status();
    ASSERT_TRUE(coordinator_->Barrier(absl::StrCat("train ", step)).ok());
    if (*reached) stopped = step;
  }
  ASSERT_GE(stopped, 5);
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices(), stopped);
  absl::StatusOr<SaveHandle> handle =
      (*manager)->Save(stopped, testing::SaveArraysOf(model, shards));
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::vector<std::string> steps =
      *coordinator_->AllGather("stopped", absl::StrCat(stopped));
  for (const std::string& step : steps) EXPECT_EQ(step, steps[0]);
  EXPECT_THAT(*(*manager)->List(), ElementsAre(stopped));
}

class Tiers : public Job {
 protected:
  std::string Durable(const std::string& name) {
    return Root() + "/" + name + "/durable";
  }
  std::string LocalPattern(const std::string& name) {
    return Root() + "/" + name + "/local/{rank}";
  }
  std::string LocalOf(const std::string& name, int rank) {
    return absl::StrReplaceAll(LocalPattern(name),
                               {{"{rank}", std::to_string(rank)}});
  }
  std::unique_ptr<CheckpointManager> OpenTiers(const std::string& name,
                                               int replicas) {
    if (coordinator_->rank() == 0) {
      std::filesystem::create_directories(Durable(name));
    }
    EXPECT_TRUE(coordinator_->Barrier("tiers root " + name).ok());
    CheckpointManagerOptions options;
    options.pool_bytes = 4 << 20;
    options.persist_every = 4;
    options.local.root = LocalPattern(name);
    options.local.replicas = replicas;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(Durable(name), *backend_, *coordinator_,
                                options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? *std::move(manager) : nullptr;
  }
  // Saves `steps` (each its own version), expecting each to commit.
  void SaveSteps(CheckpointManager& manager, std::vector<int64_t> steps) {
    const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
    for (int64_t step : steps) {
      testing::DeviceShards shards =
          testing::FillShards(model, backend_->devices(), step);
      absl::StatusOr<SaveHandle> handle =
          manager.Save(step, testing::SaveArraysOf(model, shards));
      ASSERT_TRUE(handle.ok()) << handle.status();
      absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
      ASSERT_TRUE(info.ok())
          << "rank " << coordinator_->rank() << ": " << info.status();
      EXPECT_EQ(info->tier, step % 4 == 0 ? Tier::kDurable : Tier::kLocal);
      replicated_bytes_ = info->replicated_bytes;
    }
  }
  int64_t replicated_bytes_ = 0;  // by the last step SaveSteps saved
  // Restores the newest step onto the mesh it was saved on; checks every
  // byte against `version` and returns the stats.
  RestoreStats RestoreNewest(CheckpointManager& manager, uint64_t version,
                             const Mesh& mesh = MeshOf(2, 4)) {
    const std::vector<ArraySpec> model = Reshard(Model(MeshOf(2, 4)), mesh);
    std::vector<ShardBuffers> buffers;
    std::vector<RestoreTarget> targets;
    for (const ArraySpec& spec : model) {
      buffers.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers.back().target);
    }
    absl::StatusOr<RestoreStats> stats = manager.Restore(std::nullopt, targets);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) return {};
    if (coordinator_->rank() == 0) {
      std::printf("restored %s step %d: %s\n",
                  std::string(TierName(stats->restored_from)).c_str(),
                  static_cast<int>(stats->step), stats->note.c_str());
    }
    for (size_t a = 0; a < model.size(); ++a) {
      for (const RestoreDestination& dest : targets[a].destinations) {
        const std::vector<uint8_t> expected =
            testing::BoxBytes(model[a], static_cast<int>(a), dest.box, version);
        EXPECT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
            << "rank " << coordinator_->rank() << " " << model[a].name << " "
            << dest.box.ToString() << " (" << stats->note << ")";
      }
    }
    return *stats;
  }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// True for an array of the mixed model that is split over "data": no
// other rank holds its boxes. The others are held by data-parallel
// replicas (split over "model" only) or by every rank (replicated).
bool SplitOverData(const ArraySpec& spec) {
  for (const std::vector<std::string>& axes : spec.sharding.named()->spec) {
    if (absl::c_linear_search(axes, "data")) return true;
  }
  return false;
}

TEST_F(Tiers, LostPartIsRestoredFromItsReplicaAndAnotherMeshFromDurable) {
  ASSERT_EQ(coordinator_->size(), 4);
  const int rank = coordinator_->rank();
  {
    auto manager = OpenTiers("lost", 2);
    ASSERT_NE(manager, nullptr);
    SaveSteps(*manager, {4, 5, 6, 7});
    EXPECT_THAT(*manager->List(), ElementsAre(4));  // durable: step 4 only
  }
  // Each rank holds its part of the newest two local steps, and its left
  // neighbour's copy (one host: the replica goes to rank + 1).
  const std::string local = LocalOf("lost", rank);
  const int left = (rank + 3) % 4;
  for (int64_t step : {6, 7}) {
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrFormat("%s/step_%08d/MANIFEST.json", local, step)));
    EXPECT_TRUE(std::filesystem::exists(absl::StrFormat(
        "%s/peers/r%05d/step_%08d/MANIFEST.json", local, left, step)));
  }
  EXPECT_FALSE(std::filesystem::exists(local + "/step_00000005"));  // pruned
  // The copy holds the arrays split over "data" only (every other box has
  // a second holder, a data-parallel replica or every rank), and the whole
  // part's manifest; what was sent is what it holds.
  const std::string copy =
      absl::StrFormat("%s/peers/r%05d/step_00000007", local, left);
  absl::StatusOr<Manifest> kept =
      DecodeManifest(ReadFile(copy + "/MANIFEST.json"));
  ASSERT_TRUE(kept.ok()) << kept.status();
  absl::StatusOr<Manifest> part = DecodeManifest(ReadFile(copy + "/PART.json"));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->part->process, left);
  EXPECT_EQ(part->arrays.size(), Model(MeshOf(2, 4)).size());
  std::set<std::string> split, sent;
  for (const ArraySpec& spec : Model(MeshOf(2, 4))) {
    if (SplitOverData(spec)) split.insert(spec.name);
  }
  int64_t sent_bytes = 0;
  for (const ManifestArray& array : kept->arrays) {
    sent.insert(array.name);
    for (const ManifestExtent& extent : array.extents) {
      sent_bytes += extent.length_bytes;
    }
  }
  EXPECT_EQ(sent, split);
  // Rank `left` sent it; every rank sent as many bytes (the model splits
  // evenly), which this rank checks on its own figure.
  EXPECT_EQ(replicated_bytes_, sent_bytes);
  // Rank 2's node is lost: its whole local root goes, replicas included.
  ASSERT_TRUE(coordinator_->Barrier("before loss").ok());
  if (rank == 2) std::filesystem::remove_all(local);
  ASSERT_TRUE(coordinator_->Barrier("after loss").ok());
  auto manager = OpenTiers("lost", 2);
  ASSERT_NE(manager, nullptr);
  const RestoreStats stats = RestoreNewest(*manager, 7);
  EXPECT_EQ(stats.restored_from, Tier::kLocal) << stats.note;
  EXPECT_EQ(stats.step, 7);
  // Its arrays split over "data" from its copy at rank 3, the others from
  // the ranks that hold them in their own parts.
  EXPECT_THAT(stats.note, HasSubstr("rank 2's part from rank 0's part"));
  EXPECT_THAT(stats.note, HasSubstr("rank 3's replica of it"));
  // Only rank 2 received bytes: its part, over the transport.
  EXPECT_EQ(stats.bytes_received > 0, rank == 2) << stats.bytes_received;
  // Rank 2 has its part back.
  if (rank == 2) {
    EXPECT_TRUE(
        std::filesystem::exists(local + "/step_00000007/MANIFEST.json"));
  }
  // Another sharding needs bytes no single part holds: the durable step.
  const RestoreStats other = RestoreNewest(*manager, 4, MeshOf(4, 2));
  EXPECT_EQ(other.restored_from, Tier::kDurable) << other.note;
  EXPECT_EQ(other.step, 4);
  EXPECT_THAT(other.note, HasSubstr("not all in"));
  // Forced to the durable tier, as without a local one (not collective).
  RestoreOptions durable_only;
  durable_only.local_tier = false;
  std::vector<ShardBuffers> buffers;
  std::vector<RestoreTarget> targets;
  for (const ArraySpec& spec : Model(MeshOf(2, 4))) {
    buffers.push_back(*AllocateShards(spec, backend_->devices()));
    targets.push_back(buffers.back().target);
  }
  absl::StatusOr<RestoreStats> forced =
      manager->Restore(std::nullopt, targets, nullptr, durable_only);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->restored_from, Tier::kDurable);
  EXPECT_EQ(forced->step, 4);
}

TEST_F(Tiers, CorruptReplicaIsPassedOverForTheNextOne) {
  ASSERT_EQ(coordinator_->size(), 4);
  const int rank = coordinator_->rank();
  {
    auto manager = OpenTiers("corrupt", 3);  // replicas on rank + 1, + 2
    ASSERT_NE(manager, nullptr);
    SaveSteps(*manager, {4, 5});
  }
  ASSERT_TRUE(coordinator_->Barrier("before damage").ok());
  if (rank == 2)
    std::filesystem::remove_all(LocalOf("corrupt", 2) + "/step_00000005");
  if (rank == 3) {
    // Flip the first byte of every extent (each starts at a multiple of
    // 4 KiB) of rank 3's copy of rank 2's data.
    const std::string file =
        LocalOf("corrupt", 3) + "/peers/r00002/step_00000005/data/r00002.bin";
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << file;
    for (long at = 0;; at += 4096) {
      std::fseek(f, at, SEEK_SET);
      const int byte = std::fgetc(f);
      if (byte == EOF) break;
      std::fseek(f, at, SEEK_SET);
      std::fputc(byte ^ 0xff, f);
    }
    std::fclose(f);
  }
  ASSERT_TRUE(coordinator_->Barrier("after damage").ok());
  auto manager = OpenTiers("corrupt", 3);
  ASSERT_NE(manager, nullptr);
  const RestoreStats stats = RestoreNewest(*manager, 5);
  EXPECT_EQ(stats.restored_from, Tier::kLocal) << stats.note;
  EXPECT_EQ(stats.step, 5);
  // Rank 3's copy served some extents first (the least loaded source);
  // their hashes failed, so it was left out, and rank 0's copy served.
  EXPECT_THAT(stats.note, HasSubstr("rank 0's replica of it ("));
  EXPECT_THAT(stats.note, Not(HasSubstr("rank 3's replica of it (")));
  EXPECT_THAT(stats.note, HasSubstr("rank 2's rebuilt part: DATA_LOSS: array"));
  EXPECT_THAT(stats.note,
              HasSubstr("from rank 3's replica of it: its bytes do not match"));
}

TEST_F(Tiers, LostPartAndReplicaFallBackToTheDurableStep) {
  ASSERT_EQ(coordinator_->size(), 4);
  const int rank = coordinator_->rank();
  {
    auto manager = OpenTiers("both", 2);
    ASSERT_NE(manager, nullptr);
    SaveSteps(*manager, {4, 5});
  }
  ASSERT_TRUE(coordinator_->Barrier("before loss").ok());
  if (rank == 1)
    std::filesystem::remove_all(LocalOf("both", 1) + "/step_00000005");
  if (rank == 2) {
    std::filesystem::remove_all(LocalOf("both", 2) +
                                "/peers/r00001/step_00000005");
  }
  ASSERT_TRUE(coordinator_->Barrier("after loss").ok());
  auto manager = OpenTiers("both", 2);
  ASSERT_NE(manager, nullptr);
  const RestoreStats stats = RestoreNewest(*manager, 4);
  EXPECT_EQ(stats.restored_from, Tier::kDurable) << stats.note;
  EXPECT_EQ(stats.step, 4);
  EXPECT_THAT(stats.note, HasSubstr("no local step has every rank's part"));
}

using TiersKill = Tiers;
using TiersAfterKill = Tiers;

// Rank 2 dies while its part of local step 2 is being written; mpirun then
// ends the other ranks wherever they are.
TEST_F(TiersKill, RankDiesMidSave) {
  ASSERT_EQ(coordinator_->size(), 4);
  auto manager = OpenTiers("kill", 2);
  ASSERT_NE(manager, nullptr);
  SaveSteps(*manager, {1});
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  testing::DeviceShards shards =
      testing::FillShards(model, backend_->devices(), 2);
  ASSERT_TRUE(coordinator_->Barrier("step 1 saved").ok());
  absl::StatusOr<SaveHandle> handle = manager->Save(
      2, testing::SaveArraysOf(model, shards), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  if (coordinator_->rank() == 2) _exit(9);
  handle->WaitCommitted().status().IgnoreError();
}

TEST_F(TiersAfterKill, TheStepBeforeIsRestoredWholeAndNothingIsTorn) {
  ASSERT_EQ(coordinator_->size(), 4);
  auto manager = OpenTiers("kill", 2);
  ASSERT_NE(manager, nullptr);
  // Opening recovered every local root: no temporary directory is left.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(
           LocalOf("kill", coordinator_->rank()))) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << entry.path();
  }
  // Step 2 lacks rank 2's part everywhere: step 1, whole, is restored.
  EXPECT_FALSE(std::filesystem::exists(LocalOf("kill", 2) + "/step_00000002"));
  const RestoreStats stats = RestoreNewest(*manager, 1);
  EXPECT_EQ(stats.restored_from, Tier::kLocal) << stats.note;
  EXPECT_EQ(stats.step, 1);
  // The job goes on from step 1: step 2 again replaces rank 3's stale part.
  SaveSteps(*manager, {2});
  EXPECT_EQ(RestoreNewest(*manager, 2).step, 2);
}

}  // namespace
}  // namespace hoist
