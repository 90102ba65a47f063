#include "hoist/manifest.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/utf8.h"
#include "hoist/format/manifest_decode.h"
#include "hoist/format/manifest_index.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

using Json = nlohmann::json;

std::string HexOf(uint64_t value) { return absl::StrFormat("%016x", value); }

std::string HexOf(const ExtentHash& hash) {
  return hash.wide ? absl::StrCat(HexOf(hash.high), HexOf(hash.low))
                   : HexOf(hash.low);
}

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

// True if no array or object in `text` nests deeper than `max_depth`. A
// linear scan that knows only strings and brackets, run before parsing so
// that nothing recursive ever sees deeper input (invalid JSON is left to
// the parser).
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

// Reads JSON fields with type checks; every error names where it is.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  absl::Status Error(std::string_view what) const {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: %s", kManifestFileName, where_, what));
  }

  absl::StatusOr<const Json*> Field(const Json& object, const char* name,
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

  absl::StatusOr<int64_t> Int(const Json& object, const char* name) const {
    absl::StatusOr<const Json*> field =
        Field(object, name, Json::value_t::number_integer);
    if (!field.ok()) return field.status();
    if ((*field)->is_number_unsigned() &&
        (*field)->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(absl::StrFormat("field '%s' does not fit in int64", name));
    }
    return (*field)->get<int64_t>();
  }

  absl::StatusOr<std::string> String(const Json& object,
                                     const char* name) const {
    absl::StatusOr<const Json*> field =
        Field(object, name, Json::value_t::string);
    if (!field.ok()) return field.status();
    return (*field)->get<std::string>();
  }

  absl::StatusOr<std::vector<int64_t>> Ints(const Json& object,
                                            const char* name) const {
    absl::StatusOr<const Json*> field =
        Field(object, name, Json::value_t::array);
    if (!field.ok()) return field.status();
    std::vector<int64_t> out;
    out.reserve((*field)->size());
    for (const Json& v : **field) {
      if (!v.is_number_integer() ||
          (v.is_number_unsigned() &&
           v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
        return Error(
            absl::StrFormat("field '%s' must hold int64 values", name));
      }
      out.push_back(v.get<int64_t>());
    }
    return out;
  }

 private:
  std::string where_;
};

// What a manifest's extents are read against: its format's version and
// its step.
struct Context {
  bool version_1 = false;  // hoist/1: XXH3-64, no references
  int64_t step = 0;
  bool part = false;
};

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

absl::StatusOr<ManifestArray> DecodeArray(const Json& json, size_t index,
                                          size_t count,
                                          const Context& context) {
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
  ASSIGN_OR_RETURN(const Json* extents,
                   named.Field(json, "extents", Json::value_t::array));
  if (static_cast<int64_t>(extents->size()) > kMaxExtentsPerArray) {
    return named.Error(absl::StrFormat("%d extents, more than the limit of %d",
                                       extents->size(), kMaxExtentsPerArray));
  }
  array.extents.reserve(extents->size());
  for (size_t i = 0; i < extents->size(); ++i) {
    ASSIGN_OR_RETURN(
        ManifestExtent extent,
        DecodeExtent((*extents)[i], array, i, extents->size(), context));
    array.extents.push_back(std::move(extent));
  }
  if (absl::Status status = CheckTiling(array, *elements, context.part);
      !status.ok()) {
    return status;
  }
  return array;
}

}  // namespace

