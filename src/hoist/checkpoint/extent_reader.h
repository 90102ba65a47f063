// Reading one saved extent with bounded memory: in pieces that are each a
// contiguous run of the file, hashed as they go by.
#ifndef HOIST_CHECKPOINT_EXTENT_READER_H_
#define HOIST_CHECKPOINT_EXTENT_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "hoist/box.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// A 4 KiB-aligned buffer (for O_DIRECT), grown on demand and reused.
class ReadBuffer {
 public:
  ReadBuffer() = default;
  ReadBuffer(ReadBuffer&& other) noexcept;
  ReadBuffer& operator=(ReadBuffer&&) = delete;
  ~ReadBuffer();
  uint8_t* Get(int64_t bytes);

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
};

// Cuts `box` (contiguous in C order) into boxes of at most `max_bytes`
// (never less than one element) that are each contiguous too, in order:
// runs of whole rows of its first axis longer than 1, recursing into a row
// that alone is larger than `max_bytes`.
std::vector<Box> ContiguousPieces(const Box& box, int64_t item_bytes,
                                  int64_t max_bytes);

// kDataLoss unless every directory between `step_dir` and `file` (relative
// to it) is a real directory, not a link that could lead out of the
// checkpoint. `checked` remembers the directories already checked.
absl::Status CheckDataPath(Storage& storage, const std::string& step_dir,
                           const std::string& file,
                           absl::flat_hash_set<std::string>& checked);

// kDataLoss unless `extent` lies within `file`'s size: checked before any
// buffer is sized from a manifest's claim.
absl::Status CheckExtentInFile(ReadableFile& file,
                               const ManifestExtent& extent);

// Reads `extent` from `file` piece by piece (ContiguousPieces with
// `max_bytes`), calling `piece(box, bytes)` for each, then checks the XXH3
// of the whole: kDataLoss "xxh3 mismatch" if it differs (after every piece
// was handed out). Holds at most one piece in `buffer`.
absl::Status ReadExtentInPieces(
    ReadableFile& file, const ManifestExtent& extent, int64_t item_bytes,
    int64_t max_bytes, ReadBuffer& buffer,
    const std::function<void(const Box&, const uint8_t*)>& piece);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_EXTENT_READER_H_
