// Soak: saves and restores continuously with retention, checking that
// memory (RSS) stays flat after warm-up and that no file descriptor leaks.
// Runs for HOIST_SOAK_SECONDS (default 3: a smoke run in the default suite;
// the long mode is e.g. HOIST_SOAK_SECONDS=600).
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/time/clock.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "testing/array_bytes.h"
#include "testing/crash_model.h"
#include "testing/mixed_model.h"
#include "testing/sanitized.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int OpenDescriptors() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count;
}

using testing::kSanitized;  // their allocators' quarantine grows RSS

TEST(SoakTest, SaveAndRestoreForMinutesWithFlatMemoryAndNoLeakedFiles) {
  const char* env = std::getenv("HOIST_SOAK_SECONDS");
  const absl::Duration length = absl::Seconds(env ? std::atof(env) : 3.0);
  testing::TempDir temp;
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 8});
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  CheckpointManagerOptions options;
  options.pool_bytes = 2 << 20;  // smaller than a save: waves every time
  options.keep_last = 3;
  options.keep_every = 100;
  std::unique_ptr<CheckpointManager> manager = *CheckpointManager::Open(
      temp.path() + "/ckpt", *backend, *coordinator, options);
  const std::vector<ArraySpec> model = testing::CrashModel();
  testing::DeviceShards shards = testing::FillShards(model, backend->devices());
  const std::vector<SaveArray> arrays = testing::SaveArraysOf(model, shards);

  const absl::Time start = absl::Now();
  const absl::Time warm = start + length / 5;
  int64_t rss_warm = -1, rss_peak = 0, step = 0, restores = 0;
  int fds_warm = -1;
  while (absl::Now() - start < length || step < 10) {
    ++step;
    testing::Refill(model, shards, static_cast<uint64_t>(step));
    absl::StatusOr<SaveHandle> handle =
        manager->Save(step, arrays, "{}",
                      step % 2 ? ReturnWhen::kStaged : ReturnWhen::kDispatched);
    ASSERT_TRUE(handle.ok()) << "step " << step << ": " << handle.status();
    ASSERT_TRUE(handle->WaitStaged().ok());
    if (step % 4 == 0) {
      ASSERT_TRUE(handle->WaitCommitted().ok());
      HostArrays host = WholeArraysInHost(model);
      ASSERT_TRUE(manager->Restore(step, host.targets).ok()) << step;
      for (size_t a = 0; a < model.size(); ++a) {
        const std::vector<uint8_t> expected =
            testing::BoxBytes(model[a], static_cast<int>(a),
                              Box::FromShape(model[a].shape), step);
        ASSERT_EQ(host.bytes[a].span(), absl::MakeConstSpan(expected))
            << "step " << step << " array " << model[a].name;
      }
      ++restores;
    }
    if (rss_warm < 0 && absl::Now() >= warm && step >= 8) {
      ASSERT_TRUE(manager->WaitUntilFinished().ok());
      rss_warm = ResidentBytes();
      fds_warm = OpenDescriptors();
    }
    rss_peak = std::max(rss_peak, ResidentBytes());
  }
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  const int64_t rss_end = ResidentBytes();
  const int fds_end = OpenDescriptors();
  const std::vector<int64_t> kept = *manager->List();
  std::printf(
      "soak: %.0f s, %lld saves, %lld restores verified, steps kept %zu, RSS "
      "after warm-up %.1f MiB, at the end %.1f MiB (drift %+.1f MiB), peak "
      "%.1f MiB, fds %d -> %d\n",
      absl::ToDoubleSeconds(absl::Now() - start), static_cast<long long>(step),
      static_cast<long long>(restores), kept.size(), rss_warm / 1048576.0,
      rss_end / 1048576.0, (rss_end - rss_warm) / 1048576.0,
      rss_peak / 1048576.0, fds_warm, fds_end);
  EXPECT_EQ(fds_end, fds_warm) << "file descriptors leaked";
  // Retention: the last three, plus every 100th.
  std::vector<int64_t> expected;
  for (int64_t s = 1; s <= step; ++s) {
    if (s > step - 3 || s % 100 == 0) expected.push_back(s);
  }
  EXPECT_EQ(kept, expected);
  if (!kSanitized) {
    EXPECT_LT(rss_end - rss_warm, int64_t{16} << 20) << "RSS grew";
  }
}

}  // namespace
}  // namespace hoist
