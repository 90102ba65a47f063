#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/restore/verify.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/host_backend.h"
#include "hoist/huge_pages.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "testing/array_bytes.h"
#include "testing/loop_filesystem.h"
#include "testing/mixed_model.h"
#include "testing/recording_file.h"
#include "testing/shard_buffers.h"
#include "testing/smaps.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using testing::BoxBytes;
using ::testing::HasSubstr;

using testing::MeshOf;
using testing::Reshard;
using testing::SmapsField;

std::vector<ArraySpec> Model(const Mesh& mesh) {
  return testing::MixedModel(mesh);
}

// Model() and "big", whose 512 KiB extents (one per "data" shard) are large
// enough to be read straight into an aligned destination.
std::vector<ArraySpec> ModelWithLargeExtents(const Mesh& mesh) {
  std::vector<ArraySpec> model = Model(mesh);
  model.push_back(
      {"big", DType::kFloat32, {1024, 256}, NamedSharding{mesh, {{"data"}}}});
  return model;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *MakeHostBackend({.num_devices = 8});
    pool_ = *StagingPool::Create(*backend_, 1 << 20);
    root_ = temp_.path();
  }

  // Saves `model` (contents salted by `version`) as `step`.
  absl::StatusOr<SaveResult> Save(Storage& storage,
                                  const std::vector<ArraySpec>& model,
                                  int64_t step, uint64_t version = 0,
                                  bool overwrite = false,
                                  SavePlanOptions plan_options = {}) {
    plan_options.writer_streams = 2;
    absl::StatusOr<SavePlan> plan =
        MakeSavePlan(model, Topology::Uniform(1, 8), plan_options);
    if (!plan.ok()) return plan.status();
    testing::DeviceShards shards =
        testing::FillShards(model, backend_->devices(), version);
    TransferEngine engine(*pool_);
    SaveRequest request;
    request.root = root_;
    request.step = step;
    request.arrays = model;
    request.plan = &*plan;
    request.metadata_json = R"({"note":"test"})";
    request.overwrite = overwrite;
    return SaveCheckpoint(storage, *coordinator_, request, engine,
                          backend_->devices(), shards.sources);
  }

  // Restores `model` (any sharding) from `step` and checks every byte.
  void ExpectRestores(Storage& storage, const std::vector<ArraySpec>& model,
                      int64_t step, uint64_t version = 0) {
    std::vector<ShardBuffers> buffers;
    std::vector<RestoreTarget> targets;
    for (const ArraySpec& spec : model) {
      buffers.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers.back().target);
    }
    absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
        storage, JoinPath(root_, StepDirName(step)), targets, *pool_);
    ASSERT_TRUE(stats.ok()) << stats.status();
    for (size_t a = 0; a < model.size(); ++a) {
      for (const RestoreDestination& dest : targets[a].destinations) {
        const std::vector<uint8_t> expected =
            BoxBytes(model[a], static_cast<int>(a), dest.box, version);
        ASSERT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
            << model[a].name << " " << dest.box.ToString() << " on device "
            << dest.device->id();
      }
    }
  }

  // Every array of `model` whole in `host`, as saved (version 0).
  static void ExpectWholeArrays(const std::vector<ArraySpec>& model,
                                const HostArrays& host) {
    for (size_t a = 0; a < model.size(); ++a) {
      const std::vector<uint8_t> expected = BoxBytes(
          model[a], static_cast<int>(a), Box::FromShape(model[a].shape));
      EXPECT_EQ(host.bytes[a].span(), absl::MakeConstSpan(expected))
          << model[a].name;
    }
  }

  // Saves `model` (BigBoxes(): eight 256 x 256 boxes of "big") as step 1,
  // makes the pool 64 KiB, and returns a target whose boxes, tagged 100 +
  // their index, go to a receiver.
  RestoreTarget SaveForAReceiver(const std::vector<ArraySpec>& model) {
    EXPECT_TRUE(Save(*posix_, model, 1).ok());
    pool_ = *StagingPool::Create(*backend_, 64 * 1024);
    RestoreTarget target{"big", DType::kFloat32, {8 * 256, 256}, {}};
    for (int64_t d = 0; d < 8; ++d) {
      target.destinations.push_back({Box({d * 256, 0}, {256, 256}), nullptr,
                                     nullptr, static_cast<uint64_t>(100 + d)});
    }
    return target;
  }

  // Restores every array of `model` from `step` whole into `host`
  // (WholeArraysInHost's) through `pool`, its files recording their reads,
  // and checks every byte. Returns the reads.
  std::vector<testing::RecordedRead> RestoreWholeRecordingReads(
      const std::vector<ArraySpec>& model, int64_t step, HostArrays& host,
      StagingPool& pool, const RestoreOptions& options) {
    const std::string step_dir = JoinPath(root_, StepDirName(step));
    const absl::StatusOr<Manifest> manifest =
        ReadManifestFile(*posix_, step_dir);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    if (!manifest.ok()) return {};
    testing::ReadLog log;
    absl::StatusOr<RestoreStats> stats =
        RestoreCheckpoint(*manifest, step_dir, host.targets, pool, options,
                          nullptr, RecordingOpener(log));
    EXPECT_TRUE(stats.ok()) << stats.status();
    ExpectWholeArrays(model, host);
    return log.reads();
  }

  // Opens a step's data files as a restore does, each recording its reads
  // into `log` (which must outlive the restore).
  ExtentFileOpener RecordingOpener(testing::ReadLog& log) {
    return [this, &log](const ExtentPlace& place)
               -> absl::StatusOr<std::unique_ptr<ReadableFile>> {
      ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                       posix_->OpenReadableBeneath(place.dir, place.relative));
      return std::make_unique<testing::RecordingFile>(std::move(file), log);
    };
  }

  testing::TempDir temp_;
  std::string root_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<Coordinator> coordinator_ = MakeSingleProcessCoordinator();
  std::unique_ptr<Storage> posix_ = MakePosixStorage();
};

