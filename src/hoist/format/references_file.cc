// REFERENCES.json: encoded and decoded here, written and read through
// Storage (see references_file.h).
#include "hoist/format/references_file.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_json.h"

namespace hoist {
namespace {

using manifest_json::Json;

uint64_t FilesHash(const std::vector<std::string>& files) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const std::string& file : files) {
    XXH3_64bits_update(state, file.data(), file.size());
    XXH3_64bits_update(state, "\n", 1);
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

}  // namespace

std::vector<std::string> FilesReferenced(const Manifest& manifest) {
  // Each (step, file) once, before any path is made: a delta references
  // the same few files from every one of its extents.
  absl::flat_hash_set<std::pair<int64_t, std::string_view>> distinct;
  for (const ManifestArray& array : manifest.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      if (extent.step && *extent.step != manifest.step) {
        distinct.emplace(*extent.step, extent.file);
      }
    }
  }
  std::vector<std::string> files;
  files.reserve(distinct.size());
  for (const auto& [step, file] : distinct) {
    files.push_back(JoinPath(StepDirName(step), std::string(file)));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::optional<int64_t> StepOfReferencedFile(std::string_view file) {
  const size_t slash = file.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  return ParseStepDirName(file.substr(0, slash));
}

std::string EncodeReferences(int64_t step,
                             const std::vector<std::string>& files) {
  Json json = {{"format", kReferencesFormat},
               {"step", step},
               {"files", files},
               {"xxh3", manifest_json::HexOf(FilesHash(files))}};
  return json.dump() + "\n";
}

absl::StatusOr<std::vector<std::string>> DecodeReferences(std::string_view text,
                                                          int64_t step) {
  const auto error = [&](std::string_view what) {
    return absl::DataLossError(absl::StrCat(std::string(kReferencesFileName),
                                            " of step ", step, ": ",
                                            std::string(what)));
  };
  if (!manifest_json::NestingWithin(text, 4)) return error("nested too deep");
  const Json json = Json::parse(text.begin(), text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return error("not valid JSON");
  const auto field = [&](const char* name) -> const Json* {
    const auto it = json.find(name);
    return it == json.end() ? nullptr : &*it;
  };
  const Json* format = field("format");
  if (format == nullptr || !format->is_string() ||
      format->get<std::string>() != kReferencesFormat) {
    return error(absl::StrCat("not ", std::string(kReferencesFormat)));
  }
  const Json* said = field("step");
  if (said == nullptr || !said->is_number_integer() ||
      said->get<int64_t>() != step) {
    return error("it names another step");
  }
  const Json* listed = field("files");
  const Json* hash = field("xxh3");
  if (listed == nullptr || !listed->is_array() || hash == nullptr ||
      !hash->is_string()) {
    return error("no files or xxh3");
  }
  std::vector<std::string> files;
  files.reserve(listed->size());
  for (const Json& file : *listed) {
    if (!file.is_string()) return error("a file that is not a string");
    std::string name = file.get<std::string>();
    const std::optional<int64_t> in = StepOfReferencedFile(name);
    if (!IsSafeRelativePath(name) || !in || *in == step) {
      return error(absl::StrFormat("'%s' is not a file of another step", name));
    }
    if (!files.empty() && files.back() >= name) {
      return error("its files are not sorted, or repeat");
    }
    files.push_back(std::move(name));
  }
  const std::optional<uint64_t> expected =
      manifest_json::ParseHex64(hash->get<std::string>());
  if (!expected || *expected != FilesHash(files)) {
    return error("its files do not match their xxh3");
  }
  return files;
}

absl::Status WriteReferencesFile(Storage& storage, const std::string& step_dir,
                                 int64_t step,
                                 const std::vector<std::string>& files) {
  const std::string text = EncodeReferences(step, files);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   storage.OpenWritable(
                       JoinPath(step_dir, std::string(kReferencesFileName))));
  RETURN_IF_ERROR(file->WriteAt(
      0, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()),
                             text.size())));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<std::vector<std::string>> ReadReferencesFile(
    Storage& storage, const std::string& step_dir, int64_t step) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(
                       JoinPath(step_dir, std::string(kReferencesFileName))));
  ASSIGN_OR_RETURN(const int64_t size, file->Size());
  if (size > kMaxReferencesBytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s of step %d: %d bytes, more than a reader takes (%d)",
        std::string(kReferencesFileName), step, size, kMaxReferencesBytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(file->ReadAt(
      0, absl::MakeSpan(reinterpret_cast<uint8_t*>(text.data()), text.size())));
  return DecodeReferences(text, step);
}

}  // namespace hoist
