// Format hoist/3: encoding and decoding a split manifest's head and
// sections (manifest_split.h).
#include "hoist/format/manifest_split.h"

#include <xxhash.h>

#include <cassert>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"

namespace hoist {
namespace {

using manifest_json::ArrayHead;
using manifest_json::Context;
using manifest_json::Json;
using manifest_json::Reader;

constexpr std::string_view kBlankLine = "\n\n";

uint64_t SectionHash(std::string_view text) {
  return XXH3_64bits(text.data(), text.size());
}

std::string Where(const ManifestArray& array) {
  return absl::StrFormat("array '%s'", array.name);
}

// An array's "extents" in the head: where its section lies, and what it
// holds.
absl::StatusOr<ManifestSection> DecodeSectionPlace(const Json& json,
                                                   const ManifestArray& array,
                                                   int64_t at) {
  const Reader r(Where(array) + ": extents");
  if (!json.is_object()) {
    return r.Error(absl::StrFormat(
        "a %s head gives where the extents lie (an object), not a %s",
        kManifestFormatV3, json.type_name()));
  }
  ManifestSection section;
  ASSIGN_OR_RETURN(section.extents, r.Int(json, "count"));
  ASSIGN_OR_RETURN(section.bytes, r.Int(json, "bytes"));
  ASSIGN_OR_RETURN(section.referenced_bytes, r.Int(json, "referenced"));
  ASSIGN_OR_RETURN(section.offset_bytes, r.Int(json, "at"));
  ASSIGN_OR_RETURN(section.length_bytes, r.Int(json, "length"));
  ASSIGN_OR_RETURN(std::string hash, r.String(json, "xxh3"));
  const std::optional<uint64_t> parsed = manifest_json::ParseHex64(hash);
  if (!parsed) {
    return r.Error(
        absl::StrFormat("xxh3 '%s' is not 16 lowercase hex digits", hash));
  }
  section.xxh3 = *parsed;
  if (section.extents < 0 || section.extents > kMaxExtentsPerArray) {
    return r.Error(absl::StrFormat("count %d is not in [0, %d]",
                                   section.extents, kMaxExtentsPerArray));
  }
  if (section.bytes < 0 || section.referenced_bytes < 0 ||
      section.referenced_bytes > section.bytes) {
    return r.Error(absl::StrFormat(
        "bytes %d and referenced %d are not 0 <= referenced <= bytes",
        section.bytes, section.referenced_bytes));
  }
  if (section.offset_bytes != at) {
    return r.Error(absl::StrFormat(
        "its section is at %d, but the previous one ends at %d (sections "
        "follow each other)",
        section.offset_bytes, at));
  }
  if (section.length_bytes < 1 ||
      section.length_bytes > kMaxManifestSectionBytes) {
    return r.Error(absl::StrFormat("length %d is not in [1, %d]",
                                   section.length_bytes,
                                   kMaxManifestSectionBytes));
  }
  return section;
}

// A hoist/3 head's document (`head_bytes` long, before the blank line) of
// a manifest of `file_bytes` bytes.
absl::StatusOr<ManifestHead> DecodeHead(const Json& json, int64_t head_bytes,
                                        int64_t file_bytes) {
  ManifestHead head;
  head.format = kManifestFormatV3;
  head.split = true;
  head.file_bytes = file_bytes;
  head.sections_at = head_bytes + static_cast<int64_t>(kBlankLine.size());
  RETURN_IF_ERROR(manifest_json::DecodeTopLevel(json, head.manifest).status());
  const Reader r("top level");
  ASSIGN_OR_RETURN(const Json* arrays,
                   r.Field(json, "arrays", Json::value_t::array));
  absl::flat_hash_set<std::string> names;
  head.manifest.arrays.reserve(arrays->size());
  head.sections.reserve(arrays->size());
  int64_t at = 0;
  for (size_t i = 0; i < arrays->size(); ++i) {
    ASSIGN_OR_RETURN(ArrayHead array, manifest_json::DecodeArrayHead(
                                          (*arrays)[i], i, arrays->size()));
    if (!names.insert(array.array.name).second) {
      return r.Error(
          absl::StrFormat("array name '%s' appears twice", array.array.name));
    }
    const auto extents = (*arrays)[i].find("extents");
    if (extents == (*arrays)[i].end()) {
      return Reader(Where(array.array)).Error("field 'extents' is missing");
    }
    ASSIGN_OR_RETURN(const ManifestSection section,
                     DecodeSectionPlace(*extents, array.array, at));
    at += section.length_bytes;  // at most 2^30 an array: no overflow
    head.manifest.arrays.push_back(std::move(array.array));
    head.sections.push_back(section);
  }
  if (head.sections_at + at != file_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but its head says its sections end at byte %d: it "
        "was cut short, or has bytes after them",
        kManifestFileName, file_bytes, head.sections_at + at));
  }
  return head;
}

}  // namespace