TEST_F(CheckpointTest, SaveCommitsAStepWithAValidManifest) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  absl::StatusOr<SaveResult> saved = Save(*posix_, model, 1000);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->path, root_ + "/step_00001000");
  EXPECT_THAT(*posix_->List(root_), ::testing::ElementsAre("step_00001000"));
  absl::StatusOr<Manifest> manifest = ReadManifestFile(*posix_, saved->path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 1000);
  EXPECT_EQ(manifest->arrays.size(), model.size());
  EXPECT_EQ(manifest->metadata_json, R"({"note":"test"})");
  EXPECT_TRUE(VerifyCheckpoint(*posix_, saved->path).ok());
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
}

TEST_F(CheckpointTest, RestoresBitExactOntoEveryOtherSharding) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 7).ok());
  ExpectRestores(*posix_, model, 7);                         // same
  ExpectRestores(*posix_, Reshard(model, MeshOf(4, 2)), 7);  // 4 x 2
  ExpectRestores(*posix_, Reshard(model, MeshOf(8, 1)), 7);  // 8 x 1
  ExpectRestores(*posix_, Reshard(model, MeshOf(1, 1)), 7);  // one device
}

TEST_F(CheckpointTest, RestoresWholeArraysIntoHostMemory) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 7).ok());
  HostArrays host = WholeArraysInHost(model);
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      *posix_, root_ + "/step_00000007", host.targets, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->dispatches, 0);
  ExpectWholeArrays(model, host);
}

TEST(HostBufferTest, UntouchedAlignedAndAdvisedForHugePagesFromTwoMiB) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  constexpr int64_t kHugePage = int64_t{2} << 20;
  HostBuffer big(kHugePage * 2 + 12345);
  EXPECT_EQ(big.size(), kHugePage * 2 + 12345);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % 4096, 0u);
  // Nothing resident before the first write: the restore's to fault in.
  EXPECT_THAT(SmapsField(big.data(), "Rss"), ::testing::HasSubstr(" 0 kB"));
  if (AdviseHugePages()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePage, 0u);
    EXPECT_THAT(SmapsField(big.data(), "VmFlags"), ::testing::HasSubstr(" hg"));
  } else {  // a VM whose host discards freed memory (huge_pages.h)
    EXPECT_THAT(SmapsField(big.data(), "VmFlags"),
                ::testing::Not(::testing::HasSubstr(" hg")));
  }
  // The tail past the last whole 2 MiB block keeps small pages.
  EXPECT_THAT(SmapsField(big.data() + 2 * kHugePage, "VmFlags"),
              ::testing::Not(::testing::HasSubstr(" hg")));
  big.data()[big.size() - 1] = 7;

  HostBuffer small(100 << 10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 4096, 0u);
  EXPECT_THAT(SmapsField(small.data(), "VmFlags"),
              ::testing::Not(::testing::HasSubstr(" hg")));

  HostBuffer moved(std::move(big));
  EXPECT_EQ(moved.data()[moved.size() - 1], 7);
  EXPECT_EQ(big.data(), nullptr);
  EXPECT_EQ(big.size(), 0);
  small = std::move(moved);
  EXPECT_EQ(small.span().back(), 7);
  EXPECT_EQ(HostBuffer(0).data(), nullptr);
}

TEST_F(CheckpointTest, OrbaxRuleAndSingleReplicaRoundTripToo) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  SavePlanOptions orbax;
  orbax.replica_rule = ReplicaRule::kOrbax;
  orbax.min_slice_bytes = 0;
  ASSERT_TRUE(Save(*posix_, model, 1, 0, false, orbax).ok());
  ExpectRestores(*posix_, Reshard(model, MeshOf(4, 2)), 1);
  SavePlanOptions single;
  single.replica_rule = ReplicaRule::kSingleReplica;
  ASSERT_TRUE(Save(*posix_, model, 2, 0, false, single).ok());
  ExpectRestores(*posix_, Reshard(model, MeshOf(8, 1)), 2);
}