const ManifestArray* Manifest::Find(std::string_view name) const {
  const manifest_index_internal::CountingEq equal;
  for (const ManifestArray& array : arrays) {
    if (equal(array.name, name)) return &array;
  }
  return nullptr;
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  if (path.find('\\') != std::string_view::npos ||
      path.find('\0') != std::string_view::npos) {
    return false;
  }
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(path.data(), path.size()), '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

namespace {

absl::Status ValidateMetadataJsonText(std::string_view json) {
  if (!NestingWithin(json, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metadata nests deeper than %d levels", kMaxJsonDepth));
  }
  // A SAX pass: the parser checks the grammar and UTF-8 without building
  // the document (Save runs this on the caller's thread).
  struct TopLevel final : nlohmann::json_sax<Json> {
    Json::value_t type = Json::value_t::discarded;
    bool first = true;
    void Saw(Json::value_t t) {
      if (first) type = t;
      first = false;
    }
    bool null() override { return Saw(Json::value_t::null), true; }
    bool boolean(bool) override { return Saw(Json::value_t::boolean), true; }
    bool number_integer(number_integer_t) override {
      return Saw(Json::value_t::number_integer), true;
    }
    bool number_unsigned(number_unsigned_t) override {
      return Saw(Json::value_t::number_unsigned), true;
    }
    bool number_float(number_float_t, const string_t&) override {
      return Saw(Json::value_t::number_float), true;
    }
    bool string(string_t&) override { return Saw(Json::value_t::string), true; }
    bool binary(binary_t&) override { return Saw(Json::value_t::binary), true; }
    bool start_object(std::size_t) override {
      return Saw(Json::value_t::object), true;
    }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override {
      return Saw(Json::value_t::array), true;
    }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception&) override {
      return false;
    }
  } top;
  if (!Json::sax_parse(json.begin(), json.end(), &top)) {
    return absl::InvalidArgumentError(
        "metadata is not valid JSON in UTF-8 (NaN and infinities are not "
        "JSON, and every string must be valid UTF-8)");
  }
  if (top.type != Json::value_t::object) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metadata must be a JSON object, not a %s",
                        Json(top.type).type_name()));
  }
  return absl::OkStatus();
}

// The last large text ValidateMetadataJson accepted. A training loop saves
// the same metadata again and again (Python's holds the state's tree:
// megabytes at 100,000 arrays), and each save validates it twice (when it
// is accepted, and in EncodeManifest at the commit): comparing it with the
// last one costs a memcmp, parsing it again a fifth of a repeated save's
// blocked time (issue 55).
// Texts from 4 KiB (smaller ones parse as fast) to 64 MiB (the memo's copy
// stays for the process's life) are remembered.
constexpr size_t kMemoMinBytes = 4096;
constexpr size_t kMemoMaxBytes = size_t{64} << 20;
struct MetadataMemo {
  Mutex mu;
  std::string accepted ABSL_GUARDED_BY(mu);
};
MetadataMemo& Memo() {
  static MetadataMemo* const memo = new MetadataMemo;
  return *memo;
}

}  // namespace

absl::Status ValidateMetadataJson(std::string_view json) {
  if (json.size() < kMemoMinBytes || json.size() > kMemoMaxBytes) {
    return ValidateMetadataJsonText(json);
  }
  MetadataMemo& memo = Memo();
  {
    MutexLock lock(&memo.mu);
    if (json == memo.accepted) return absl::OkStatus();
  }
  RETURN_IF_ERROR(ValidateMetadataJsonText(json));
  MutexLock lock(&memo.mu);
  memo.accepted.assign(json);
  return absl::OkStatus();
}

namespace {

// `s` (valid UTF-8) as a JSON string: quotes, backslashes and control
// characters escaped, everything else as it is.
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

}  // namespace

