// The manifest of a checkpoint: every array's dtype, shape and extents
// (which bytes of which data file hold which box, in this step's directory
// or, for bytes that did not change, in an earlier step's), written last
// and atomically. A step directory without a valid MANIFEST.json is not a
// checkpoint. Format hoist/2 (XXH3-128 hashes, references to other steps'
// bytes) is written, and hoist/3 (hoist/2 split: a head that lists the
// arrays, then each array's extents in a section of its own, which a reader
// reads only for the arrays it wants) when a manifest has more than
// kSplitManifestExtents extents; hoist/1 (XXH3-64, no references) is still
// read.
//
// Manifest is a plain struct; EncodeManifest / DecodeManifest turn it into
// and out of JSON. Decoding trusts nothing: everything a reader relies on is
// validated before it is returned.
#ifndef HOIST_MANIFEST_H_
#define HOIST_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/box.h"
#include "hoist/dtype.h"

namespace hoist {

inline constexpr std::string_view kManifestFormat = "hoist/2";
inline constexpr std::string_view kManifestFormatV3 = "hoist/3";
inline constexpr std::string_view kManifestFormatV1 = "hoist/1";
inline constexpr std::string_view kManifestFileName = "MANIFEST.json";

// What a reader accepts; anything beyond is refused (kDataLoss) before it
// can cost time or memory, and a save that would exceed them is refused
// (kInvalidArgument) before it commits an unreadable step.
//   - the manifest's size: 256 MiB (parsed, it takes several times that);
//     of a split (hoist/3) manifest, its head's;
inline constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;
//   - a split manifest's section (one array's extents): 1 GiB;
inline constexpr int64_t kMaxManifestSectionBytes = int64_t{1} << 30;
//   - JSON nesting, user metadata included: 512 levels;
inline constexpr int kMaxJsonDepth = 512;
//   - extents of one array: 2^21 (checking that they tile it is
//     near-linear: 1,000,000 extents take about a second);
inline constexpr int64_t kMaxExtentsPerArray = int64_t{1} << 21;
//   - every extent's offset is a multiple of 4 KiB, and it ends below 2^56
//     bytes into its file (64 PiB: no sum of offsets can overflow);
inline constexpr int64_t kExtentAlignmentBytes = 4096;
inline constexpr int64_t kMaxFileBytes = int64_t{1} << 56;
//   - rank: kMaxRank (box.h).

// The hash of an extent's bytes: XXH3-128 (hoist/2), or, read from a
// hoist/1 manifest, XXH3-64 (in `low`; `wide` false). Only a wide hash is
// strong enough to decide that bytes did not change (deltas).
struct ExtentHash {
  uint64_t low = 0;
  uint64_t high = 0;
  bool wide = true;
  friend bool operator==(const ExtentHash&, const ExtentHash&) = default;
};

// Bytes of a file holding one box of an array, in C order, little-endian.
struct ManifestExtent {
  Box box;
  // Relative to the directory of the step that holds the bytes:
  // "data/r00000_w00.bin".
  std::string file;
  int64_t offset_bytes = 0;
  int64_t length_bytes = 0;  // box elements * item size
  ExtentHash hash;
  // Set when the bytes are another step's (a delta: they did not change
  // since that step wrote them): that step's number. Always the step that
  // wrote them, never one that references them in turn (one hop).
  std::optional<int64_t> step;
  friend bool operator==(const ManifestExtent&,
                         const ManifestExtent&) = default;
};

struct ManifestArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string sharding;  // the sharding it was saved with; informational
  std::vector<ManifestExtent> extents;  // tile the array exactly once
  friend bool operator==(const ManifestArray&, const ManifestArray&) = default;
};

// The most processes a part may name (a sanity bound on a hostile file).
inline constexpr int kMaxProcesses = 1 << 20;

// A local-tier step holds, per process, that process's part: every box its
// devices held when it saved (SavePlanOptions::part_of_process). Its
// extents are disjoint but need not cover the arrays; a restore from it
// serves only destinations inside them.
struct ManifestPart {
  int process = 0;    // the rank that saved it
  int processes = 1;  // of the job's
  friend bool operator==(const ManifestPart&, const ManifestPart&) = default;
};

struct Manifest {
  int64_t step = 0;
  std::string metadata_json = "{}";  // user metadata: a JSON object
  std::vector<ManifestArray> arrays;
  std::optional<ManifestPart> part;  // set for one process's part only
  friend bool operator==(const Manifest&, const Manifest&) = default;

  // The array called `name`, or null: a scan of `arrays`, for a single
  // lookup. Code that looks up one array per array (a save's delta base, a
  // restore's targets) indexes the manifest once instead (ManifestIndex).
  const ManifestArray* Find(std::string_view name) const;
};