TEST_F(CheckpointTest, RestoringASubsetReadsOnlyItsBytes) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 3).ok());
  const ArraySpec& spec = model[2];
  ShardBuffers buffers = *AllocateShards(spec, backend_->devices());
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      *posix_, root_ + "/step_00000003", {buffers.target}, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes_read,
            Box::FromShape(spec.shape).num_elements() * ItemSize(spec.dtype));
  EXPECT_EQ(stats->dispatches, 8);  // one CopyFromHost per device
}

TEST_F(CheckpointTest, RestoreThroughASmallPoolRunsInWaves) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 4).ok());
  pool_ = *StagingPool::Create(*backend_, 64 * 1024);
  std::vector<ShardBuffers> buffers;
  std::vector<RestoreTarget> targets;
  for (const ArraySpec& spec : Reshard(model, MeshOf(4, 2))) {
    buffers.push_back(*AllocateShards(spec, backend_->devices()));
    targets.push_back(buffers.back().target);
  }
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(*posix_, root_ + "/step_00000004", targets, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->waves, 1);
  EXPECT_LE(pool_->stats().peak_bytes, 64 * 1024);
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
  ExpectRestores(*posix_, Reshard(model, MeshOf(4, 2)), 4);
}

// One 256 KiB box per device (8 x 1 mesh).
std::vector<ArraySpec> BigBoxes() {
  return {{"big",
           DType::kFloat32,
           {8 * 256, 256},
           NamedSharding{MeshOf(8, 1), {{"data"}}}}};
}

TEST_F(CheckpointTest, BoxLargerThanThePoolIsRestoredInParts) {
  // Restored through a 64 KiB pool.
  const std::vector<ArraySpec> model = BigBoxes();
  ASSERT_TRUE(Save(*posix_, model, 1).ok());
  pool_ = *StagingPool::Create(*backend_, 64 * 1024);
  ShardBuffers buffers = *AllocateShards(model[0], backend_->devices());
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      *posix_, root_ + "/step_00000001", {buffers.target}, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->waves, 8);
  for (const RestoreDestination& dest : buffers.target.destinations) {
    const std::vector<uint8_t> expected = BoxBytes(model[0], 0, dest.box);
    ASSERT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
        << dest.box.ToString();
  }
  // A single row wider than half the pool cannot be split further.
  pool_ = *StagingPool::Create(*backend_, 1024);
  EXPECT_EQ(RestoreCheckpoint(*posix_, root_ + "/step_00000001",
                              {buffers.target}, *pool_)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

// Boxes without a device or memory go to the caller's receiver, once per
// wave, in parts when a box is larger than half the pool; every part
// carries its box, its offset in the box and the box's tag, and together
// they are the box's bytes.
TEST_F(CheckpointTest, ReceiverGetsEveryPartOfItsBoxesOncePerWave) {
  const std::vector<ArraySpec> model = BigBoxes();
  const RestoreTarget target = SaveForAReceiver(model);
  std::vector<std::vector<uint8_t>> got(8, std::vector<uint8_t>(256 * 1024));
  std::vector<int64_t> filled(8, 0);
  int calls = 0;
  const RestoreReceiver receiver = [&](absl::Span<const StagedPart> parts) {
    ++calls;
    for (const StagedPart& part : parts) {
      const int d = static_cast<int>(part.destination->tag - 100);
      EXPECT_TRUE(part.destination->box.Contains(part.part));
      EXPECT_EQ(part.size_bytes, part.part.num_elements() * 4);
      std::memcpy(got[d].data() + part.offset_bytes, part.bytes,
                  part.size_bytes);
      filled[d] += part.size_bytes;
    }
    return absl::OkStatus();
  };
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      *posix_, root_ + "/step_00000001", {target}, *pool_, {}, receiver);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(calls, stats->waves);
  EXPECT_GT(stats->waves, 8);  // 256 KiB boxes through 32 KiB waves
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(filled[d], 256 * 1024);
    EXPECT_EQ(got[d], BoxBytes(model[0], 0, target.destinations[d].box)) << d;
  }
  // Without a receiver such boxes are refused; a receiver's error fails the
  // restore with it.
  EXPECT_EQ(
      RestoreCheckpoint(*posix_, root_ + "/step_00000001", {target}, *pool_)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  const absl::Status failed =
      RestoreCheckpoint(*posix_, root_ + "/step_00000001", {target}, *pool_, {},
                        [](absl::Span<const StagedPart>) {
                          return absl::InternalError("device out of memory");
                        })
          .status();
  EXPECT_THAT(failed.message(), HasSubstr("device out of memory"));
  // Failing at a later wave, while the waves after it are taken ahead and
  // being read, leaves nothing leased either.
  int waves_received = 0;
  const absl::Status failed_later =
      RestoreCheckpoint(*posix_, root_ + "/step_00000001", {target}, *pool_, {},
                        [&](absl::Span<const StagedPart>) {
                          return ++waves_received < 3
                                     ? absl::OkStatus()
                                     : absl::InternalError("device lost");
                        })
          .status();
  EXPECT_THAT(failed_later.message(), HasSubstr("device lost"));
  EXPECT_EQ(waves_received, 3);
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
}

