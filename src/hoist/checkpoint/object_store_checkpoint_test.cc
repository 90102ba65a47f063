// Checkpoints on object stores, against real servers (SeaweedFS for S3,
// fake-gcs-server for GCS, started once for this binary): save, restore
// onto another sharding, retention, verify, what a crash leaves, damaged
// objects, and a server killed in the middle of a save.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/layout.h"
#include "hoist/host_backend.h"
#include "testing/array_bytes.h"
#include "testing/mixed_model.h"
#include "testing/object_store_server.h"
#include "testing/shard_buffers.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using testing::BoxBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ObjectStoreServer;

std::vector<ArraySpec> Model(int64_t rows) {
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  return {
      {"params/w",
       DType::kBFloat16,
       {rows, 64},
       NamedSharding{mesh, {{}, {"model"}}}},
      {"opt/mu",
       DType::kFloat32,
       {rows, 64},
       NamedSharding{mesh, {{"data", "model"}}}},
      {"opt/count", DType::kInt32, {}, Sharding::Replicated(mesh)},
  };
}

// 32 layers of 64 x 64 over the 2 x 4 mesh: 256 slices, so every writer
// stream of a process gets some.
std::vector<ArraySpec> Layers() {
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  std::vector<ArraySpec> model;
  for (int i = 0; i < 32; ++i) {
    model.push_back({absl::StrCat("layer", i),
                     DType::kFloat32,
                     {64, 64},
                     NamedSharding{mesh, {{"data", "model"}}}});
  }
  return model;
}

class ObjectStoreCheckpointTest
    : public ::testing::TestWithParam<ObjectStoreServer::Kind> {
 protected:
  void SetUp() override {
    HOIST_REQUIRE_SERVERS();
    testing::SharedServers& servers = testing::TheServers();
    server_ = servers.Of(GetParam());
    root_ = server_->Url(testing::UniquePrefix("ckpt"));
    backend_ = *MakeHostBackend({.num_devices = 8});
    UseModel(Model(256));
  }

  void UseModel(std::vector<ArraySpec> model) {
    model_ = std::move(model);
    shards_ = testing::FillShards(model_, backend_->devices());
  }

  std::unique_ptr<CheckpointManager> Open(CheckpointManagerOptions options) {
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root_, *backend_, *coordinator_, options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? *std::move(manager) : nullptr;
  }

  absl::Status SaveVersion(CheckpointManager& manager, int64_t step,
                           uint64_t version) {
    testing::Refill(model_, shards_, version);
    absl::StatusOr<SaveHandle> handle =
        manager.Save(step, testing::SaveArraysOf(model_, shards_));
    if (!handle.ok()) return handle.status();
    return handle->WaitCommitted().status();
  }

  // Restores `step` onto a 4 x 2 mesh: OK when it holds `version`.
  absl::Status Holds(CheckpointManager& manager, int64_t step,
                     uint64_t version) {
    const Mesh other = *Mesh::Create({"data", "model"}, {4, 2});
    std::vector<ShardBuffers> buffers;
    std::vector<RestoreTarget> targets;
    for (ArraySpec spec : model_) {
      if (spec.sharding.named() != nullptr) {
        spec.sharding = NamedSharding{other, spec.sharding.named()->spec};
      } else {
        spec.sharding = Sharding::Replicated(other);
      }
      buffers.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers.back().target);
    }
    absl::StatusOr<RestoreStats> stats = manager.Restore(step, targets);
    if (!stats.ok()) return stats.status();
    for (size_t a = 0; a < model_.size(); ++a) {
      for (const RestoreDestination& dest : targets[a].destinations) {
        const std::vector<uint8_t> expected =
            BoxBytes(model_[a], static_cast<int>(a), dest.box, version);
        if (std::memcmp(dest.data, expected.data(), expected.size()) != 0) {
          return absl::DataLossError(
              absl::StrCat(model_[a].name, " ", dest.box.ToString()));
        }
      }
    }
    return absl::OkStatus();
  }

  // Uploads `bytes` as the object `url`.
  static absl::Status Put(Storage& storage, const std::string& url,
                          const std::vector<uint8_t>& bytes) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage.OpenWritable(url);
    if (!file.ok()) return file.status();
    if (absl::Status s = (*file)->WriteAt(0, bytes); !s.ok()) return s;
    return (*file)->Sync();
  }

  std::unique_ptr<Storage> TheStorage() {
    return *testing::OpenObjectStorage(root_);
  }

  ObjectStoreServer* server_ = nullptr;
  std::string root_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_ = MakeSingleProcessCoordinator();
  std::vector<ArraySpec> model_;
  testing::DeviceShards shards_;
};

