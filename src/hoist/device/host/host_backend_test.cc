#include "hoist/host_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "hoist/base/thread_priority.h"
#include "hoist/huge_pages.h"
#include "testing/sanitized.h"
#include "testing/smaps.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;
using testing::SmapsField;

std::unique_ptr<Backend> Make(int devices, int engines = 1,
                              int64_t chunk = int64_t{4} << 20) {
  HostBackendOptions options;
  options.num_devices = devices;
  options.copy_engines = engines;
  options.copy_chunk_bytes = chunk;
  return *MakeHostBackend(options);
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST(HostBackendTest, DevicesHaveConsecutiveGlobalIds) {
  HostBackendOptions options;
  options.num_devices = 3;
  options.first_device_id = 8;
  std::unique_ptr<Backend> backend = *MakeHostBackend(options);
  ASSERT_EQ(backend->devices().size(), 3u);
  EXPECT_EQ(backend->devices()[0]->id(), 8);
  EXPECT_EQ(backend->devices()[2]->id(), 10);
  EXPECT_EQ(backend->name(), "host");
}

TEST(HostBackendTest, OneDispatchCarriesEveryOpContiguousAndStrided) {
  std::unique_ptr<Backend> backend = Make(1);
  Device& device = *backend->devices()[0];
  const std::vector<uint8_t> src = Iota(4096);
  std::vector<uint8_t> contiguous(1000), strided(10 * 16);
  const CopyOp ops[] = {
      {src.data() + 5, 1000, contiguous.data(), 1000, 1000, 1},
      // 10 rows of 16 bytes, every 100 bytes from offset 50
      {src.data() + 50, 100, strided.data(), 16, 16, 10},
  };
  ASSERT_TRUE(device.CopyToHost(ops).Wait().ok());
  EXPECT_TRUE(
      std::equal(contiguous.begin(), contiguous.end(), src.begin() + 5));
  for (int r = 0; r < 10; ++r) {
    EXPECT_TRUE(std::equal(strided.begin() + r * 16,
                           strided.begin() + (r + 1) * 16,
                           src.begin() + 50 + r * 100))
        << "row " << r;
  }
  const DeviceCounters counters = device.counters();
  EXPECT_EQ(counters.dispatches, 1);
  EXPECT_EQ(counters.ops, 2);
  EXPECT_EQ(counters.bytes, 1000 + 160);
}

TEST(HostBackendTest, LargeOpsAreSplitAcrossEnginesAndStayExact) {
  std::unique_ptr<Backend> backend = Make(1, /*engines=*/4, /*chunk=*/4096);
  Device& device = *backend->devices()[0];
  const std::vector<uint8_t> src = Iota(1 << 20);
  std::vector<uint8_t> dst(1 << 20), rows(300 * 5000);
  const CopyOp ops[] = {
      {src.data(), 1 << 20, dst.data(), 1 << 20, 1 << 20, 1},
      {src.data() + 1, 3000, rows.data(), 5000, 2900, 300},
  };
  ASSERT_TRUE(device.CopyFromHost(ops).Wait().ok());
  EXPECT_EQ(dst, src);
  for (int r = 0; r < 300; ++r) {
    ASSERT_EQ(std::memcmp(&rows[r * 5000], &src[1 + r * 3000], 2900), 0);
  }
}

TEST(HostBackendTest, DispatchesOnOneDeviceCompleteInOrder) {
  std::unique_ptr<Backend> backend = Make(1);
  Device& device = *backend->devices()[0];
  const std::vector<uint8_t> src = Iota(1 << 16);
  std::vector<std::vector<uint8_t>> dst(20, std::vector<uint8_t>(1 << 16));
  Mutex mu;
  std::vector<int> order;
  std::vector<Future<>> recorded;  // set once each callback has recorded
  for (int i = 0; i < 20; ++i) {
    const CopyOp op{src.data(), 0, dst[i].data(), 0, 1 << 16, 1};
    Promise<> done;
    recorded.push_back(done.future());
    device.CopyToHost({&op, 1}).OnReady(
        [&, i, done = std::move(done)](const absl::Status& status) mutable {
          {
            MutexLock lock(&mu);
            order.push_back(i);
          }
          done.Set(status);
        });
  }
  ASSERT_TRUE(WhenAll(recorded).Wait().ok());
  std::vector<int> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  MutexLock lock(&mu);
  EXPECT_EQ(order, expected);
  EXPECT_EQ(device.counters().dispatches, 20);
}

TEST(HostBackendTest, EmptyAndZeroSizeOpsNeedNoDispatch) {
  std::unique_ptr<Backend> backend = Make(1);
  Device& device = *backend->devices()[0];
  EXPECT_TRUE(device.CopyToHost({}).Wait().ok());
  const CopyOp zero{nullptr, 0, nullptr, 0, 0, 4};
  EXPECT_TRUE(device.CopyToHost({&zero, 1}).Wait().ok());
  EXPECT_EQ(device.counters().dispatches, 0);
}

// A device that implements only what it must: the prepared-copy calls
// are Device's defaults.
class OnlyCopies final : public Device {
 public:
  explicit OnlyCopies(Device& device) : device_(device) {}
  DeviceId id() const override { return device_.id(); }
  Future<> CopyToHost(absl::Span<const CopyOp> ops) override {
    return device_.CopyToHost(ops);
  }
  Future<> CopyFromHost(absl::Span<const CopyOp> ops) override {
    return device_.CopyFromHost(ops);
  }
  absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) override {
    return device_.Allocate(bytes);
  }
  DeviceCounters counters() const override { return device_.counters(); }

 private:
  Device& device_;
};