// The next wave's leases are taken, and its reads started, while the
// restoring thread still hands the last wave over: during the receiver's
// first call, the pool holds more than that wave's images.
TEST_F(CheckpointTest, NextWaveIsTakenWhileTheLastIsHandedOver) {
  const RestoreTarget target = SaveForAReceiver(BigBoxes());
  const std::string step_dir = root_ + "/step_00000001";
  const absl::StatusOr<Manifest> manifest = ReadManifestFile(*posix_, step_dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  testing::ReadLog log;
  int calls = 0;
  int64_t first_wave_bytes = 0;
  int64_t in_use_during_first = 0;
  const std::function<bool()> next_wave_taken = [&] {
    return pool_->stats().in_use_bytes > first_wave_bytes;
  };
  const RestoreReceiver receiver = [&](absl::Span<const StagedPart> parts) {
    if (calls++ > 0) return absl::OkStatus();
    for (const StagedPart& part : parts) {
      first_wave_bytes += AlignUp(part.size_bytes, StagingPool::kAlignment);
    }
    // The restore's other thread takes the next wave's leases, then its
    // readers read into them, without this thread doing anything: asked
    // again at each read. Were the next wave taken only after this call,
    // no read would come, and the wait would never end.
    log.AwaitUntil(next_wave_taken);
    in_use_during_first = pool_->stats().in_use_bytes;
    return absl::OkStatus();
  };
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(*manifest, step_dir, {target}, *pool_, {}, receiver,
                        RecordingOpener(log));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->waves, 8);  // 256 KiB boxes through 32 KiB waves
  EXPECT_GT(first_wave_bytes, 0);
  EXPECT_GT(in_use_during_first, first_wave_bytes);
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
}

// A 32 MiB extent restored as column blocks is read in pieces of at most
// 16 MiB (bounded memory) and still lands bit-exact.
TEST_F(CheckpointTest, ExtentLargerThanARunIsReadInPieces) {
  pool_ = *StagingPool::Create(*backend_, 96 << 20);
  const std::vector<ArraySpec> whole = {{"big",
                                         DType::kFloat32,
                                         {2048, 4096},
                                         Sharding::Replicated(MeshOf(1, 1))}};
  ASSERT_TRUE(Save(*posix_, whole, 1, 7).ok());
  Manifest manifest = *ReadManifestFile(*posix_, root_ + "/step_00000001");
  ASSERT_EQ(manifest.arrays[0].extents.size(), 1u);
  std::vector<ArraySpec> columns = whole;
  columns[0].sharding = NamedSharding{MeshOf(2, 4), {{}, {"model"}}};
  ExpectRestores(*posix_, columns, 1, 7);
  EXPECT_TRUE(VerifyCheckpoint(*posix_, root_ + "/step_00000001").ok());
}

TEST_F(CheckpointTest, ExistingStepIsAlreadyExistsUnlessOverwriting) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 5, /*version=*/1).ok());
  absl::Status status = Save(*posix_, model, 5, 2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("step 5 is already committed"));
  ExpectRestores(*posix_, model, 5, 1);  // untouched
  ASSERT_TRUE(Save(*posix_, model, 5, 2, /*overwrite=*/true).ok());
  ExpectRestores(*posix_, model, 5, 2);
  EXPECT_THAT(*posix_->List(root_), ::testing::ElementsAre("step_00000005"));
}

TEST_F(CheckpointTest, CrashAtEverySyncPointLeavesThePreviousStepIntact) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  MemoryStorage memory;
  ASSERT_TRUE(memory.CreateDir("/ckpt").ok());
  ASSERT_TRUE(memory.SyncDir("/").ok());
  root_ = "/ckpt";
  ASSERT_TRUE(Save(memory, model, 1, /*version=*/1).ok());
  int crashes = 0;
  for (int sync = 0;; ++sync) {
    FaultInjectingStorage faulty(memory, {.crash_at_sync = sync});
    absl::StatusOr<SaveResult> saved = Save(faulty, model, 2, 2);
    memory.Crash();
    if (saved.ok()) break;  // got past every sync point
    ++crashes;
    ASSERT_TRUE(faulty.crashed()) << saved.status();
    EXPECT_FALSE(*memory.Exists("/ckpt/step_00000002")) << "sync " << sync;
    ExpectRestores(memory, model, 1, 1);
    // Clean up the debris a real restart's GC would remove.
    const std::vector<std::string> names = memory.List("/ckpt").value();
    for (const std::string& name : names) {
      if (IsTmpStepDirName(name)) {
        ASSERT_TRUE(memory.RemoveAll("/ckpt/" + name).ok());
      }
    }
  }
  EXPECT_GE(crashes, 5);  // data files, manifest, directories, root
  ExpectRestores(memory, model, 2, 2);
}

