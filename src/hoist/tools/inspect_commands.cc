#include "hoist/tools/inspect_commands.h"

#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/bytes.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint_root.h"
#include "hoist/manifest.h"
#include "hoist/tools/command_error.h"
#include "hoist/tools/progress_line.h"

namespace hoist {
namespace {

// What a step's extents hold in all, as its manifest's head says.
struct Totals {
  int64_t bytes = 0;
  int64_t referenced_bytes = 0;
};
Totals HeadBytes(const ManifestHead& head) {
  Totals totals;
  for (const ManifestSection& section : head.sections) {
    totals.bytes += section.bytes;
    totals.referenced_bytes += section.referenced_bytes;
  }
  return totals;
}

// Bytes per data file, by their path from the step directory
// ("data/r00000_w00.bin"), or, for another step's bytes, "step 3:
// data/r00000_w00.bin".
std::map<std::string, int64_t> FileBytes(const Manifest& manifest) {
  std::map<std::string, int64_t> file_bytes;
  for (const ManifestArray& array : manifest.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      file_bytes[extent.step
                     ? absl::StrCat("step ", *extent.step, ": ", extent.file)
                     : extent.file] += extent.length_bytes;
    }
  }
  return file_bytes;
}

absl::Status Ls(const std::string& path, const StorageOptions& storage,
                bool json, const ProgressFlags& progress_flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRoot> root,
                   CheckpointRoot::OpenForReading(path, storage));
  ASSIGN_OR_RETURN(std::vector<RootEntry> entries, root->Entries());
  // One manifest read per step: a request each on an object store.
  OperationProgress progress;
  progress.bytes = false;
  progress.total.store(static_cast<int64_t>(entries.size()));
  std::optional<ProgressLine> line;
  line.emplace(progress_flags, "ls (steps)", progress);
  nlohmann::json out = nlohmann::json::array();
  // Printed once every manifest is read: the progress line never mixes
  // with the table on a terminal.
  std::string table;
  if (!json) {
    table += absl::StrFormat("%-24s %10s %8s  %s\n", "step", "bytes", "arrays",
                             "state");
  }
  for (const RootEntry& entry : entries) {
    progress.done.fetch_add(1);
    progress.current.Set(entry.path);
    if (entry.kind == RootEntry::Kind::kCommitted) {
      // Its head: of a split manifest, its first bytes only.
      absl::StatusOr<ManifestHead> manifest =
          root->ReadManifestHead(entry.step);
      const std::string state =
          manifest.ok()
              ? "committed"
              : "unreadable: " + std::string(manifest.status().message());
      const int64_t bytes = manifest.ok() ? HeadBytes(*manifest).bytes : 0;
      const int64_t arrays =
          manifest.ok() ? static_cast<int64_t>(manifest->sections.size()) : 0;
      out.push_back({{"step", entry.step},
                     {"path", entry.path},
                     {"bytes", bytes},
                     {"arrays", arrays},
                     {"state", manifest.ok() ? "committed" : "unreadable"}});
      if (!json) {
        table += absl::StrFormat("%-24d %10s %8d  %s\n", entry.step,
                                 FormatBytes(bytes), arrays, state);
      }
    } else if (entry.kind == RootEntry::Kind::kReferenced) {
      const int64_t bytes = root->HeldBytes(entry.step).value_or(0);
      out.push_back({{"step", entry.step},
                     {"path", entry.path},
                     {"bytes", bytes},
                     {"state", "referenced"}});
      if (!json) {
        table += absl::StrFormat(
            "%-24d %10s %8s  %s\n", entry.step, FormatBytes(bytes), "-",
            "referenced (pruned: no checkpoint, keeps the data files that "
            "kept steps reference)");
      }
    } else {
      out.push_back({{"path", entry.path}, {"state", "incomplete"}});
      if (!json) {
        table += absl::StrFormat(
            "%-24s %10s %8s  %s\n",
            entry.path.substr(entry.path.rfind('/') + 1), "-", "-",
            "incomplete (a save that did not commit; removed when a "
            "manager opens the root)");
      }
    }
  }
  line.reset();
  std::cout << (json ? out.dump(2) + "\n" : table);
  return absl::OkStatus();
}

