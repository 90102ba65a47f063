// Reading MANIFEST.json in a step directory, through Storage. A split
// manifest (hoist/3) is read from its start in growing chunks until its
// head's blank line, then by range, its sections; a document (hoist/1,
// hoist/2) is read whole, which the first chunks found out.
#include "hoist/format/manifest_file.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_split.h"

namespace hoist {
namespace {

// The first read (a head of a few thousand arrays, one request on an
// object store); each next one reads as much again as was read.
constexpr int64_t kFirstReadBytes = int64_t{1} << 20;
// The most a read of neighbouring sections asks for at once.
constexpr int64_t kMaxSectionsReadBytes = int64_t{64} << 20;

// An open MANIFEST.json and its first bytes, as far as they were read.
class ManifestText {
 public:
  static absl::StatusOr<ManifestText> Open(Storage& storage,
                                           const std::string& step_dir) {
    ManifestText text;
    text.step_dir_ = step_dir;
    text.path_ = JoinPath(step_dir, std::string(kManifestFileName));
    ASSIGN_OR_RETURN(text.file_, storage.OpenReadable(text.path_));
    ASSIGN_OR_RETURN(text.size_, text.file_->Size());
    return text;
  }

  // Reads on from the start until the head's blank line: the head, or
  // (none: a document) the whole manifest.
  absl::StatusOr<ManifestHead> ReadHead() {
    int64_t want = std::min(size_, kFirstReadBytes);
    while (true) {
      RETURN_IF_ERROR(ReadPrefix(want));
      if (const std::optional<size_t> head_bytes = SplitHeadBytes(prefix_)) {
        std::optional<absl::StatusOr<ManifestHead>> head = DecodeSplitHead(
            std::string_view(prefix_).substr(0, *head_bytes), size_);
        if (head) return Checked(*std::move(head));
        break;  // a blank line in a document: not a head
      }
      if (want == size_ || !MaybeSplit(prefix_) ||
          want > kMaxManifestBytes + static_cast<int64_t>(kBlankLineBytes)) {
        break;
      }
      want = std::min(size_, 2 * want);
    }
    return ReadDocument();
  }

  // kDataLoss unless the file still has the size `head` was read with.
  absl::Status SameSize(const ManifestHead& head) const {
    if (size_ == head.file_bytes) return absl::OkStatus();
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but %d when its head was read: it changed", path_, size_,
        head.file_bytes));
  }

  // The sections of the arrays `wanted` says into head.manifest (a split
  // head's): neighbouring ones in one read, each read at most
  // kMaxSectionsReadBytes unless one section is longer.
  absl::Status ReadSections(ManifestHead& head,
                            const std::vector<size_t>& wanted) {
    size_t i = 0;
    while (i < wanted.size()) {
      const ManifestSection& first = head.sections[wanted[i]];
      size_t end = i + 1;
      int64_t length = first.length_bytes;
      while (end < wanted.size() && wanted[end] == wanted[end - 1] + 1 &&
             length + head.sections[wanted[end]].length_bytes <=
                 kMaxSectionsReadBytes) {
        length += head.sections[wanted[end]].length_bytes;
        ++end;
      }
      const int64_t at = head.sections_at + first.offset_bytes;
      std::string bytes;
      std::string_view run;
      if (at + length <= static_cast<int64_t>(prefix_.size())) {
        run = std::string_view(prefix_).substr(at, length);  // read already
      } else {
        bytes.resize(length);
        RETURN_IF_ERROR(file_->ReadAt(
            at, absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(bytes.data()),
                                    bytes.size())));
        run = bytes;
      }
      for (size_t k = i; k < end; ++k) {
        const ManifestSection& section = head.sections[wanted[k]];
        const absl::Status status =
            DecodeSection(run.substr(section.offset_bytes - first.offset_bytes,
                                     section.length_bytes),
                          wanted[k], head);
        if (!status.ok()) return WithPath(status);
      }
      i = end;
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBlankLineBytes = 2;

  // A document (hoist/1, hoist/2), read whole; its head is all of it.
  absl::StatusOr<ManifestHead> ReadDocument() {
    if (size_ > kMaxManifestBytes) {
      return absl::DataLossError(
          absl::StrFormat("%s: %d bytes, more than a manifest may have (%d)",
                          path_, size_, kMaxManifestBytes));
    }
    RETURN_IF_ERROR(ReadPrefix(size_));
    absl::StatusOr<Manifest> manifest = DecodeManifest(prefix_);
    if (!manifest.ok()) return WithPath(manifest.status());
    ManifestHead head;
    // hoist/1 hashes with XXH3-64 only (a manifest without extents reads
    // as hoist/2).
    head.format = kManifestFormat;
    for (const ManifestArray& array : manifest->arrays) {
      head.sections.push_back(SummaryOf(array));
      for (const ManifestExtent& extent : array.extents) {
        if (!extent.hash.wide) head.format = kManifestFormatV1;
      }
    }
    head.file_bytes = size_;
    head.manifest = *std::move(manifest);
    return Checked(std::move(head));
  }

  // The file's first `bytes` bytes in prefix_.
  absl::Status ReadPrefix(int64_t bytes) {
    const size_t had = prefix_.size();
    if (static_cast<int64_t>(had) >= bytes) return absl::OkStatus();
    prefix_.resize(bytes);
    return file_->ReadAt(
        had,
        absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(prefix_.data()) + had,
                            prefix_.size() - had));
  }

