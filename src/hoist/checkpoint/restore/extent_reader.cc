#include "hoist/checkpoint/restore/extent_reader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/extent_hash.h"
#include "hoist/huge_pages.h"
#include "hoist/io/io_sizes.h"

namespace hoist {
namespace {

// Reads start and end at multiples of this where they can (O_DIRECT).
constexpr int64_t kReadAlignment = 4096;

}  // namespace

ReadBuffer::ReadBuffer(ReadBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      mapped_(std::exchange(other.mapped_, false)) {}

ReadBuffer::~ReadBuffer() {
  if (mapped_) munmap(data_, capacity_);
}

uint8_t* ReadBuffer::Get(int64_t bytes) {
  if (bytes > capacity_) {
    if (mapped_) munmap(data_, capacity_);
    // At once room for the largest run or piece a reader reads (and the
    // 4 KiB blocks around a piece): only the pages touched are faulted in,
    // while a buffer that grows is new memory to fault in again (10% of a
    // restore onto devices on this project's VM).
    bytes = std::max(bytes, kReadBufferBytes);
    // Whole huge pages, asked for as such everywhere, as the pool's are
    // (AdviseHugePagesForIo): every run and piece of a restore is read
    // through it, and a direct read into it then pins (and the device sees)
    // a few large pages, not thousands of 4 KiB ones. mmap aligns a mapping
    // of whole huge pages to them.
    capacity_ = AlignUp(bytes, kHugePageBytes);
    void* data = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) std::abort();  // as operator new would
    AdviseHugePagesForIo(data, capacity_);
    data_ = static_cast<uint8_t*>(data);
    mapped_ = true;
  }
  return data_;
}

namespace {

// Calls `fn` for `parts` near-equal parts of `box` along `axis`, made one at
// a time (as Box::Split cuts them, without building them all).
absl::Status ForEachPart(const Box& box, int axis, int64_t parts,
                         absl::FunctionRef<absl::Status(const Box&)> fn) {
  const int64_t size = box.shape()[axis];
  const int64_t base = size / parts;
  const int64_t extra = size % parts;
  std::vector<int64_t> origin = box.origin(), shape = box.shape();
  for (int64_t i = 0; i < parts; ++i) {
    shape[axis] = base + (i < extra ? 1 : 0);
    RETURN_IF_ERROR(fn(Box(origin, shape)));
    origin[axis] += shape[axis];
  }
  return absl::OkStatus();
}

absl::Status VisitPieces(const Box& box, int64_t item_bytes, int64_t max_bytes,
                         absl::FunctionRef<absl::Status(const Box&)> fn) {
  const int64_t bytes = box.num_elements() * item_bytes;
  int axis = 0;
  while (axis < box.rank() && box.shape()[axis] == 1) ++axis;
  if (bytes <= max_bytes || axis == box.rank()) return fn(box);
  const int64_t rows = box.shape()[axis];
  const int64_t row_bytes = bytes / rows;
  if (row_bytes > max_bytes) {
    return ForEachPart(box, axis, rows, [&](const Box& row) {
      return VisitPieces(row, item_bytes, max_bytes, fn);
    });
  }
  const int64_t rows_per_piece = max_bytes / row_bytes;
  return ForEachPart(box, axis, (rows + rows_per_piece - 1) / rows_per_piece,
                     fn);
}

}  // namespace

absl::Status ForEachContiguousPiece(
    const Box& box, int64_t item_bytes, int64_t max_bytes,
    absl::FunctionRef<absl::Status(const Box&)> fn) {
  if (box.empty()) return absl::OkStatus();
  return VisitPieces(box, item_bytes, std::max(max_bytes, item_bytes), fn);
}

absl::Status CheckExtentInFile(ReadableFile& file,
                               const ManifestExtent& extent) {
  return FileSizeWithExtent(file, extent).status();
}

absl::StatusOr<int64_t> FileSizeWithExtent(ReadableFile& file,
                                           const ManifestExtent& extent) {
  ASSIGN_OR_RETURN(int64_t size, file.Size());
  // The manifest decoder has checked that offset + length does not overflow.
  if (extent.offset_bytes + extent.length_bytes > size) {
    return absl::DataLossError(absl::StrFormat(
        "extent [%d, +%d) runs past the end of %s (%d bytes): truncated",
        extent.offset_bytes, extent.length_bytes, extent.file, size));
  }
  return size;
}

absl::Status ReadExtentInPieces(
    ReadableFile& file, const ManifestExtent& extent, int64_t item_bytes,
    int64_t max_bytes, ReadBuffer& buffer,
    const std::function<void(const Box&, const uint8_t*)>& piece, bool verify) {
  ASSIGN_OR_RETURN(const int64_t file_bytes, FileSizeWithExtent(file, extent));
  ExtentHasher hasher(extent.hash);
  int64_t offset = extent.offset_bytes;
  RETURN_IF_ERROR(ForEachContiguousPiece(
      extent.box, item_bytes, max_bytes, [&](const Box& box) {
        const int64_t bytes = box.num_elements() * item_bytes;
        // A piece starts and ends anywhere in the file; the read covers
        // the whole 4 KiB blocks around it (up to the file's end), so it
        // goes O_DIRECT rather than through the page cache.
        const int64_t start = offset / kReadAlignment * kReadAlignment;
        const int64_t head = offset - start;
        const int64_t length =
            std::min(AlignUp(head + bytes, kReadAlignment), file_bytes - start);
        uint8_t* data = buffer.Get(length);
        RETURN_IF_ERROR(file.ReadAt(start, absl::MakeSpan(data, length)));
        if (verify) hasher.Update(data + head, bytes);
        piece(box, data + head);
        offset += bytes;
        return absl::OkStatus();
      }));
  // The message does not print the hash of what was read: a hostile
  // manifest could learn a file's contents from it, piece by piece.
  if (verify && !hasher.Matches()) {
    return absl::DataLossError(absl::StrFormat(
        "xxh3 mismatch in %s @ %d: the bytes do not hash to the manifest's "
        "%s",
        extent.file, extent.offset_bytes, FormatExtentHash(extent.hash)));
  }
  return absl::OkStatus();
}

}  // namespace hoist