// The step's head, and the file table when the extents were read: always
// for a manifest read whole, with `files` for a split one (which then reads
// every section).
absl::Status Inspect(const std::string& step_dir, const StorageOptions& storage,
                     bool json, bool files) {
  ASSIGN_OR_RETURN(const ManifestHead head,
                   ReadManifestHeadAt(step_dir, storage));
  std::optional<std::map<std::string, int64_t>> file_bytes;
  if (!head.split) {
    file_bytes = FileBytes(head.manifest);
  } else if (files) {
    ASSIGN_OR_RETURN(const Manifest whole, ReadManifestAt(step_dir, storage));
    file_bytes = FileBytes(whole);
  }
  const Manifest& manifest = head.manifest;
  const Totals totals = HeadBytes(head);
  nlohmann::json arrays = nlohmann::json::array();
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    const ManifestArray& array = manifest.arrays[a];
    arrays.push_back({{"name", array.name},
                      {"dtype", std::string(DTypeName(array.dtype))},
                      {"shape", array.shape},
                      {"sharding", array.sharding},
                      {"bytes", head.sections[a].bytes},
                      {"extents", head.sections[a].extents}});
  }
  const std::string files_note =
      "(a split manifest: --files reads every array's extents for them)";
  if (json) {
    nlohmann::json out{
        {"path", step_dir},
        {"format", std::string(head.format)},
        {"step", manifest.step},
        {"metadata", nlohmann::json::parse(manifest.metadata_json)},
        {"bytes", totals.bytes},
        {"written_bytes", totals.bytes - totals.referenced_bytes},
        {"referenced_bytes", totals.referenced_bytes},
        {"manifest_bytes", head.file_bytes},
        {"arrays", arrays}};
    if (file_bytes) {
      nlohmann::json table = nlohmann::json::object();
      for (const auto& [file, bytes] : *file_bytes) table[file] = bytes;
      out["files"] = table;
    }
    std::cout << out.dump(2) << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat(
      "%s: format %s, step %d, %d arrays, %s (%s written, %s referenced in "
      "earlier steps)\nmetadata: %s\n\n",
      step_dir, head.format, manifest.step, manifest.arrays.size(),
      FormatBytes(totals.bytes),
      FormatBytes(totals.bytes - totals.referenced_bytes),
      FormatBytes(totals.referenced_bytes), manifest.metadata_json);
  std::cout << absl::StrFormat("%-40s %-14s %-16s %10s %7s  %s\n", "array",
                               "dtype", "shape", "bytes", "extents",
                               "saved sharding");
  for (const nlohmann::json& a : arrays) {
    std::cout << absl::StrFormat(
        "%-40s %-14s %-16s %10s %7d  %s\n", a["name"].get<std::string>(),
        a["dtype"].get<std::string>(),
        ShapeToString(a["shape"].get<std::vector<int64_t>>()),
        FormatBytes(a["bytes"].get<double>()), a["extents"].get<int64_t>(),
        a["sharding"].get<std::string>());
  }
  if (!file_bytes) {
    std::cout << "\nfiles: " << files_note << "\n";
    return absl::OkStatus();
  }
  std::cout << "\nfiles:\n";
  for (const auto& [file, bytes] : *file_bytes) {
    std::cout << absl::StrFormat("  %-30s %10s\n", file, FormatBytes(bytes));
  }
  return absl::OkStatus();
}

// 0: verified; 1: problems found (printed), or no step to verify.
int Verify(const std::string& path, const StorageOptions& storage, bool json,
           const ProgressFlags& progress_flags) {
  auto opened = OpenStepAt(path, storage);
  absl::StatusOr<VerifyReport> verified =
      [&]() -> absl::StatusOr<VerifyReport> {
    if (!opened.ok()) return opened.status();
    OperationProgress progress;
    ProgressLine line(progress_flags,
                      absl::StrCat("verify step ", opened->second), progress);
    return opened->first->Verify(opened->second, &progress);
  }();
  if (!verified.ok()) {
    std::cerr << "hoist verify: " << verified.status().message() << "\n";
    return 1;
  }
  const int64_t step = opened->second;
  const VerifyReport& report = *verified;
  if (json) {
    std::cout << nlohmann::json{{"path", path},
                                {"step", step},
                                {"ok", report.ok()},
                                {"arrays", report.arrays},
                                {"extents", report.extents},
                                {"bytes", report.bytes},
                                {"problems", report.problems}}
                     .dump(2)
              << "\n";
  } else {
    for (const std::string& problem : report.problems) {
      std::cout << "problem: " << problem << "\n";
    }
    std::cout << absl::StrFormat(
        "%s (step %d): %s (%d arrays, %d extents, %s read, %d problems)\n",
        path, step, report.ok() ? "OK" : "CORRUPT", report.arrays,
        report.extents, FormatBytes(report.bytes), report.problems.size());
  }
  return report.ok() ? 0 : 1;
}

