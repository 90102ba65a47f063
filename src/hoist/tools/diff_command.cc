#include "hoist/tools/diff_command.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hoist/base/bytes.h"
#include "hoist/base/status_macros.h"
#include "hoist/diff.h"
#include "hoist/tools/command_error.h"

namespace hoist {
namespace {

nlohmann::json ChangedJson(const ArrayDiff& array, bool values) {
  std::vector<std::string> boxes;
  for (const Box& box : array.changed_extents) boxes.push_back(box.ToString());
  nlohmann::json out = {{"name", array.name},
                        {"dtype_a", std::string(DTypeName(array.dtype_a))},
                        {"dtype_b", std::string(DTypeName(array.dtype_b))},
                        {"shape_a", array.shape_a},
                        {"shape_b", array.shape_b},
                        {"retyped", array.retyped},
                        {"resharded", array.resharded},
                        {"extents", array.extents},
                        {"changed_extents", boxes},
                        {"changed_bytes", array.changed_bytes}};
  if (values && array.values_compared) {
    out["max_abs_diff"] = array.max_abs_diff;
    out["max_rel_diff"] = array.max_rel_diff;
  } else if (values) {
    out["values_note"] = array.values_note;
  }
  return out;
}

void PrintText(const StepDiff& diff, const DiffSide& a, const DiffSide& b,
               bool values) {
  std::cout << absl::StrFormat(
      "%s step %d -> %s step %d: %d changed, %d added, %d removed, %d "
      "unchanged\n",
      a.path, diff.step_a, b.path, diff.step_b, diff.changed.size(),
      diff.added.size(), diff.removed.size(), diff.unchanged);
  for (const std::string& name : diff.added) std::cout << "+ " << name << "\n";
  for (const std::string& name : diff.removed) {
    std::cout << "- " << name << "\n";
  }
  for (const ArrayDiff& array : diff.changed) {
    std::string what;
    if (array.retyped) {
      what = absl::StrFormat("%s%s -> %s%s", DTypeName(array.dtype_a),
                             ShapeToString(array.shape_a),
                             DTypeName(array.dtype_b),
                             ShapeToString(array.shape_b));
    } else {
      what = absl::StrFormat(
          "%d of %d extents, %s%s", array.changed_extents.size(), array.extents,
          FormatBytes(static_cast<double>(array.changed_bytes)),
          array.resharded ? " (saved with another sharding)" : "");
    }
    if (values && array.values_compared) {
      what += absl::StrFormat("; max abs diff %g, max rel diff %g",
                              array.max_abs_diff, array.max_rel_diff);
    }
    std::cout << "~ " << array.name << ": " << what << "\n";
  }
}

// ROOT STEP_A STEP_B, or ROOT_A STEP_A ROOT_B STEP_B.
absl::StatusOr<std::pair<DiffSide, DiffSide>> SidesOf(
    const std::vector<std::string>& args) {
  const auto step = [](const std::string& text) -> absl::StatusOr<int64_t> {
    int64_t n;
    if (!absl::SimpleAtoi(text, &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' is not a step number (a non-negative integer)", text));
    }
    return n;
  };
  if (args.size() == 3) {
    ASSIGN_OR_RETURN(const int64_t a, step(args[1]));
    ASSIGN_OR_RETURN(const int64_t b, step(args[2]));
    return std::make_pair(DiffSide{args[0], a}, DiffSide{args[0], b});
  }
  ASSIGN_OR_RETURN(const int64_t a, step(args[1]));
  ASSIGN_OR_RETURN(const int64_t b, step(args[3]));
  return std::make_pair(DiffSide{args[0], a}, DiffSide{args[2], b});
}

}  // namespace

void AddDiffCommand(CLI::App& app, const StorageOptions& storage,
                    const ProgressFlags& progress_flags) {
  struct Flags {
    std::vector<std::string> args;
    bool json = false;
    bool values = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* command = app.add_subcommand(
      "diff",
      "What changed from one committed step to another: arrays added, "
      "removed, or changed in dtype or shape, and the extents whose bytes "
      "changed, from the manifests alone (no data read); exit 0 whether or "
      "not they differ");
  command
      ->add_option("ARGS", flags->args,
                   "ROOT STEP_A STEP_B, or ROOT_A STEP_A ROOT_B STEP_B (roots "
                   "local or on an object store)")
      ->required()
      ->expected(3, 4);
  command->add_flag("--values", flags->values,
                    "Also read each changed array from both steps and report "
                    "its largest absolute and relative difference");
  command->add_flag("--json", flags->json,
                    "Print JSON: added, removed (names), changed (objects "
                    "with a name), unchanged (a count)");
  command->callback([flags, &storage, &progress_flags] {
    absl::StatusOr<std::pair<DiffSide, DiffSide>> sides = SidesOf(flags->args);
    if (!sides.ok()) FailCommand("diff", sides.status());
    const auto& [a, b] = *sides;
    OperationProgress progress;
    std::optional<ProgressLine> line;
    if (flags->values) line.emplace(progress_flags, "diff --values", progress);
    absl::StatusOr<StepDiff> diff =
        DiffSteps(a, b, storage, flags->values, &progress);
    line.reset();
    if (!diff.ok()) FailCommand("diff", diff.status());
    if (!flags->json) {
      PrintText(*diff, a, b, flags->values);
      return;
    }
    nlohmann::json changed = nlohmann::json::array();
    for (const ArrayDiff& array : diff->changed) {
      changed.push_back(ChangedJson(array, flags->values));
    }
    std::cout
        << nlohmann::json{{"a", {{"path", a.path}, {"step", diff->step_a}}},
                          {"b", {{"path", b.path}, {"step", diff->step_b}}},
                          {"added", diff->added},
                          {"removed", diff->removed},
                          {"changed", changed},
                          {"unchanged", diff->unchanged}}
               .dump(2)
        << "\n";
  });
}

}  // namespace hoist
