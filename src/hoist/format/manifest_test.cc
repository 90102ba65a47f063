#include "hoist/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

// An extent of a hoist/2 manifest whose bytes are its own step's.
ManifestExtent Extent(Box box, std::string file, int64_t offset, int64_t length,
                      uint64_t hash) {
  return {std::move(box),
          std::move(file),
          offset,
          length,
          ExtentHash{.low = hash, .high = 0xfedcba9876543210ULL, .wide = true},
          std::nullopt};
}

Manifest Sample() {
  Manifest m;
  m.step = 1000;
  m.metadata_json = R"({"lr":0.001,"run":"gpt"})";
  ManifestArray w{"params/w", DType::kBFloat16, {4, 6}, "Named(...)", {}};
  w.extents = {
      Extent(Box({0, 0}, {2, 6}), "data/r00000_w00.bin", 0, 24,
             0x0123456789abcdefULL),
      Extent(Box({2, 0}, {2, 6}), "data/r00001_w00.bin", 4096, 24, 42),
  };
  ManifestArray step{"opt/count", DType::kInt32, {}, "", {}};
  step.extents = {Extent(Box(), "data/r00000_w00.bin", 8192, 4, 7)};
  m.arrays = {w, step};
  return m;
}

// Decodes Sample() with one edit applied to its JSON.
absl::Status DecodeEdited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json json = nlohmann::json::parse(EncodeManifest(Sample()).value());
  edit(json);
  return DecodeManifest(json.dump()).status();
}

TEST(ManifestTest, RoundTripsExactly) {
  const Manifest m = Sample();
  absl::StatusOr<Manifest> decoded = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, m);
  EXPECT_EQ(decoded->Find("opt/count")->dtype, DType::kInt32);
  EXPECT_EQ(decoded->Find("nope"), nullptr);
}

// A part's extents need not cover its arrays, but must not overlap; the
// part's numbers are checked.
TEST(ManifestTest, APartRoundTripsAndMayLeaveArraysUncovered) {
  Manifest m = Sample();
  m.part = ManifestPart{1, 4};
  m.arrays[0].extents.erase(m.arrays[0].extents.begin());
  absl::StatusOr<Manifest> decoded = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, m);
  ASSERT_TRUE(decoded->part.has_value());
  EXPECT_EQ(decoded->part->process, 1);

  // Without the part, the same extents are a hole.
  m.part.reset();
  EXPECT_THAT(DecodeManifest(EncodeManifest(m).value()).status().message(),
              HasSubstr("extents cover 12 of its 24 elements"));

  for (const auto& [bad_part, message] :
       std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"process", 4}, {"processes", 4}}, "process 4 of 4"},
           {{{"process", -1}, {"processes", 4}}, "process -1 of 4"},
           {{{"process", 0}}, "processes"},
           {"rank 3", "part"}}) {
    const nlohmann::json part = bad_part;  // clang 14 captures no bindings
    const absl::Status status = DecodeEdited([&](nlohmann::json& j) {
      j["part"] = part;
      j["arrays"][0]["extents"].erase(1);
    });
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << part.dump();
    EXPECT_THAT(status.message(), HasSubstr(message)) << part.dump();
  }
  // Overlaps stay refused in a part.
  EXPECT_THAT(DecodeEdited([](nlohmann::json& j) {
                j["part"] = {{"process", 0}, {"processes", 2}};
                j["arrays"][0]["extents"][1]["box"]["origin"] = {1, 0};
              }).message(),
              HasSubstr("overlap"));
}

TEST(ManifestTest, NamesNeedingEscapesAndMetadataAsGivenRoundTrip) {
  Manifest m = Sample();
  m.arrays[0].name =
      "a \"quoted\" \\ name\n\t\x01\x1f caf\xc3\xa9 \xe2\x82\xac";
  m.arrays[0].sharding = "{\"explicit\": \"\\\\\"}";
  m.metadata_json =
      R"({"nested":{"list":[1,2.5,"x"],"empty":{}},"u":"\u00e9"})";
  const std::string text = EncodeManifest(m).value();
  // Valid JSON, whatever a parser makes of it.
  EXPECT_FALSE(nlohmann::json::parse(text, nullptr, false).is_discarded());
  absl::StatusOr<Manifest> decoded = DecodeManifest(text);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->arrays[0].name, m.arrays[0].name);
  EXPECT_EQ(decoded->arrays[0].sharding, m.arrays[0].sharding);
  EXPECT_EQ(nlohmann::json::parse(decoded->metadata_json),
            nlohmann::json::parse(m.metadata_json));
  EXPECT_EQ(decoded->arrays, m.arrays);
}

