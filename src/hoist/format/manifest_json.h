// The JSON pieces every manifest format shares, for manifest.cc (hoist/1
// and hoist/2, one document) and manifest_split.cc (hoist/3: a head and
// sections). Private to format/.
#ifndef HOIST_FORMAT_MANIFEST_JSON_H_
#define HOIST_FORMAT_MANIFEST_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "hoist/manifest.h"

namespace hoist {
namespace manifest_json {

using Json = nlohmann::json;

// `value` as 16 lowercase hex digits, and back (nullopt for anything
// else).
std::string HexOf(uint64_t value);
std::optional<uint64_t> ParseHex64(const std::string& text);

// True if no array or object in `text` nests deeper than `max_depth`. A
// linear scan that knows only strings and brackets, run before parsing so
// that nothing recursive ever sees deeper input (invalid JSON is left to
// the parser).
bool NestingWithin(std::string_view text, int max_depth);

// What is checked before parsing a document or a split manifest's section
// (`what`: "a manifest", "array 'w''s section"): its size against
// `max_bytes`, and its nesting. kDataLoss.
absl::Status CheckJsonText(std::string_view text, int64_t max_bytes,
                           std::string_view what);

// kDataLoss: "MANIFEST.json: not valid JSON (N bytes)".
absl::Status NotValidJson(std::string_view text);

// Reads JSON fields with type checks; every error names where it is.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  absl::Status Error(std::string_view what) const;
  absl::StatusOr<const Json*> Field(const Json& object, const char* name,
                                    Json::value_t type) const;
  absl::StatusOr<int64_t> Int(const Json& object, const char* name) const;
  absl::StatusOr<std::string> String(const Json& object,
                                     const char* name) const;
  absl::StatusOr<std::vector<int64_t>> Ints(const Json& object,
                                            const char* name) const;

 private:
  std::string where_;
};

// What a manifest's extents are read against: its format and its step.
struct Context {
  bool version_1 = false;  // hoist/1: XXH3-64, no references
  bool split = false;      // hoist/3: a head, then sections
  int64_t step = 0;
  bool part = false;
};

// The top level of a manifest's document (or head), its arrays aside, into
// `manifest`: what its arrays are read against. kInvalidArgument for an
// unknown format.
absl::StatusOr<Context> DecodeTopLevel(const Json& json, Manifest& manifest);

// An array's name, dtype, shape and sharding (its extents left empty), and
// its number of elements. `index` of `count` names it in errors (count 0:
// not known yet).
struct ArrayHead {
  ManifestArray array;
  int64_t elements = 0;
};
absl::StatusOr<ArrayHead> DecodeArrayHead(const Json& json, size_t index,
                                          size_t count);

// `extents` (a JSON array, as hoist/2's "extents") into head.array's
// extents, each checked, then checked to tile the array (only to be
// disjoint in a part).
absl::Status DecodeExtents(const Json& extents, ArrayHead& head,
                           const Context& context);

// Checks that `manifest` can be encoded and read back (see EncodeManifest),
// and bounds its encoded length.
struct Encodable {
  bool version_1 = false;  // every hash XXH3-64
  int64_t extents = 0;
  size_t bound = 0;  // bytes the text can take, at most
};
absl::StatusOr<Encodable> CheckEncodable(const Manifest& manifest);

// Appends `s` (valid UTF-8) as a JSON string.
void AppendJsonString(std::string& out, std::string_view s);
void AppendInts(std::string& out, absl::Span<const int64_t> values);
// `{"format": F, "step": S, "metadata": M[, "part": P],\n "arrays": [`.
void AppendTopLevel(std::string& out, const Manifest& manifest,
                    std::string_view format);
// `\n  {"name": N, "dtype": D, "shape": S, "sharding": H, "extents": `
// (after a comma unless `first`); CheckEncodable has checked its names.
void AppendArrayHead(std::string& out, const ManifestArray& array, bool first);
// The array's extents as a JSON array, one per line.
void AppendExtents(std::string& out, const ManifestArray& array,
                   bool version_1);

}  // namespace manifest_json
}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_JSON_H_
