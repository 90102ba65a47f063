// Format hoist/3: a manifest split into a head and sections, so that a
// reader reads only the arrays it wants (see ManifestHead).
//
//   {"format": "hoist/3", "step": 7, "metadata": {...}, "arrays": [
//     {"name": "w", "dtype": "float32", "shape": [4096, 4096],
//      "sharding": "...", "extents": {"count": 256, "bytes": 67108864,
//      "referenced": 0, "at": 0, "length": 41216, "xxh3": "<16 hex>"}},
//     ...]}
//   <blank line>
//   [{"box": ..., "file": ..., "offset": ..., "length": ..., "xxh128": ...},
//    ...]                                      <- array 0's section
//   [...]                                      <- array 1's section
//
// The head is hoist/2's document with each array's "extents" replaced by
// where its section lies: "at" bytes after the blank line, "length" bytes
// long (its closing line break included), with that XXH3-64, holding
// "count" extents of "bytes" bytes, "referenced" of them in other steps. The
// sections follow each other in the arrays' order, with nothing between
// them and nothing after the last. The head holds no blank line (its
// metadata is written compact if it had one; a JSON string holds no line
// break), and begins with kSplitManifestStart. Private to format/.
#ifndef HOIST_FORMAT_MANIFEST_SPLIT_H_
#define HOIST_FORMAT_MANIFEST_SPLIT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "hoist/format/manifest_json.h"
#include "hoist/manifest.h"

namespace hoist {

// `manifest` as hoist/3; CheckEncodable gave `encodable`. kInvalidArgument
// for a head larger than kMaxManifestBytes or a section larger than
// kMaxManifestSectionBytes.
absl::StatusOr<std::string> EncodeSplitManifest(
    const Manifest& manifest, const manifest_json::Encodable& encodable);

// How a split manifest begins, as hoist writes it; a text that begins
// otherwise is read as a document (hoist/1, hoist/2).
inline constexpr std::string_view kSplitManifestStart =
    "{\"format\": \"hoist/3\",";

// Whether `text` (a manifest's first bytes, at least 21 of them) may be a
// split manifest: it begins with kSplitManifestStart.
bool MaybeSplit(std::string_view text);

// Where a split manifest's head ends in `text` (its first bytes): the
// offset of the blank line ("\n\n"), which the sections follow. nullopt if
// `text` does not begin with kSplitManifestStart, or no blank line lies
// within its first kMaxManifestBytes + 2 bytes.
std::optional<size_t> SplitHeadBytes(std::string_view text);

// `head` (a manifest's text up to its blank line) decoded, for a manifest
// of `file_bytes` bytes in all. nullopt when it is not a hoist/3 head (not
// a JSON object whose "format" is "hoist/3": the text is then one
// document). kDataLoss for anything wrong in it (as DecodeManifest says),
// and when its sections do not end exactly at `file_bytes`.
std::optional<absl::StatusOr<ManifestHead>> DecodeSplitHead(
    std::string_view head, int64_t file_bytes);

// Array `index`'s section (its `length` bytes from sections_at + `at`)
// into head.manifest.arrays[index].extents. kDataLoss, naming the array,
// when its XXH3-64, its count or its bytes are not the head's, or when
// its extents do not decode or tile the array (see DecodeManifest).
absl::Status DecodeSection(std::string_view section, size_t index,
                           ManifestHead& head);

// `text` decoded whole if it is a split manifest, nullopt if it is not.
std::optional<absl::StatusOr<Manifest>> DecodeIfSplit(std::string_view text);

}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_SPLIT_H_
