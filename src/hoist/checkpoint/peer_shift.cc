// Files moved between processes: see peer_shift.h. One shift:
//   1. an AllGather of each rank's chunk count (every rank makes as many
//      exchanges as the rank sending the most chunks);
//   2. one exchange of a header: the step, then each file's path and size;
//   3. the files' bytes as one stream, cut into chunks, one exchange each.
// The receiver creates every file the header names, writes the stream into
// them in order, then syncs and closes them.
#include "hoist/checkpoint/peer_shift.h"

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
    if (!IsSafeRelativePath(file.path) ||
        (!data_file && file.path != kManifestFileName &&
         file.path != kPartManifestFileName)) {
      return bad(absl::StrFormat("'%s' is not a file of a step", file.path));
    }
    files.push_back(std::move(file));
  }
  return files;
}

// The bytes [at, at + size) of the concatenation of `files`: a span into a
// piece when they lie in one, else copied into `buffer`.
absl::Span<const uint8_t> Chunk(absl::Span<const OutgoingFile> files,
                                int64_t at, int64_t size,
                                std::vector<uint8_t>& buffer) {
  std::vector<absl::Span<const uint8_t>> parts;
  int64_t start = 0;  // of the current piece in the stream
  for (const OutgoingFile& file : files) {
    for (absl::Span<const uint8_t> piece : file.pieces) {
      const int64_t end = start + static_cast<int64_t>(piece.size());
      const int64_t from = std::max(at, start), to = std::min(at + size, end);
      if (from < to) parts.push_back(piece.subspan(from - start, to - from));
      start = end;
    }
  }
  if (parts.size() == 1) return parts[0];
  buffer.resize(size);
  size_t filled = 0;
  for (absl::Span<const uint8_t> part : parts) {
    std::memcpy(buffer.data() + filled, part.data(), part.size());
    filled += part.size();
  }
  return {buffer.data(), filled};
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
                        const std::string& receive_dir, int64_t* sent,
                        int64_t* received) {
  const int n = coordinator.size(), rank = coordinator.rank();
  const int to = (rank + offset) % n, from = (rank - offset + n) % n;
  int64_t total = 0;
  for (const OutgoingFile& file : files) total += file.size_bytes();
  const int64_t chunks = (total + kShiftChunkBytes - 1) / kShiftChunkBytes;
  // 1. Every rank makes as many exchanges as the one with the most chunks.
  ASSIGN_OR_RETURN(
      std::vector<std::string> counts,
      coordinator.AllGather(name + " chunks", absl::StrFormat("%d", chunks)));
  int64_t rounds = 0;
  for (const std::string& count : counts) {
    int64_t c = 0;
    if (absl::SimpleAtoi(count, &c)) rounds = std::max(rounds, c);
  }
  // 2. The header.
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
  std::vector<int64_t> ends;  // of each of their files in the stream
  for (const FileHeader& file : theirs) {
    ends.push_back((ends.empty() ? 0 : ends.back()) + file.size);
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
  // 3. The stream. The receiver never fails an exchange: the sender must
  // not be left mid-send, so a write's error is kept and the rest dropped.
  std::vector<uint8_t> buffer;
  int64_t at = 0;  // into their stream
  for (int64_t i = 0; i < rounds; ++i) {
    absl::Span<const uint8_t> chunk;
    if (i < chunks) {
      const int64_t start = i * kShiftChunkBytes;
      chunk = Chunk(files, start, std::min(kShiftChunkBytes, total - start),
                    buffer);
      if (sent != nullptr) *sent += static_cast<int64_t>(chunk.size());
    }
    RETURN_IF_ERROR(coordinator.Exchange(
        absl::StrFormat("%s chunk %d", name, i), chunk, to, from,
        [&](absl::Span<const uint8_t> piece) {
          while (!piece.empty() && writing && first.ok()) {
            const size_t f =
                std::upper_bound(ends.begin(), ends.end(), at) - ends.begin();
            if (f >= ends.size()) {
              first = absl::DataLossError(absl::StrFormat(
                  "rank %d sent more bytes of step %d than its files hold",
                  from, step));
              break;
            }
            const int64_t in_file = at - (ends[f] - theirs[f].size);
            const size_t take = static_cast<size_t>(
                std::min<int64_t>(piece.size(), ends[f] - at));
            first = outs[f]->WriteAt(in_file, piece.first(take));
            piece.remove_prefix(take);
            at += static_cast<int64_t>(take);
          }
          if (!writing) at += static_cast<int64_t>(piece.size());
          return absl::OkStatus();
        }));
  }
  if (received != nullptr) *received += at;
  if (writing && first.ok() && at != (ends.empty() ? 0 : ends.back())) {
    first = absl::DataLossError(absl::StrFormat(
        "the files of step %d from rank %d: %d of their %d bytes arrived", step,
        from, at, ends.back()));
  }
  for (std::unique_ptr<WritableFile>& out : outs) {
    if (first.ok()) first = out->Sync();
    if (absl::Status closed = out->Close(); first.ok()) first = closed;
  }
  return first;
}

}  // namespace hoist
