// A real object-store server for a C++ test: testing/object_store_server.py
// (SeaweedFS for S3, fake-gcs-server for GCS, on 127.0.0.1 and free ports)
// run as a child process. Start() returns once the server answers and puts
// the environment its clients need (AWS_ENDPOINT_URL and keys, or
// STORAGE_EMULATOR_HOST) into this process's; the destructor closes the
// child's standard input, which stops the server, and waits for it, so a
// test that fails (or dies: the pipe closes) leaves no server behind.
//
// Needs HOIST_TEST_PYTHON (a Python with pyarrow and the servers: the
// project's .venv) and HOIST_SOURCE_DIR defined when compiling.
#ifndef HOIST_TESTING_OBJECT_STORE_SERVER_H_
#define HOIST_TESTING_OBJECT_STORE_SERVER_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hoist/storage.h"

namespace hoist::testing {

class ObjectStoreServer {
 public:
  enum class Kind { kS3, kGcs };

  // Starts a server of `kind` keeping its data under `dir`.
  static absl::StatusOr<std::unique_ptr<ObjectStoreServer>> Start(
      Kind kind, const std::string& dir) {
    // Close-on-exec: a launcher started later must not hold this one's
    // stdin open (it would never see it close).
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      return absl::InternalError("pipe failed");
    }
    const std::string script =
        std::string(HOIST_SOURCE_DIR) + "/testing/object_store_server.py";
    const char* kind_name = kind == Kind::kS3 ? "s3" : "gcs";
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      execl(HOIST_TEST_PYTHON, HOIST_TEST_PYTHON, script.c_str(), kind_name,
            "--dir", dir.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    std::unique_ptr<ObjectStoreServer> server(new ObjectStoreServer(
        kind, pid, fdopen(to_child[1], "w"), fdopen(from_child[0], "r")));
    if (absl::Status ready = server->AwaitReady(); !ready.ok()) return ready;
    return server;
  }

  ~ObjectStoreServer() {
    fclose(to_);  // the launcher stops the server and exits
    fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  // "s3://BUCKET/PREFIX" (or gs://) under the server's bucket.
  std::string Url(const std::string& prefix) const {
    return absl::StrCat(kind_ == Kind::kS3 ? "s3://" : "gs://", bucket_, "/",
                        prefix);
  }
  Kind kind() const { return kind_; }

  // SIGKILLs the server, as a crash would.
  absl::Status Kill() { return Command("kill", "killed"); }
  // Starts it again on the same ports and data.
  absl::Status Restart() { return Command("restart", "ready"); }
  // SIGSTOP: the server accepts connections and never answers, as a hung
  // one does. Resume() sends SIGCONT.
  absl::Status Pause() { return Command("pause", "paused"); }
  absl::Status Resume() { return Command("resume", "resumed"); }

 private:
  ObjectStoreServer(Kind kind, pid_t pid, FILE* to, FILE* from)
      : kind_(kind), pid_(pid), to_(to), from_(from) {}

  absl::StatusOr<std::string> ReadLine() {
    char line[4096];
    if (fgets(line, sizeof line, from_) == nullptr) {
      return absl::UnavailableError(
          "the object-store server launcher exited (is .venv filled? "
          "see testing/object_store_server.py)");
    }
    return std::string(absl::StripTrailingAsciiWhitespace(line));
  }

  // Reads NAME=VALUE lines into the environment until "ready".
  absl::Status AwaitReady() {
    while (true) {
      absl::StatusOr<std::string> line = ReadLine();
      if (!line.ok()) return line.status();
      if (*line == "ready") return absl::OkStatus();
      if (absl::StartsWith(*line, "error ")) {
        return absl::UnavailableError(line->substr(6));
      }
      const size_t eq = line->find('=');
      if (eq == std::string::npos) continue;
      const std::string name = line->substr(0, eq);
      const std::string value = line->substr(eq + 1);
      if (name == "HOIST_TEST_S3_BUCKET" || name == "HOIST_TEST_GCS_BUCKET") {
        bucket_ = value;
      }
      if (name != "pid") setenv(name.c_str(), value.c_str(), 1);
    }
  }

  absl::Status Command(const char* command, const char* answer) {
    fprintf(to_, "%s\n", command);
    fflush(to_);
    if (std::string(answer) == "ready") return AwaitReady();
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    if (*line != answer) {
      return absl::InternalError(absl::StrCat(command, ": ", *line));
    }
    return absl::OkStatus();
  }

  const Kind kind_;
  const pid_t pid_;
  FILE* const to_;
  FILE* const from_;
  std::string bucket_;
};

// Both servers, started at the first call and stopped when the test binary
// ends (a global test environment's teardown); `failed` says why one did
// not start. For a binary run as one ctest test: each test case run as a
// process of its own would start its own servers.
struct SharedServers {
  std::string dir;
  std::unique_ptr<ObjectStoreServer> s3;
  std::unique_ptr<ObjectStoreServer> gcs;
  absl::Status failed;