TEST(ManifestTest, HashIsThirtyTwoHexDigits) {
  const std::string json = EncodeManifest(Sample()).value();
  EXPECT_THAT(json,
              HasSubstr(R"("xxh128": "fedcba98765432100123456789abcdef")"));
  EXPECT_THAT(json, HasSubstr(R"("format": "hoist/2")"));
}

// A hoist/1 manifest (XXH3-64, no references) still reads, and written
// again it stays hoist/1.
TEST(ManifestTest, VersionOneStillReads) {
  nlohmann::json json = nlohmann::json::parse(EncodeManifest(Sample()).value());
  json["format"] = "hoist/1";
  for (auto& array : json["arrays"]) {
    for (auto& extent : array["extents"]) {
      const std::string wide = extent["xxh128"];
      extent.erase("xxh128");
      extent["xxh3"] = wide.substr(16);
    }
  }
  absl::StatusOr<Manifest> decoded = DecodeManifest(json.dump());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const ExtentHash& hash = decoded->arrays[0].extents[0].hash;
  EXPECT_FALSE(hash.wide);
  EXPECT_EQ(hash.low, 0x0123456789abcdefULL);
  const std::string again = EncodeManifest(*decoded).value();
  EXPECT_THAT(again, HasSubstr(R"("format": "hoist/1")"));
  EXPECT_THAT(again, HasSubstr(R"("xxh3": "0123456789abcdef")"));
  EXPECT_EQ(DecodeManifest(again).value(), *decoded);

  // hoist/1 knows no references, and no XXH3-128.
  json["arrays"][0]["extents"][0]["step"] = 3;
  EXPECT_TRUE(DecodeManifest(json.dump()).ok());  // an unknown field
  EXPECT_FALSE(DecodeManifest(json.dump()).value().arrays[0].extents[0].step);
  Manifest mixed = *decoded;
  mixed.arrays[0].extents[0].hash.wide = true;
  EXPECT_EQ(EncodeManifest(mixed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ManifestTest, ReferencesToOtherStepsRoundTrip) {
  Manifest m = Sample();
  m.arrays[0].extents[1].step = 7;
  const std::string json = EncodeManifest(m).value();
  EXPECT_THAT(json, HasSubstr(R"("step": 7})"));
  absl::StatusOr<Manifest> decoded = DecodeManifest(json);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, m);

  // Never to its own step, a negative one, or from a part; nor from a
  // hoist/1 manifest.
  for (int64_t bad : {m.step, int64_t{-1}}) {
    Manifest refused = m;
    refused.arrays[0].extents[1].step = bad;
    EXPECT_EQ(EncodeManifest(refused).status().code(),
              absl::StatusCode::kInvalidArgument);
    nlohmann::json edited = nlohmann::json::parse(json);
    edited["arrays"][0]["extents"][1]["step"] = bad;
    const absl::Status status = DecodeManifest(edited.dump()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(status.message(), HasSubstr("references step"));
  }
  Manifest part = m;
  part.part = ManifestPart{0, 2};
  EXPECT_EQ(EncodeManifest(part).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Hoist's own order (format, step, metadata, part, arrays) is decoded one
// array at a time; any other order, as an older writer's sorted keys, the
// whole document at once: both give the same manifest, and the same errors.
TEST(ManifestTest, EveryKeyOrderDecodesAlikeAndErrorsAreTheSame) {
  Manifest m = Sample();
  m.part = ManifestPart{0, 2};
  const std::string ours = EncodeManifest(m).value();
  ASSERT_LT(ours.find("\"part\""), ours.find("\"arrays\""));
  const std::string sorted = nlohmann::json::parse(ours).dump();
  ASSERT_LT(sorted.find("\"arrays\""), sorted.find("\"format\""));
  nlohmann::ordered_json late = nlohmann::ordered_json::parse(ours);
  const nlohmann::ordered_json part = late["part"];
  late.erase("part");
  late["part"] = part;  // after the arrays
  for (const std::string& text : {ours, sorted, late.dump()}) {
    absl::StatusOr<Manifest> decoded = DecodeManifest(text);
    ASSERT_TRUE(decoded.ok()) << decoded.status() << text;
    EXPECT_EQ(*decoded, m);
  }
  // Errors in hoist's order name the array's place as in any other.
  const auto edited = [&](std::string from, std::string to) {
    std::string text = ours;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return DecodeManifest(text.replace(at, from.size(), to)).status();
  };
  absl::Status status = edited("\"opt/count\"", "\"\"");
  EXPECT_THAT(status.message(), HasSubstr("array 1 of 2: empty name"));
  status = edited("\"opt/count\"", "\"params/w\"");
  EXPECT_THAT(status.message(), HasSubstr("'params/w' appears twice"));
  status = edited("\"bfloat16\"", "\"float128\"");
  EXPECT_THAT(status.message(),
              HasSubstr("array 'params/w': unknown dtype 'float128'"));
  status = edited("\"step\": 1000", "\"step\": -1");
  EXPECT_THAT(status.message(), HasSubstr("step is negative"));
  status = edited("\"arrays\": [", "\"arrays\": [7, ");
  EXPECT_THAT(status.message(), HasSubstr("array 0 of 3: expected a JSON"));
}

TEST(ManifestTest, GarbageAndTruncatedJsonAreDataLoss) {
  const std::string json = EncodeManifest(Sample()).value();
  for (const std::string& text :
       {std::string("\x00\xff garbage", 10), json.substr(0, json.size() / 2),
        std::string(""), std::string("[]"), std::string("null")}) {
    absl::Status status = DecodeManifest(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << text;
  }
}

TEST(ManifestTest, UnknownFormatIsInvalidArgument) {
  absl::Status status = DecodeEdited([](auto& j) { j["format"] = "hoist/9"; });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'hoist/9' is not supported"));
}

TEST(ManifestTest, EveryViolationNamesArrayAndExtent) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["arrays"][0]["dtype"] = "float128"; },
       "array 'params/w': unknown dtype 'float128'"},
      {[](auto& j) {
         j["arrays"][0]["shape"] = {4, -6};
       },
       "negative size"},
      {[](auto& j) {
         j["arrays"][0]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
       },
       "more elements than fit"},
      {[](auto& j) {
         j["arrays"][0]["extents"][1]["box"]["origin"] = {3, 0};
       },
       "array 'params/w': extent 1 of 2: box dimension 0 [3, +2) lies outside"},
      {[](auto& j) {
         j["arrays"][0]["extents"][1]["box"]["origin"] = {1, 0};
       },
       "overlap"},
      {[](auto& j) { j["arrays"][0]["extents"].erase(1); },
       "extents cover 12 of its 24 elements"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["length"] = 48; },
       "extent 0 of 2: length 48 does not match"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["offset"] = -1; },
       "offset -1 is negative"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["offset"] = INT64_MAX - 3; },
       "not a multiple of 4096"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["offset"] = 4097; },
       "offset 4097 is negative, not a multiple of 4096"},
      // Aligned, but ending past the largest file a reader accepts: nothing
      // computed from it (AlignUp(offset + length)) can overflow.
      {[](auto& j) {
         j["arrays"][0]["extents"][0]["offset"] = (int64_t{1} << 62);
       },
       "ends past"},
      {[](auto& j) {
         j["arrays"][0]["shape"] = std::vector<int64_t>(kMaxRank + 1, 1);
       },
       "rank 65 is above the limit"},
      {[](auto& j) {
         j["arrays"][0]["extents"][0]["file"] = "../../etc/passwd";
       },
       "not a plain relative path"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["file"] = "/etc/passwd"; },
       "not a plain relative path"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["xxh128"] = "12"; },
       "32 lowercase hex"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["step"] = "one"; },
       "field 'step' has type string"},
      {[](auto& j) { j["arrays"][0]["extents"][0]["box"]["shape"] = {2}; },
       "rank"},
      {[](auto& j) { j["arrays"][1]["name"] = "params/w"; }, "appears twice"},
      {[](auto& j) { j["arrays"][0].erase("extents"); },
       "array 'params/w': field 'extents' is missing"},
      {[](auto& j) { j["step"] = "ten"; }, "field 'step' has type string"},
      {[](auto& j) { j["step"] = 18446744073709551615ull; },
       "does not fit in int64"},
      {[](auto& j) { j["metadata"] = 3; }, "field 'metadata'"},
  };
  for (const Case& c : cases) {
    absl::Status status = DecodeEdited(c.edit);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

// Hostile JSON: nesting 100,000 deep (200 KB) used to overflow the stack of
// every reader when the metadata was re-serialized.
TEST(ManifestTest, DeepNestingIsRefusedBeforeParsing) {
  nlohmann::json json = nlohmann::json::parse(EncodeManifest(Sample()).value());
  json["metadata"] = nlohmann::json::object();
  std::string text = json.dump();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  text.replace(text.find("\"metadata\":{}"), 13,
               "\"metadata\":{\"x\":" + deep + "}");
  absl::Status status = DecodeManifest(text).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("nests deeper than 512"));
  // Brackets inside strings do not count.
  json["metadata"] = {{"s", std::string(100000, '[')}};
  EXPECT_TRUE(DecodeManifest(json.dump()).ok());
}

