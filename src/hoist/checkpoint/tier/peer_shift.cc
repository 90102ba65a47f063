// Files moved between processes: see peer_shift.h. One shift is two
// exchanges:
//   1. a header: the step, then each file's path and size;
//   2. the files' bytes as one stream, gathered from their pieces by the
//      coordinator as it sends (Coordinator::ExchangeGathered).
// The receiver creates every file the header names, writes the stream into
// them in order as it arrives (FileStream: aligned, O_DIRECT, on a thread
// of its own), then syncs and closes them.
#include "hoist/checkpoint/tier/peer_shift.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/tier/file_stream.h"
#include "hoist/format/layout.h"
#include "hoist/manifest.h"

namespace hoist {
namespace {

struct FileHeader {
  std::string path;  // relative to the step directory
  int64_t size = 0;
};

std::string EncodeHeader(int64_t step, absl::Span<const OutgoingFile> files) {
  std::string out = absl::StrFormat("%d\n", step);
  for (const OutgoingFile& file : files) {
    absl::StrAppendFormat(&out, "%s\t%d\n", file.path, file.size_bytes());
  }
  return out;
}

// A header EncodeHeader made on another rank; checked as anything read.
absl::StatusOr<std::vector<FileHeader>> DecodeHeader(absl::string_view text,
                                                     int64_t step, int from) {
  std::vector<FileHeader> files;
  if (text.empty()) return files;  // it sends nothing
  const auto bad = [&](std::string_view why) {
    return absl::DataLossError(absl::StrFormat(
        "the files of step %d rank %d sent: %s", step, from, why));
  };
  std::vector<absl::string_view> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  int64_t sent_step = -1;
  if (lines.empty() || !absl::SimpleAtoi(lines[0], &sent_step) ||
      sent_step != step) {
    return bad("they are of another step");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> fields = absl::StrSplit(lines[i], '\t');
    FileHeader file;
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[1], &file.size) ||
        file.size < 0 || file.size > kMaxFileBytes) {
      return bad(absl::StrFormat("line %d is not 'path<TAB>size'", i + 1));
    }
    file.path = std::string(fields[0]);
    const bool data_file =
        absl::StartsWith(file.path, std::string(kDataDirName) + "/") &&
        file.path.find('/', sizeof kDataDirName) == std::string::npos;
    // Never a MANIFEST.json: the receiver commits the step, writing it.
    if (!IsSafeRelativePath(file.path) ||
        (!data_file && file.path != kPartManifestFileName)) {
      return bad(absl::StrFormat("'%s' is not a file a peer sends", file.path));
    }
    files.push_back(std::move(file));
  }
  return files;
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrFormat("%s: %s", path, std::strerror(errno)));
  }
  struct stat st;
  MappedFile file;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(absl::StrFormat("%s: not a regular file", path));
  }
  file.size_ = st.st_size;
  if (file.size_ > 0) {
    void* at = mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrFormat("mmap %s: %s", path, std::strerror(error)));
    }
    file.data_ = static_cast<const uint8_t*>(at);
    // Read ahead all of it now, in large requests: the file is read once,
    // in order (sent or hashed), and a local part written O_DIRECT is not
    // in the page cache, where faulting it in 128 KiB at a time reads at a
    // fraction of the disk's speed. Advice: its failure changes nothing.
    madvise(at, file.size_, MADV_WILLNEED);
  }
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t OutgoingFile::size_bytes() const {
  int64_t size = 0;
  for (absl::Span<const uint8_t> piece : pieces) size += piece.size();
  return size;
}

absl::Span<const uint8_t> ZeroPadding(int64_t bytes) {
  static const uint8_t kZeros[kExtentAlignmentBytes] = {};
  return {kZeros, static_cast<size_t>(
                      std::clamp<int64_t>(bytes, 0, kExtentAlignmentBytes))};
}

absl::Status ShiftFiles(Coordinator& coordinator, Storage& storage,
                        const std::string& name, int64_t step, int offset,
                        absl::Span<const OutgoingFile> files,
                        const std::string& receive_dir, int64_t* received,
                        const ReceivedBytes& seen) {
  const int n = coordinator.size(), rank = coordinator.rank();
  const int to = (rank + offset) % n, from = (rank - offset + n) % n;
  // 1. The header.
  absl::Status first;  // this rank's first error; the shift goes on
  const std::string header = files.empty() ? "" : EncodeHeader(step, files);
  std::string their_header;
  RETURN_IF_ERROR(coordinator.Exchange(
      name + " header",
      {reinterpret_cast<const uint8_t*>(header.data()), header.size()}, to,
      from, [&](absl::Span<const uint8_t> piece) {
        their_header.append(reinterpret_cast<const char*>(piece.data()),
                            piece.size());
        return absl::OkStatus();
      }));
  std::vector<FileHeader> theirs;
  if (absl::StatusOr<std::vector<FileHeader>> decoded =
          DecodeHeader(their_header, step, from);
      decoded.ok()) {
    theirs = *std::move(decoded);
  } else {
    first = decoded.status();
  }
  if (!theirs.empty() && receive_dir.empty() && first.ok()) {
    first = absl::InternalError(absl::StrFormat(
        "rank %d sent files of step %d that nothing here takes", from, step));
  }
  std::vector<std::unique_ptr<WritableFile>> outs;
  std::vector<std::string> paths;
  std::vector<int64_t> sizes;
  int64_t expected = 0;  // bytes of their files
  for (const FileHeader& file : theirs) {
    paths.push_back(file.path);
    sizes.push_back(file.size);
    expected += file.size;
    if (!first.ok() || receive_dir.empty()) continue;
    absl::StatusOr<std::unique_ptr<WritableFile>> opened =
        storage.OpenWritable(JoinPath(receive_dir, file.path));
    if (opened.ok()) {
      outs.push_back(*std::move(opened));
    } else {
      first = opened.status();
    }
  }
  const bool writing = first.ok() && !outs.empty();
  FileStream out(std::move(outs), std::move(paths), std::move(sizes), seen);
  // 2. The stream. The receiver never fails the exchange: the sender must
  // not be left mid-send, so a write's error is kept and the rest dropped.
  std::vector<absl::Span<const uint8_t>> stream;
  for (const OutgoingFile& file : files) {
    stream.insert(stream.end(), file.pieces.begin(), file.pieces.end());
  }
  int64_t at = 0;  // into their stream
  RETURN_IF_ERROR(coordinator.ExchangeGathered(
      name + " files", stream, to, from, [&](absl::Span<const uint8_t> piece) {
        if (writing && first.ok()) {
          if (absl::Status appended = out.Append(piece); !appended.ok()) {
            first = absl::IsDataLoss(appended)
                        ? absl::DataLossError(absl::StrFormat(
                              "rank %d sent more bytes of step %d than its "
                              "files hold",
                              from, step))
                        : appended;
          }
        }
        at += static_cast<int64_t>(piece.size());
        return absl::OkStatus();
      }));
  if (received != nullptr) *received += at;
  if (writing && first.ok() && at != expected) {
    first = absl::DataLossError(absl::StrFormat(
        "the files of step %d from rank %d: %d of their %d bytes arrived", step,
        from, at, expected));
  }
  if (writing && first.ok()) first = out.Finish();
  if (absl::Status closed = out.Close(); first.ok()) first = closed;
  return first;
}

}  // namespace hoist