TEST_F(CheckpointTest, DiskFullMidSaveIsACleanError) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 1).ok());
  for (int write : {0, 3, 9}) {
    FaultInjectingStorage full(*posix_, {.fail_write = write, .error = ENOSPC});
    // New values: every extent is written (deltas write none of the same).
    absl::Status status = Save(full, model, 2, /*version=*/2).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(status.message(), HasSubstr("No space left on device"));
    EXPECT_THAT(*posix_->List(root_), ::testing::ElementsAre("step_00000001"))
        << "write " << write;
    EXPECT_EQ(pool_->stats().in_use_bytes, 0);
  }
  ExpectRestores(*posix_, model, 1);
  EXPECT_TRUE(Save(*posix_, model, 2, 2).ok());  // space is back
}

// A save allocates each write's range before writing it (so that ext4 runs
// the two writers of a file side by side); a failed allocation fails the
// save cleanly, with the error as the filesystem gave it.
TEST_F(CheckpointTest, EveryWriteIsReservedAndAFailedReservationIsACleanError) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 1, /*version=*/1).ok());
  FaultInjectingStorage counting(*posix_, {});
  ASSERT_TRUE(Save(counting, model, 2, 2).ok());
  EXPECT_GE(counting.reserves(), 2);  // two data files, every run in them
  FaultInjectingStorage full(*posix_, {.fail_reserve = 0, .error = ENOSPC});
  const absl::Status status = Save(full, model, 3, 3).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("injected reserve failure"));
  EXPECT_THAT(*posix_->List(root_),
              ::testing::ElementsAre("step_00000001", "step_00000002"));
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
  ExpectRestores(*posix_, model, 2, 2);
}

// The same on a real (loop-mounted ext4) filesystem filled for real: the
// kernel, not an injector, says ENOSPC, in whichever write it happens.
TEST_F(CheckpointTest, DiskFullOnARealFilesystemIsACleanError) {
  testing::LoopFilesystem fs(48 << 20);
  if (!fs.ok()) GTEST_SKIP() << fs.reason();
  root_ = fs.path() + "/ckpt";
  ASSERT_TRUE(posix_->CreateDir(root_).ok());
  pool_ = *StagingPool::Create(*backend_, 8 << 20);
  const std::vector<ArraySpec> model = {
      {"w",
       DType::kFloat32,
       {1024, 2048},
       NamedSharding{MeshOf(2, 4), {{"data"}, {"model"}}}}};  // 8 MiB
  ASSERT_TRUE(Save(*posix_, model, 1, 1).ok());
  // Leave 3 MiB free, so the next save fails part-way through its writes.
  const std::string filler = fs.path() + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(1 << 20, 'x');
    while (fs.FreeBytes() > (int64_t{4} << 20))
      out.write(block.data(), block.size()).flush();
  }
  sync();
  absl::Status status = Save(*posix_, model, 2, 2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(*posix_->List(root_), ::testing::ElementsAre("step_00000001"));
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
  ExpectRestores(*posix_, model, 1, 1);
  EXPECT_TRUE(VerifyCheckpoint(*posix_, root_ + "/step_00000001").ok());

  std::filesystem::remove(filler);  // space is back: the same save succeeds
  ASSERT_TRUE(Save(*posix_, model, 2, 2).ok());
  ExpectRestores(*posix_, model, 2, 2);
}

TEST_F(CheckpointTest, FailureAtEveryWriteAndSyncLeavesThePreviousStepIntact) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 1, /*version=*/1).ok());
  // Count the writes and syncs of one save, then fail each in turn.
  FaultInjectingStorage counting(*posix_, {});
  ASSERT_TRUE(Save(counting, model, 2, 2).ok());
  ASSERT_TRUE(posix_->RemoveAll(root_ + "/step_00000002").ok());
  const int writes = counting.writes();
  const int syncs = counting.syncs();
  ASSERT_GT(writes, 2);
  ASSERT_GT(syncs, 4);
  for (int i = 0; i < writes + syncs; ++i) {
    FaultPlan plan;
    plan.error = i % 2 == 0 ? ENOSPC : EIO;
    plan.torn = i % 3 == 0;
    if (i < writes) {
      plan.fail_write = i;
    } else {
      plan.fail_sync = i - writes;
    }
    FaultInjectingStorage faulty(*posix_, plan);
    absl::Status status = Save(faulty, model, 2, 2).status();
    ASSERT_FALSE(status.ok()) << "fault " << i << " went unnoticed";
    EXPECT_THAT(*posix_->List(root_), ::testing::ElementsAre("step_00000001"))
        << "fault " << i << ": " << status;
    EXPECT_EQ(pool_->stats().in_use_bytes, 0) << "fault " << i;
  }
  ExpectRestores(*posix_, model, 1, 1);
  RecordProperty("faults_injected", writes + syncs);
}

