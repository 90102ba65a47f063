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

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hoist::testing {

class ObjectStoreServer {
 public:
  enum class Kind { kS3, kGcs };

  // Starts a server of `kind` keeping its data under `dir`.
  static absl::StatusOr<std::unique_ptr<ObjectStoreServer>> Start(
      Kind kind, const std::string& dir) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
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

}  // namespace hoist::testing

#endif  // HOIST_TESTING_OBJECT_STORE_SERVER_H_