TEST_P(ObjectStoreCheckpointTest, SavesRestoresOntoAnotherMeshAndPrunes) {
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  options.keep_last = 2;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(SaveVersion(*manager, step, step).ok()) << step;
  }
  // Retention has run once the last save's wait returned.
  EXPECT_THAT(*manager->List(), ElementsAre(2, 3));
  EXPECT_TRUE(Holds(*manager, 3, 3).ok());
  EXPECT_TRUE(Holds(*manager, 2, 2).ok());
  absl::StatusOr<std::unique_ptr<CheckpointRoot>> root =
      CheckpointRoot::OpenForReading(root_);
  ASSERT_TRUE(root.ok()) << root.status();
  absl::StatusOr<VerifyReport> report = (*root)->Verify(3);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty());
}

// Deltas on an object store: a step that changed nothing uploads no data
// and references the step before; pruned, that step keeps its objects
// while a kept step reads them, and loses them after.
TEST_P(ObjectStoreCheckpointTest, DeltasReferenceEarlierObjectsUntilPruned) {
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  options.keep_last = 2;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  ASSERT_TRUE(SaveVersion(*manager, 2, 1).ok());  // nothing changed
  const Manifest two = *manager->ReadManifest(2);
  for (const ManifestArray& array : two.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      EXPECT_EQ(extent.step, 1) << array.name;
    }
  }
  ASSERT_TRUE(SaveVersion(*manager, 3, 3).ok());  // prunes step 1
  EXPECT_THAT(*manager->List(), ElementsAre(2, 3));
  auto reader = *CheckpointRoot::OpenForReading(root_);
  std::vector<RootEntry> entries = *reader->Entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].kind, RootEntry::Kind::kReferenced);
  EXPECT_TRUE(Holds(*manager, 2, 1).ok());
  EXPECT_TRUE(Holds(*manager, 3, 3).ok());
  EXPECT_TRUE(reader->Verify(2)->ok());
  ASSERT_TRUE(SaveVersion(*manager, 4, 4).ok());  // prunes step 2, then 1
  entries = *reader->Entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].step, 3);
  EXPECT_EQ(reader->HeldBytes(1).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(ObjectStoreCheckpointTest, ASaveLargerThanThePoolCommitsInWaves) {
  UseModel(Model(4096));  // 2.5 MiB over a 256 KiB pool
  CheckpointManagerOptions options;
  options.pool_bytes = 256 << 10;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 7, 7).ok());
  EXPECT_TRUE(Holds(*manager, 7, 7).ok());
}

// By default a process uploads as many objects at once as its store
// prefers (Storage::preferred_writer_streams: S3 4, GCS 16); a number
// given overrides it.
TEST_P(ObjectStoreCheckpointTest, WriterStreamsAreTheStoresUnlessGiven) {
  UseModel(Layers());
  std::unique_ptr<Storage> storage = TheStorage();
  const int preferred = storage->preferred_writer_streams();
  EXPECT_EQ(preferred, GetParam() == ObjectStoreServer::Kind::kS3 ? 4 : 16);
  for (int given : {0, 3}) {
    CheckpointManagerOptions options;
    options.pool_bytes = 1 << 20;
    options.plan.writer_streams = given;
    auto manager = Open(options);
    ASSERT_NE(manager, nullptr);
    const int64_t step = given + 1;
    ASSERT_TRUE(SaveVersion(*manager, step, step).ok());
    absl::StatusOr<std::vector<std::string>> objects =
        ListDataFiles(*storage, JoinPath(root_, StepDirName(step)));
    ASSERT_TRUE(objects.ok()) << objects.status();
    EXPECT_EQ(objects->size(), static_cast<size_t>(given ? given : preferred));
    EXPECT_TRUE(Holds(*manager, step, step).ok());
  }
}