// Host memory that is not 4 KiB-aligned (as a caller's own buffers may
// be) cannot take O_DIRECT reads: its extents are read into an aligned
// buffer and copied, small and large alike.
TEST_F(CheckpointTest, RestoresIntoUnalignedHostMemory) {
  const std::vector<ArraySpec> model = ModelWithLargeExtents(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 3).ok());
  std::vector<std::vector<uint8_t>> memory;
  std::vector<RestoreTarget> targets;
  for (const ArraySpec& spec : model) {
    const int64_t bytes =
        Box::FromShape(spec.shape).num_elements() * ItemSize(spec.dtype);
    memory.emplace_back(bytes + 4096 + 64);
    uint8_t* start =
        memory.back().data() +
        (4096 - reinterpret_cast<uintptr_t>(memory.back().data()) % 4096) +
        64;  // 64 bytes past a 4 KiB boundary
    targets.push_back({spec.name,
                       spec.dtype,
                       spec.shape,
                       {{Box::FromShape(spec.shape), nullptr, start}}});
  }
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(*posix_, root_ + "/step_00000003", targets, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (size_t a = 0; a < model.size(); ++a) {
    const std::vector<uint8_t> expected =
        BoxBytes(model[a], static_cast<int>(a), Box::FromShape(model[a].shape));
    const auto* got =
        static_cast<const uint8_t*>(targets[a].destinations[0].data);
    EXPECT_EQ(std::vector<uint8_t>(got, got + expected.size()), expected)
        << model[a].name;
  }
}

// Extents bound for host memory are read into the readers' buffers and
// copied into place, even those a direct read could fill (aligned, not
// small); RestoreOptions::stage_host_reads = false reads those straight
// into the destination.
TEST_F(CheckpointTest, HostReadsGoThroughTheReadersBuffersUnlessAskedNot) {
  const std::vector<ArraySpec> model = ModelWithLargeExtents(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 3).ok());
  for (const bool staged : {true, false}) {
    SCOPED_TRACE(staged ? "staged" : "direct");
    HostArrays host = WholeArraysInHost(model);
    RestoreOptions options;
    options.stage_host_reads = staged;
    int into_destinations = 0;
    for (const testing::RecordedRead& read :
         RestoreWholeRecordingReads(model, 3, host, *pool_, options)) {
      for (const HostBuffer& bytes : host.bytes) {
        into_destinations += read.into >= bytes.data() &&
                             read.into < bytes.data() + bytes.size();
      }
    }
    if (staged) {
      EXPECT_EQ(into_destinations, 0);
    } else {
      EXPECT_EQ(into_destinations, 2);  // "big"'s, one per "data" shard
    }
  }
}

// A model's small arrays lie between its large ones; the save lays them out
// together, so a restore reads them in one request per data file, and
// each large extent straight into place (it read each small one on its
// own before).
TEST_F(CheckpointTest, SmallArraysBetweenLargeOnesAreReadInOneRequestAFile) {
  const Mesh mesh = MeshOf(2, 4);
  std::vector<ArraySpec> model;
  for (int layer = 0; layer < 4; ++layer) {
    model.push_back({absl::StrCat("w", layer),
                     DType::kFloat32,
                     {1024, 256},
                     NamedSharding{mesh, {{"data"}}}});  // 512 KiB extents
    model.push_back({absl::StrCat("b", layer),
                     DType::kFloat32,
                     {256},
                     NamedSharding{mesh, {}}});
  }
  ASSERT_TRUE(Save(*posix_, model, 3).ok());
  HostArrays host = WholeArraysInHost(model);
  RestoreOptions options;
  options.stage_host_reads = false;  // the large ones straight into place
  const std::vector<testing::RecordedRead> reads =
      RestoreWholeRecordingReads(model, 3, host, *pool_, options);
  int small_runs = 0, large = 0;
  for (const testing::RecordedRead& read : reads) {
    if (read.bytes < kSmallSliceBytes) {
      ++small_runs;
    } else {
      ++large;
    }
  }
  EXPECT_EQ(large, 8);
  EXPECT_LE(small_runs, 2);  // the Save above writes 2 data files
}

