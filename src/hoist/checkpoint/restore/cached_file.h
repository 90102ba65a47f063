// A data file of a step whose shared extents are already in memory: what a
// shared restore's RestoreCheckpoint reads through, so that an extent
// another rank read and sent is not read from storage again.
#ifndef HOIST_CHECKPOINT_RESTORE_CACHED_FILE_H_
#define HOIST_CHECKPOINT_RESTORE_CACHED_FILE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/storage.h"

namespace hoist {

// A data file whose shared extents are served from memory (`cached`: file
// offset -> bytes) and the rest read from storage, opened on first need;
// `served` counts the bytes served from memory.
// `cached`, `served` and what `open` uses must outlive it; `cached` must not
// change while it is read. Not thread-safe (one reader at a time), but
// `served` may be shared by several.
class CachedFile final : public ReadableFile {
 public:
  CachedFile(
      const std::map<int64_t, absl::Span<const uint8_t>>* cached,
      std::function<absl::StatusOr<std::unique_ptr<ReadableFile>>()> open,
      std::atomic<int64_t>* served)
      : cached_(cached), open_(std::move(open)), served_(served) {}

  // The bytes at `offset` from memory where cached, the rest from the
  // file (opened on first need); its errors as ReadableFile's.
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override;
  absl::StatusOr<int64_t> Size() override;

 private:
  absl::Status ReadStored(int64_t offset, absl::Span<uint8_t> out);
  absl::Status Open();

  const std::map<int64_t, absl::Span<const uint8_t>>* const cached_;
  const std::function<absl::StatusOr<std::unique_ptr<ReadableFile>>()> open_;
  std::atomic<int64_t>* const served_;
  std::unique_ptr<ReadableFile> file_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_CACHED_FILE_H_