absl::StatusOr<std::string> EncodeSplitManifest(
    const Manifest& manifest, const manifest_json::Encodable& encodable) {
  // The sections first, into the string that will hold the whole text;
  // the head, which says where they lie, goes in front of them last.
  std::string text;
  text.reserve(encodable.bound);
  std::vector<ManifestSection> sections;
  sections.reserve(manifest.arrays.size());
  for (const ManifestArray& array : manifest.arrays) {
    ManifestSection section{.offset_bytes = static_cast<int64_t>(text.size())};
    manifest_json::AppendExtents(text, array, /*version_1=*/false);
    text.push_back('\n');
    section.length_bytes =
        static_cast<int64_t>(text.size()) - section.offset_bytes;
    if (section.length_bytes > kMaxManifestSectionBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array '%s': its extents would take %d bytes of the manifest, more "
          "than a reader accepts (%d): fewer extents",
          array.name, section.length_bytes, kMaxManifestSectionBytes));
    }
    section.xxh3 = SectionHash(std::string_view(text).substr(
        section.offset_bytes, section.length_bytes));
    const ManifestSection holds = SummaryOf(array);
    section.extents = holds.extents;
    section.bytes = holds.bytes;
    section.referenced_bytes = holds.referenced_bytes;
    sections.push_back(section);
  }
  // A blank line in the metadata would end the head early.
  Manifest top;
  top.step = manifest.step;
  top.part = manifest.part;
  top.metadata_json =
      manifest.metadata_json.find(kBlankLine) == std::string::npos
          ? manifest.metadata_json
          : Json::parse(manifest.metadata_json).dump();
  std::string head;
  manifest_json::AppendTopLevel(head, top, kManifestFormatV3);
  // What MaybeSplit looks for.
  assert(std::string_view(head).starts_with(kSplitManifestStart));
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    const ManifestSection& s = sections[a];
    manifest_json::AppendArrayHead(head, manifest.arrays[a], a == 0);
    absl::StrAppend(&head, "{\"count\": ", s.extents, ", \"bytes\": ", s.bytes,
                    ", \"referenced\": ", s.referenced_bytes,
                    ", \"at\": ", s.offset_bytes,
                    ", \"length\": ", s.length_bytes, ", \"xxh3\": \"",
                    manifest_json::HexOf(s.xxh3), "\"}}");
  }
  head.append("]}");
  if (static_cast<int64_t>(head.size()) > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the manifest's head would be %d bytes, more than a reader accepts "
        "(%d): fewer arrays or smaller metadata",
        head.size(), kMaxManifestBytes));
  }
  head.append(kBlankLine);
  text.insert(0, head);
  return text;
}

bool MaybeSplit(std::string_view text) {
  return text.starts_with(kSplitManifestStart);
}

std::optional<size_t> SplitHeadBytes(std::string_view text) {
  if (!MaybeSplit(text)) return std::nullopt;
  const size_t at =
      text.substr(0, kMaxManifestBytes + kBlankLine.size()).find(kBlankLine);
  if (at == std::string_view::npos) return std::nullopt;
  return at;
}

std::optional<absl::StatusOr<ManifestHead>> DecodeSplitHead(
    std::string_view text, int64_t file_bytes) {
  if (!manifest_json::NestingWithin(text, kMaxJsonDepth)) return std::nullopt;
  Json json = Json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  const auto format = json.find("format");
  if (format == json.end() || !format->is_string() ||
      format->get<std::string>() != kManifestFormatV3) {
    return std::nullopt;
  }
  return DecodeHead(json, static_cast<int64_t>(text.size()), file_bytes);
}

absl::Status DecodeSection(std::string_view text, size_t index,
                           ManifestHead& head) {
  ManifestArray& array = head.manifest.arrays[index];
  const ManifestSection& section = head.sections[index];
  const std::string where = Where(array) + ": extents";
  const Reader r(where);
  if (const uint64_t hash = SectionHash(text); hash != section.xxh3) {
    return r.Error(absl::StrFormat(
        "the %d bytes at %d have XXH3-64 %s, but the head says %s",
        section.length_bytes, head.sections_at + section.offset_bytes,
        manifest_json::HexOf(hash), manifest_json::HexOf(section.xxh3)));
  }
  RETURN_IF_ERROR(manifest_json::CheckJsonText(text, kMaxManifestSectionBytes,
                                               Where(array) + "'s section"));
  const Json json = Json::parse(text.begin(), text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (json.is_discarded()) return r.Error("not valid JSON");
  ArrayHead decoded{.array = {.name = array.name,
                              .dtype = array.dtype,
                              .shape = array.shape,
                              .sharding = array.sharding,
                              .extents = {}},
                    .elements = *CheckedNumElements(array.shape)};
  const Context context{.split = true,
                        .step = head.manifest.step,
                        .part = head.manifest.part.has_value()};
  RETURN_IF_ERROR(manifest_json::DecodeExtents(json, decoded, context));
  const ManifestSection holds = SummaryOf(decoded.array);
  if (holds.extents != section.extents || holds.bytes != section.bytes ||
      holds.referenced_bytes != section.referenced_bytes) {
    return r.Error(absl::StrFormat(
        "%d extents of %d bytes (%d referenced), but the head says %d of %d "
        "(%d referenced)",
        holds.extents, holds.bytes, holds.referenced_bytes, section.extents,
        section.bytes, section.referenced_bytes));
  }
  array.extents = std::move(decoded.array.extents);
  return absl::OkStatus();
}

std::optional<absl::StatusOr<Manifest>> DecodeIfSplit(std::string_view text) {
  const std::optional<size_t> head_bytes = SplitHeadBytes(text);
  if (!head_bytes) return std::nullopt;
  std::optional<absl::StatusOr<ManifestHead>> head = DecodeSplitHead(
      text.substr(0, *head_bytes), static_cast<int64_t>(text.size()));
  if (!head) return std::nullopt;
  if (!head->ok()) return head->status();
  ManifestHead& decoded = **head;
  for (size_t i = 0; i < decoded.sections.size(); ++i) {
    const ManifestSection& s = decoded.sections[i];
    RETURN_IF_ERROR(DecodeSection(
        text.substr(decoded.sections_at + s.offset_bytes, s.length_bytes), i,
        decoded));
  }
  return std::move(decoded.manifest);
}

}  // namespace hoist
