// Progress of a long command on stderr (stdout stays the command's output,
// --json included): on a terminal, one line redrawn a few times a second
// with the bytes done and total, the rate, the time left and what is under
// way; elsewhere (a log), a line every few seconds; nothing with --quiet.
#ifndef HOIST_TOOLS_PROGRESS_LINE_H_
#define HOIST_TOOLS_PROGRESS_LINE_H_

#include <CLI/CLI.hpp>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "hoist/checkpoint_types.h"
#include "hoist/mutex.h"

namespace hoist {

struct ProgressFlags {
  bool quiet = false;
  double every_s = 2;  // between lines off a terminal
};

// Adds --quiet and --progress-every to `app` (every command: given before
// or after it).
void AddProgressFlags(CLI::App& app, ProgressFlags& flags);

class ProgressLine {
 public:
  // Shows `progress` under `label` ("verify step 12") until Finish.
  ProgressLine(const ProgressFlags& flags, std::string label,
               const OperationProgress& progress);
  ~ProgressLine() { Finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Stops, showing the final figures (once shown at all).
  void Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // The line for `done` of `total` after `elapsed` ("" `current`: none).
  static std::string Format(const std::string& label, int64_t done,
                            int64_t total, bool bytes, absl::Duration elapsed,
                            const std::string& current);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Show(bool final);
  bool Finishing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finishing_;
  }

  const std::string label_;
  const OperationProgress& progress_;
  const bool terminal_;
  const absl::Duration every_;
  const absl::Time start_;
  bool shown_ = false;  // on the line's thread, then Finish's
  Mutex mu_;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hoist

#endif  // HOIST_TOOLS_PROGRESS_LINE_H_