// Written directly, not through a JSON document: a save of 100,000 arrays
// encodes one per step, on the saver's thread, beside the training loop.
// One line per extent; the metadata (validated first) goes in as given.
absl::StatusOr<std::string> EncodeManifest(const Manifest& manifest) {
  RETURN_IF_ERROR(ValidateMetadataJson(manifest.metadata_json));
  // hoist/1 only for a manifest all of whose hashes are XXH3-64. The same
  // pass bounds the text's length (names escaped 6 bytes a byte, integers
  // of 20 digits), which is reserved: growing a string of tens of MiB
  // copies it, and a page reserved but never written costs nothing.
  int wide = 0, narrow = 0;
  size_t bound = 256 + manifest.metadata_json.size();
  for (const ManifestArray& array : manifest.arrays) {
    bound += 128 + 6 * (array.name.size() + array.sharding.size()) +
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
  const bool version_1 = narrow > 0;
  std::string out;
  out.reserve(bound);
  absl::StrAppend(&out, "{\"format\": ");
  AppendJsonString(out, version_1 ? kManifestFormatV1 : kManifestFormat);
  absl::StrAppend(&out, ",\n \"step\": ", manifest.step,
                  ",\n \"metadata\": ", manifest.metadata_json);
  if (manifest.part) {
    absl::StrAppend(&out,
                    ",\n \"part\": {\"process\": ", manifest.part->process,
                    ", \"processes\": ", manifest.part->processes, "}");
  }
  out.append(",\n \"arrays\": [");
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    const ManifestArray& array = manifest.arrays[a];
    if (!IsValidUtf8(array.name) || !IsValidUtf8(array.sharding)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("array name '%s' (or its sharding) is not valid "
                          "UTF-8; a manifest is JSON",
                          absl::CHexEscape(array.name)));
    }
    out.append(a == 0 ? "\n  {\"name\": " : ",\n  {\"name\": ");
    AppendJsonString(out, array.name);
    out.append(", \"dtype\": ");
    AppendJsonString(out, DTypeName(array.dtype));
    out.append(", \"shape\": ");
    AppendInts(out, array.shape);
    out.append(", \"sharding\": ");
    AppendJsonString(out, array.sharding);
    out.append(", \"extents\": [");
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
                      HexOf(extent.hash), "\"");
      if (extent.step) absl::StrAppend(&out, ", \"step\": ", *extent.step);
      out.push_back('}');
    }
    out.append("]}");
  }
  out.append("]}\n");
  if (static_cast<int64_t>(out.size()) > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the manifest would be %d bytes, more than a reader accepts (%d): "
        "fewer arrays, fewer extents or smaller metadata",
        out.size(), kMaxManifestBytes));
  }
  return out;
}

namespace {

// The top level of a manifest's document, its arrays aside, into
// `manifest`: what its arrays are read against.
absl::StatusOr<Context> DecodeTopLevel(const Json& json, Manifest& manifest) {
  const Reader r("top level");
  ASSIGN_OR_RETURN(std::string format, r.String(json, "format"));
  if (format != kManifestFormat && format != kManifestFormatV1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: format '%s' is not supported (this reader knows '%s' and '%s')",
        kManifestFileName, format, kManifestFormat, kManifestFormatV1));
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
                 .step = manifest.step,
                 .part = manifest.part.has_value()};
}

absl::Status NotValidJson(std::string_view text) {
  return absl::DataLossError(absl::StrFormat("%s: not valid JSON (%d bytes)",
                                             kManifestFileName, text.size()));
}

// The whole document at once: every error said exactly.
absl::StatusOr<Manifest> DecodeDocument(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (json.is_discarded()) return NotValidJson(text);
  Manifest manifest;
  ASSIGN_OR_RETURN(const Context context, DecodeTopLevel(json, manifest));
  const Reader r("top level");
  ASSIGN_OR_RETURN(const Json* arrays,
                   r.Field(json, "arrays", Json::value_t::array));
  absl::flat_hash_set<std::string> names;
  manifest.arrays.reserve(arrays->size());
  for (size_t i = 0; i < arrays->size(); ++i) {
    ASSIGN_OR_RETURN(ManifestArray array,
                     DecodeArray((*arrays)[i], i, arrays->size(), context));
    if (!names.insert(array.name).second) {
      return r.Error(
          absl::StrFormat("array name '%s' appears twice", array.name));
    }
    manifest.arrays.push_back(std::move(array));
  }
  return manifest;
}

