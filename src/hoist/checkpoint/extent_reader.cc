#include "hoist/checkpoint/extent_reader.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"

namespace hoist {

ReadBuffer::ReadBuffer(ReadBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)) {}

ReadBuffer::~ReadBuffer() { std::free(data_); }

uint8_t* ReadBuffer::Get(int64_t bytes) {
  if (bytes > capacity_) {
    std::free(data_);
    capacity_ = AlignUp(std::max<int64_t>(bytes, 4096), 4096);
    data_ = static_cast<uint8_t*>(std::aligned_alloc(4096, capacity_));
    if (data_ == nullptr) std::abort();  // as operator new would
  }
  return data_;
}

namespace {

void AppendPieces(const Box& box, int64_t item_bytes, int64_t max_bytes,
                  std::vector<Box>& out) {
  const int64_t bytes = box.num_elements() * item_bytes;
  int axis = 0;
  while (axis < box.rank() && box.shape()[axis] == 1) ++axis;
  if (bytes <= max_bytes || axis == box.rank()) {
    out.push_back(box);
    return;
  }
  const int64_t rows = box.shape()[axis];
  const int64_t row_bytes = bytes / rows;
  if (row_bytes > max_bytes) {
    for (const Box& row : box.Split(axis, rows)) {
      AppendPieces(row, item_bytes, max_bytes, out);
    }
    return;
  }
  const int64_t rows_per_piece = max_bytes / row_bytes;
  for (Box& part :
       box.Split(axis, (rows + rows_per_piece - 1) / rows_per_piece)) {
    out.push_back(std::move(part));
  }
}

}  // namespace

std::vector<Box> ContiguousPieces(const Box& box, int64_t item_bytes,
                                  int64_t max_bytes) {
  std::vector<Box> out;
  if (box.empty()) return out;
  AppendPieces(box, item_bytes, std::max(max_bytes, item_bytes), out);
  return out;
}

absl::Status CheckDataPath(Storage& storage, const std::string& step_dir,
                           const std::string& file,
                           absl::flat_hash_set<std::string>& checked) {
  std::string dir = step_dir;
  size_t at = 0;
  while (true) {
    const size_t slash = file.find('/', at);
    if (slash == std::string::npos) break;
    dir = JoinPath(dir, file.substr(at, slash - at));
    at = slash + 1;
    if (checked.contains(dir)) continue;
    ASSIGN_OR_RETURN(bool is_dir, storage.IsDir(dir));
    if (!is_dir) {
      return absl::DataLossError(absl::StrFormat(
          "%s: not a directory inside the checkpoint (missing, or a link)",
          dir));
    }
    checked.insert(dir);
  }
  return absl::OkStatus();
}

absl::Status CheckExtentInFile(ReadableFile& file,
                               const ManifestExtent& extent) {
  ASSIGN_OR_RETURN(int64_t size, file.Size());
  // The manifest decoder has checked that offset + length does not overflow.
  if (extent.offset_bytes + extent.length_bytes > size) {
    return absl::DataLossError(absl::StrFormat(
        "extent [%d, +%d) runs past the end of %s (%d bytes): truncated",
        extent.offset_bytes, extent.length_bytes, extent.file, size));
  }
  return absl::OkStatus();
}

absl::Status ReadExtentInPieces(
    ReadableFile& file, const ManifestExtent& extent, int64_t item_bytes,
    int64_t max_bytes, ReadBuffer& buffer,
    const std::function<void(const Box&, const uint8_t*)>& piece) {
  RETURN_IF_ERROR(CheckExtentInFile(file, extent));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(
      XXH3_createState(), &XXH3_freeState);
  if (state == nullptr) std::abort();
  XXH3_64bits_reset(state.get());
  int64_t offset = extent.offset_bytes;
  for (const Box& box : ContiguousPieces(extent.box, item_bytes, max_bytes)) {
    const int64_t bytes = box.num_elements() * item_bytes;
    uint8_t* data = buffer.Get(bytes);
    RETURN_IF_ERROR(file.ReadAt(offset, absl::MakeSpan(data, bytes)));
    XXH3_64bits_update(state.get(), data, bytes);
    piece(box, data);
    offset += bytes;
  }
  const uint64_t hash = XXH3_64bits_digest(state.get());
  if (hash != extent.xxh3) {
    return absl::DataLossError(
        absl::StrFormat("xxh3 mismatch in %s @ %d: manifest %016x, bytes %016x",
                        extent.file, extent.offset_bytes, extent.xxh3, hash));
  }
  return absl::OkStatus();
}

}  // namespace hoist
