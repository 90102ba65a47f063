#include "hoist/tools/plan_command.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/predict.h"
#include "hoist/save_plan.h"
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"

namespace hoist {
namespace {

struct PlanFlags {
  GptConfig model;
  bool no_adam = false;
  std::string dtype = "float32";
  std::string mesh = "2x4";
  int processes = 2;
  int writers = 1;
  std::string min_slice = "1MiB";
  int max_replicas = 0;
  std::string size;  // when set: the model of about this many bytes
  bool list_arrays = false;
  bool json = false;
  // --predict: the rates of the cluster the save runs on (defaults: an
  // H100/H200 host, see AddPlanCommand) and the pool.
  bool predict = false;
  SaveRates rates = [] {
    SaveRates r;
    r.d2h_gbps = 50;
    r.write_gbps = 5;
    return r;
  }();
  double dispatch_us = 20;
  double per_slice_us = 2;
  std::string pool = "auto";
  std::string host_memory_budget = "auto";
};

nlohmann::json SummaryJson(const PlanSummary& s) {
  return {{"arrays", s.arrays},
          {"replicated_arrays", s.replicated_arrays},
          {"unsplit_arrays", s.unsplit_arrays},
          {"slices", s.slices},
          {"strided_slices", s.strided_slices},
          {"total_bytes", s.total_bytes},
          {"file_bytes", s.file_bytes},
          {"max_device_bytes", s.max_device_bytes},
          {"mean_device_bytes", s.mean_device_bytes},
          {"max_process_bytes", s.max_process_bytes},
          {"mean_process_bytes", s.mean_process_bytes},
          {"dispatches_per_slice", s.dispatches_per_slice},
          {"dispatches_batched", s.dispatches_batched}};
}

absl::Status RunPlan(PlanFlags flags) {
  absl::StatusOr<std::pair<int64_t, int64_t>> mesh_shape =
      ParseMeshFlag(flags.mesh);
  if (!mesh_shape.ok()) return mesh_shape.status();
  absl::StatusOr<int64_t> min_slice = ParseBytes(flags.min_slice);
  if (!min_slice.ok()) return min_slice.status();
  absl::StatusOr<DType> dtype = ParseDType(flags.dtype);
  if (!dtype.ok()) return dtype.status();
  if (!flags.size.empty()) {
    absl::StatusOr<int64_t> size = ParseBytes(flags.size);
    if (!size.ok()) return size.status();
    const int64_t vocab = flags.model.vocab;
    flags.model = GptConfigForBytes(*size, *dtype);
    flags.model.vocab = vocab;
  }
  flags.model.dtype = *dtype;
  flags.model.adam = !flags.no_adam;

  absl::StatusOr<Mesh> mesh =
      Mesh::Create({"data", "model"}, {mesh_shape->first, mesh_shape->second});
  if (!mesh.ok()) return mesh.status();
  if (flags.processes < 1 || mesh->num_devices() % flags.processes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--processes %d must divide the mesh's %d devices",
                        flags.processes, mesh->num_devices()));
  }
  const Topology topology = Topology::Uniform(
      flags.processes, static_cast<int>(mesh->num_devices() / flags.processes));
  absl::StatusOr<std::vector<ArraySpec>> model = GptModel(flags.model, *mesh);
  if (!model.ok()) return model.status();

