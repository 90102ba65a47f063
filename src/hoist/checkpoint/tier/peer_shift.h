// Files of a step moved between processes of a job through
// Coordinator::Exchange, for the local tier (local_tier.h): a collective
// shift in which each rank sends files to rank + offset and writes the files
// rank - offset sends into a directory of its own.
//
// The files are streamed in one exchange, gathered from their pieces (usually
// mapped files) by the coordinator as it sends them in pieces of its own; the
// receiver stages them for writing (file_stream.h): a shift holds no memory
// beyond what the coordinator holds and 32 MiB of staging.
#ifndef HOIST_CHECKPOINT_TIER_PEER_SHIFT_H_
#define HOIST_CHECKPOINT_TIER_PEER_SHIFT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/checkpoint/tier/file_stream.h"
#include "hoist/coordinator.h"
#include "hoist/storage.h"

namespace hoist {

// The full manifest of a process's part, kept beside a replica holding only
// some of its extents (local_tier.h).
inline constexpr char kPartManifestFileName[] = "PART.json";

// A file mapped read-only (no copy), or empty.
class MappedFile {
 public:
  // kNotFound when it cannot be opened; kDataLoss for a non-regular file.
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();
  absl::Span<const uint8_t> bytes() const {
    return {data_, static_cast<size_t>(size_)};
  }

 private:
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// A file to send: its path in the step directory ("data/<name>" or
// PART.json; the receiver writes MANIFEST.json as it commits) and its bytes,
// the concatenation of `pieces` (which must stay valid until the shift
// returns).
struct OutgoingFile {
  std::string path;
  std::vector<absl::Span<const uint8_t>> pieces;
  int64_t size_bytes() const;
};

// Zero bytes to pad with, up to 4 KiB (kExtentAlignmentBytes).
absl::Span<const uint8_t> ZeroPadding(int64_t bytes);

// Collective: every rank calls it under the same `name` and `offset`. This
// rank sends `files` (none: nothing) to rank + offset, while rank - offset
// sends it its files, which are written into `receive_dir` (which must
// exist with its data/ subdirectory), synced and closed; when
// `receive_dir` is empty this rank expects nothing, and anything sent is an
// error. The receiver checks the names (files of a step only) and sizes it
// was told, and removes nothing on an error: the caller discards the
// directory. Adds to `received`, when given, the bytes of files written;
// hands them to `seen`, when given, as they arrive.
// Errors: this rank's first (the shift still goes on, so the other ranks are
// not left waiting); kDataLoss for a file that arrived short or a name a peer
// does not send; the coordinator's as is.
absl::Status ShiftFiles(Coordinator& coordinator, Storage& storage,
                        const std::string& name, int64_t step, int offset,
                        absl::Span<const OutgoingFile> files,
                        const std::string& receive_dir,
                        int64_t* received = nullptr,
                        const ReceivedBytes& seen = nullptr);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_PEER_SHIFT_H_