// Where a quarter of the pool holds them, the readers' buffers are its
// first bytes (resident huge pages): every read lands there, and the pool
// is whole again afterwards. Where it does not they map their own.
TEST_F(CheckpointTest, ReadersReadIntoThePoolWhereItHasRoom) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  ASSERT_TRUE(Save(*posix_, model, 3).ok());
  constexpr int64_t kLent = AlignUp(kReadBufferBytes, 4096);
  for (const int64_t capacity : {8 * kLent, 4 * kLent - 4096}) {
    SCOPED_TRACE(capacity);
    std::unique_ptr<StagingPool> pool =
        *StagingPool::Create(*backend_, capacity);
    uint8_t* const base = pool->Acquire(4096)->data();
    HostArrays host = WholeArraysInHost(model);
    RestoreOptions options;
    options.reader_threads = 2;
    const std::vector<testing::RecordedRead> reads =
        RestoreWholeRecordingReads(model, 3, host, *pool, options);
    ASSERT_FALSE(reads.empty());
    int in_pool = 0;
    for (const testing::RecordedRead& read : reads) {
      in_pool += read.into >= base && read.into + read.bytes <= base + capacity;
    }
    EXPECT_EQ(in_pool, capacity == 8 * kLent ? reads.size() : 0u);
    EXPECT_EQ(pool->stats().in_use_bytes, 0);
  }
}

TEST_F(CheckpointTest, TornWriteAndFailedSyncAbortTheStep) {
  const std::vector<ArraySpec> model = Model(MeshOf(2, 4));
  FaultInjectingStorage torn(*posix_, {.fail_write = 2, .torn = true});
  EXPECT_EQ(Save(torn, model, 1).status().code(), absl::StatusCode::kAborted);
  FaultInjectingStorage sync(*posix_, {.fail_sync = 1});
  EXPECT_EQ(Save(sync, model, 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(posix_->List(root_)->empty());
}

// Corrupts the step on disk through `edit`, then checks restore and verify.
class CorruptionTest : public CheckpointTest {
 protected:
  std::string Step() { return root_ + "/step_00000001"; }
  void SetUp() override {
    CheckpointTest::SetUp();
    model_ = Model(MeshOf(2, 4));
    ASSERT_TRUE(Save(*posix_, model_, 1).ok());
    manifest_ = *ReadManifestFile(*posix_, Step());
  }
  absl::StatusOr<RestoreStats> Restore(const RestoreOptions& options = {}) {
    std::vector<RestoreTarget> targets;
    for (const ArraySpec& spec : model_) {
      buffers_.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers_.back().target);
    }
    return RestoreCheckpoint(*posix_, Step(), targets, *pool_, options);
  }
  absl::Status RestoreAll(const RestoreOptions& options = {}) {
    return Restore(options).status();
  }
  void WriteManifestText(const std::string& text) {
    std::ofstream(Step() + "/MANIFEST.json", std::ios::trunc) << text;
  }
  std::vector<ArraySpec> model_;
  Manifest manifest_;
  std::vector<ShardBuffers> buffers_;
};

TEST_F(CorruptionTest, FlippedByteIsDataLossNamingFileAndOffset) {
  const ManifestExtent& extent = manifest_.arrays[1].extents[0];
  std::fstream file(Step() + "/" + extent.file,
                    std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(extent.offset_bytes + 3);
  char byte;
  file.read(&byte, 1);
  byte ^= 0x40;
  file.seekp(extent.offset_bytes + 3);
  file.write(&byte, 1);
  file.close();
  // Unchecked (a benchmark knob), the flip goes unnoticed: checking is
  // what catches it.
  RestoreOptions unchecked;
  unchecked.verify_xxh3 = false;
  EXPECT_TRUE(RestoreAll(unchecked).ok());
  absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrFormat("array '%s': extent 0 of",
                                        manifest_.arrays[1].name)));
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrFormat("xxh3 mismatch in %s @ %d", extent.file,
                                        extent.offset_bytes)));
  VerifyReport report = VerifyCheckpoint(*posix_, Step());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("xxh3 mismatch"));
}

// A restore in waves, taken ahead of the restoring thread: a bad extent of
// the last array fails it, and every lease returns.
TEST_F(CorruptionTest, FlippedByteInALaterWaveIsDataLossAndReturnsEveryLease) {
  const ManifestArray& last = manifest_.arrays.back();
  const ManifestExtent& extent = last.extents.back();
  std::fstream file(Step() + "/" + extent.file,
                    std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(extent.offset_bytes);
  char byte;
  file.read(&byte, 1);
  byte ^= 0x01;
  file.seekp(extent.offset_bytes);
  file.write(&byte, 1);
  file.close();
  pool_ = *StagingPool::Create(*backend_, 64 * 1024);
  RestoreOptions unchecked;
  unchecked.verify_xxh3 = false;
  const absl::StatusOr<RestoreStats> stats = Restore(unchecked);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->waves, 2);
  const absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrFormat("array '%s'", last.name)));
  EXPECT_THAT(status.message(), HasSubstr("xxh3 mismatch"));
  EXPECT_EQ(pool_->stats().in_use_bytes, 0);
}