  nlohmann::json json = {{"model",
                          {{"layers", flags.model.layers},
                           {"d_model", flags.model.d_model},
                           {"vocab", flags.model.vocab},
                           {"seq", flags.model.seq},
                           {"adam", flags.model.adam},
                           {"dtype", flags.dtype},
                           {"parameters", GptParameterCount(flags.model)},
                           {"arrays", model->size()}}},
                         {"mesh", mesh->ToString()},
                         {"processes", flags.processes},
                         {"devices_per_process", topology.devices(0).size()},
                         {"min_slice_bytes", *min_slice},
                         {"max_replicas", flags.max_replicas},
                         {"writer_streams", flags.writers},
                         {"rules", nlohmann::json::object()}};
  if (flags.list_arrays) {
    // What another program needs to build the same arrays: the benchmarks
    // against other checkpoint engines shard them exactly like this.
    nlohmann::json list = nlohmann::json::array();
    for (const ArraySpec& spec : *model) {
      list.push_back({{"name", spec.name},
                      {"dtype", std::string(DTypeName(spec.dtype))},
                      {"shape", spec.shape},
                      {"spec", spec.sharding.named()->spec}});
    }
    json["array_list"] = std::move(list);
  }
  std::vector<std::pair<ReplicaRule, PlanSummary>> rows;
  std::vector<double> plan_seconds;
  std::vector<SavePrediction> predictions;
  flags.rates.dispatch_s = flags.dispatch_us * 1e-6;
  flags.rates.per_slice_s = flags.per_slice_us * 1e-6;
  if (flags.predict) {
    json["rates"] = {{"d2h_gbps", flags.rates.d2h_gbps},
                     {"host_gbps", flags.rates.host_gbps},
                     {"write_gbps", flags.rates.write_gbps},
                     {"fs_gbps", flags.rates.fs_gbps},
                     {"dispatch_s", flags.rates.dispatch_s},
                     {"per_slice_s", flags.rates.per_slice_s},
                     {"commit_s", flags.rates.commit_s}};
  }
  for (ReplicaRule rule : {ReplicaRule::kSingleReplica, ReplicaRule::kOrbax,
                           ReplicaRule::kBalanced}) {
    SavePlanOptions options;
    options.replica_rule = rule;
    options.min_slice_bytes = *min_slice;
    options.max_replicas = flags.max_replicas;
    options.writer_streams = flags.writers;
    const absl::Time start = absl::Now();
    absl::StatusOr<SavePlan> plan = MakeSavePlan(*model, topology, options);
    if (!plan.ok()) return plan.status();
    plan_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    rows.emplace_back(rule, Summarize(*plan, topology));
    nlohmann::json summary = SummaryJson(rows.back().second);
    summary["plan_s"] = plan_seconds.back();  // MakeSavePlan alone
    if (flags.predict) {
      // "auto": room for the busiest process's whole share.
      int64_t pool = rows.back().second.max_process_bytes +
                     rows.back().second.slices * options.alignment_bytes;
      if (flags.pool != "auto") {
        absl::StatusOr<int64_t> bytes = ParseBytes(flags.pool);
        if (!bytes.ok()) return bytes.status();
        pool = *bytes;
      }
      // "auto": room for the busiest share too (a host with memory to
      // spare, as the manager's auto budget gives a GPU host); "pool": the
      // pool alone.
      int64_t budget = std::max(
          pool, rows.back().second.max_process_bytes +
                    rows.back().second.slices * options.alignment_bytes);
      if (flags.host_memory_budget == "pool") {
        budget = pool;
      } else if (flags.host_memory_budget != "auto") {
        absl::StatusOr<int64_t> bytes = ParseBytes(flags.host_memory_budget);
        if (!bytes.ok()) return bytes.status();
        budget = *bytes;
      }
      absl::StatusOr<SavePrediction> p =
          PredictSave(*plan, topology, pool, flags.rates, budget);
      if (!p.ok()) return p.status();
      summary["pool_bytes"] = pool;
      summary["host_memory_budget_bytes"] = budget;
      summary["predicted_blocked_s"] = p->blocked_s;
      summary["predicted_save_s"] = p->save_s;
      summary["blocked_bound"] = p->blocked_bound;
      summary["save_bound"] = p->save_bound;
      summary["waves"] = p->waves;
      predictions.push_back(*std::move(p));
    }
    json["rules"][std::string(ReplicaRuleName(rule))] = std::move(summary);
  }
  if (flags.json) {
    std::cout << json.dump(2) << "\n";
    return absl::OkStatus();
  }

  const PlanSummary& first = rows.front().second;
  std::cout << absl::StrFormat(
      "GPT-style model: %d layers, d_model %d, vocab %d, seq %d, %s%s\n"
      "  %.1fM parameters, %d arrays, %s to save\n"
      "%s on %d processes x %d devices; min slice %s, max replicas %s, %d "
      "writer stream(s) per process\n\n",
      flags.model.layers, flags.model.d_model, flags.model.vocab,
      flags.model.seq, flags.dtype, flags.model.adam ? " + Adam (mu, nu)" : "",
      GptParameterCount(flags.model) / 1e6, first.arrays,
      FormatBytes(first.total_bytes), mesh->ToString(), flags.processes,
      topology.devices(0).size(), FormatBytes(*min_slice),
      flags.max_replicas == 0 ? "all" : std::to_string(flags.max_replicas),
      flags.writers);
  std::cout << absl::StrFormat(
      "%-10s %8s %8s %9s %23s %23s %11s %8s %9s\n", "rule", "slices", "strided",
      "unsplit", "bytes/device max/mean", "bytes/process max/mean", "per-slice",
      "batched", "plan");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [rule, s] = rows[i];
    std::cout << absl::StrFormat(
        "%-10s %8d %8d %4d/%-4d %11s  %8.2fx  %11s  %8.2fx %11d %8d %8.3fs\n",
        ReplicaRuleName(rule), s.slices, s.strided_slices, s.unsplit_arrays,
        s.replicated_arrays, FormatBytes(s.max_device_bytes),
        s.max_device_bytes / std::max(1.0, s.mean_device_bytes),
        FormatBytes(s.max_process_bytes),
        s.max_process_bytes / std::max(1.0, s.mean_process_bytes),
        s.dispatches_per_slice, s.dispatches_batched, plan_seconds[i]);
  }
  if (flags.predict) {
    std::cout << absl::StrFormat(
        "\npredicted, per save (rates: D2H %.1f GB/s per device, host %s, "
        "writes %.2f GB/s per process, filesystem %s; commit %.3fs):\n"
        "%-10s %12s %8s %12s %8s %7s\n",
        flags.rates.d2h_gbps,
        flags.rates.host_gbps > 0
            ? absl::StrFormat("%.1f GB/s", flags.rates.host_gbps)
            : std::string("unlimited"),
        flags.rates.write_gbps,
        flags.rates.fs_gbps > 0
            ? absl::StrFormat("%.1f GB/s", flags.rates.fs_gbps)
            : std::string("unlimited"),
        flags.rates.commit_s, "rule", "blocked", "bound", "to durable", "bound",
        "waves");
    for (size_t i = 0; i < rows.size(); ++i) {
      const SavePrediction& p = predictions[i];
      std::cout << absl::StrFormat(
          "%-10s %11.3fs %8s %11.3fs %8s %7d\n", ReplicaRuleName(rows[i].first),
          p.blocked_s, p.blocked_bound, p.save_s, p.save_bound, p.waves);
    }
  }
  const PlanSummary& orbax = rows[1].second;
  const PlanSummary& balanced = rows[2].second;
  std::cout << absl::StrFormat(
      "\nunsplit = replicated arrays saved whole by one replica somewhere "
      "(of all replicated arrays).\n"
      "Arrays left unsplit: Orbax rule %d, hoist rule %d. Busiest device: "
      "Orbax %s, hoist %s.\n"
      "Copy dispatches per save: %d if dispatched per slice, %d batched (one "
      "per device).\n",
      orbax.unsplit_arrays, balanced.unsplit_arrays,
      FormatBytes(orbax.max_device_bytes),
      FormatBytes(balanced.max_device_bytes), balanced.dispatches_per_slice,
      balanced.dispatches_batched);
  return absl::OkStatus();
}

}  // namespace