// The arrays decoded one by one as the parser completes each, so that the
// document never holds them all: a manifest of 100,000 arrays took 290 MB
// and half its decoding time in the document alone. A SAX handler: the
// top level goes into one document (its "arrays" left empty), each array
// into a document of its own, decoded and dropped. For the manifests hoist
// writes: "format" and "step" (and "part", if any) before "arrays", no key
// twice, every array an object. Anything else gives up (nullopt):
// DecodeDocument then reads it whole. An array that does not decode ends
// the decoding, not the parse: its error is DecodeDocument's, said once
// the count of arrays is known. Text that is not JSON at all
// (syntax_error()) the parser, the same on both ways, refuses at the same
// byte.
class StreamedDecoder final : public nlohmann::json_sax<Json> {
 public:
  // The manifest, or the error DecodeDocument would give, or nullopt when
  // the text is not in hoist's shape (DecodeDocument must read it).
  std::optional<absl::StatusOr<Manifest>> Decode(std::string_view text) {
    if (!Json::sax_parse(text.begin(), text.end(), this) || !arrays_done_) {
      return std::nullopt;
    }
    Manifest manifest;
    absl::StatusOr<Context> context = DecodeTopLevel(top_, manifest);
    if (!context.ok() || context->version_1 != context_.version_1 ||
        context->step != context_.step || context->part != context_.part) {
      return std::nullopt;
    }
    if (!duplicate_name_.empty()) {
      return Reader("top level")
          .Error(absl::StrFormat("array name '%s' appears twice",
                                 duplicate_name_));
    }
    if (failed_element_.has_value()) {
      // Decoded again now that the count is known, for the same message.
      absl::StatusOr<ManifestArray> array =
          DecodeArray(*failed_element_, failed_index_, arrays_seen_, *context);
      if (array.ok()) return std::nullopt;  // cannot be; let it say
      return array.status();
    }
    manifest.arrays = std::move(arrays_);
    return manifest;
  }

