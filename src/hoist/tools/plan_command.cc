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
#include "hoist/base/status_macros.h"
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"
#include "hoist/predict.h"
#include "hoist/save_plan.h"

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

// What the flags describe: the model's arrays on the mesh, the processes
// that hold its devices, and the plan's minimum slice.
struct PlanInputs {
  Mesh mesh;
  Topology topology;
  std::vector<ArraySpec> model;
  int64_t min_slice = 0;
};

absl::StatusOr<PlanInputs> ResolveInputs(PlanFlags& flags) {
  ASSIGN_OR_RETURN(const auto mesh_shape, ParseMeshFlag(flags.mesh));
  ASSIGN_OR_RETURN(const int64_t min_slice, ParseBytes(flags.min_slice));
  ASSIGN_OR_RETURN(const DType dtype, ParseDType(flags.dtype));
  if (!flags.size.empty()) {
    ASSIGN_OR_RETURN(const int64_t size, ParseBytes(flags.size));
    const int64_t vocab = flags.model.vocab;
    flags.model = GptConfigForBytes(size, dtype);
    flags.model.vocab = vocab;
  }
  flags.model.dtype = dtype;
  flags.model.adam = !flags.no_adam;
  ASSIGN_OR_RETURN(
      Mesh mesh,
      Mesh::Create({"data", "model"}, {mesh_shape.first, mesh_shape.second}));
  if (flags.processes < 1 || mesh.num_devices() % flags.processes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--processes %d must divide the mesh's %d devices",
                        flags.processes, mesh.num_devices()));
  }
  Topology topology = Topology::Uniform(
      flags.processes, static_cast<int>(mesh.num_devices() / flags.processes));
  ASSIGN_OR_RETURN(std::vector<ArraySpec> model, GptModel(flags.model, mesh));
  return PlanInputs{std::move(mesh), std::move(topology), std::move(model),
                    min_slice};
}

// The JSON report's header: the model, the mesh, the plan's options (and,
// with --list-arrays, every array as another program would build it: the
// benchmarks against other checkpoint engines shard them exactly so).
nlohmann::json InputsJson(const PlanFlags& flags, const PlanInputs& in) {
  nlohmann::json json = {{"model",
                          {{"layers", flags.model.layers},
                           {"d_model", flags.model.d_model},
                           {"vocab", flags.model.vocab},
                           {"seq", flags.model.seq},
                           {"adam", flags.model.adam},
                           {"dtype", flags.dtype},
                           {"parameters", GptParameterCount(flags.model)},
                           {"arrays", in.model.size()}}},
                         {"mesh", in.mesh.ToString()},
                         {"processes", flags.processes},
                         {"devices_per_process", in.topology.devices(0).size()},
                         {"min_slice_bytes", in.min_slice},
                         {"max_replicas", flags.max_replicas},
                         {"writer_streams", flags.writers},
                         {"rules", nlohmann::json::object()}};
  if (flags.list_arrays) {
    nlohmann::json list = nlohmann::json::array();
    for (const ArraySpec& spec : in.model) {
      list.push_back({{"name", spec.name},
                      {"dtype", std::string(DTypeName(spec.dtype))},
                      {"shape", spec.shape},
                      {"spec", spec.sharding.named()->spec}});
    }
    json["array_list"] = std::move(list);
  }
  if (flags.predict) {
    json["rates"] = {{"d2h_gbps", flags.rates.d2h_gbps},
                     {"host_gbps", flags.rates.host_gbps},
                     {"write_gbps", flags.rates.write_gbps},
                     {"fs_gbps", flags.rates.fs_gbps},
                     {"dispatch_s", flags.rates.dispatch_s},
                     {"per_slice_s", flags.rates.per_slice_s},
                     {"commit_s", flags.rates.commit_s}};
  }
  return json;
}

// One replica rule's plan: its summary, how long planning took, and (with
// --predict) what a save of it costs.
struct PlanRow {
  ReplicaRule rule = ReplicaRule::kBalanced;
  PlanSummary summary;
  double plan_s = 0;
  SavePrediction prediction;
};

// A save's prediction with the pool and host memory budget the flags give
// ("auto": room for the busiest process's whole share; a budget of "pool":
// the pool alone), recorded in `summary`.
absl::StatusOr<SavePrediction> PredictRow(
    const PlanFlags& flags, const PlanInputs& in, const SavePlan& plan,
    const PlanSummary& s, int64_t alignment, nlohmann::json& summary) {
  const int64_t share = s.max_process_bytes + s.slices * alignment;
  int64_t pool = share;
  if (flags.pool != "auto") {
    ASSIGN_OR_RETURN(pool, ParseBytes(flags.pool));
  }
  int64_t budget = std::max(pool, share);
  if (flags.host_memory_budget == "pool") {
    budget = pool;
  } else if (flags.host_memory_budget != "auto") {
    ASSIGN_OR_RETURN(budget, ParseBytes(flags.host_memory_budget));
  }
  ASSIGN_OR_RETURN(SavePrediction p,
                   PredictSave(plan, in.topology, pool, flags.rates, budget));
  summary["pool_bytes"] = pool;
  summary["host_memory_budget_bytes"] = budget;
  summary["predicted_blocked_s"] = p.blocked_s;
  summary["predicted_save_s"] = p.save_s;
  summary["blocked_bound"] = p.blocked_bound;
  summary["save_bound"] = p.save_bound;
  summary["waves"] = p.waves;
  return p;
}