void AddPlanCommand(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Plan a save of a GPT-style sample model and compare the replica rules "
      "(single replica, Orbax, hoist's balanced rule). Moves no data.");
  cmd->add_option("--layers", flags->model.layers, "Transformer blocks")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--d-model", flags->model.d_model, "Hidden size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--vocab", flags->model.vocab, "Vocabulary size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seq", flags->model.seq, "Position embeddings")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_flag("--no-adam", flags->no_adam,
                "Weights only, without Adam's mu and nu");
  cmd->add_option("--dtype", flags->dtype,
                  "Weight dtype (numpy name: float32, bfloat16, ...)")
      ->capture_default_str();
  cmd->add_option("--mesh", flags->mesh,
                  "Device mesh DATAxMODEL; weights are sharded over MODEL and "
                  "replicated over DATA")
      ->capture_default_str();
  cmd->add_option("--processes", flags->processes,
                  "Processes (hosts); each drives an equal share of the "
                  "mesh's devices, in order")
      ->capture_default_str();
  cmd->add_option("--writers", flags->writers,
                  "Writer streams (data files) per process")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--min-slice-bytes", flags->min_slice,
                  "Smallest replica slice, e.g. 64K, 1MiB; 0 splits always")
      ->capture_default_str();
  cmd->add_option("--max-replicas", flags->max_replicas,
                  "Most replicas sharing one box's save (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--size", flags->size,
                  "Model size (weights of --dtype + fp32 Adam), as in hoist "
                  "demo; sets --layers and --d-model")
      ->capture_default_str();
  cmd->add_flag("--list-arrays", flags->list_arrays,
                "With --json: every array's name, dtype, shape and partition "
                "spec (array_list)");
  cmd->add_flag("--json", flags->json, "Print the figures as JSON");
  cmd->add_flag("--predict", flags->predict,
                "Also predict each rule's blocked time and time to durable "
                "per save from the rates below (defaults: an H100/H200 "
                "host's PCIe and a local NVMe; see docs/prediction.md)");
  cmd->add_option("--d2h-gbps", flags->rates.d2h_gbps,
                  "--predict: device-to-host copy per device, GB/s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--host-gbps", flags->rates.host_gbps,
                  "--predict: all of a process's devices copying at once, "
                  "GB/s (0: no limit beyond --d2h-gbps each)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--disk-gbps", flags->rates.write_gbps,
                  "--predict: one process's writes, hashing included, GB/s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--fs-gbps", flags->rates.fs_gbps,
                  "--predict: the shared filesystem, every process together, "
                  "GB/s (0: no job-wide limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--commit-s", flags->rates.commit_s,
                  "--predict: a commit's fixed cost, seconds")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dispatch-us", flags->dispatch_us,
                  "--predict: the training thread's cost per copy dispatch, "
                  "microseconds")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--per-slice-us", flags->per_slice_us,
                  "--predict: the training thread's cost per slice, "
                  "microseconds")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--pool", flags->pool,
                  "--predict: the staging pool per process (auto: the "
                  "busiest process's whole share)")
      ->capture_default_str();
  cmd->add_option("--host-memory-budget", flags->host_memory_budget,
                  "--predict: host memory a save may hold per process, the "
                  "pool included (auto: the busiest process's whole share, "
                  "as the manager's default gives a host with memory to "
                  "spare; pool: the pool alone); past it staging waits for "
                  "writes")
      ->capture_default_str();
  cmd->callback([flags] {
    absl::Status status = RunPlan(*flags);
    if (!status.ok()) {
      std::cerr << "hoist plan: " << status.message() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace hoist
