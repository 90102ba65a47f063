// Crash consistency under real kills: a child process (crash_saver) opens
// the root (recovering what the last kill left) and saves step after step;
// it is killed with SIGKILL at a random moment; then a new CheckpointManager
// opens the root and every committed step must restore bit-exact, the newest
// no older than the last step the child reported committed.
//
// Kill moments follow the child's own progress, not the clock since it was
// spawned (which, under a sanitizer, can pass before the child has done
// anything): a quarter of the kills land during Open (uniform over how long
// opening has taken), the rest after a random number of commits, uniform
// over the time one save takes (staging, writing, manifest, rename,
// retention). 20 kills by default; HOIST_LONG=1 for 1,000. Then the same
// against S3 (SeaweedFS), where the build has object storage.
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
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "testing/crash_model.h"
#ifdef HOIST_TEST_PYTHON
#include "testing/object_store_server.h"
#endif
#include "testing/temp_dir.h"

extern char** environ;

namespace hoist {
namespace {

// When to kill: during Open, `delay` after the spawn (or as soon as the
// child says it has opened, if that comes first); or `delay` after the
// child's `commits`-th "committed" line.
struct KillPlan {
  bool during_open = false;
  int commits = 0;
  absl::Duration delay;
};

// What one run saw.
struct ChildRun {
  int64_t last_committed = 0;  // the newest "committed N", or 0
  absl::Duration open_time;    // spawn to "opened" (when seen)
  absl::Duration save_time;    // between two "committed" lines (when seen)
  bool opened = false;
  int64_t overflow_bytes = 0;  // the most a save staged into the overflow
};

// Runs crash_saver and kills it with SIGKILL as `plan` says.
ChildRun RunAndKill(const std::string& root, int64_t start,
                    const KillPlan& plan, int64_t pool_bytes) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string start_text = std::to_string(start);
  const std::string pool_text = std::to_string(pool_bytes);
  char* argv[] = {const_cast<char*>(HOIST_CRASH_SAVER),
                  const_cast<char*>(root.c_str()),
                  const_cast<char*>(start_text.c_str()),
                  const_cast<char*>(pool_text.c_str()), nullptr};
  const absl::Time spawned = absl::Now();
  pid_t pid;
  EXPECT_EQ(
      posix_spawn(&pid, HOIST_CRASH_SAVER, &actions, nullptr, argv, environ),
      0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  ChildRun run;
  std::string pending;
  int commits = 0;
  absl::Time last_commit;
  // Until the kill moment is known, wait for the child's lines (bounded, so
  // a child that hangs fails the test instead of hanging it).
  absl::Time kill_at =
      plan.during_open ? spawned + plan.delay : absl::InfiniteFuture();
  const absl::Time give_up = spawned + absl::Seconds(120);
  char buffer[256];
  bool alive = true;
  bool reached = false;
  while (alive) {
    const absl::Time now = absl::Now();
    if (now >= kill_at) {
      reached = true;  // the planned moment
      break;
    }
    if (now >= give_up) break;  // a hang guard, not a measurement
    const absl::Time until = std::min(kill_at, give_up);
    pollfd fd{out[0], POLLIN, 0};
    const int ready = poll(
        &fd, 1, static_cast<int>(absl::ToInt64Milliseconds(until - now)) + 1);
    if (ready <= 0) continue;
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n <= 0) {
      alive = false;  // the child died on its own
      break;
    }
    pending.append(buffer, n);
    for (size_t eol; (eol = pending.find('\n')) != std::string::npos;
         pending.erase(0, eol + 1)) {
      const std::string line = pending.substr(0, eol);
      const absl::Time seen = absl::Now();
      if (line == "opened") {
        run.opened = true;
        run.open_time = seen - spawned;
        last_commit = seen;
        if (plan.during_open) kill_at = seen;
        if (!plan.during_open && plan.commits == 0) {
          kill_at = seen + plan.delay;
        }
      } else if (line.rfind("committed ", 0) == 0) {
        run.last_committed = std::atoll(line.c_str() + 10);
        if (const size_t at = line.find(" overflow ");
            at != std::string::npos) {
          run.overflow_bytes = std::max<int64_t>(
              run.overflow_bytes, std::atoll(line.c_str() + at + 10));
        }
        run.save_time = seen - last_commit;
        last_commit = seen;
        if (!plan.during_open && ++commits == plan.commits) {
          kill_at = seen + plan.delay;
        }
      }
    }
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) {
    pending.append(buffer, n);  // lines written before it died
  }
  close(out[0]);
  EXPECT_TRUE(WIFSIGNALED(status))
      << "crash_saver exited by itself: " << pending;
  EXPECT_TRUE(reached || !alive)
      << "crash_saver never reached its kill point (opened, then "
      << plan.commits << " commits): " << pending;
  for (size_t at = 0;
       (at = pending.find("committed ", at)) != std::string::npos;) {
    at += 10;
    run.last_committed =
        std::max<int64_t>(run.last_committed, std::atoll(pending.c_str() + at));
  }
  return run;
}

// `kills` runs of crash_saver against `root` (a pool of `pool_bytes`), each
// killed at a random moment, each followed by a full check of what is
// committed. Returns the most bytes a save reported staged into the pool's
// overflow.
int64_t KillAndCheck(const std::string& root, int kills,
                     int64_t pool_bytes = 4 << 20) {
  std::mt19937 rng(20261129);
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 8});
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  const std::vector<ArraySpec> model = testing::CrashModel();
  int64_t acknowledged = 0, next = 1, verified_steps = 0;
  int during_open = 0, during_save = 0;
  int64_t overflow_bytes = 0;
  // Running estimates of how long opening and one save take here.
  absl::Duration open_time = absl::Milliseconds(50);
  absl::Duration save_time = absl::Milliseconds(50);
  for (int kill_number = 0; kill_number < kills; ++kill_number) {
    KillPlan plan;
    plan.during_open = rng() % 4 == 0;
    plan.commits = static_cast<int>(rng() % 3);
    const absl::Duration span = plan.during_open ? open_time : save_time;
    plan.delay = span * (static_cast<double>(rng() % 1000) / 1000.0);
    const ChildRun run = RunAndKill(root, next, plan, pool_bytes);
    overflow_bytes = std::max(overflow_bytes, run.overflow_bytes);
    (plan.during_open ? during_open : during_save)++;
    if (run.opened) open_time = (open_time * 3 + run.open_time) / 4;
    if (run.last_committed > 0) save_time = (save_time * 3 + run.save_time) / 4;
    acknowledged = std::max(acknowledged, run.last_committed);

    CheckpointManagerOptions options;
    options.pool_bytes = 4 << 20;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root, *backend, *coordinator, options);
    EXPECT_TRUE(manager.ok())
        << "kill " << kill_number << ": " << manager.status();
    if (!manager.ok()) return overflow_bytes;
    const std::vector<int64_t> steps = *(*manager)->List();
    if (acknowledged > 0) {
      EXPECT_FALSE(steps.empty()) << "kill " << kill_number;
      if (steps.empty()) return overflow_bytes;
      EXPECT_GE(steps.back(), acknowledged) << "kill " << kill_number;
    }
    for (int64_t step : steps) {
      HostArrays host = WholeArraysInHost(model);
      absl::StatusOr<RestoreStats> restored =
          (*manager)->Restore(step, host.targets);
      EXPECT_TRUE(restored.ok()) << "kill " << kill_number << " step " << step
                                 << ": " << restored.status();
      if (!restored.ok()) return overflow_bytes;
      for (size_t a = 0; a < model.size(); ++a) {
        std::vector<uint8_t> expected(host.bytes[a].size());
        FillSynthetic(expected.data(), static_cast<int64_t>(expected.size()),
                      testing::CrashSeed(step, a));
        EXPECT_EQ(absl::MakeConstSpan(expected), host.bytes[a].span())
            << "kill " << kill_number << " step " << step << " array "
            << model[a].name;
        if (absl::MakeConstSpan(expected) != host.bytes[a].span()) {
          return overflow_bytes;
        }
      }
      ++verified_steps;
    }
    next = steps.empty() ? next : steps.back() + 1;
  }
  ::testing::Test::RecordProperty("kills", kills);
  ::testing::Test::RecordProperty("kills_during_open", during_open);
  ::testing::Test::RecordProperty("kills_during_save", during_save);
  ::testing::Test::RecordProperty("verified_steps",
                                  static_cast<int>(verified_steps));
  std::printf(
      "crash_test %s: %d kills (%d during open and recovery, %d during "
      "saves), %lld step restores verified, last acknowledged step %lld\n",
      root.c_str(), kills, during_open, during_save,
      static_cast<long long>(verified_steps),
      static_cast<long long>(acknowledged));
  EXPECT_GT(acknowledged, 0);  // the children did commit steps
  return overflow_bytes;
}

