// Test helper: a ShardProducer that makes host copies of shards held in
// (host backend) device memory, as a runtime's batched transfer would,
// counting its calls, the host bytes it holds and what it released.
#ifndef HOIST_TESTING_COPYING_PRODUCER_H_
#define HOIST_TESTING_COPYING_PRODUCER_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/mutex.h"
#include "hoist/shard_producer.h"
#include "testing/array_bytes.h"

namespace hoist::testing {

// Makes host copies of the shards `shards` holds (as a runtime's batched
// transfer would), counting calls, live bytes and releases.
class CopyingProducer final : public ShardProducer {
 public:
  CopyingProducer(const std::vector<ArraySpec>& model,
                  const testing::DeviceShards& shards)
      : model_(model), shards_(shards) {}

  // Every shard of `arrays` marked produced (data null): what this makes.
  static void MarkProduced(std::vector<SaveArray>& arrays) {
    for (SaveArray& array : arrays) {
      for (SaveArray::Shard& shard : array.shards) {
        shard.data = nullptr;
        shard.produced = true;
      }
    }
  }

  // Produce call number `call` (from 1) fails.
  void FailCall(int call) { fail_call_ = call; }

  absl::Status Produce(absl::Span<ProducedShard> asked) override {
    MutexLock lock(&mu_);
    ++calls_;
    for (ProducedShard& shard : asked) {
      EXPECT_EQ(++asked_[Key(shard.array, shard.device)], 1)
          << "array " << shard.array << " on " << shard.device;
    }
    if (calls_ == fail_call_) {
      return absl::FailedPreconditionError("array deleted on its device");
    }
    for (ProducedShard& shard : asked) {
      for (const auto& placed : shards_.placed[shard.array]) {
        if (placed.device != shard.device) continue;
        const size_t bytes =
            placed.box.num_elements() * ItemSize(model_[shard.array].dtype);
        auto copy = std::make_unique<std::vector<uint8_t>>(bytes);
        std::memcpy(copy->data(), placed.data, bytes);
        shard.data = copy->data();
        live_bytes_ += static_cast<int64_t>(bytes);
        peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
        copies_[{shard.array, shard.device}] = std::move(copy);
      }
    }
    return absl::OkStatus();
  }

  void Release(absl::Span<const ProducedShard> shards) override {
    MutexLock lock(&mu_);
    for (const ProducedShard& shard : shards) {
      EXPECT_EQ(++released_[Key(shard.array, shard.device)], 1)
          << "array " << shard.array << " on " << shard.device;
      auto it = copies_.find({shard.array, shard.device});
      if (it == copies_.end()) continue;  // a failed Produce's
      EXPECT_EQ(shard.data, it->second->data());
      live_bytes_ -= static_cast<int64_t>(it->second->size());
      copies_.erase(it);
    }
  }

  int calls() {
    MutexLock lock(&mu_);
    return calls_;
  }
  int64_t peak_live_bytes() {
    MutexLock lock(&mu_);
    return peak_live_bytes_;
  }
  // Every shard asked for was released, and no copy is left.
  void ExpectAllReleased() {
    MutexLock lock(&mu_);
    EXPECT_EQ(released_, asked_);
    EXPECT_TRUE(copies_.empty());
    EXPECT_EQ(live_bytes_, 0);
  }
  size_t asked() {
    MutexLock lock(&mu_);
    return asked_.size();
  }

 private:
  using Key = std::pair<int, DeviceId>;
  const std::vector<ArraySpec>& model_;
  const testing::DeviceShards& shards_;
  Mutex mu_;
  int fail_call_ = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, int> asked_ ABSL_GUARDED_BY(mu_);
  std::map<Key, int> released_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::unique_ptr<std::vector<uint8_t>>> copies_
      ABSL_GUARDED_BY(mu_);
  int64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_COPYING_PRODUCER_H_
