#include "hoist/transfer/transfer_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hoist/host_backend.h"
#include "hoist/mutex.h"
#include "testing/array_bytes.h"
#include "testing/faulty_device.h"
#include "testing/mixed_model.h"

namespace hoist {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SixteenShardedArrays;

using testing::BoxBytes;

// Receives extents, copies their bytes out and releases each lease, on a
// writer thread of its own (as the persist stage will).
class CopyingSink final : public StagedExtentSink {
 public:
  CopyingSink() : writer_([this] { Drain(); }) {}
  ~CopyingSink() override {
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    writer_.join();
  }
  void OnStaged(StagedExtent extent) override {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(extent));
  }
  // Waits until the writer has drained what was handed over so far.
  std::map<int, std::vector<uint8_t>> Take() {
    MutexLock lock(&mu_);
    mu_.Await(Condition(
        +[](std::deque<StagedExtent>* q) { return q->empty(); }, &queue_));
    return std::move(staged_);
  }

 private:
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ || !queue_.empty();
  }
  void Drain() {
    while (true) {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &CopyingSink::HasWork));
      if (queue_.empty()) return;
      StagedExtent extent = std::move(queue_.front());
      std::vector<uint8_t> bytes(
          extent.lease.data(), extent.lease.data() + extent.lease.size_bytes());
      extent.lease.Release();
      EXPECT_TRUE(staged_.emplace(extent.slice, std::move(bytes)).second)
          << "slice " << extent.slice << " staged twice";
      queue_.pop_front();
    }
  }

  Mutex mu_;
  std::deque<StagedExtent> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<uint8_t>> staged_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

// One process's view: a host backend for its devices, each device holding
// its shards filled with ElementBytes.
class Harness {
 public:
  Harness(std::vector<ArraySpec> model, const Topology& topology, int process,
          SavePlanOptions options = {})
      : model_(std::move(model)) {
    plan_ = *MakeSavePlan(model_, topology, options);
    const std::vector<DeviceId>& ids = topology.devices(process);
    backend_ = *MakeHostBackend({.num_devices = static_cast<int>(ids.size()),
                                 .first_device_id = ids.front()});
    shards_ = testing::FillShards(model_, backend_->devices());
  }

  absl::StatusOr<TransferStats> Stage(
      StagingPool& pool, TransferOptions options, StagedExtentSink& sink,
      int process = 0, absl::Span<Device* const> devices = {},
      const std::function<void()>& on_dispatched = nullptr,
      const std::function<absl::Status()>& after_first_wave = nullptr) {
    TransferEngine engine(pool, options);
    return engine.Stage(plan_, process,
                        devices.empty() ? backend_->devices() : devices,
                        shards_.sources, sink, on_dispatched, after_first_wave);
  }

  // Every slice of `process` staged, each equal to its box's bytes.
  void ExpectExact(const std::map<int, std::vector<uint8_t>>& staged,
                   int process = 0) const {
    const std::vector<int> share = plan_.SlicesOfProcess(process);
    EXPECT_EQ(staged.size(), share.size());
    for (int s : share) {
      const PlannedSlice& slice = plan_.slices[s];
      auto it = staged.find(s);
      ASSERT_NE(it, staged.end()) << "slice " << s << " never staged";
      EXPECT_TRUE(it->second ==
                  BoxBytes(model_[slice.array], slice.array, slice.box))
          << model_[slice.array].name << " " << slice.box.ToString();
    }
  }

  // Stage, through an engine whose waves go to `overflow` when `pool` has
  // no room.
  absl::StatusOr<TransferStats> StageWithOverflow(StagingPool& pool,
                                                  StagingPool& overflow,
                                                  StagedExtentSink& sink) {
    TransferEngine engine(pool);
    engine.set_overflow(&overflow);
    return engine.Stage(plan_, 0, backend_->devices(), shards_.sources, sink);
  }

  const SavePlan& plan() const { return plan_; }
  const ShardSources& sources() const { return shards_.sources; }
  Backend& backend() { return *backend_; }
  std::unique_ptr<StagingPool> Pool(int64_t capacity) {
    return *StagingPool::Create(*backend_, capacity);
  }