  // `status` with the step directory in front ("DIR/MANIFEST.json: ...").
  absl::Status WithPath(const absl::Status& status) const {
    return absl::Status(status.code(),
                        absl::StrCat(step_dir_, "/", status.message()));
  }

  // `head` with the step directory in its error, and its step checked
  // against the directory's name.
  absl::StatusOr<ManifestHead> Checked(absl::StatusOr<ManifestHead> head) {
    if (!head.ok()) return WithPath(head.status());
    if (const std::optional<int64_t> step = StepOfDir(step_dir_);
        step && *step != head->manifest.step) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the manifest is of step %d, but its directory names step %d",
          path_, head->manifest.step, *step));
    }
    return head;
  }

  std::string step_dir_;
  std::string path_;
  std::unique_ptr<ReadableFile> file_;
  int64_t size_ = 0;
  std::string prefix_;
};

// The manifest with only the arrays `choose` picks from its head (indices,
// ascending), extents and all: of a split manifest, only their sections
// are read.
absl::StatusOr<Manifest> ReadSomeArrays(
    Storage& storage, const std::string& step_dir,
    const std::function<std::vector<size_t>(const ManifestHead&)>& choose) {
  ASSIGN_OR_RETURN(ManifestText text, ManifestText::Open(storage, step_dir));
  ASSIGN_OR_RETURN(ManifestHead head, text.ReadHead());
  const std::vector<size_t> chosen = choose(head);
  if (head.split) RETURN_IF_ERROR(text.ReadSections(head, chosen));
  Manifest manifest = std::move(head.manifest);
  std::vector<ManifestArray> arrays;
  arrays.reserve(chosen.size());
  for (const size_t i : chosen) arrays.push_back(std::move(manifest.arrays[i]));
  manifest.arrays = std::move(arrays);
  return manifest;
}

}  // namespace

absl::StatusOr<ManifestHead> ReadManifestHead(Storage& storage,
                                              const std::string& step_dir) {
  ASSIGN_OR_RETURN(ManifestText text, ManifestText::Open(storage, step_dir));
  return text.ReadHead();
}

absl::Status ReadManifestSections(Storage& storage, const std::string& step_dir,
                                  ManifestHead& head,
                                  const std::vector<size_t>& arrays) {
  if (!head.split || arrays.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(ManifestText text, ManifestText::Open(storage, step_dir));
  RETURN_IF_ERROR(text.SameSize(head));
  return text.ReadSections(head, arrays);
}

absl::StatusOr<Manifest> ReadManifestFile(Storage& storage,
                                          const std::string& step_dir) {
  ASSIGN_OR_RETURN(ManifestText text, ManifestText::Open(storage, step_dir));
  ASSIGN_OR_RETURN(ManifestHead head, text.ReadHead());
  if (head.split) {
    std::vector<size_t> all(head.sections.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    RETURN_IF_ERROR(text.ReadSections(head, all));
  }
  return std::move(head.manifest);
}

absl::StatusOr<Manifest> ReadManifestArrays(
    Storage& storage, const std::string& step_dir,
    const absl::flat_hash_set<std::string>& names) {
  return ReadSomeArrays(storage, step_dir, [&](const ManifestHead& head) {
    return ArraysNamed(head, names);
  });
}

absl::StatusOr<Manifest> ReadManifestReferences(Storage& storage,
                                                const std::string& step_dir) {
  return ReadSomeArrays(storage, step_dir, [](const ManifestHead& head) {
    std::vector<size_t> referencing;
    for (size_t i = 0; i < head.sections.size(); ++i) {
      if (head.sections[i].referenced_bytes > 0) referencing.push_back(i);
    }
    return referencing;
  });
}

std::vector<size_t> ArraysNamed(const ManifestHead& head,
                                const absl::flat_hash_set<std::string>& names) {
  std::vector<size_t> found;
  for (size_t i = 0; i < head.manifest.arrays.size(); ++i) {
    if (names.contains(head.manifest.arrays[i].name)) found.push_back(i);
  }
  return found;
}

}  // namespace hoist