  // Each event goes to the array being read, or to the top level's
  // document; false stops the parse (giving up).
  bool null() override { return Value(nullptr); }
  bool boolean(bool v) override { return Value(v); }
  bool number_integer(number_integer_t v) override { return Value(v); }
  bool number_unsigned(number_unsigned_t v) override { return Value(v); }
  bool number_float(number_float_t v, const string_t& s) override {
    return Forward([&](auto& to) { return to.number_float(v, s); });
  }
  bool string(string_t& v) override { return Value(v); }
  bool binary(binary_t& v) override {
    return Forward([&](auto& to) { return to.binary(v); });
  }
  bool start_object(std::size_t n) override {
    // An array begins (after an error, arrays are only counted).
    if (depth_ == 2 && in_arrays_ && !Failed()) {
      element_ = Json();
      element_parser_.emplace(element_, /*allow_exceptions=*/false);
    }
    const bool ok = Forward([&](auto& to) { return to.start_object(n); });
    ++depth_;
    return ok;
  }
  bool end_object() override {
    --depth_;
    const bool ok = Forward([&](auto& to) { return to.end_object(); });
    if (depth_ == 2 && in_arrays_) return ok && Decoded();
    return ok;
  }
  bool start_array(std::size_t n) override {
    if (depth_ == 1 && key_ == "arrays") {
      if (!format_ || !step_) return false;  // decoded later: give up
      context_ = {.version_1 = *format_ == kManifestFormatV1,
                  .step = *step_,
                  .part = keys_.contains("part")};
      in_arrays_ = true;
      ++depth_;
      return top_parser_.start_array(n);
    }
    if (depth_ == 2 && in_arrays_) return false;  // an array is an object
    const bool ok = Forward([&](auto& to) { return to.start_array(n); });
    ++depth_;
    return ok;
  }
  bool end_array() override {
    --depth_;
    if (depth_ == 1 && in_arrays_) {
      in_arrays_ = false;
      arrays_done_ = true;
      return top_parser_.end_array();
    }
    return Forward([&](auto& to) { return to.end_array(); });
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      key_ = k;
      if (!keys_.insert(key_).second) return false;  // a key twice
      // After the arrays, it could change how they decode.
      if (arrays_done_ &&
          (key_ == "format" || key_ == "step" || key_ == "part")) {
        return false;
      }
    }
    return Forward([&](auto& to) { return to.key(k); });
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception&) override {
    syntax_error_ = true;
    return false;
  }
  // Whether Decode gave up because the text is not valid JSON.
  bool syntax_error() const { return syntax_error_; }

 private:
  using DomParser = nlohmann::detail::json_sax_dom_parser<Json>;

  // A scalar; the top level's format and step are kept as they come.
  template <typename T>
  bool Value(T&& v) {
    if (depth_ == 1 && !in_arrays_) {
      Json value(v);
      if (key_ == "format" && value.is_string()) {
        format_ = value.template get<std::string>();
      } else if (key_ == "step" && value.is_number_integer() &&
                 (!value.is_number_unsigned() ||
                  value.template get<uint64_t>() <= uint64_t{INT64_MAX})) {
        step_ = value.template get<int64_t>();
      }
    }
    if (depth_ == 2 && in_arrays_) return false;  // an array is an object
    return Forward([&](auto& to) {
      if constexpr (std::is_same_v<std::decay_t<T>, std::nullptr_t>) {
        return to.null();
      } else if constexpr (std::is_same_v<std::decay_t<T>, bool>) {
        return to.boolean(v);
      } else if constexpr (std::is_same_v<std::decay_t<T>, number_integer_t>) {
        return to.number_integer(v);
      } else if constexpr (std::is_same_v<std::decay_t<T>, number_unsigned_t>) {
        return to.number_unsigned(v);
      } else {
        return to.string(v);
      }
    });
  }

  // `event` on the array being read (inside "arrays"), else on the top
  // level's document.
  template <typename Event>
  bool Forward(Event event) {
    if (in_arrays_ && depth_ >= 2) {
      // No parser: an array after an error, skipped.
      return element_parser_ ? event(*element_parser_) : true;
    }
    return event(top_parser_);
  }

  bool Failed() const {
    return failed_element_.has_value() || !duplicate_name_.empty();
  }

  // The array just read, decoded and dropped. The first that fails is
  // kept, and the parse goes on only to count the arrays (its error names
  // the count): a manifest that is JSON is parsed once.
  bool Decoded() {
    const size_t index = arrays_seen_++;
    if (!element_parser_) return true;  // skipped
    element_parser_.reset();
    absl::StatusOr<ManifestArray> array =
        DecodeArray(element_, index, 0, context_);
    if (!array.ok()) {
      failed_index_ = index;
      failed_element_ = std::move(element_);
    } else if (!names_.insert(array->name).second) {
      duplicate_name_ = array->name;
    } else {
      arrays_.push_back(*std::move(array));
    }
    element_ = Json();
    return true;
  }

  Json top_;
  DomParser top_parser_{top_, /*allow_exceptions=*/false};
  Json element_;
  std::optional<DomParser> element_parser_;
  int depth_ = 0;    // containers open
  std::string key_;  // the top level's last
  absl::flat_hash_set<std::string> keys_;
  std::optional<std::string> format_;
  std::optional<int64_t> step_;
  bool in_arrays_ = false, arrays_done_ = false;
  bool syntax_error_ = false;
  size_t arrays_seen_ = 0;
  // The first array that did not decode, and its index; or the first name
  // seen twice.
  std::optional<Json> failed_element_;
  size_t failed_index_ = 0;
  std::string duplicate_name_;
  Context context_;
  std::vector<ManifestArray> arrays_;
  absl::flat_hash_set<std::string> names_;
};

// What both ways check before parsing: the size, and the nesting.
absl::Status CheckManifestText(std::string_view text) {
  if (static_cast<int64_t>(text.size()) > kMaxManifestBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes, more than a manifest may have (%d)",
                        kManifestFileName, text.size(), kMaxManifestBytes));
  }
  if (!NestingWithin(text, kMaxJsonDepth)) {
    return absl::DataLossError(
        absl::StrFormat("%s: JSON nests deeper than %d levels",
                        kManifestFileName, kMaxJsonDepth));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> DecodeManifestDocument(std::string_view text) {
  RETURN_IF_ERROR(CheckManifestText(text));
  return DecodeDocument(text);
}

absl::StatusOr<Manifest> DecodeManifest(std::string_view text) {
  RETURN_IF_ERROR(CheckManifestText(text));
  StreamedDecoder streamed;
  if (std::optional<absl::StatusOr<Manifest>> decoded = streamed.Decode(text)) {
    return *std::move(decoded);
  }
  // Not JSON: reading it again would say so at the same byte (half the
  // time the fuzzers spent on such input went there).
  if (streamed.syntax_error()) return NotValidJson(text);
  return DecodeDocument(text);
}

}  // namespace hoist