// Prepared copies are checked once and dispatched again and again, each
// dispatch reading the sources as they are then (an op cut into pieces
// too), on the host backend and through Device's defaults; a malformed op
// is refused when it is prepared.
TEST(HostBackendTest, PreparedCopiesDispatchAgainReadingTheSourcesThen) {
  std::unique_ptr<Backend> backend = Make(1, /*engines=*/2, /*chunk=*/4096);
  OnlyCopies defaults(*backend->devices()[0]);
  for (Device* device :
       {backend->devices()[0], static_cast<Device*>(&defaults)}) {
    const int64_t dispatches = device->counters().dispatches;
    std::vector<uint8_t> src = Iota(3 * 4096 + 100);  // 4 pieces
    std::vector<uint8_t> whole(src.size()), strided(8 * 16);
    const CopyOp ops[] = {
        {src.data(), 0, whole.data(), 0, static_cast<int64_t>(src.size()), 1},
        {src.data() + 7, 64, strided.data(), 16, 16, 8}};
    absl::StatusOr<std::shared_ptr<const PreparedCopies>> prepared =
        device->PrepareCopiesToHost(ops);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    for (int round = 0; round < 3; ++round) {
      for (uint8_t& b : src) b += 1;  // the training step
      ASSERT_TRUE(device->CopyPreparedToHost(*prepared).Wait().ok());
      EXPECT_EQ(whole, src) << "round " << round;
      for (int r = 0; r < 8; ++r) {
        EXPECT_TRUE(std::equal(strided.begin() + r * 16,
                               strided.begin() + (r + 1) * 16,
                               src.begin() + 7 + r * 64))
            << "round " << round << ", row " << r;
      }
    }
    EXPECT_EQ(device->counters().dispatches - dispatches, 3);
  }
  std::vector<uint8_t> buf(64);
  const CopyOp null_src{nullptr, 8, buf.data(), 8, 8, 1};
  absl::StatusOr<std::shared_ptr<const PreparedCopies>> refused =
      backend->devices()[0]->PrepareCopiesToHost({&null_src, 1});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("device 0: copy op 0"));
}

TEST(HostBackendTest, MalformedOpsFailWithoutCopying) {
  std::unique_ptr<Backend> backend = Make(1);
  Device& device = *backend->devices()[0];
  std::vector<uint8_t> buf(64);
  const CopyOp null_src{nullptr, 8, buf.data(), 8, 8, 1};
  absl::Status status = device.CopyToHost({&null_src, 1}).Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("device 0: copy op 0 of 1"));
  const CopyOp narrow_pitch{buf.data(), 4, buf.data() + 32, 8, 8, 2};
  EXPECT_THAT(device.CopyToHost({&narrow_pitch, 1}).Wait().message(),
              HasSubstr("pitch smaller"));
  const CopyOp negative{buf.data(), 8, buf.data(), 8, -8, 1};
  EXPECT_FALSE(device.CopyToHost({&negative, 1}).Wait().ok());
  EXPECT_EQ(device.counters().dispatches, 0);
}

TEST(HostBackendTest, PinnedMemoryIsPageAlignedAndWritable) {
  std::unique_ptr<Backend> backend = Make(1);
  absl::StatusOr<MemoryBlock> block = backend->AllocatePinned(1 << 20);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block->data()) % 4096, 0u);
  EXPECT_EQ(block->size_bytes(), 1 << 20);
  std::memset(block->data(), 0xab, 1 << 20);
  EXPECT_EQ(static_cast<uint8_t*>(block->data())[12345], 0xab);
  EXPECT_FALSE(backend->AllocatePinned(0).ok());
}

