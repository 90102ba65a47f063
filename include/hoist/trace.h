// Tracer: records where a save's time goes, as Chrome trace events (open the
// file in Perfetto or chrome://tracing). Tracks are named ("device 3",
// "writer data/r00000_w00.bin", "commit"); each event is a span on a track.
// Thread-safe; a component given no tracer records nothing.
#ifndef HOIST_TRACE_H_
#define HOIST_TRACE_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hoist/mutex.h"

namespace hoist {

class Tracer {
 public:
  // Event times are relative to construction.
  Tracer() : origin_(absl::Now()) {}

  // A span named `name` on track `track`, from `start` to `end`.
  void Span(const std::string& track, std::string name, absl::Time start,
            absl::Time end) ABSL_LOCKS_EXCLUDED(mu_);

  // The trace as Chrome trace-event JSON: {"traceEvents": [...]}, one
  // "thread" per track, named.
  std::string ToJson() const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes ToJson() to `path`. kAborted etc. with the path on failure.
  absl::Status WriteFile(const std::string& path) const;

  // Tracks seen so far, in order of first use.
  std::vector<std::string> tracks() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Event {
    int track;
    std::string name;
    int64_t start_us;
    int64_t duration_us;
  };
  const absl::Time origin_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, int> track_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> track_names_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_TRACE_H_