TEST(ManifestTest, MetadataMustBeAJsonObjectInUtf8) {
  EXPECT_TRUE(ValidateMetadataJson(R"({"lr": 0.1, "tags": ["a"]})").ok());
  for (const std::string& bad :
       {std::string("[1]"), std::string("3"), std::string("{\"lr\": NaN}"),
        std::string("{\"lr\": Infinity}"), std::string("{\"k\": \"caf\xe9\"}"),
        std::string("{\"k\": \"\\ud800\"}"), std::string("{"),
        std::string(1000, '[') + std::string(1000, ']')}) {
    const absl::Status status = ValidateMetadataJson(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ValidateMetadataJson("[1]").message(),
              HasSubstr("must be a JSON object, not a array"));
}

// Large metadata accepted once is accepted again without a parse; a text
// that differs from it, by one byte, is still checked.
TEST(ManifestTest, LargeMetadataAcceptedOnceIsStillCheckedWhenItChanges) {
  std::string good = "{\"tree\": [";
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&good, i == 0 ? "" : ", ", i);
  good += "]}";
  ASSERT_GT(good.size(), 4096u);
  EXPECT_TRUE(ValidateMetadataJson(good).ok());
  EXPECT_TRUE(ValidateMetadataJson(good).ok());
  std::string bad = good;
  bad[bad.size() - 3] = 'x';  // "...199x]}"
  EXPECT_EQ(ValidateMetadataJson(bad).code(),
            absl::StatusCode::kInvalidArgument);
  std::string truncated = good.substr(0, good.size() - 1);
  EXPECT_EQ(ValidateMetadataJson(truncated).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateMetadataJson(good).ok());
}

