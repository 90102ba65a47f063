#include "hoist/tools/interop_commands.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hoist/base/bytes.h"
#include "hoist/interop.h"
#include "hoist/tools/command_error.h"

namespace hoist {

namespace {

void AddImportCommand(CLI::App& app, const StorageOptions& storage,
                      const ProgressFlags& progress_flags) {
  struct Flags {
    std::string src, root, format = "safetensors",
                           pool = absl::StrCat(kImportPoolBytes >> 20, "MiB");
    int64_t step = 0;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* command = app.add_subcommand(
      "import",
      "Save a safetensors checkpoint (a file, or a directory with "
      "model.safetensors.index.json and its shards) as a committed step; "
      "every header is checked before anything is written. (Orbax and DCP "
      "checkpoints import from Python: hoist.import_checkpoint)");
  command->add_option("SRC", flags->src, "safetensors file or directory")
      ->required();
  command->add_option("ROOT", flags->root, "Checkpoint root (created)")
      ->required();
  command->add_option("STEP", flags->step, "Step to save it as")
      ->required()
      ->check(NonNegative());
  command->add_option("--format", flags->format, "Input format")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
  command->add_option("--pool", flags->pool, "Staging pool")
      ->capture_default_str();
  command->add_flag("--json", flags->json, "Print the figures as JSON");
  command->callback([flags, &storage, &progress_flags] {
    absl::StatusOr<int64_t> pool = ParseBytes(flags->pool);
    if (!pool.ok()) FailCommand("import", pool.status());
    OperationProgress progress;
    std::optional<ProgressLine> line;
    line.emplace(progress_flags, "import", progress);
    absl::StatusOr<ImportStats> stats = ImportSafetensors(
        flags->src, flags->root, flags->step, *pool, storage, &progress);
    line.reset();
    if (!stats.ok()) FailCommand("import", stats.status());
    const double seconds = absl::ToDoubleSeconds(stats->elapsed);
    if (flags->json) {
      std::cout << nlohmann::json({{"step", stats->step},
                                   {"path", stats->path},
                                   {"arrays", stats->arrays},
                                   {"bytes", stats->bytes},
                                   {"elapsed_s", seconds}})
                       .dump(2)
                << "\n";
      return;
    }
    std::cout << absl::StrFormat(
        "imported %d arrays, %s, in %.2fs as %s\n", stats->arrays,
        FormatBytes(static_cast<double>(stats->bytes)), seconds, stats->path);
  });
}

void AddExportCommand(CLI::App& app, const StorageOptions& storage,
                      const ProgressFlags& progress_flags) {
  struct Flags {
    std::string step_dir, out_dir, format = "safetensors", prefix;
    std::string max_shard,
        memory =
            absl::StrCat(SafetensorsExportOptions{}.memory_bytes >> 20, "MiB");
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* command = app.add_subcommand(
      "export",
      "Write a committed step in another format: Hugging Face safetensors "
      "(model.safetensors, or model-0000K-of-0000N.safetensors files and "
      "model.safetensors.index.json past --max-shard-size), streamed through "
      "bounded memory, each tensor's XXH3 in the file's metadata");
  command
      ->add_option("CKPT", flags->step_dir,
                   "Step directory (ROOT/step_N), or a root (its newest step)")
      ->required();
  command
      ->add_option("OUT_DIR", flags->out_dir,
                   "Directory to write into, or an s3:// or gs:// prefix")
      ->required();
  command->add_option("--format", flags->format, "Output format")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
  command->add_option("--max-shard-size", flags->max_shard,
                      "Largest file (default 5,000,000,000 bytes, the Hub's "
                      "5GB; binary units: 2GiB, 500MiB, ...)");
  command->add_option("--prefix", flags->prefix,
                      "FROM or FROM=TO: only arrays named FROM..., renamed "
                      "TO... (e.g. model/ for what {\"model\": state_dict} "
                      "saved)");
  command
      ->add_option("--memory", flags->memory, "Host memory for bytes in flight")
      ->capture_default_str();
  command->add_flag("--json", flags->json, "Print the figures as JSON");
  command->callback([flags, &storage, &progress_flags] {
    SafetensorsExportOptions options;
    options.prefix = flags->prefix;
    options.storage = storage;
    OperationProgress progress;
    options.progress = &progress;
    for (auto [text, out, what] :
         {std::tuple{&flags->max_shard, &options.max_shard_bytes,
                     "--max-shard-size"},
          std::tuple{&flags->memory, &options.memory_bytes, "--memory"}}) {
      if (text->empty()) continue;  // the library's default
      absl::StatusOr<int64_t> bytes = ParseBytes(*text);
      if (!bytes.ok()) {
        FailCommand("export", absl::InvalidArgumentError(absl::StrCat(
                                  what, ": ", bytes.status().message())));
      }
      *out = *bytes;
    }
    std::optional<ProgressLine> line;
    line.emplace(progress_flags, "export", progress);
    absl::StatusOr<ExportStats> stats =
        ExportSafetensors(flags->step_dir, flags->out_dir, options);
    line.reset();
    if (!stats.ok()) FailCommand("export", stats.status());
    const double seconds = absl::ToDoubleSeconds(stats->elapsed);
    if (flags->json) {
      nlohmann::json out = {{"tensors", stats->tensors},
                            {"bytes", stats->bytes},
                            {"bytes_read", stats->bytes_read},
                            {"files", stats->files},
                            {"elapsed_s", seconds}};
      std::cout << out.dump(2) << "\n";
      return;
    }
    std::cout << absl::StrFormat(
        "exported %d tensors, %s, in %.2fs (%s/s) to %d file(s):\n",
        stats->tensors, FormatBytes(static_cast<double>(stats->bytes)), seconds,
        FormatBytes(seconds > 0 ? static_cast<double>(stats->bytes) / seconds
                                : 0.0),
        stats->files.size());
    for (const std::string& file : stats->files) {
      std::cout << "  " << file << "\n";
    }
  });
}

}  // namespace

void AddInteropCommands(CLI::App& app, const StorageOptions& storage,
                        const ProgressFlags& progress) {
  AddExportCommand(app, storage, progress);
  AddImportCommand(app, storage, progress);
}

}  // namespace hoist