// The pool and device memory are resident before the first copy. The pool
// is advised for huge pages (larger direct transfers, for the one-time cost
// of faulting it in); device memory only where huge pages pay: in a VM
// whose host discards freed memory, faulting them in costs several times
// more (hoist/huge_pages.h).
TEST(HostBackendTest, MemoryIsResidentAndAdvisedForHugePagesWhereTheyPay) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  std::unique_ptr<Backend> backend = Make(1);
  constexpr int64_t kBytes = int64_t{4} << 20;
  absl::StatusOr<MemoryBlock> pool = backend->AllocatePinned(kBytes);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<MemoryBlock> device = backend->devices()[0]->Allocate(kBytes);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_THAT(SmapsField(device->data(), "Rss"),
              ::testing::Not(HasSubstr(" 0 kB")));
  if (!testing::kSanitized) {  // a sanitizer's mlock does nothing
    EXPECT_THAT(SmapsField(pool->data(), "Rss"),
                ::testing::Not(HasSubstr(" 0 kB")));
  }
  EXPECT_THAT(SmapsField(pool->data(), "VmFlags"), HasSubstr(" hg"));
  const std::string flags = SmapsField(device->data(), "VmFlags");
  if (AdviseHugePages()) {
    EXPECT_THAT(flags, HasSubstr(" hg"));
  } else {
    EXPECT_THAT(flags, ::testing::Not(HasSubstr(" hg")));
  }
}

TEST(HostBackendTest, DeviceAllocateGivesUsableMemory) {
  std::unique_ptr<Backend> backend = Make(2);
  absl::StatusOr<MemoryBlock> block = backend->devices()[1]->Allocate(100);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->size_bytes(), 100);
  std::memset(block->data(), 1, 100);
  MemoryBlock moved = *std::move(block);
  EXPECT_NE(moved.data(), nullptr);
}

// The scheduling policy of each of this process's threads whose name starts
// with `prefix` (field 41 of /proc/self/task/TID/stat; 0 SCHED_OTHER, 5
// SCHED_IDLE).
std::vector<int> PoliciesOfThreadsNamed(const std::string& prefix) {
  std::vector<int> policies;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind(prefix, 0) != 0) continue;
    std::ifstream stat_file(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)),
                     std::istreambuf_iterator<char>());
    // Fields after the name, which ends at the last ')': state is field 3.
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int f = 3; f <= 41; ++f) fields >> field;
    policies.push_back(std::stoi(field));
  }
  return policies;
}

TEST(HostBackendTest, CopyEnginesRunUnderTheirPolicyAndStillCopy) {
  using Priority = HostBackendOptions::CopyPriority;
  // The default is kBatch: wake-ups that do not preempt the caller.
  EXPECT_EQ(HostBackendOptions().copy_priority, Priority::kBatch);
  for (const auto& [priority, want] :
       {std::pair{Priority::kNormal, SCHED_OTHER},
        std::pair{Priority::kBatch, SCHED_BATCH},
        std::pair{Priority::kIdle, SCHED_IDLE}}) {
    absl::Status allowed;
    std::thread([&, policy = want] {
      if (policy == SCHED_IDLE) {
        allowed = LowerThisThreadPriority(0, /*idle=*/true);
      } else if (policy == SCHED_BATCH) {
        allowed = MakeThisThreadBatch();
      }
    }).join();
    if (!allowed.ok()) {
      std::cerr << "policy " << want << " refused here: " << allowed << "\n";
      continue;
    }
    HostBackendOptions options;
    options.num_devices = 2;
    options.copy_engines = 2;
    options.first_device_id = 40;  // names no other test's engines share
    options.copy_priority = priority;
    std::unique_ptr<Backend> backend = *MakeHostBackend(options);
    // The engines name and lower themselves as they start.
    std::vector<int> policies;
    for (int tries = 0; tries < 1000; ++tries) {
      policies = PoliciesOfThreadsNamed("hoist-copy4");
      if (policies.size() == 4 &&
          std::count(policies.begin(), policies.end(), want) == 4) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_THAT(policies, ::testing::ElementsAre(want, want, want, want));
    const std::vector<uint8_t> src = Iota(1 << 20);
    std::vector<uint8_t> dst(src.size());
    const CopyOp op{src.data(),
                    static_cast<int64_t>(src.size()),
                    dst.data(),
                    static_cast<int64_t>(src.size()),
                    static_cast<int64_t>(src.size()),
                    1};
    ASSERT_TRUE(backend->devices()[1]->CopyToHost({&op, 1}).Wait().ok());
    EXPECT_EQ(dst, src);
  }
}

TEST(HostBackendTest, BadOptionsAreRejected) {
  HostBackendOptions options;
  options.num_devices = 0;
  EXPECT_EQ(MakeHostBackend(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.copy_engines = 0;
  EXPECT_FALSE(MakeHostBackend(options).ok());
}

}  // namespace
}  // namespace hoist
