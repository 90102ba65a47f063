#include "hoist/tools/progress_line.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"

namespace hoist {
namespace {

// How often the line is redrawn on a terminal.
constexpr absl::Duration kTerminalEvery = absl::Milliseconds(200);

std::string Amount(int64_t n, bool bytes) {
  return bytes ? FormatBytes(static_cast<double>(n)) : absl::StrCat(n);
}

}  // namespace

void AddProgressFlags(CLI::App& app, ProgressFlags& flags) {
  app.add_flag("--quiet,-q", flags.quiet,
               "No progress on stderr (long commands show it: a line redrawn "
               "on a terminal, one every --progress-every elsewhere)");
  app.add_option("--progress-every", flags.every_s,
                 "Seconds between progress lines when stderr is not a "
                 "terminal (a log)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

ProgressLine::ProgressLine(const ProgressFlags& flags, std::string label,
                           const OperationProgress& progress)
    : label_(std::move(label)),
      progress_(progress),
      terminal_(isatty(STDERR_FILENO) == 1),
      every_(terminal_ ? kTerminalEvery : absl::Seconds(flags.every_s)),
      start_(absl::Now()) {
  if (flags.quiet) return;
  thread_ = std::thread([this] { Run(); });
}

std::string ProgressLine::Format(const std::string& label, int64_t done,
                                 int64_t total, bool bytes,
                                 absl::Duration elapsed,
                                 const std::string& current) {
  std::string line = absl::StrFormat("%s: %s", label, Amount(done, bytes));
  if (total > 0) {
    absl::StrAppendFormat(&line, " / %s  %3d%%", Amount(total, bytes),
                          static_cast<int>(100 * done / total));
  }
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (seconds > 0 && done > 0) {
    const double rate = done / seconds;
    absl::StrAppendFormat(&line, "  %s/s",
                          Amount(static_cast<int64_t>(rate), bytes));
    if (total > done) {
      absl::StrAppendFormat(
          &line, "  ETA %s",
          absl::FormatDuration(absl::Trunc(absl::Seconds((total - done) / rate),
                                           absl::Seconds(1))));
    }
  }
  if (!current.empty()) absl::StrAppend(&line, "  ", current);
  return line;
}

void ProgressLine::Show(bool final) {
  std::string line = Format(
      label_, progress_.done.load(), progress_.total.load(), progress_.bytes,
      absl::Now() - start_, final ? std::string() : progress_.current.Get());
  if (terminal_) {
    // Redrawn in place, cut to a terminal's usual width.
    if (line.size() > 120) line.resize(120);
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::Run() {
  MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(Condition(this, &ProgressLine::Finishing),
                               every_)) {
    Show(false);
  }
}

void ProgressLine::Finish() {
  {
    MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
  }
  if (!thread_.joinable()) return;
  thread_.join();
  // A line shown ends at its final figures (a command done before the
  // first showed none).
  if (shown_) Show(true);
}

}  // namespace hoist
