// MetricsLog: JSON lines appended with O_APPEND, one write per save.
#include "hoist/checkpoint/metrics_log.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(
    std::string_view path, int rank) {
  std::string resolved(path);
  for (size_t at = resolved.find("{rank}"); at != std::string::npos;
       at = resolved.find("{rank}", at)) {
    resolved.replace(at, 6, absl::StrCat(rank));
  }
  const int fd =
      ::open(resolved.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metrics_path %s cannot be opened for appending: %s",
                        resolved, std::strerror(errno)));
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(std::move(resolved), fd));
}

MetricsLog::~MetricsLog() { ::close(fd_); }

std::string FormatPhaseRecords(const PhaseReport& report, absl::Time now) {
  std::string out;
  const double time = absl::ToUnixMicros(now) / 1e6;
  for (const PhaseStat& phase : report.phases) {
    absl::StrAppendFormat(
        &out,
        "{\"time\": %.6f, \"kind\": \"%s\", \"step\": %d, \"rank\": %d, "
        "\"tier\": \"%s\", \"phase\": \"%s\", \"seconds\": %.6f, "
        "\"bytes\": %d, \"elapsed_s\": %.6f",
        time, report.kind, report.step, phase.rank, TierName(report.tier),
        phase.phase, absl::ToDoubleSeconds(phase.elapsed), phase.bytes,
        absl::ToDoubleSeconds(report.elapsed));
    for (const PhaseStat& slowest : report.slowest) {
      if (slowest.phase != phase.phase) continue;
      absl::StrAppendFormat(&out, ", \"slowest_rank\": %d, \"slowest_s\": %.6f",
                            slowest.rank,
                            absl::ToDoubleSeconds(slowest.elapsed));
    }
    out += "}\n";
  }
  return out;
}

absl::Status MetricsLog::Append(const PhaseReport& report) {
  const std::string lines = FormatPhaseRecords(report, absl::Now());
  size_t done = 0;
  while (done < lines.size()) {
    const ssize_t n = ::write(fd_, lines.data() + done, lines.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrFormat(
          "metrics %s: cannot append: %s", path_, std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace hoist