TEST(ManifestTest, EncodingRefusesWhatCouldNotBeReadBack) {
  Manifest m = Sample();
  m.metadata_json = "[1]";
  EXPECT_EQ(EncodeManifest(m).status().code(),
            absl::StatusCode::kInvalidArgument);
  m = Sample();
  m.arrays[0].name = "caf\xe9";
  absl::Status status = EncodeManifest(m).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not valid UTF-8"));
}

// The tiling check is near-linear: 8,000 one-element extents in two rows
// of 4,000 decode, and one overlap among them is named. The old check
// compared every pair within a row (16,384 extents in one row took 16 s).
// bench/manifest_bench measures the time per extent up to 1,000,000.
TEST(ManifestTest, ManyExtentsDecodeAndAnOverlapAmongThemIsFound) {
  constexpr int64_t kRows = 2, kCols = 4000;
  Manifest m;
  ManifestArray a{"row", DType::kUint8, {kRows, kCols}, "", {}};
  a.extents.reserve(kRows * kCols);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      a.extents.push_back(Extent(Box({r, c}, {1, 1}), "data/r00000_w00.bin",
                                 (r * kCols + c) * 4096, 1, 0));
    }
  }
  m.arrays.push_back(std::move(a));
  absl::StatusOr<std::string> text = EncodeManifest(m);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<Manifest> decoded = DecodeManifest(*text);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->arrays[0].extents.size(), 8000u);
  nlohmann::json json = nlohmann::json::parse(*text);
  json["arrays"][0]["extents"][7777]["box"]["origin"] = {1, 2000};
  absl::Status status = DecodeManifest(json.dump()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("overlap"));
}

TEST(ManifestTest, TooManyExtentsOrBytesAreRefused) {
  std::string text = EncodeManifest(Sample()).value();
  text.append(kMaxManifestBytes, ' ');  // valid JSON, too large
  absl::Status status = DecodeManifest(text).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("more than a manifest may have"));
}

TEST(ManifestTest, SafeRelativePaths) {
  EXPECT_TRUE(IsSafeRelativePath("data/r00000_w00.bin"));
  EXPECT_TRUE(IsSafeRelativePath("x"));
  for (const char* bad :
       {"", "/abs", "a/../b", "..", "./a", "a//b", "a/", "a\\b"}) {
    EXPECT_FALSE(IsSafeRelativePath(bad)) << bad;
  }
  EXPECT_FALSE(IsSafeRelativePath(std::string_view("a\0b", 3)));
}

}  // namespace
}  // namespace hoist