  ObjectStoreServer* Of(ObjectStoreServer::Kind kind) const {
    return kind == ObjectStoreServer::Kind::kS3 ? s3.get() : gcs.get();
  }
};

// "NAME-NNNN": a prefix no other test of the run uses.
inline std::string UniquePrefix(const std::string& name) {
  static std::mt19937_64 random{std::random_device{}()};
  return absl::StrCat(name, "-", random() % 1000000000);
}

// The object-store Storage for `url` (never a local one).
inline absl::StatusOr<std::unique_ptr<Storage>> OpenObjectStorage(
    const std::string& url, const ObjectStoreOptions& options = {}) {
  if (url.find("://") == std::string::npos) {
    return absl::InternalError(url + ": not an object store URL");
  }
  return OpenStorage(url, {.s3 = options, .gcs = options});
}

// The name of a test parameter: "S3" or "GCS".
inline std::string KindName(
    const ::testing::TestParamInfo<ObjectStoreServer::Kind>& info) {
  return info.param == ObjectStoreServer::Kind::kS3 ? "S3" : "GCS";
}

inline SharedServers& TheServers() {
  static SharedServers* servers = [] {
    auto* s = new SharedServers;
    char pattern[] = "/tmp/hoist-servers-XXXXXX";
    s->dir = mkdtemp(pattern) != nullptr ? pattern : "/tmp";
    absl::StatusOr<std::unique_ptr<ObjectStoreServer>> s3 =
        ObjectStoreServer::Start(ObjectStoreServer::Kind::kS3, s->dir + "/s3");
    absl::StatusOr<std::unique_ptr<ObjectStoreServer>> gcs =
        ObjectStoreServer::Start(ObjectStoreServer::Kind::kGcs,
                                 s->dir + "/gcs");
    if (s3.ok()) s->s3 = *std::move(s3);
    if (gcs.ok()) s->gcs = *std::move(gcs);
    s->failed = !s3.ok() ? s3.status() : gcs.status();
    struct Stop : ::testing::Environment {
      void TearDown() override {
        SharedServers& servers = TheServers();
        servers.s3.reset();
        servers.gcs.reset();
        std::error_code ignored;
        std::filesystem::remove_all(servers.dir, ignored);
      }
    };
    ::testing::AddGlobalTestEnvironment(new Stop);
    return s;
  }();
  return *servers;
}

// In a test's SetUp: skips the test when the servers could not start,
// or fails it when HOIST_REQUIRE_OBJECT_STORE is set (tools/test.sh fills
// .venv with the servers and sets it, so CI never skips silently).
#define HOIST_REQUIRE_SERVERS()                                        \
  do {                                                                 \
    const absl::Status failed = ::hoist::testing::TheServers().failed; \
    if (!failed.ok()) {                                                \
      if (std::getenv("HOIST_REQUIRE_OBJECT_STORE") != nullptr) {      \
        FAIL() << "no object-store server: " << failed;                \
      }                                                                \
      GTEST_SKIP() << "no object-store server: " << failed;            \
    }                                                                  \
  } while (0)

}  // namespace hoist::testing

#endif  // HOIST_TESTING_OBJECT_STORE_SERVER_H_