// An object store limits requests per key prefix: a step's data objects go
// under 256 hashed prefixes (data/HH/rPPPPP_wSS.bin), which the manifest
// names, so that a job of many ranks spreads its uploads; none lies
// directly under data/. Restores, deltas and retention find them there.
TEST_P(ObjectStoreCheckpointTest, AStepsObjectsSpreadOverHashedPrefixes) {
  UseModel(Layers());
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  options.plan.writer_streams = 32;
  options.keep_last = 1;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  std::unique_ptr<Storage> storage = TheStorage();
  const std::string step_dir = JoinPath(root_, StepDirName(1));
  const std::vector<std::string> objects = *ListDataFiles(*storage, step_dir);
  ASSERT_EQ(objects.size(), 32u);
  std::set<std::string> prefixes;
  for (int stream = 0; stream < 32; ++stream) {
    const std::string name = DataFileName(0, stream, /*spread=*/true);
    EXPECT_THAT(name, ::testing::MatchesRegex("data/[0-9a-f]{2}/r00000_w" +
                                              absl::StrFormat("%02d", stream) +
                                              "\\.bin"));
    EXPECT_TRUE(absl::c_linear_search(objects, name)) << name;
    prefixes.insert(name.substr(0, 8));
  }
  EXPECT_GE(prefixes.size(), 24u);  // 32 names over 256 prefixes
  const absl::StatusOr<std::vector<std::string>> entries =
      storage->List(JoinPath(step_dir, std::string(kDataDirName)));
  ASSERT_TRUE(entries.ok()) << entries.status();
  for (const std::string& entry : *entries) {
    EXPECT_EQ(entry.size(), 2u) << entry << " lies directly under data/";
  }
  const absl::StatusOr<Manifest> manifest = manager->ReadManifest(1);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::set<std::string> named;
  for (const ManifestArray& array : manifest->arrays) {
    for (const ManifestExtent& extent : array.extents)
      named.insert(extent.file);
  }
  for (const std::string& file : named) {
    EXPECT_TRUE(absl::c_linear_search(objects, file)) << file;
  }
  EXPECT_TRUE(Holds(*manager, 1, 1).ok());
  // A delta references them; pruning step 1 keeps exactly those.
  ASSERT_TRUE(SaveVersion(*manager, 2, 1).ok());
  EXPECT_TRUE(Holds(*manager, 2, 1).ok());
  EXPECT_EQ(ListDataFiles(*storage, step_dir)->size(), named.size());
  auto reader = *CheckpointRoot::OpenForReading(root_);
  EXPECT_TRUE(reader->Verify(2)->ok());
  EXPECT_GT(*reader->HeldBytes(1), 0);
}

// A local tier's parts are on the local filesystem, and take its number
// of streams (2), while the durable saves take the object store's.
TEST_P(ObjectStoreCheckpointTest, ALocalTiersPartsTakeTheLocalStreams) {
  UseModel(Layers());
  testing::TempDir local;
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  options.persist_every = 2;  // 1 local, 2 durable
  options.local.root = local.path();
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  ASSERT_TRUE(SaveVersion(*manager, 2, 2).ok());
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           JoinPath(JoinPath(local.path(), StepDirName(1)), "data"))) {
    files += entry.is_regular_file() ? 1 : 0;
  }
  EXPECT_EQ(files, 2u);
  std::unique_ptr<Storage> storage = TheStorage();
  absl::StatusOr<std::vector<std::string>> objects =
      ListDataFiles(*storage, JoinPath(root_, StepDirName(2)));
  ASSERT_TRUE(objects.ok()) << objects.status();
  EXPECT_EQ(objects->size(),
            static_cast<size_t>(storage->preferred_writer_streams()));
}