// A manifest with more extents than this is written split (hoist/3): at
// 65,536 extents a hoist/2 manifest is about 10 MiB, which a reader reads
// whole in tens of milliseconds; a job of thousands of ranks writes
// millions, which every `ls`, `inspect` and restore of a few arrays would
// read and decode whole.
inline constexpr int64_t kSplitManifestExtents = int64_t{1} << 16;

struct ManifestEncoding {
  // Split (hoist/3) above this many extents in all; never when the hashes
  // are XXH3-64 (hoist/1). 0: always; INT64_MAX: never (one JSON document,
  // as Python's `manifest()` and `inspect()` return).
  int64_t split_above_extents = kSplitManifestExtents;
};

// The text of `manifest`: hoist/2 (one JSON document), hoist/3 (split: see
// ManifestHead) above encoding.split_above_extents, or hoist/1 when every
// hash is XXH3-64 (a hoist/1 manifest written again). kInvalidArgument
// (nothing thrown) if it could not be read back: hashes of both widths, a
// reference in a hoist/1 manifest or to the manifest's own step, metadata
// that ValidateMetadataJson refuses, an array name that is not UTF-8, a
// document or head larger than kMaxManifestBytes, or a section larger than
// kMaxManifestSectionBytes.
absl::StatusOr<std::string> EncodeManifest(
    const Manifest& manifest, const ManifestEncoding& encoding = {});

// What a reader learns of one array's extents from a manifest's head.
struct ManifestSection {
  int64_t extents = 0;           // how many
  int64_t bytes = 0;             // their lengths' sum
  int64_t referenced_bytes = 0;  // of which other steps hold (a delta's)
  // Split manifests only: where the section lies in the file, from
  // ManifestHead::sections_at, and the XXH3-64 of its text.
  int64_t offset_bytes = 0;
  int64_t length_bytes = 0;
  uint64_t xxh3 = 0;
};

// What `array`'s extents hold (count, bytes, referenced bytes), as a
// split manifest's head says it; where the section lies is left 0.
ManifestSection SummaryOf(const ManifestArray& array);

// A manifest as far as its head says. A split (hoist/3) manifest is a JSON
// document, the head, holding everything but the extents and, per array,
// where its section lies; then a blank line; then each array's extents (a
// JSON array, as hoist/2's "extents") in a section of its own, one after
// another. A reader reads the head, then only the sections it needs. For
// hoist/1 and hoist/2, which are read whole, the head is the whole manifest.
struct ManifestHead {
  std::string_view format = kManifestFormat;  // one of the constants above
  bool split = false;
  // Split: every array's extents empty (read them with the sections).
  Manifest manifest;
  std::vector<ManifestSection> sections;  // one per array of `manifest`
  int64_t sections_at = 0;  // split: the file offset of the first section
  int64_t file_bytes = 0;   // the manifest's size, sections included
};

// OK if `json` can be a step's user metadata: a JSON object, valid UTF-8,
// nested at most kMaxJsonDepth deep (NaN and infinities are not JSON).
// kInvalidArgument saying what is wrong otherwise. Thread-safe; the last
// text of 4 KiB to 64 MiB it accepted is remembered (a copy, for the
// process's life) and accepted again at the cost of a comparison: a
// training loop's saves repeat their metadata.
absl::Status ValidateMetadataJson(std::string_view json);

// Parses and validates the whole text: hoist/1, /2 or /3 (head and every
// section; each section's XXH3-64 and counts must be the head's, and the
// sections must follow each other to the text's end). kInvalidArgument for
// a format other than "hoist/3", "hoist/2" or "hoist/1";
// kDataLoss, naming the array and extent, for anything else that is wrong:
// not JSON, larger or deeper than the limits above, missing or mistyped
// fields, unknown dtype, negative or overflowing shapes, a rank above
// kMaxRank, boxes outside the array, lengths that do not match the box,
// offsets that are unaligned or end past kMaxFileBytes, file names that are
// absolute, contain "..", "." or empty components, more than
// kMaxExtentsPerArray extents, or extents that overlap or (unless the
// manifest is a part) leave part of an array uncovered. Never allocates more
// than a small multiple of `json`'s size, never recurses deeper than the
// nesting limit, and takes time near-linear in its size.
absl::StatusOr<Manifest> DecodeManifest(std::string_view json);

// True for a relative path of plain components ("data/r00000_w00.bin"):
// not empty, not absolute, no "", "." or ".." component, no backslash or NUL.
bool IsSafeRelativePath(std::string_view path);

}  // namespace hoist

#endif  // HOIST_MANIFEST_H_