 private:
  std::vector<ArraySpec> model_;
  SavePlan plan_;
  std::unique_ptr<Backend> backend_;
  testing::DeviceShards shards_;
};

// Every dispatch the backend's devices have made.
int64_t Dispatches(Backend& backend) {
  int64_t n = 0;
  for (Device* device : backend.devices()) n += device->counters().dispatches;
  return n;
}

Mesh Mesh2x4() { return *Mesh::Create({"data", "model"}, {2, 4}); }

ArraySpec Named(std::string name, DType dtype, std::vector<int64_t> shape,
                PartitionSpec spec) {
  return {std::move(name), dtype, std::move(shape),
          NamedSharding{Mesh2x4(), std::move(spec)}};
}

// Every dtype, sharded, replicated and replica-sliced, odd sizes.
std::vector<ArraySpec> EveryDTypeModel() {
  std::vector<ArraySpec> model;
  int i = 0;
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    switch (i++ % 3) {
      case 0:
        model.push_back(Named(name, dtype, {37, 12}, {{}, {"model"}}));
        break;
      case 1:
        model.push_back(Named(name, dtype, {8, 5, 3}, {{"data"}, {}}));
        break;
      default:
        model.push_back(Named(name, dtype, {29, 7}, {}));
    }
  }
  return model;
}

TransferOptions Mode(DispatchMode dispatch, WaitMode wait) {
  return {.dispatch = dispatch, .wait = wait};
}

struct Case {
  ReplicaRule rule;
  DispatchMode dispatch;
  WaitMode wait;
};

class EveryModeTest : public ::testing::TestWithParam<Case> {};
INSTANTIATE_TEST_SUITE_P(
    Modes, EveryModeTest,
    ::testing::Values(Case{ReplicaRule::kBalanced, DispatchMode::kBatched,
                           WaitMode::kParallel},
                      Case{ReplicaRule::kOrbax, DispatchMode::kBatched,
                           WaitMode::kParallel},
                      Case{ReplicaRule::kBalanced, DispatchMode::kPerSlice,
                           WaitMode::kParallel},
                      Case{ReplicaRule::kOrbax, DispatchMode::kPerSlice,
                           WaitMode::kSequential},
                      Case{ReplicaRule::kBalanced, DispatchMode::kBatched,
                           WaitMode::kSequential}));

TEST_P(EveryModeTest, StagesEveryDTypeByteExactOnEveryProcess) {
  const Topology topology = Topology::Uniform(2, 4);
  SavePlanOptions options;
  options.replica_rule = GetParam().rule;
  options.min_slice_bytes = 0;
  for (int process = 0; process < 2; ++process) {
    Harness harness(EveryDTypeModel(), topology, process, options);
    auto pool = harness.Pool(1 << 20);
    CopyingSink sink;
    absl::StatusOr<TransferStats> stats = harness.Stage(
        *pool, Mode(GetParam().dispatch, GetParam().wait), sink, process);
    ASSERT_TRUE(stats.ok()) << stats.status();
    harness.ExpectExact(sink.Take(), process);
    EXPECT_EQ(pool->stats().in_use_bytes, 0);
  }
}

TEST(TransferEngineTest, StridedSlicesAlongEveryAxisAreExact) {
  // Replicated twice; Orbax splits along the first even axis: 0, 1 and 2.
  ExplicitSharding pair;
  pair.shards = {{0, Box({0, 0, 0}, {4, 3, 5})},
                 {1, Box({0, 0, 0}, {4, 3, 5})}};
  auto with_shape = [&](std::vector<int64_t> shape) {
    ExplicitSharding s;
    for (DeviceId d : {0, 1}) s.shards.push_back({d, Box::FromShape(shape)});
    return s;
  };
  std::vector<ArraySpec> model = {
      {"axis0", DType::kFloat32, {4, 3, 5}, with_shape({4, 3, 5})},
      {"axis1", DType::kBFloat16, {3, 4, 5}, with_shape({3, 4, 5})},
      {"axis2", DType::kInt8, {3, 5, 4}, with_shape({3, 5, 4})},
  };
  SavePlanOptions options;
  options.replica_rule = ReplicaRule::kOrbax;
  options.min_slice_bytes = 0;
  Harness harness(model, Topology::Uniform(1, 2), 0, options);
  int strided = 0;
  for (const PlannedSlice& slice : harness.plan().slices) {
    strided += slice.copy.rows > 1;
  }
  EXPECT_EQ(strided, 4);  // axis1 and axis2, two slices each
  auto pool = harness.Pool(1 << 20);
  CopyingSink sink;
  ASSERT_TRUE(harness.Stage(*pool, {}, sink).ok());
  harness.ExpectExact(sink.Take());
}