TEST_F(CorruptionTest, TruncatedDataFileIsDataLossAndVerifyReportsEveryExtent) {
  const std::string file = Step() + "/data/r00000_w01.bin";
  ASSERT_EQ(truncate(file.c_str(), 10), 0);
  absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  int in_file = 0;
  for (const ManifestArray& a : manifest_.arrays) {
    for (const ManifestExtent& e : a.extents) {
      in_file += e.file == "data/r00000_w01.bin";
    }
  }
  VerifyReport report = VerifyCheckpoint(*posix_, Step());
  EXPECT_EQ(static_cast<int>(report.problems.size()), in_file);
}

TEST_F(CorruptionTest, GarbageOrTruncatedManifestIsDataLoss) {
  WriteManifestText("{\"format\": \"hoist/1\", \"step\": 1, \"arr");
  EXPECT_EQ(RestoreAll().code(), absl::StatusCode::kDataLoss);
  WriteManifestText(std::string("\x7f\x45\x4c\x46 binary junk", 16));
  EXPECT_EQ(RestoreAll().code(), absl::StatusCode::kDataLoss);
  VerifyReport report = VerifyCheckpoint(*posix_, Step());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("not valid JSON"));
}

TEST_F(CorruptionTest, PathTraversalInTheManifestIsRefused) {
  manifest_.arrays[0].extents[0].file = "../../../etc/passwd";
  WriteManifestText(EncodeManifest(manifest_).value());
  absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("not a plain relative path"));
}

TEST_F(CorruptionTest, DataDirectoryLinkedOutOfTheCheckpointIsRefused) {
  testing::TempDir elsewhere;
  std::filesystem::rename(Step() + "/data", elsewhere.path() + "/data");
  std::filesystem::create_directory_symlink(elsewhere.path() + "/data",
                                            Step() + "/data");
  absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("not a directory inside"));
  // verify does not read through the link either.
  VerifyReport report = VerifyCheckpoint(*posix_, Step());
  ASSERT_FALSE(report.problems.empty());
  EXPECT_EQ(report.bytes, 0);
  EXPECT_THAT(report.problems[0], HasSubstr("not a directory inside"));
}

// A manifest may claim an array of any size: restore and verify check the
// claim against the file before sizing any buffer from it.
TEST_F(CorruptionTest, HugeExtentClaimIsRefusedBeforeAnyLargeAllocation) {
  const int64_t elements = int64_t{1} << 38;  // 1 TiB of float32
  manifest_.arrays.push_back(
      {"bomb",
       DType::kFloat32,
       {elements},
       "replicated",
       {{Box::FromShape({elements}), "data/r00000_w00.bin", 0, elements * 4,
         ExtentHash{.low = 0x0123456789abcdefull}, std::nullopt}}});
  WriteManifestText(EncodeManifest(manifest_).value());

  VerifyReport report = VerifyCheckpoint(*posix_, Step());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("array 'bomb'"));
  EXPECT_THAT(report.problems[0], HasSubstr("runs past the end"));

  // Sixteen elements of it, into host memory: the extent does not fit the
  // destination, so it would be read through a buffer.
  std::vector<float> small(16);
  RestoreTarget target{"bomb",
                       DType::kFloat32,
                       {elements},
                       {{Box({0}, {16}), nullptr, small.data()}}};
  absl::Status status =
      RestoreCheckpoint(*posix_, Step(), {target}, *pool_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("array 'bomb': extent 0 of 1"));
  EXPECT_THAT(status.message(), HasSubstr("runs past the end"));
}

TEST_F(CorruptionTest, DataFileLinkedOutOfTheCheckpointIsRefused) {
  testing::TempDir elsewhere;
  const std::string file = Step() + "/data/r00000_w00.bin";
  std::filesystem::rename(file, elsewhere.path() + "/stolen.bin");
  std::filesystem::create_symlink(elsewhere.path() + "/stolen.bin", file);
  absl::Status status = RestoreAll();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("is a symbolic link"));
}

TEST_F(CorruptionTest, MismatchedRequestIsFailedPreconditionWithBothSides) {
  std::vector<ArraySpec> wrong = model_;
  wrong[0].shape = {16, 32};
  ShardBuffers buffers = *AllocateShards(wrong[0], backend_->devices());
  absl::Status status =
      RestoreCheckpoint(*posix_, Step(), {buffers.target}, *pool_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("requested bool (16, 32)"));
  EXPECT_THAT(status.message(), HasSubstr("holds bool (16, 24)"));

  RestoreTarget missing{"params/nope", DType::kFloat32, {1}, {}};
  EXPECT_EQ(
      RestoreCheckpoint(*posix_, Step(), {missing}, *pool_).status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hoist