absl::StatusOr<PlanRow> PlanWithRule(ReplicaRule rule, const PlanFlags& flags,
                                     const PlanInputs& in,
                                     nlohmann::json& json) {
  SavePlanOptions options;
  options.replica_rule = rule;
  options.min_slice_bytes = in.min_slice;
  options.max_replicas = flags.max_replicas;
  options.writer_streams = flags.writers;
  PlanRow row;
  row.rule = rule;
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const SavePlan plan,
                   MakeSavePlan(in.model, in.topology, options));
  row.plan_s = absl::ToDoubleSeconds(absl::Now() - start);
  row.summary = Summarize(plan, in.topology);
  nlohmann::json summary = SummaryJson(row.summary);
  summary["plan_s"] = row.plan_s;  // MakeSavePlan alone
  if (flags.predict) {
    ASSIGN_OR_RETURN(row.prediction,
                     PredictRow(flags, in, plan, row.summary,
                                options.alignment_bytes, summary));
  }
  json["rules"][std::string(ReplicaRuleName(rule))] = std::move(summary);
  return row;
}

void PrintTable(const PlanFlags& flags, const PlanInputs& in,
                const std::vector<PlanRow>& rows) {
  const PlanSummary& first = rows.front().summary;
  std::cout << absl::StrFormat(
      "GPT-style model: %d layers, d_model %d, vocab %d, seq %d, %s%s\n"
      "  %.1fM parameters, %d arrays, %s to save\n"
      "%s on %d processes x %d devices; min slice %s, max replicas %s, %d "
      "writer stream(s) per process\n\n",
      flags.model.layers, flags.model.d_model, flags.model.vocab,
      flags.model.seq, flags.dtype, flags.model.adam ? " + Adam (mu, nu)" : "",
      GptParameterCount(flags.model) / 1e6, first.arrays,
      FormatBytes(first.total_bytes), in.mesh.ToString(), flags.processes,
      in.topology.devices(0).size(), FormatBytes(in.min_slice),
      flags.max_replicas == 0 ? "all" : std::to_string(flags.max_replicas),
      flags.writers);
  std::cout << absl::StrFormat(
      "%-10s %8s %8s %9s %23s %23s %11s %8s %9s\n", "rule", "slices", "strided",
      "unsplit", "bytes/device max/mean", "bytes/process max/mean", "per-slice",
      "batched", "plan");
  for (const PlanRow& row : rows) {
    const PlanSummary& s = row.summary;
    std::cout << absl::StrFormat(
        "%-10s %8d %8d %4d/%-4d %11s  %8.2fx  %11s  %8.2fx %11d %8d %8.3fs\n",
        ReplicaRuleName(row.rule), s.slices, s.strided_slices, s.unsplit_arrays,
        s.replicated_arrays, FormatBytes(s.max_device_bytes),
        s.max_device_bytes / std::max(1.0, s.mean_device_bytes),
        FormatBytes(s.max_process_bytes),
        s.max_process_bytes / std::max(1.0, s.mean_process_bytes),
        s.dispatches_per_slice, s.dispatches_batched, row.plan_s);
  }
}

void PrintPredictions(const PlanFlags& flags,
                      const std::vector<PlanRow>& rows) {
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
  for (const PlanRow& row : rows) {
    const SavePrediction& p = row.prediction;
    std::cout << absl::StrFormat(
        "%-10s %11.3fs %8s %11.3fs %8s %7d\n", ReplicaRuleName(row.rule),
        p.blocked_s, p.blocked_bound, p.save_s, p.save_bound, p.waves);
  }
}

void PrintComparison(const std::vector<PlanRow>& rows) {
  const PlanSummary& orbax = rows[1].summary;
  const PlanSummary& balanced = rows[2].summary;
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
}

absl::Status RunPlan(PlanFlags flags) {
  ASSIGN_OR_RETURN(const PlanInputs in, ResolveInputs(flags));
  flags.rates.dispatch_s = flags.dispatch_us * 1e-6;
  flags.rates.per_slice_s = flags.per_slice_us * 1e-6;
  nlohmann::json json = InputsJson(flags, in);
  std::vector<PlanRow> rows;
  for (ReplicaRule rule : {ReplicaRule::kSingleReplica, ReplicaRule::kOrbax,
                           ReplicaRule::kBalanced}) {
    ASSIGN_OR_RETURN(rows.emplace_back(), PlanWithRule(rule, flags, in, json));
  }
  if (flags.json) {
    std::cout << json.dump(2) << "\n";
    return absl::OkStatus();
  }
  PrintTable(flags, in, rows);
  if (flags.predict) PrintPredictions(flags, rows);
  PrintComparison(rows);
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