TEST(TransferEngineTest,
     BatchedIsOneDispatchPerDeviceAndPerSliceIsOnePerSlice) {
  SavePlanOptions options;
  options.min_slice_bytes = 0;
  const std::vector<ArraySpec> model = EveryDTypeModel();
  Harness batched(model, Topology::Uniform(1, 8), 0, options);
  auto pool = batched.Pool(1 << 20);
  CopyingSink sink;
  absl::StatusOr<TransferStats> stats = batched.Stage(*pool, {}, sink);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->waves, 1);
  EXPECT_EQ(stats->dispatches, 8);
  EXPECT_EQ(stats->slices, static_cast<int64_t>(batched.plan().slices.size()));
  for (Device* device : batched.backend().devices()) {
    EXPECT_EQ(device->counters().dispatches, 1) << device->id();
  }
  const std::map<int, std::vector<uint8_t>> batched_bytes = sink.Take();

  Harness per_slice(model, Topology::Uniform(1, 8), 0, options);
  auto pool2 = per_slice.Pool(1 << 20);
  CopyingSink sink2;
  stats = per_slice.Stage(
      *pool2, Mode(DispatchMode::kPerSlice, WaitMode::kParallel), sink2);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->dispatches, stats->slices);
  int64_t device_dispatches = 0;
  for (Device* device : per_slice.backend().devices()) {
    device_dispatches += device->counters().dispatches;
  }
  EXPECT_EQ(device_dispatches, stats->slices);
  EXPECT_EQ(sink2.Take(), batched_bytes);
}

TEST(TransferEngineTest, PoolSmallerThanOneDeviceShareStagesInWaves) {
  // 8 devices x 16 slices of 16 KiB each, through a 64 KiB pool.
  const std::vector<ArraySpec> model = SixteenShardedArrays();
  Harness harness(model, Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(64 * 1024);
  CopyingSink sink;
  absl::StatusOr<TransferStats> stats = harness.Stage(*pool, {}, sink);
  ASSERT_TRUE(stats.ok()) << stats.status();
  harness.ExpectExact(sink.Take());
  EXPECT_GT(stats->waves, 1);
  EXPECT_LE(stats->peak_pool_bytes, 64 * 1024);
  EXPECT_LE(stats->dispatches, stats->waves * 8);
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
}

// Holds every extent it receives until the test lets them go: storage
// that has not written a byte yet.
class HoldingSink final : public StagedExtentSink {
 public:
  void OnStaged(StagedExtent extent) override {
    MutexLock lock(&mu_);
    held_.push_back(std::move(extent));
  }
  // Each held slice's bytes; the leases go back to their pools.
  std::map<int, std::vector<uint8_t>> Release() {
    MutexLock lock(&mu_);
    std::map<int, std::vector<uint8_t>> bytes;
    for (StagedExtent& extent : held_) {
      bytes[extent.slice].assign(
          extent.lease.data(), extent.lease.data() + extent.lease.size_bytes());
      extent.lease.Release();
    }
    held_.clear();
    return bytes;
  }

 private:
  Mutex mu_;
  std::vector<StagedExtent> held_ ABSL_GUARDED_BY(mu_);
};

// A share 32 times the pool is staged whole while storage holds every
// byte: the waves the pool cannot take go to the overflow, none waits.
TEST(TransferEngineTest, WavesThePoolCannotTakeGoToTheOverflowWithoutWaiting) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();  // 2 MiB
  Harness harness(model, Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(64 * 1024);
  auto overflow = harness.Pool(2 << 20);
  HoldingSink sink;
  absl::StatusOr<TransferStats> stats =
      harness.StageWithOverflow(*pool, *overflow, sink);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->stalled_bytes, 0);
  EXPECT_GE(stats->overflow_bytes, (2 << 20) - 64 * 1024);
  EXPECT_EQ(pool->stats().waits, 0);
  harness.ExpectExact(sink.Release());
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_EQ(overflow->stats().in_use_bytes, 0);
}