TEST(CrashTest, SigkillAtRandomMomentsNeverLosesACommittedStep) {
  testing::TempDir temp;
  KillAndCheck(temp.path() + "/ckpt",
               std::getenv("HOIST_LONG") != nullptr ? 1000 : 20);
}

// The same with a pool of a fifth of the model: most of each save is
// staged into the pool's overflow (pageable memory) and written from there,
// so kills land while bytes sit in it.
TEST(CrashTest, SigkillWithBytesInTheOverflowNeverLosesACommittedStep) {
  testing::TempDir temp;
  const int64_t overflow =
      KillAndCheck(temp.path() + "/ckpt",
                   std::getenv("HOIST_LONG") != nullptr ? 200 : 20, 128 << 10);
  EXPECT_GT(overflow, 0) << "no save used the overflow";
}

#ifdef HOIST_TEST_PYTHON
// The same against S3 (SeaweedFS on 127.0.0.1): the children upload in
// place and commit by the manifest's put; each new open collects what the
// last kill left. 10 kills by default; HOIST_LONG=1 for 100.
TEST(CrashTest, SigkillAgainstS3NeverLosesACommittedStep) {
  HOIST_REQUIRE_SERVERS();
  KillAndCheck(testing::TheServers().s3->Url("crash"),
               std::getenv("HOIST_LONG") != nullptr ? 100 : 10);
}
#endif

}  // namespace
}  // namespace hoist