TEST_P(ObjectStoreCheckpointTest, APartialStepIsInvisibleAndCollectedAtOpen) {
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  {
    auto manager = Open(options);
    ASSERT_NE(manager, nullptr);
    ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  }
  // What a job killed in the middle of saving step 2 leaves: data, no
  // manifest.
  std::unique_ptr<Storage> storage = TheStorage();
  ASSERT_TRUE(Put(*storage, root_ + "/step_00000002/data/r00000_w00.bin",
                  std::vector<uint8_t>(4096, 1))
                  .ok());
  absl::StatusOr<std::unique_ptr<CheckpointRoot>> reader =
      CheckpointRoot::OpenForReading(root_);
  ASSERT_TRUE(reader.ok());
  EXPECT_THAT(*(*reader)->List(), ElementsAre(1));
  EXPECT_EQ((*reader)->ReadManifest(2).status().code(),
            absl::StatusCode::kNotFound);
  auto entries = (*reader)->Entries();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[1].kind, RootEntry::Kind::kIncomplete);
  // The next open collects it; step 1 stays.
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  EXPECT_FALSE(*storage->Exists(root_ + "/step_00000002"));
  EXPECT_TRUE(Holds(*manager, 1, 1).ok());
  ASSERT_TRUE(SaveVersion(*manager, 2, 2).ok());
  EXPECT_TRUE(Holds(*manager, 2, 2).ok());
}

TEST_P(ObjectStoreCheckpointTest, DamagedObjectsAreRefusedAndNamed) {
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  ASSERT_TRUE(SaveVersion(*manager, 2, 2).ok());
  std::unique_ptr<Storage> storage = TheStorage();
  const std::string object =
      JoinPath(JoinPath(root_, StepDirName(2)), DataFileName(0, 0, true));
  const int64_t size = *(*storage->OpenReadable(object))->Size();
  // Replaced by a truncated copy of other bytes.
  ASSERT_TRUE(storage->RemoveAll(object).ok());
  ASSERT_TRUE(Put(*storage, object,
                  std::vector<uint8_t>(static_cast<size_t>(size / 2), 0x5a))
                  .ok());
  const absl::Status restored = Holds(*manager, 2, 2);
  EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << restored;
  EXPECT_THAT(restored.message(), HasSubstr("r00000_w00.bin"));
  auto root = CheckpointRoot::OpenForReading(root_);
  absl::StatusOr<VerifyReport> report = (*root)->Verify(2);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->problems.empty());
  EXPECT_THAT(report->problems.front(), HasSubstr("r00000_w00.bin"));
  // Deleted: named too.
  ASSERT_TRUE(storage->RemoveAll(object).ok());
  const absl::Status missing = Holds(*manager, 2, 2);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("r00000_w00.bin"));
  // The other step is untouched.
  EXPECT_TRUE(Holds(*manager, 1, 1).ok());
}

// The server SIGKILLed mid-save (each restarts on its data: SeaweedFS's
// directory, fake-gcs-server's filesystem backend), or hung (SIGSTOP).
class ServerKilledTest : public ObjectStoreCheckpointTest {
 protected:
  // A pool of `pool_bytes` and short object-store timeouts (seconds).
  static CheckpointManagerOptions ShortTimeouts(int64_t pool_bytes,
                                                int attempts, int connect_s,
                                                int request_s) {
    CheckpointManagerOptions options;
    options.pool_bytes = pool_bytes;
    options.object_store.max_attempts = attempts;
    options.object_store.connect_timeout_s = connect_s;
    options.object_store.request_timeout_s = request_s;
    return options;
  }
};