// With too little overflow, the waves that fit in neither wait for the
// sink to release the pool's leases, and are counted as stalled.
TEST(TransferEngineTest, WavesThatFitInNeitherWaitForTheSinkAndAreCounted) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();  // 2 MiB
  Harness harness(model, Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(64 * 1024);
  auto overflow = harness.Pool(256 * 1024);
  CopyingSink sink;
  absl::StatusOr<TransferStats> stats =
      harness.StageWithOverflow(*pool, *overflow, sink);
  ASSERT_TRUE(stats.ok()) << stats.status();
  harness.ExpectExact(sink.Take());
  EXPECT_GT(stats->overflow_bytes, 0);
  EXPECT_GT(stats->stalled_bytes, 0);
  // The first wave (half the pool) went to the pool without waiting.
  EXPECT_LE(stats->stalled_bytes + stats->overflow_bytes,
            (2 << 20) - 32 * 1024);
}

// Begin on one thread dispatches the first wave; Finish on another does
// the rest; together they stage what Stage does.
TEST(TransferEngineTest, BeginOnOneThreadFinishOnAnother) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();
  Harness harness(model, Topology::Uniform(1, 8), 0);
  for (const int64_t capacity : {int64_t{4} << 20, int64_t{64} << 10}) {
    auto pool = harness.Pool(capacity);
    TransferEngine engine(*pool);
    CopyingSink sink;
    const auto dispatches = [&] { return Dispatches(harness.backend()); };
    const int64_t before = dispatches();
    absl::StatusOr<std::unique_ptr<StagingRun>> run =
        engine.Begin(harness.plan(), 0, harness.backend().devices(),
                     harness.sources(), sink);
    ASSERT_TRUE(run.ok()) << run.status();
    const bool all = AllDispatched(**run);
    EXPECT_EQ(all, capacity == int64_t{4} << 20);  // one wave, or several
    // The first wave is out before Finish.
    const int64_t in_begin = dispatches() - before;
    EXPECT_GT(in_begin, 0);
    int64_t dispatched_in_finish = -1;
    absl::StatusOr<TransferStats> stats;
    std::thread finisher([&] {
      stats = engine.Finish(*std::move(run), [&] {
        dispatched_in_finish = dispatches() - before - in_begin;
      });
    });
    finisher.join();
    ASSERT_TRUE(stats.ok()) << stats.status();
    harness.ExpectExact(sink.Take());
    EXPECT_EQ(stats->dispatches, in_begin + dispatched_in_finish);
    if (all) {
      EXPECT_EQ(dispatched_in_finish, 0);
      EXPECT_EQ(stats->waves, 1);
    } else {
      EXPECT_GT(dispatched_in_finish, 0);
    }
    EXPECT_EQ(pool->stats().in_use_bytes, 0);
  }
}

