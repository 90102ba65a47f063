#include "hoist/trace.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"

namespace hoist {

void Tracer::Span(const std::string& track, std::string name, absl::Time start,
                  absl::Time end) {
  const int64_t start_us = absl::ToInt64Microseconds(start - origin_);
  const int64_t duration_us =
      std::max<int64_t>(0, absl::ToInt64Microseconds(end - start));
  MutexLock lock(&mu_);
  auto [it, inserted] =
      track_ids_.emplace(track, static_cast<int>(track_names_.size()));
  if (inserted) track_names_.push_back(track);
  events_.push_back({it->second, std::move(name), start_us, duration_us});
}

std::string Tracer::ToJson() const {
  nlohmann::json events = nlohmann::json::array();
  MutexLock lock(&mu_);
  for (size_t t = 0; t < track_names_.size(); ++t) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t},
                      {"args", {{"name", track_names_[t]}}}});
  }
  for (const Event& e : events_) {
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", e.track},
                      {"ts", e.start_us},
                      {"dur", e.duration_us}});
  }
  return nlohmann::json{{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"}}
      .dump();
}

absl::Status Tracer::WriteFile(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  out << ToJson();
  out.close();
  if (!out) {
    return absl::AbortedError(absl::StrFormat(
        "%s: writing the trace failed: %s", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<std::string> Tracer::tracks() const {
  MutexLock lock(&mu_);
  return track_names_;
}

}  // namespace hoist
