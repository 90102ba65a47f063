#include "hoist/checkpoint/restore/cached_file.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "hoist/base/status_macros.h"

namespace hoist {

absl::Status CachedFile::ReadAt(int64_t offset, absl::Span<uint8_t> out) {
  const int64_t end = offset + static_cast<int64_t>(out.size());
  for (int64_t at = offset; at < end;) {
    auto next = cached_->upper_bound(at);
    if (next != cached_->begin()) {
      const auto& [start, bytes] = *std::prev(next);
      const int64_t stop = start + static_cast<int64_t>(bytes.size());
      if (at < stop) {
        const int64_t n = std::min(end, stop) - at;
        std::memcpy(out.data() + (at - offset), bytes.data() + (at - start), n);
        served_->fetch_add(n);
        at += n;
        continue;
      }
    }
    const int64_t gap_end =
        next == cached_->end() ? end : std::min(end, next->first);
    RETURN_IF_ERROR(ReadStored(
        at, out.subspan(at - offset, static_cast<size_t>(gap_end - at))));
    at = gap_end;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CachedFile::Size() {
  RETURN_IF_ERROR(Open());
  return file_->Size();
}

absl::Status CachedFile::ReadStored(int64_t offset, absl::Span<uint8_t> out) {
  RETURN_IF_ERROR(Open());
  return file_->ReadAt(offset, out);
}

absl::Status CachedFile::Open() {
  if (file_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(file_, open_());
  return absl::OkStatus();
}

}  // namespace hoist