// One layout, made once, stages save after save: each Begin reads the
// sources it is given (here a second copy of the shards, then the first
// again), in one wave or in several, and a source missing from them is
// refused before anything is dispatched.
TEST(TransferEngineTest, OneLayoutStagesSaveAfterSaveFromTheirOwnSources) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();
  Harness harness(model, Topology::Uniform(1, 8), 0);
  // The same bytes in other buffers: a later save's arrays.
  const testing::DeviceShards copy =
      testing::FillShards(model, harness.backend().devices());
  for (const int64_t capacity : {int64_t{4} << 20, int64_t{64} << 10}) {
    auto pool = harness.Pool(capacity);
    TransferEngine engine(*pool);
    absl::StatusOr<std::shared_ptr<const StagingLayout>> layout =
        engine.Lay(harness.plan(), 0, harness.backend().devices());
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ((*layout)->slices.size(), harness.plan().slices.size());
    EXPECT_EQ((*layout)->wave_ends.size() > 1, capacity == int64_t{64} << 10);
    // Each slice is in one device group of its own wave, that of its device.
    std::vector<int> grouped((*layout)->slices.size(), 0);
    for (size_t w = 0; w < (*layout)->wave_ends.size(); ++w) {
      const size_t begin = w == 0 ? 0 : (*layout)->wave_ends[w - 1];
      for (int d = 0; d < 8; ++d) {
        for (size_t i : (*layout)->DeviceSlices(w, d)) {
          EXPECT_EQ((*layout)->slices[i].device, d);
          EXPECT_GE(i, begin);
          EXPECT_LT(i, (*layout)->wave_ends[w]);
          ++grouped[i];
        }
      }
    }
    EXPECT_THAT(grouped, Each(1));
    // The copy's sources again, their devices in the reverse order of the
    // layout's: found by device id, not by the layout's device index.
    ShardSources reversed;
    for (size_t a = 0; a < copy.placed.size(); ++a) {
      for (auto p = copy.placed[a].rbegin(); p != copy.placed[a].rend(); ++p) {
        reversed.Add(static_cast<int>(a), p->device, p->data);
      }
    }
    ASSERT_NE(reversed.IndexOf(harness.backend().devices().front()->id()), 0);
    for (const ShardSources* sources :
         {&copy.sources, &harness.sources(),
          static_cast<const ShardSources*>(&reversed), &copy.sources}) {
      CopyingSink sink;
      absl::StatusOr<std::unique_ptr<StagingRun>> run = engine.Begin(
          harness.plan(), *layout, harness.backend().devices(), *sources, sink);
      ASSERT_TRUE(run.ok()) << run.status();
      absl::StatusOr<TransferStats> stats = engine.Finish(*std::move(run));
      ASSERT_TRUE(stats.ok()) << stats.status();
      harness.ExpectExact(sink.Take());
      EXPECT_EQ(stats->waves,
                static_cast<int64_t>((*layout)->wave_ends.size()));
      EXPECT_EQ(pool->stats().in_use_bytes, 0);
    }
    const int64_t before = Dispatches(harness.backend());
    CopyingSink sink;
    absl::StatusOr<std::unique_ptr<StagingRun>> run =
        engine.Begin(harness.plan(), *layout, harness.backend().devices(),
                     ShardSources{}, sink);
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(run.status().message(), HasSubstr("no source buffer"));
    EXPECT_EQ(Dispatches(harness.backend()), before);
  }
}

