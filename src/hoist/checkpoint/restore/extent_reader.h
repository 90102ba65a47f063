// Reading one saved extent with bounded memory: in pieces that are each a
// contiguous run of the file, hashed as they go by.
#ifndef HOIST_CHECKPOINT_RESTORE_EXTENT_READER_H_
#define HOIST_CHECKPOINT_RESTORE_EXTENT_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/box.h"
#include "hoist/io/io_sizes.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// The most a reader asks of its ReadBuffer: a run of kMaxIoRunBytes, or a
// piece of that many with the 4 KiB blocks around it.
inline constexpr int64_t kReadBufferBytes = kMaxIoRunBytes + 2 * 4096;

// A 4 KiB-aligned buffer (for O_DIRECT), reused: memory lent to it (a lease
// of the staging pool: resident, in huge pages), or else mapped on first
// use, kReadBufferBytes at once (only what is touched is faulted in). It
// maps more when asked for more than it has.
class ReadBuffer {
 public:
  ReadBuffer() = default;
  // Uses `lent` (4 KiB-aligned; it must outlive the buffer) until asked for
  // more.
  explicit ReadBuffer(absl::Span<uint8_t> lent)
      : data_(lent.data()), capacity_(static_cast<int64_t>(lent.size())) {}
  ReadBuffer(ReadBuffer&& other) noexcept;
  ReadBuffer& operator=(ReadBuffer&&) = delete;
  ~ReadBuffer();
  uint8_t* Get(int64_t bytes);

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
  bool mapped_ = false;  // data_ is a mapping of its own
};

// Cuts `box` (contiguous in C order) into boxes of at most `max_bytes`
// (never less than one element) that are each contiguous too, and calls `fn`
// with each in order, stopping at its first error: runs of whole rows of its
// first axis longer than 1, recursing into a row that alone is larger than
// `max_bytes`. Pieces are made one at a time: memory stays bounded whatever
// the box's claimed size.
absl::Status ForEachContiguousPiece(
    const Box& box, int64_t item_bytes, int64_t max_bytes,
    absl::FunctionRef<absl::Status(const Box&)> fn);

// kDataLoss unless `extent` lies within `file`'s size: checked before any
// buffer is sized from a manifest's claim.
absl::Status CheckExtentInFile(ReadableFile& file,
                               const ManifestExtent& extent);
// The same check, returning the file's size.
absl::StatusOr<int64_t> FileSizeWithExtent(ReadableFile& file,
                                           const ManifestExtent& extent);

// Reads `extent` from `file` piece by piece (ForEachContiguousPiece with
// `max_bytes`), calling `piece(box, bytes)` for each, then checks the XXH3
// of the whole: kDataLoss "xxh3 mismatch" if it differs (after every piece
// was handed out; not when `verify` is false, which only benchmarks ask).
// Holds at most one piece in `buffer`, with the rest of the 4 KiB blocks
// around it (each piece is read as whole blocks, O_DIRECT where the
// storage can: up to max_bytes + 8 KiB).
absl::Status ReadExtentInPieces(
    ReadableFile& file, const ManifestExtent& extent, int64_t item_bytes,
    int64_t max_bytes, ReadBuffer& buffer,
    const std::function<void(const Box&, const uint8_t*)>& piece,
    bool verify = true);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_EXTENT_READER_H_