absl::Status Rm(const std::string& path, const StorageOptions& options,
                const std::vector<int64_t>& steps,
                const ProgressFlags& progress_flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage,
                   OpenStorage(path, options));
  // Never creates a root: it must exist before it is locked and recovered.
  RETURN_IF_ERROR(CheckpointRoot::OpenForReading(path, storage.get()).status());
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRoot> root,
                   CheckpointRoot::Open(path, storage.get()));
  OperationProgress progress;
  progress.bytes = false;
  progress.total.store(static_cast<int64_t>(steps.size()));
  ProgressLine line(progress_flags, "rm (steps)", progress);
  for (int64_t step : steps) {
    progress.current.Set(absl::StrCat("step ", step));
    RETURN_IF_ERROR(root->Delete(step));
    progress.done.fetch_add(1);
    std::cout << "removed step " << step << " from " << path << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

void AddInspectCommands(CLI::App& app, const StorageOptions& storage,
                        const ProgressFlags& progress) {
  struct Flags {
    std::string path;
    bool json = false;
    bool files = false;
    std::vector<int64_t> steps;
  };
  auto flags = std::make_shared<Flags>();

  CLI::App* ls = app.add_subcommand(
      "ls", "List a root's committed steps (and incomplete saves)");
  ls->add_option("ROOT", flags->path, "Checkpoint root")->required();
  ls->add_flag("--json", flags->json, "Print JSON");
  ls->callback([flags, &storage, &progress] {
    if (absl::Status s = Ls(flags->path, storage, flags->json, progress);
        !s.ok())
      FailCommand("ls", s);
  });

  CLI::App* inspect = app.add_subcommand(
      "inspect",
      "Show a step's arrays (dtype, shape, saved sharding, bytes) and files");
  inspect
      ->add_option("CKPT", flags->path,
                   "Step directory (ROOT/step_N), or a root (its newest step)")
      ->required();
  inspect->add_flag("--json", flags->json, "Print JSON");
  inspect->add_flag(
      "--files", flags->files,
      "Also list the data files of a split manifest (hoist/3), whose head "
      "alone is read otherwise: this reads every array's extents");
  inspect->callback([flags, &storage] {
    if (absl::Status s =
            Inspect(flags->path, storage, flags->json, flags->files);
        !s.ok()) {
      FailCommand("inspect", s);
    }
  });

  CLI::App* verify = app.add_subcommand(
      "verify",
      "Re-read every extent of a step and check its XXH3; exit 0 if intact, "
      "1 if not (every problem is listed)");
  verify
      ->add_option("CKPT", flags->path,
                   "Step directory (ROOT/step_N), or a root (its newest step)")
      ->required();
  verify->add_flag("--json", flags->json, "Print JSON");
  verify->callback([flags, &storage, &progress] {
    if (Verify(flags->path, storage, flags->json, progress) != 0) {
      throw CLI::RuntimeError(1);
    }
  });

  CLI::App* rm = app.add_subcommand(
      "rm", "Delete committed steps (takes the root's lock)");
  rm->add_option("ROOT", flags->path, "Checkpoint root")->required();
  rm->add_option("STEP", flags->steps, "Steps to delete")
      ->required()
      ->check(NonNegative());
  rm->callback([flags, &storage, &progress] {
    if (absl::Status s = Rm(flags->path, storage, flags->steps, progress);
        !s.ok())
      FailCommand("rm", s);
  });
}

}  // namespace hoist
