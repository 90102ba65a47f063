#include "hoist/format/layout.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "hoist/base/xxh3.h"
#include "hoist/storage.h"

namespace hoist {

std::string DataFileName(int process, int stream, bool spread) {
  const std::string name = absl::StrFormat("r%05d_w%02d.bin", process, stream);
  if (!spread) return absl::StrFormat("%s/%s", kDataDirName, name);
  const uint64_t hash = XXH3_64bits(name.data(), name.size());
  return absl::StrFormat("%s/%02x/%s", kDataDirName, hash >> 56, name);
}

bool SpreadsDataFiles(const Storage& storage) {
  return storage.capabilities().prefix_rate_limited;
}

absl::StatusOr<std::vector<std::string>> ListDataFiles(Storage& storage,
                                                       const std::string& dir) {
  const std::string data = JoinPath(dir, kDataDirName);
  std::vector<std::string> files;
  absl::StatusOr<bool> exists = storage.Exists(data);
  if (!exists.ok()) return exists.status();
  if (!*exists) return files;
  absl::StatusOr<std::vector<std::string>> names = storage.List(data);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const std::string relative = JoinPath(kDataDirName, name);
    // A data file's name ends in .bin; anything else may be a prefix.
    absl::StatusOr<bool> prefix = absl::EndsWith(name, ".bin")
                                      ? absl::StatusOr<bool>(false)
                                      : storage.IsDir(JoinPath(dir, relative));
    if (!prefix.ok()) return prefix.status();
    if (!*prefix) {
      files.push_back(relative);
      continue;
    }
    absl::StatusOr<std::vector<std::string>> inner =
        storage.List(JoinPath(dir, relative));
    if (!inner.ok()) return inner.status();
    for (const std::string& file : *inner) {
      files.push_back(JoinPath(relative, file));
    }
  }
  return files;
}

std::string StepDirName(int64_t step) {
  return absl::StrFormat("step_%08d", step);
}

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() < kPrefix.size() + 8 || name.substr(0, 5) != kPrefix) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(kPrefix.size());
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()),
                        &step)) {
    return std::nullopt;
  }
  if (StepDirName(step) != name) return std::nullopt;  // one spelling only
  return step;
}

std::string TmpStepDirName(int64_t step) {
  std::random_device random;
  const uint64_t nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
  return absl::StrFormat(".%s.tmp-%016x", StepDirName(step), nonce);
}

std::optional<TmpStepDir> ParseTmpStepDirName(std::string_view name) {
  constexpr std::string_view kTmp = ".tmp-";
  constexpr size_t kNonceDigits = 16;
  if (name.empty() || name.front() != '.') return std::nullopt;
  const size_t tmp = name.find(kTmp);
  if (tmp == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> step = ParseStepDirName(name.substr(1, tmp - 1));
  if (!step) return std::nullopt;
  std::string_view rest = name.substr(tmp + kTmp.size());
  if (rest.size() < kNonceDigits) return std::nullopt;
  for (char c : rest.substr(0, kNonceDigits)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return std::nullopt;
    }
  }
  rest.remove_prefix(kNonceDigits);
  if (rest.empty()) return TmpStepDir{*step, TmpKind::kSave};
  if (rest == kAsideSuffix) return TmpStepDir{*step, TmpKind::kAside};
  if (rest == kDeletingSuffix) return TmpStepDir{*step, TmpKind::kDeleting};
  return std::nullopt;
}

bool IsTmpStepDirName(std::string_view name) {
  return ParseTmpStepDirName(name).has_value();
}

std::optional<int64_t> StepOfDir(std::string_view path) {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  const std::string_view name =
      slash == std::string_view::npos ? path : path.substr(slash + 1);
  if (std::optional<int64_t> step = ParseStepDirName(name)) return step;
  if (std::optional<TmpStepDir> tmp = ParseTmpStepDirName(name)) {
    return tmp->step;
  }
  return std::nullopt;
}

std::string ParentDir(const std::string& step_dir) {
  std::string path = step_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

ExtentPlace PlaceOfExtent(const std::string& step_dir,
                          const ManifestExtent& extent) {
  if (!extent.step) {
    return {step_dir, extent.file, JoinPath(step_dir, extent.file)};
  }
  const std::string root = ParentDir(step_dir);
  std::string relative = JoinPath(StepDirName(*extent.step), extent.file);
  std::string path = JoinPath(root, relative);
  return {root, std::move(relative), std::move(path)};
}

}  // namespace hoist
