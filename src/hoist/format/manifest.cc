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
#include "hoist/format/manifest_json.h"
#include "hoist/format/manifest_split.h"
#include "hoist/mutex.h"

namespace hoist {

using manifest_json::ArrayHead;
using manifest_json::Context;
using manifest_json::Json;
using manifest_json::NestingWithin;
using manifest_json::NotValidJson;
using manifest_json::Reader;

const ManifestArray* Manifest::Find(std::string_view name) const {
  const manifest_index_internal::CountingEq equal;
  for (const ManifestArray& array : arrays) {
    if (equal(array.name, name)) return &array;
  }
  return nullptr;
}

ManifestSection SummaryOf(const ManifestArray& array) {
  ManifestSection section;
  section.extents = static_cast<int64_t>(array.extents.size());
  for (const ManifestExtent& extent : array.extents) {
    section.bytes += extent.length_bytes;  // inside the array: no overflow
    if (extent.step) section.referenced_bytes += extent.length_bytes;
  }
  return section;
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

// Written directly, not through a JSON document: a save of 100,000 arrays
// encodes one per step, on the saver's thread, beside the training loop.
// One line per extent; the metadata (validated first) goes in as given.
absl::StatusOr<std::string> EncodeManifest(const Manifest& manifest,
                                           const ManifestEncoding& encoding) {
  ASSIGN_OR_RETURN(const manifest_json::Encodable encodable,
                   manifest_json::CheckEncodable(manifest));
  if (!encodable.version_1 &&
      encodable.extents > encoding.split_above_extents) {
    return EncodeSplitManifest(manifest, encodable);
  }
  std::string out;
  out.reserve(encodable.bound);
  manifest_json::AppendTopLevel(
      out, manifest, encodable.version_1 ? kManifestFormatV1 : kManifestFormat);
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    manifest_json::AppendArrayHead(out, manifest.arrays[a], a == 0);
    manifest_json::AppendExtents(out, manifest.arrays[a], encodable.version_1);
    out.push_back('}');
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

// One array of a hoist/1 or hoist/2 document, extents and all.
absl::StatusOr<ManifestArray> DecodeArray(const Json& json, size_t index,
                                          size_t count,
                                          const Context& context) {
  ASSIGN_OR_RETURN(ArrayHead head,
                   manifest_json::DecodeArrayHead(json, index, count));
  ASSIGN_OR_RETURN(const Json* extents,
                   Reader(absl::StrFormat("array '%s'", head.array.name))
                       .Field(json, "extents", Json::value_t::array));
  RETURN_IF_ERROR(manifest_json::DecodeExtents(*extents, head, context));
  return std::move(head.array);
}

// The top level of a hoist/1 or hoist/2 document: a hoist/3 head alone is
// refused (its extents are in sections after it).
absl::StatusOr<Context> DecodeDocumentTop(const Json& json,
                                          Manifest& manifest) {
  ASSIGN_OR_RETURN(const Context context,
                   manifest_json::DecodeTopLevel(json, manifest));
  if (context.split) {
    return Reader("top level")
        .Error(absl::StrFormat(
            "a %s manifest is a head, a blank line, then its sections; "
            "there is no blank line after this one's head",
            kManifestFormatV3));
  }
  return context;
}

// The whole document at once: every error said exactly.
absl::StatusOr<Manifest> DecodeDocument(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (json.is_discarded()) return NotValidJson(text);
  Manifest manifest;
  ASSIGN_OR_RETURN(const Context context, DecodeDocumentTop(json, manifest));
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
    absl::StatusOr<Context> context = DecodeDocumentTop(top_, manifest);
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

// What both ways check before parsing a document: the size, and the
// nesting.
absl::Status CheckDocumentText(std::string_view text) {
  return manifest_json::CheckJsonText(text, kMaxManifestBytes, "a manifest");
}

}  // namespace

absl::StatusOr<Manifest> DecodeManifestDocument(std::string_view text) {
  if (std::optional<absl::StatusOr<Manifest>> split = DecodeIfSplit(text)) {
    return *std::move(split);
  }
  RETURN_IF_ERROR(CheckDocumentText(text));
  return DecodeDocument(text);
}

absl::StatusOr<Manifest> DecodeManifest(std::string_view text) {
  if (std::optional<absl::StatusOr<Manifest>> split = DecodeIfSplit(text)) {
    return *std::move(split);
  }
  RETURN_IF_ERROR(CheckDocumentText(text));
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