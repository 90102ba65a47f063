// The manager's metrics sink (CheckpointManagerOptions::metrics_path): one
// JSON line per phase of each save and restore on this rank, appended to a
// local file (docs/observability.md has the fields).
#ifndef HOIST_CHECKPOINT_METRICS_LOG_H_
#define HOIST_CHECKPOINT_METRICS_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/checkpoint_types.h"

namespace hoist {

class MetricsLog {
 public:
  // Opens `path` ("{rank}" replaced by `rank`) for appending, creating it:
  // kInvalidArgument naming it when it cannot be, so that a bad path fails
  // when the manager opens, never mid-save.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(std::string_view path,
                                                          int rank);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // One line per phase, in one write (lines of several ranks appending to
  // one file do not interleave).
  absl::Status Append(const PhaseReport& report);

  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
};

// The records Append writes, without writing them (tested alone).
std::string FormatPhaseRecords(const PhaseReport& report, absl::Time now);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_METRICS_LOG_H_