// Stable sources: each device group's copies are prepared once and
// dispatched again while the group's lease lands where it did; a lease
// placed elsewhere (part of the pool held) gets copies prepared for it.
// Every staging is exact.
TEST(TransferEngineTest, StableSourcesPrepareEachGroupsCopiesOnce) {
  Harness harness(SixteenShardedArrays(), Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(int64_t{4} << 20);
  TransferEngine engine(*pool);
  absl::StatusOr<std::shared_ptr<const StagingLayout>> layout =
      engine.Lay(harness.plan(), 0, harness.backend().devices());
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ((*layout)->wave_ends.size(), 1u);
  auto stable = std::make_shared<StableSources>();
  std::vector<const PreparedCopies*> prepared[3];
  for (int round = 0; round < 3; ++round) {
    Lease held;
    if (round == 2) held = *pool->Acquire(4096);  // every lease moves
    CopyingSink sink;
    absl::StatusOr<std::unique_ptr<StagingRun>> run =
        engine.Begin(harness.plan(), *layout, harness.backend().devices(),
                     harness.sources(), sink, stable);
    ASSERT_TRUE(run.ok()) << run.status();
    absl::StatusOr<TransferStats> stats = engine.Finish(*std::move(run));
    ASSERT_TRUE(stats.ok()) << stats.status();
    harness.ExpectExact(sink.Take());
    EXPECT_EQ(stats->dispatches, 8);
    ASSERT_EQ(stable->prepared.size(), 8u);  // one wave of 8 groups
    for (const StableSources::Prepared& group : stable->prepared) {
      EXPECT_NE(group.copies, nullptr);
      prepared[round].push_back(group.copies.get());
    }
  }
  EXPECT_EQ(prepared[1], prepared[0]) << "dispatched again, not prepared";
  for (size_t g = 0; g < 8; ++g) {
    EXPECT_NE(prepared[2][g], prepared[1][g]) << "group " << g;
  }
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
}

TEST(ShardSourcesTest, FindsTheLastAddOfEachArrayAndDevice) {
  int a = 0, b = 0, c = 0;
  ShardSources learned;
  EXPECT_TRUE(learned.Add(2, 9, &a));
  EXPECT_TRUE(learned.Add(0, 4, &b));
  EXPECT_TRUE(learned.Add(2, 9, &c));  // replaces &a
  EXPECT_EQ(learned.IndexOf(9), 0);    // in the order first added
  EXPECT_EQ(learned.IndexOf(4), 1);
  EXPECT_EQ(learned.Find(2, 9), &c);
  EXPECT_EQ(learned.FindAt(2, 0), &c);
  EXPECT_EQ(learned.FindAt(2, -1), nullptr);  // IndexOf's "no column"
  EXPECT_EQ(learned.Find(0, 4), &b);
  EXPECT_EQ(learned.Find(0, 9), nullptr);   // array 0 has no shard on 9
  EXPECT_EQ(learned.Find(2, 4), nullptr);   // past device 4's arrays
  EXPECT_EQ(learned.Find(2, 7), nullptr);   // an unknown device
  EXPECT_EQ(learned.Find(-1, 9), nullptr);  // no such array
}

TEST(ShardSourcesTest, MadeForDevicesRefusesAShardOnAnyOther) {
  int a = 0;
  ShardSources sources(std::vector<DeviceId>{3, 5});
  sources.Reserve(4);
  EXPECT_FALSE(sources.Add(1, 7, &a));
  EXPECT_EQ(sources.Find(1, 7), nullptr);
  EXPECT_EQ(sources.IndexOf(3), 0);  // in the order given
  EXPECT_EQ(sources.IndexOf(5), 1);
  EXPECT_EQ(sources.IndexOf(7), -1);
  EXPECT_TRUE(sources.Add(1, 5, &a));
  EXPECT_EQ(sources.FindAt(1, 1), &a);
  EXPECT_EQ(sources.Find(1, 3), nullptr);
  EXPECT_EQ(sources.Find(3, 5), nullptr);  // reserved, never added
  EXPECT_EQ(sources.Find(4, 5), nullptr);  // past the reserved arrays
}

// The host backend's held copies start only at the release.
TEST(TransferEngineTest, HeldHostCopiesStartAtTheRelease) {
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 1});
  Device& device = *backend->devices()[0];
  std::vector<uint8_t> from(1 << 20, 7), to(1 << 20, 0);
  const CopyOp op{from.data(),
                  static_cast<int64_t>(from.size()),
                  to.data(),
                  static_cast<int64_t>(to.size()),
                  static_cast<int64_t>(to.size()),
                  1};
  device.HoldCopies();
  Future<> copied = device.CopyToHost({&op, 1});
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(copied.ready());
  EXPECT_EQ(to[0], 0);
  device.ReleaseCopies();
  ASSERT_TRUE(copied.Wait().ok());
  EXPECT_EQ(to, from);
}

TEST(TransferEngineTest, ManySmallSlicesInWavesKeepDispatchesPerWave) {
  SavePlanOptions options;
  options.min_slice_bytes = 0;
  std::vector<ArraySpec> model;
  for (int i = 0; i < 40; ++i) {
    model.push_back(Named("a" + std::to_string(i), DType::kFloat32, {64, 16},
                          {{}, {"model"}}));
  }
  Harness harness(model, Topology::Uniform(1, 8), 0, options);
  auto pool = harness.Pool(64 * 1024);
  CopyingSink sink;
  absl::StatusOr<TransferStats> stats = harness.Stage(*pool, {}, sink);
  ASSERT_TRUE(stats.ok()) << stats.status();
  harness.ExpectExact(sink.Take());
  EXPECT_EQ(stats->dispatches, stats->waves * 8);
}

