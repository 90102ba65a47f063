// Test fixture: a CheckpointManager's root in a temporary directory, on the
// host backend's 8 devices, with a four-array model filled with known bytes.
// Shared by the manager's tests (checkpoint_manager_test.cc, by subject:
// manager_staging_test.cc, manager_recovery_test.cc).
#ifndef HOIST_TESTING_MANAGER_TEST_H_
#define HOIST_TESTING_MANAGER_TEST_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "testing/array_bytes.h"
#include "testing/mixed_model.h"
#include "testing/shard_buffers.h"
#include "testing/temp_dir.h"

namespace hoist::testing {

class ManagerTest : public ::testing::Test {
 protected:
  // Four arrays on a 2 x 4 mesh: sharded both ways, along one axis, and
  // replicated (a scalar).
  static std::vector<ArraySpec> Model() {
    const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
    return {
        {"params/w",
         DType::kBFloat16,
         {64, 48},
         NamedSharding{mesh, {{}, {"model"}}}},
        {"params/b", DType::kFloat32, {48}, NamedSharding{mesh, {{"model"}}}},
        {"opt/mu",
         DType::kFloat32,
         {64, 48},
         NamedSharding{mesh, {{"data", "model"}}}},
        {"opt/count", DType::kInt32, {}, Sharding::Replicated(mesh)},
    };
  }

  // One 16 KiB array, replicated: larger than a 4 KiB pool when saved
  // whole (min_slice_bytes above it).
  static std::vector<ArraySpec> BigReplicatedArray() {
    return {{"big",
             DType::kFloat32,
             {64, 64},
             Sharding::Replicated(*Mesh::Create({"data", "model"}, {2, 4}))}};
  }

  static CheckpointManagerOptions SmallPool(int keep_last = 0) {
    CheckpointManagerOptions options;
    options.pool_bytes = 64 * 1024;
    options.keep_last = keep_last;
    return options;
  }

  void SetUp() override {
    backend_ = *MakeHostBackend({.num_devices = 8});
    model_ = Model();
    shards_ = testing::FillShards(model_, backend_->devices());
    root_ = temp_.path() + "/ckpt";
  }

  std::vector<SaveArray> Arrays() const {
    return testing::SaveArraysOf(model_, shards_);
  }

  std::unique_ptr<CheckpointManager> Open(CheckpointManagerOptions options = {},
                                          Storage* storage = nullptr) {
    options.pool_bytes =
        options.pool_bytes == CheckpointManagerOptions{}.pool_bytes
            ? 64 * 1024
            : options.pool_bytes;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root_, *backend_, *coordinator_, options,
                                storage);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? *std::move(manager) : nullptr;
  }

  // Restores the latest (or `step`) onto a 4 x 2 mesh and checks it holds
  // `version`.
  void ExpectHolds(CheckpointManager& manager, std::optional<int64_t> step,
                   uint64_t version) {
    const Mesh other = *Mesh::Create({"data", "model"}, {4, 2});
    std::vector<ShardBuffers> buffers;
    std::vector<RestoreTarget> targets;
    for (ArraySpec spec : model_) {
      spec.sharding = NamedSharding{other, spec.sharding.named()->spec};
      buffers.push_back(*AllocateShards(spec, backend_->devices()));
      targets.push_back(buffers.back().target);
    }
    absl::StatusOr<RestoreStats> stats = manager.Restore(step, targets);
    ASSERT_TRUE(stats.ok()) << stats.status();
    for (size_t a = 0; a < model_.size(); ++a) {
      for (const RestoreDestination& dest : targets[a].destinations) {
        const std::vector<uint8_t> expected =
            BoxBytes(model_[a], static_cast<int>(a), dest.box, version);
        ASSERT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
            << model_[a].name << " " << dest.box.ToString();
      }
    }
  }

  testing::TempDir temp_;
  std::string root_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_ = MakeSingleProcessCoordinator();
  std::vector<ArraySpec> model_;
  testing::DeviceShards shards_;
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_MANAGER_TEST_H_
