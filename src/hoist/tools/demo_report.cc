// `hoist demo`'s report: JSON (--json) or the tables, from the lead process.
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hoist/base/bytes.h"
#include "hoist/tools/demo_job.h"

namespace hoist::demo {
namespace {

// The median of `values` (0 when there are none).
double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  return (values[mid] +
          *std::max_element(values.begin(), values.begin() + mid)) /
         2;
}

// Every mode's saves together: their count, blocked times and time to
// commit, and the largest save's bytes and dispatches.
ModeStats AllModes(const Trained& trained) {
  ModeStats all;
  for (const ModeStats& m : trained.modes) {
    all.saves += m.saves;
    all.blocked.insert(all.blocked.end(), m.blocked.begin(), m.blocked.end());
    all.committed_s += m.committed_s;
    all.bytes = std::max(all.bytes, m.bytes);
    all.dispatches = std::max(all.dispatches, m.dispatches);
  }
  return all;
}

nlohmann::json ModeJson(const ModeStats& m) {
  const double n = std::max(1, m.saves);
  return nlohmann::json{
      {"saves", m.saves},
      {"bytes", m.bytes},
      {"replicated_bytes", m.replicated_bytes},
      {"blocked_s", m.blocked_sum() / n},
      {"blocked_median_s", Median(m.blocked)},
      {"blocked_max_s", m.blocked.empty() ? 0.0
                                          : *std::max_element(m.blocked.begin(),
                                                              m.blocked.end())},
      {"dispatch_s", m.dispatch_s / n},
      {"staged_s", m.staged_s / n},
      {"save_s", m.committed_s / n}};
}

nlohmann::json PredictionJson(const Predicted& predicted) {
  if (!predicted.on) return nullptr;
  return {{"d2h_gbps", predicted.rates.d2h_gbps},
          {"host_gbps", predicted.rates.host_gbps},
          {"write_gbps", predicted.rates.write_gbps},
          {"fs_gbps", predicted.rates.fs_gbps},
          {"commit_s", predicted.rates.commit_s},
          {"measure_s", predicted.measure_s},
          {"alone_blocked_s", predicted.save.blocked_s},
          {"alone_save_s", predicted.save.save_s},
          {"queued_s", predicted.queued_s},
          {"blocked_bound", predicted.save.blocked_bound},
          {"save_bound", predicted.save.save_bound}};
}

// With a local tier: each tier's restore and saves.
void AddTiersJson(const DemoFlags& flags, const Trained& trained,
                  const Restored& restored, int64_t persist_every,
                  nlohmann::json& json) {
  const auto seconds = [](const std::optional<RestoreStats>& stats) {
    return stats ? nlohmann::json(absl::ToDoubleSeconds(stats->elapsed))
                 : nlohmann::json(nullptr);
  };
  const RestoreStats& t = *restored.tiered;
  const bool local = t.restored_from == Tier::kLocal;
  json["restore_local_s"] = local ? seconds(t) : nlohmann::json(nullptr);
  json["restore_durable_s"] = local ? seconds(restored.durable) : seconds(t);
  json["restored_step"] = t.step;
  json["durable_step"] = restored.durable
                             ? nlohmann::json(restored.durable->step)
                             : nlohmann::json(nullptr);
  json["restore_note"] = t.note;
  json["tiers"] = {
      {"durable", ModeJson(trained.tiers[0])},
      {"local", ModeJson(trained.tiers[1])},
      {"replicas", flags.replicas},
      {"persist_every", persist_every},
      {"lost_local", flags.lose_local >= 0 ? nlohmann::json(flags.lose_local)
                                           : nlohmann::json(nullptr)}};
}

void PrintJson(const DemoFlags& flags, const DemoJob& job,
               const Trained& trained, const Restored& restored,
               const Predicted& predicted, int64_t latest,
               int64_t persist_every) {
  const ModeStats all = AllModes(trained);
  const double n = std::max(1, all.saves);
  const auto maybe = [&](double value) {
    return predicted.on ? nlohmann::json(value) : nlohmann::json(nullptr);
  };
  nlohmann::json json = {
      {"backend", std::string(job.backend->name())},
      {"arrays", flags.arrays},
      {"processes", job.processes},
      {"bytes", all.bytes},
      {"blocked_s", all.blocked_sum() / n},
      {"save_s", all.committed_s / n},
      {"predicted_blocked_s", maybe(predicted.blocked_s)},
      {"predicted_save_s", maybe(predicted.save_s)},
      {"prediction", PredictionJson(predicted)},
      {"save_gbps", all.bytes / 1e9 / (all.committed_s / n)},
      {"dispatches", all.dispatches},
      {"peak_rss_bytes", restored.peak_rss},
      {"verified", restored.verified},
      {"latest_step", latest},
      {"restore_mesh_s", absl::ToDoubleSeconds(restored.mesh.elapsed)},
      {"restore_host_s", absl::ToDoubleSeconds(restored.host.elapsed)},
      {"restored_from", restored.tiered ? nlohmann::json(std::string(TierName(
                                              restored.tiered->restored_from)))
                                        : nlohmann::json("durable")},
      {"modes",
       {{"staged", ModeJson(trained.modes[0])},
        {"dispatched", ModeJson(trained.modes[1])}}}};
  if (restored.tiered) {
    AddTiersJson(flags, trained, restored, persist_every, json);
  }
  std::cout << json.dump(2) << "\n";
}

// The table of the modes' saves, and the prediction beside them.
void PrintSaves(const DemoFlags& flags, const Trained& trained,
                const Predicted& predicted) {
  std::cout << "\n"
            << absl::StrFormat("%-11s %6s %15s %15s %9s\n", "mode", "saves",
                               "blocked/save", "committed/save", "blocked");
  for (int m = 0; m < 2; ++m) {
    const ModeStats& st = trained.modes[m];
    if (st.saves == 0) continue;
    std::cout << absl::StrFormat(
        "%-11s %6d %14.3fs %14.3fs %8.1f%%\n", m == 0 ? "staged" : "dispatched",
        st.saves, st.blocked_sum() / st.saves, st.committed_s / st.saves,
        100.0 * st.blocked_sum() / st.committed_s);
  }
  if (!predicted.on) return;
  std::cout << absl::StrFormat(
      "predicted      %14.3fs %14.3fs            (staged mode; a save "
      "alone %.3fs, %.3fs) from rates\n"
      "               measured here in %.2fs: copies %.1f GB/s per "
      "device, %.1f GB/s all at once; writes %.2f GB/s (%d streams); "
      "commit %.0f ms\n",
      predicted.blocked_s, predicted.save_s, predicted.save.blocked_s,
      predicted.save.save_s, predicted.measure_s, predicted.rates.d2h_gbps,
      predicted.rates.host_gbps, predicted.rates.write_gbps, flags.writers,
      predicted.rates.commit_s * 1e3);
}

// The restores: from each tier, or onto the other mesh and into host
// memory; and the peak host memory.
void PrintRestores(const DemoJob& job, const Restored& restored,
                   int64_t latest) {
  if (restored.tiered) {
    const RestoreStats& t = *restored.tiered;
    std::cout << absl::StrFormat(
        "\nrestored step %d from the %s tier onto %s in %.3fs: %s\n  (%s)\n",
        t.step, TierName(t.restored_from), job.mesh_name,
        absl::ToDoubleSeconds(t.elapsed),
        restored.verified ? "verified bit-exact" : "MISMATCH", t.note);
    if (restored.durable) {
      std::cout << absl::StrFormat(
          "restored durable step %d onto %s in %.3fs, for comparison\n",
          restored.durable->step, job.mesh_name,
          absl::ToDoubleSeconds(restored.durable->elapsed));
    }
    std::cout << absl::StrFormat(
        "peak host memory %s%s\n", FormatBytes(restored.peak_rss),
        job.processes > 1 ? " in the largest process" : "");
    return;
  }
  std::cout << absl::StrFormat(
      "\nrestored step %d onto %s in %.3fs (%d dispatches) and into host "
      "memory in %.3fs: %s\n"
      "peak host memory %s%s%s\n",
      latest, restored.other_mesh, absl::ToDoubleSeconds(restored.mesh.elapsed),
      restored.mesh.dispatches, absl::ToDoubleSeconds(restored.host.elapsed),
      restored.verified ? "verified bit-exact" : "MISMATCH",
      FormatBytes(restored.peak_rss),
      job.processes > 1 ? " in the largest process" : "",
      job.backend->name() == "host" ? " (the host devices' arrays included)"
                                    : "");
}

}  // namespace

void Report(const DemoFlags& flags, const DemoJob& job, const Trained& trained,
            const Restored& restored, const Predicted& predicted,
            int64_t latest, int64_t persist_every, bool print) {
  if (job.lead && flags.json) {
    PrintJson(flags, job, trained, restored, predicted, latest, persist_every);
    return;
  }
  if (!print) return;
  PrintSaves(flags, trained, predicted);
  PrintRestores(job, restored, latest);
}

}  // namespace hoist::demo