TEST(TransferEngineTest, SliceLargerThanThePoolFailsBeforeAnyCopy) {
  const std::vector<ArraySpec> model = {
      Named("big", DType::kFloat32, {1024, 64}, {})};
  Harness harness(model, Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(16 * 1024);
  CopyingSink sink;
  absl::Status status = harness.Stage(*pool, {}, sink).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("array 'big'"));
  EXPECT_THAT(status.message(), HasSubstr("staging pool holds 16.0 KiB"));
  for (Device* device : harness.backend().devices()) {
    EXPECT_EQ(device->counters().dispatches, 0);
  }
  EXPECT_TRUE(sink.Take().empty());
}

TEST(TransferEngineTest, FailingCopySurfacesItsErrorAndEveryLeaseComesBack) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();
  for (int fail_at : {0, 2}) {
    Harness harness(model, Topology::Uniform(1, 8), 0);
    auto pool = harness.Pool(64 * 1024);  // waves: the failure stops them
    std::vector<Device*> devices(harness.backend().devices().begin(),
                                 harness.backend().devices().end());
    testing::FaultyDevice faulty(*devices[3], fail_at,
                                 absl::InternalError("DMA engine fault"));
    devices[3] = &faulty;
    CopyingSink sink;
    absl::Status status = harness.Stage(*pool, {}, sink, 0, devices).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(status.message(), "DMA engine fault");
    sink.Take();
    EXPECT_EQ(pool->stats().in_use_bytes, 0);
  }
}

TEST(TransferEngineTest, AfterTheFirstWaveRunsOnceWhileItsCopiesProceed) {
  const std::vector<ArraySpec> model = SixteenShardedArrays();
  Harness harness(model, Topology::Uniform(1, 8), 0);
  // One wave (the pool holds the share): the save's dispatched signal comes
  // before the first wave's work, which runs once copies were enqueued.
  {
    auto pool = harness.Pool(4 << 20);
    CopyingSink sink;
    std::vector<std::string> events;
    absl::StatusOr<TransferStats> stats = harness.Stage(
        *pool, {}, sink, 0, {}, [&] { events.push_back("dispatched"); },
        [&] {
          int64_t dispatches = 0;
          for (Device* device : harness.backend().devices()) {
            dispatches += device->counters().dispatches;
          }
          events.push_back(absl::StrCat("first wave after ", dispatches));
          return absl::OkStatus();
        });
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->waves, 1);
    EXPECT_THAT(events, ElementsAre("dispatched", "first wave after 8"));
    harness.ExpectExact(sink.Take());
  }
  // Waves: its error stops the later ones; every lease comes back.
  {
    auto pool = harness.Pool(64 * 1024);
    CopyingSink sink;
    const auto dispatches = [&] { return Dispatches(harness.backend()); };
    const int64_t before = dispatches();
    int calls = 0;
    int64_t first_wave = 0;
    absl::Status status =
        harness
            .Stage(*pool, {}, sink, 0, {}, nullptr,
                   [&] {
                     ++calls;
                     first_wave = dispatches() - before;
                     return absl::UnavailableError("no directory");
                   })
            .status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(calls, 1);
    EXPECT_GT(first_wave, 0);
    EXPECT_EQ(dispatches() - before, first_wave);  // no wave after it
    sink.Take();
    EXPECT_EQ(pool->stats().in_use_bytes, 0);
  }
}

TEST(TransferEngineTest, ForeignDeviceAndMissingSourceAreRejected) {
  const std::vector<ArraySpec> model = {
      Named("w", DType::kFloat32, {8, 8}, {{"model"}})};
  Harness harness(model, Topology::Uniform(1, 8), 0);
  auto pool = harness.Pool(1 << 20);
  CopyingSink sink;
  // The plan puts every slice on devices 0-3 (ties go to the lower id).
  std::vector<Device*> some(harness.backend().devices().begin() + 4,
                            harness.backend().devices().end());
  absl::Status status = harness.Stage(*pool, {}, sink, 0, some).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("does not drive"));

  TransferEngine engine(*pool);
  status = engine
               .Stage(harness.plan(), 0, harness.backend().devices(),
                      ShardSources{}, sink)
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no source buffer"));
}

}  // namespace
}  // namespace hoist
