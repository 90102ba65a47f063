// The JSON pieces shared by every manifest format (manifest_json.h).
#include "hoist/format/manifest_json.h"

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/utf8.h"

namespace hoist {
namespace manifest_json {

std::string HexOf(uint64_t value) { return absl::StrFormat("%016x", value); }

namespace {

std::string HashHex(const ExtentHash& hash) {
  return hash.wide ? absl::StrCat(HexOf(hash.high), HexOf(hash.low))
                   : HexOf(hash.low);
}

}  // namespace

std::optional<uint64_t> ParseHex64(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

bool NestingWithin(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

absl::Status Reader::Error(std::string_view what) const {
  return absl::DataLossError(
      absl::StrFormat("%s: %s: %s", kManifestFileName, where_, what));
}

absl::StatusOr<const Json*> Reader::Field(const Json& object, const char* name,
                                          Json::value_t type) const {
  if (!object.is_object()) return Error("expected a JSON object");
  auto it = object.find(name);
  if (it == object.end()) {
    return Error(absl::StrFormat("field '%s' is missing", name));
  }
  const bool ok = type == Json::value_t::number_integer
                      ? it->is_number_integer()
                      : it->type() == type;
  if (!ok) {
    return Error(
        absl::StrFormat("field '%s' has type %s", name, it->type_name()));
  }
  return &*it;
}

absl::StatusOr<int64_t> Reader::Int(const Json& object,
                                    const char* name) const {
  absl::StatusOr<const Json*> field =
      Field(object, name, Json::value_t::number_integer);
  if (!field.ok()) return field.status();
  if ((*field)->is_number_unsigned() &&
      (*field)->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Error(absl::StrFormat("field '%s' does not fit in int64", name));
  }
  return (*field)->get<int64_t>();
}

absl::StatusOr<std::string> Reader::String(const Json& object,
                                           const char* name) const {
  absl::StatusOr<const Json*> field =
      Field(object, name, Json::value_t::string);
  if (!field.ok()) return field.status();
  return (*field)->get<std::string>();
}

absl::StatusOr<std::vector<int64_t>> Reader::Ints(const Json& object,
                                                  const char* name) const {
  absl::StatusOr<const Json*> field = Field(object, name, Json::value_t::array);
  if (!field.ok()) return field.status();
  std::vector<int64_t> out;
  out.reserve((*field)->size());
  for (const Json& v : **field) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      return Error(absl::StrFormat("field '%s' must hold int64 values", name));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

namespace {

absl::StatusOr<ManifestExtent> DecodeExtent(const Json& json,
                                            const ManifestArray& array,
                                            size_t index, size_t count,
                                            const Context& context) {
  const Reader r(
      absl::StrFormat("array '%s': extent %d of %d", array.name, index, count));
  ManifestExtent extent;
  ASSIGN_OR_RETURN(const Json* box,
                   r.Field(json, "box", Json::value_t::object));
  ASSIGN_OR_RETURN(std::vector<int64_t> origin, r.Ints(*box, "origin"));
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, r.Ints(*box, "shape"));
  if (origin.size() != array.shape.size() ||
      shape.size() != array.shape.size()) {
    return r.Error(
        absl::StrFormat("box has rank %d/%d but the array has rank %d",
                        origin.size(), shape.size(), array.shape.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (origin[d] < 0 || shape[d] < 0 ||
        origin[d] > array.shape[d] - shape[d]) {
      return r.Error(absl::StrFormat(
          "box dimension %d [%d, +%d) lies outside the array's size %d", d,
          origin[d], shape[d], array.shape[d]));
    }
  }
  extent.box = Box(std::move(origin), std::move(shape));
  ASSIGN_OR_RETURN(extent.file, r.String(json, "file"));
  if (!IsSafeRelativePath(extent.file)) {
    return r.Error(absl::StrFormat(
        "file '%s' is not a plain relative path inside the checkpoint",
        extent.file));
  }
  ASSIGN_OR_RETURN(extent.offset_bytes, r.Int(json, "offset"));
  ASSIGN_OR_RETURN(extent.length_bytes, r.Int(json, "length"));
  // Boxes inside a validated shape cannot overflow.
  const int64_t expected = extent.box.num_elements() * ItemSize(array.dtype);
  if (extent.length_bytes != expected) {
    return r.Error(
        absl::StrFormat("length %d does not match its box %s of %s (%d bytes)",
                        extent.length_bytes, extent.box.ToString(),
                        DTypeName(array.dtype), expected));
  }
  if (extent.offset_bytes < 0 ||
      extent.offset_bytes % kExtentAlignmentBytes != 0 ||
      extent.length_bytes > kMaxFileBytes - extent.offset_bytes) {
    return r.Error(absl::StrFormat(
        "offset %d is negative, not a multiple of %d, or the extent ends "
        "past %d bytes",
        extent.offset_bytes, kExtentAlignmentBytes, kMaxFileBytes));
  }
  if (context.version_1) {
    ASSIGN_OR_RETURN(std::string hash, r.String(json, "xxh3"));
    std::optional<uint64_t> parsed = ParseHex64(hash);
    if (!parsed) {
      return r.Error(
          absl::StrFormat("xxh3 '%s' is not 16 lowercase hex digits", hash));
    }
    extent.hash = {.low = *parsed, .high = 0, .wide = false};
    return extent;
  }
  ASSIGN_OR_RETURN(std::string hash, r.String(json, "xxh128"));
  std::optional<uint64_t> high =
      hash.size() == 32 ? ParseHex64(hash.substr(0, 16)) : std::nullopt;
  std::optional<uint64_t> low =
      hash.size() == 32 ? ParseHex64(hash.substr(16)) : std::nullopt;
  if (!high || !low) {
    return r.Error(
        absl::StrFormat("xxh128 '%s' is not 32 lowercase hex digits", hash));
  }
  extent.hash = {.low = *low, .high = *high, .wide = true};
  if (json.contains("step")) {
    ASSIGN_OR_RETURN(const int64_t step, r.Int(json, "step"));
    if (step < 0 || step == context.step || context.part) {
      return r.Error(absl::StrFormat(
          "it references step %d: a step's extents may reference only "
          "another step (>= 0), and a part none",
          step));
    }
    extent.step = step;
  }
  return extent;
}

// The extents tile the array: pairwise disjoint and covering every element
// (only disjoint in a part, which holds what one process held).
absl::Status CheckTiling(const ManifestArray& array, int64_t elements,
                         bool part) {
  std::vector<Box> boxes;
  boxes.reserve(array.extents.size());
  for (const ManifestExtent& extent : array.extents) {
    boxes.push_back(extent.box);
  }
  absl::StatusOr<std::optional<BoxOverlap>> overlap = FindOverlap(boxes);
  if (!overlap.ok()) {
    return absl::DataLossError(absl::StrFormat("%s: array '%s': extents: %s",
                                               kManifestFileName, array.name,
                                               overlap.status().message()));
  }
  if (*overlap) {
    const size_t a = (*overlap)->first, b = (*overlap)->second;
    return absl::DataLossError(absl::StrFormat(
        "%s: array '%s': extents %d %s and %d %s overlap", kManifestFileName,
        array.name, a, boxes[a].ToString(), b, boxes[b].ToString()));
  }
  if (part) return absl::OkStatus();
  // Disjoint boxes inside the array: their sizes add up without overflow.
  int64_t covered = 0;
  for (const Box& box : boxes) covered += box.num_elements();
  if (covered != elements) {
    return absl::DataLossError(
        absl::StrFormat("%s: array '%s': extents cover %d of its %d elements",
                        kManifestFileName, array.name, covered, elements));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ArrayHead> DecodeArrayHead(const Json& json, size_t index,
                                          size_t count) {
  const Reader r(absl::StrFormat("array %d of %d", index, count));
  ManifestArray array;
  ASSIGN_OR_RETURN(array.name, r.String(json, "name"));
  if (array.name.empty()) return r.Error("empty name");
  const Reader named(absl::StrFormat("array '%s'", array.name));
  ASSIGN_OR_RETURN(std::string dtype, named.String(json, "dtype"));
  absl::StatusOr<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return named.Error(std::string(parsed.status().message()));
  array.dtype = *parsed;
  ASSIGN_OR_RETURN(array.shape, named.Ints(json, "shape"));
  if (array.shape.size() > kMaxRank) {
    return named.Error(absl::StrFormat("rank %d is above the limit of %d",
                                       array.shape.size(), kMaxRank));
  }
  absl::StatusOr<int64_t> elements = CheckedNumElements(array.shape);
  if (!elements.ok())
    return named.Error(std::string(elements.status().message()));
  if (!CheckedMul(*elements, ItemSize(array.dtype))) {
    return named.Error("its size in bytes overflows int64");
  }
  if (auto it = json.find("sharding"); it != json.end() && it->is_string()) {
    array.sharding = it->get<std::string>();
  }
  return ArrayHead{.array = std::move(array), .elements = *elements};
}

absl::Status DecodeExtents(const Json& extents, ArrayHead& head,
                           const Context& context) {
  ManifestArray& array = head.array;
  if (!extents.is_array()) {
    return Reader(absl::StrFormat("array '%s'", array.name))
        .Error(absl::StrFormat("its extents are a %s, not an array",
                               extents.type_name()));
  }
  if (static_cast<int64_t>(extents.size()) > kMaxExtentsPerArray) {
    return Reader(absl::StrFormat("array '%s'", array.name))
        .Error(absl::StrFormat("%d extents, more than the limit of %d",
                               extents.size(), kMaxExtentsPerArray));
  }
  array.extents.reserve(extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    ASSIGN_OR_RETURN(
        ManifestExtent extent,
        DecodeExtent(extents[i], array, i, extents.size(), context));
    array.extents.push_back(std::move(extent));
  }
  return CheckTiling(array, head.elements, context.part);
}

void AppendJsonString(std::string& out, std::string_view s) {
  out.push_back('"');
  // Names rarely need escaping: appended whole then.
  if (absl::c_none_of(s, [](char c) {
        return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
      })) {
    out.append(s);
    out.push_back('"');
    return;
  }
  for (const char c : s) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void AppendInts(std::string& out, absl::Span<const int64_t> values) {
  out.push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out.append(", ");
    absl::StrAppend(&out, values[i]);
  }
  out.push_back(']');
}

absl::StatusOr<Context> DecodeTopLevel(const Json& json, Manifest& manifest) {
  const Reader r("top level");
  ASSIGN_OR_RETURN(std::string format, r.String(json, "format"));
  if (format != kManifestFormatV3 && format != kManifestFormat &&
      format != kManifestFormatV1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: format '%s' is not supported (this reader knows '%s', '%s' and "
        "'%s')",
        kManifestFileName, format, kManifestFormatV3, kManifestFormat,
        kManifestFormatV1));
  }
  ASSIGN_OR_RETURN(manifest.step, r.Int(json, "step"));
  if (manifest.step < 0) return r.Error("step is negative");
  ASSIGN_OR_RETURN(const Json* metadata,
                   r.Field(json, "metadata", Json::value_t::object));
  manifest.metadata_json = metadata->dump();
  if (json.contains("part")) {
    ASSIGN_OR_RETURN(const Json* part,
                     r.Field(json, "part", Json::value_t::object));
    const Reader pr("part");
    ASSIGN_OR_RETURN(const int64_t process, pr.Int(*part, "process"));
    ASSIGN_OR_RETURN(const int64_t processes, pr.Int(*part, "processes"));
    if (process < 0 || processes <= process || processes > kMaxProcesses) {
      return pr.Error(
          absl::StrFormat("process %d of %d is not in [0, processes <= %d)",
                          process, processes, kMaxProcesses));
    }
    manifest.part =
        ManifestPart{static_cast<int>(process), static_cast<int>(processes)};
  }
  return Context{.version_1 = format == kManifestFormatV1,
                 .split = format == kManifestFormatV3,
                 .step = manifest.step,
                 .part = manifest.part.has_value()};
}

absl::Status NotValidJson(std::string_view text) {
  return absl::DataLossError(absl::StrFormat("%s: not valid JSON (%d bytes)",
                                             kManifestFileName, text.size()));
}

absl::Status CheckJsonText(std::string_view text, int64_t max_bytes,
                           std::string_view what) {
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes, more than %s may have (%d)",
                        kManifestFileName, text.size(), what, max_bytes));
  }
  if (!NestingWithin(text, kMaxJsonDepth)) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: JSON nests deeper than %d levels",
                        kManifestFileName, what, kMaxJsonDepth));
  }
  return absl::OkStatus();
}

absl::StatusOr<Encodable> CheckEncodable(const Manifest& manifest) {
  RETURN_IF_ERROR(ValidateMetadataJson(manifest.metadata_json));
  // The same pass bounds the text's length (names escaped 6 bytes a byte,
  // integers of 20 digits), which is reserved: growing a string of tens of
  // MiB copies it, and a page reserved but never written costs nothing.
  int64_t wide = 0, narrow = 0;
  size_t bound = 256 + manifest.metadata_json.size();
  for (const ManifestArray& array : manifest.arrays) {
    if (!IsValidUtf8(array.name) || !IsValidUtf8(array.sharding)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("array name '%s' (or its sharding) is not valid "
                          "UTF-8; a manifest is JSON",
                          absl::CHexEscape(array.name)));
    }
    bound += 256 + 6 * (array.name.size() + array.sharding.size()) +
             21 * array.shape.size();
    for (const ManifestExtent& extent : array.extents) {
      bound += 224 + 6 * extent.file.size() + 48 * array.shape.size();
      (extent.hash.wide ? wide : narrow) += 1;
      if (extent.step && (!extent.hash.wide || *extent.step == manifest.step ||
                          *extent.step < 0 || manifest.part)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': an extent references step %d from step %d: only a "
            "hoist/2 step's extents may reference another step",
            absl::CHexEscape(array.name), *extent.step, manifest.step));
      }
    }
  }
  if (wide > 0 && narrow > 0) {
    return absl::InvalidArgumentError(
        "a manifest's extents hash with XXH3-128 (hoist/2) or all with "
        "XXH3-64 (hoist/1), not both");
  }
  return Encodable{
      .version_1 = narrow > 0, .extents = wide + narrow, .bound = bound};
}

