#include "hoist/tools/export_command.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hoist/base/bytes.h"
#include "hoist/export.h"

namespace hoist {

void AddExportCommand(CLI::App& app) {
  struct Flags {
    std::string step_dir, out_dir, format = "safetensors", prefix;
    std::string max_shard, memory = "256MiB";
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
  command->add_option("OUT_DIR", flags->out_dir, "Directory to write into")
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
  command->callback([flags] {
    SafetensorsExportOptions options;
    options.prefix = flags->prefix;
    for (auto [text, out, what] :
         {std::tuple{&flags->max_shard, &options.max_shard_bytes,
                     "--max-shard-size"},
          std::tuple{&flags->memory, &options.memory_bytes, "--memory"}}) {
      if (text->empty()) continue;  // the library's default
      absl::StatusOr<int64_t> bytes = ParseBytes(*text);
      if (!bytes.ok()) {
        std::cerr << "hoist export: " << what << ": "
                  << bytes.status().message() << "\n";
        throw CLI::RuntimeError(1);
      }
      *out = *bytes;
    }
    absl::StatusOr<ExportStats> stats =
        ExportSafetensors(flags->step_dir, flags->out_dir, options);
    if (!stats.ok()) {
      std::cerr << "hoist export: " << stats.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
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

}  // namespace hoist