// On GCS the failed save takes 93-112 s to come back (2026-12-06), far past
// its bounds (2 attempts of 10 s): Arrow's GCS client retries each upload
// on its own and the writer streams go on one object after another (issue
// 78's to bound). So the GCS case runs with HOIST_LONG=1; the S3 case shows
// the behaviour in every run.
TEST_P(ServerKilledTest, AServerKilledMidSaveFailsItAndLosesNothing) {
  if (GetParam() == ObjectStoreServer::Kind::kGcs &&
      std::getenv("HOIST_LONG") == nullptr) {
    GTEST_SKIP() << "GCS: about 100 s for the failed save to return; "
                    "HOIST_LONG=1 runs it";
  }
  UseModel(Model(32768));  // 20 MiB: the upload takes a while
  auto manager = Open(ShortTimeouts(32 << 20, /*attempts=*/2, /*connect_s=*/2,
                                    /*request_s=*/10));
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  testing::Refill(model_, shards_, 2);
  absl::StatusOr<SaveHandle> handle =
      manager->Save(2, testing::SaveArraysOf(model_, shards_));
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(handle->WaitStaged().ok());
  // Staged whole into the pool, the save opens its objects only now: the
  // kill comes once the upload has begun (or the save is over).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (handle->progress().written_bytes.load() == 0 &&
         absl::IsUnavailable(handle->status()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(server_->Kill().ok());
  const absl::Status failed = handle->WaitCommitted().status();
  ASSERT_TRUE(server_->Restart().ok());
  // Unless the upload beat the kill (then step 2 is whole: checked below),
  // the save failed naming the object and what was done to it, and the
  // manager reports it once more at its next call.
  if (!failed.ok()) {
    EXPECT_THAT(failed.message(), HasSubstr(root_ + "/step_00000002/data/"));
    EXPECT_THAT(failed.message(), HasSubstr("upload"));
    EXPECT_EQ(manager->WaitUntilFinished().code(), failed.code());
    EXPECT_THAT(*manager->List(), ElementsAre(1));
  }
  const absl::Status first = Holds(*manager, 1, 1);
  EXPECT_TRUE(first.ok()) << first;
  // The next save works, over what the failed one left.
  if (!failed.ok()) {
    ASSERT_TRUE(SaveVersion(*manager, 2, 2).ok());
  }
  EXPECT_TRUE(Holds(*manager, 2, 2).ok());
  ASSERT_TRUE(SaveVersion(*manager, 3, 3).ok());
  EXPECT_TRUE(Holds(*manager, 3, 3).ok());
}

// S3 gives up on a hung request after request_timeout_s. GCS's client
// (google-cloud-cpp) abandons a transfer that stalls for 120 s, a timeout
// Arrow does not expose, then stops retrying after request_timeout_s: the
// GCS case takes over two minutes, so it runs with HOIST_LONG=1.
TEST_P(ServerKilledTest, AHungServerFailsTheSaveAfterTheTimeoutNotNever) {
  const bool gcs = GetParam() == ObjectStoreServer::Kind::kGcs;
  if (gcs && std::getenv("HOIST_LONG") == nullptr) {
    GTEST_SKIP() << "GCS: 120 s of stall timeout; HOIST_LONG=1 runs it";
  }
  auto manager = Open(ShortTimeouts(1 << 20, /*attempts=*/1, /*connect_s=*/2,
                                    /*request_s=*/2));
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(SaveVersion(*manager, 1, 1).ok());
  ASSERT_TRUE(server_->Pause().ok());
  const absl::Time start = absl::Now();
  const absl::Status hung = SaveVersion(*manager, 2, 2);
  const absl::Duration waited = absl::Now() - start;
  ASSERT_TRUE(server_->Resume().ok());
  EXPECT_FALSE(hung.ok());
  EXPECT_THAT(hung.message(), HasSubstr(root_));
  // Bounded by the timeouts (S3: a few requests of 2 s each; GCS: one
  // stall of 120 s), not by the server: a generous bound, since this is
  // not a measurement.
  EXPECT_LT(waited, absl::Seconds(gcs ? 200 : 60)) << hung;
  // (Where the save failed decides whether the next call reports it once
  // more: Save() itself, or the saver thread.)
  manager->WaitUntilFinished().IgnoreError();
  EXPECT_TRUE(Holds(*manager, 1, 1).ok());
  ASSERT_TRUE(SaveVersion(*manager, 2, 2).ok());
  EXPECT_TRUE(Holds(*manager, 2, 2).ok());
}

INSTANTIATE_TEST_SUITE_P(Servers, ObjectStoreCheckpointTest,
                         ::testing::Values(ObjectStoreServer::Kind::kS3,
                                           ObjectStoreServer::Kind::kGcs),
                         testing::KindName);
INSTANTIATE_TEST_SUITE_P(Servers, ServerKilledTest,
                         ::testing::Values(ObjectStoreServer::Kind::kS3,
                                           ObjectStoreServer::Kind::kGcs),
                         testing::KindName);

}  // namespace
}  // namespace hoist