void AppendTopLevel(std::string& out, const Manifest& manifest,
                    std::string_view format) {
  absl::StrAppend(&out, "{\"format\": ");
  AppendJsonString(out, format);
  absl::StrAppend(&out, ",\n \"step\": ", manifest.step,
                  ",\n \"metadata\": ", manifest.metadata_json);
  if (manifest.part) {
    absl::StrAppend(&out,
                    ",\n \"part\": {\"process\": ", manifest.part->process,
                    ", \"processes\": ", manifest.part->processes, "}");
  }
  out.append(",\n \"arrays\": [");
}

void AppendArrayHead(std::string& out, const ManifestArray& array, bool first) {
  out.append(first ? "\n  {\"name\": " : ",\n  {\"name\": ");
  AppendJsonString(out, array.name);
  out.append(", \"dtype\": ");
  AppendJsonString(out, DTypeName(array.dtype));
  out.append(", \"shape\": ");
  AppendInts(out, array.shape);
  out.append(", \"sharding\": ");
  AppendJsonString(out, array.sharding);
  out.append(", \"extents\": ");
}

void AppendExtents(std::string& out, const ManifestArray& array,
                   bool version_1) {
  out.push_back('[');
  for (size_t e = 0; e < array.extents.size(); ++e) {
    const ManifestExtent& extent = array.extents[e];
    out.append(e == 0 ? "\n   {\"box\": {\"origin\": "
                      : ",\n   {\"box\": {\"origin\": ");
    AppendInts(out, extent.box.origin());
    out.append(", \"shape\": ");
    AppendInts(out, extent.box.shape());
    out.append("}, \"file\": ");
    AppendJsonString(out, extent.file);
    absl::StrAppend(&out, ", \"offset\": ", extent.offset_bytes,
                    ", \"length\": ", extent.length_bytes,
                    version_1 ? ", \"xxh3\": \"" : ", \"xxh128\": \"",
                    HashHex(extent.hash), "\"");
    if (extent.step) absl::StrAppend(&out, ", \"step\": ", *extent.step);
    out.push_back('}');
  }
  out.push_back(']');
}

}  // namespace manifest_json
}  // namespace hoist
