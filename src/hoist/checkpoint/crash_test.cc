// Crash consistency under real kills: a child process (crash_saver) saves
// step after step; it is killed with SIGKILL at a random moment; then a new
// CheckpointManager opens the root (recovering what the kill left) and every
// committed step must restore bit-exact, the newest no older than the last
// step the child reported committed. 20 kills by default; HOIST_LONG=1 for
// 200.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <string>

#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/tools/sample_model.h"
#include "testing/crash_model.h"
#include "testing/temp_dir.h"

extern char** environ;

namespace hoist {
namespace {

// Runs crash_saver, reads "committed N" lines until `delay` has passed,
// kills it with SIGKILL, and returns the last N it reported (or `last`).
int64_t RunAndKill(const std::string& root, int64_t start, absl::Duration delay,
                   int64_t last) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string start_text = std::to_string(start);
  char* argv[] = {const_cast<char*>(HOIST_CRASH_SAVER),
                  const_cast<char*>(root.c_str()),
                  const_cast<char*>(start_text.c_str()), nullptr};
  pid_t pid;
  EXPECT_EQ(
      posix_spawn(&pid, HOIST_CRASH_SAVER, &actions, nullptr, argv, environ),
      0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  const absl::Time deadline = absl::Now() + delay;
  char buffer[256];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    pollfd fd{out[0], POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;  // the child died on its own
    text.append(buffer, n);
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) {
    text.append(buffer, n);  // lines written before it died
  }
  close(out[0]);
  EXPECT_TRUE(WIFSIGNALED(status)) << "crash_saver exited by itself: " << text;
  size_t at = 0;
  while ((at = text.find("committed ", at)) != std::string::npos) {
    at += 10;
    last = std::max<int64_t>(last, std::atoll(text.c_str() + at));
  }
  return last;
}

TEST(CrashTest, SigkillAtRandomMomentsNeverLosesACommittedStep) {
  const int kills = std::getenv("HOIST_LONG") != nullptr ? 200 : 20;
  testing::TempDir temp;
  const std::string root = temp.path() + "/ckpt";
  std::mt19937 rng(20261129);
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 8});
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  const std::vector<ArraySpec> model = testing::CrashModel();
  int64_t acknowledged = 0, next = 1, verified_steps = 0;
  for (int kill_number = 0; kill_number < kills; ++kill_number) {
    const absl::Duration delay = absl::Milliseconds(20 + rng() % 400);
    acknowledged = RunAndKill(root, next, delay, acknowledged);

    CheckpointManagerOptions options;
    options.pool_bytes = 4 << 20;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root, *backend, *coordinator, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    const std::vector<int64_t> steps = *(*manager)->List();
    if (acknowledged > 0) {
      ASSERT_FALSE(steps.empty()) << "kill " << kill_number;
      EXPECT_GE(steps.back(), acknowledged) << "kill " << kill_number;
    }
    for (int64_t step : steps) {
      HostArrays host = WholeArraysInHost(model);
      absl::StatusOr<RestoreStats> restored =
          (*manager)->Restore(step, host.targets);
      ASSERT_TRUE(restored.ok()) << "kill " << kill_number << " step " << step
                                 << ": " << restored.status();
      for (size_t a = 0; a < model.size(); ++a) {
        std::vector<uint8_t> expected(host.bytes[a].size());
        FillSynthetic(expected.data(), static_cast<int64_t>(expected.size()),
                      testing::CrashSeed(step, a));
        ASSERT_EQ(host.bytes[a], expected)
            << "kill " << kill_number << " step " << step << " array "
            << model[a].name;
      }
      ++verified_steps;
    }
    next = steps.empty() ? next : steps.back() + 1;
  }
  RecordProperty("kills", kills);
  RecordProperty("verified_steps", static_cast<int>(verified_steps));
  std::printf(
      "crash_test: %d kills, %lld step restores verified, last "
      "acknowledged step %lld\n",
      kills, static_cast<long long>(verified_steps),
      static_cast<long long>(acknowledged));
  EXPECT_GT(acknowledged, 0);  // the children did commit steps
}

}  // namespace
}  // namespace hoist
