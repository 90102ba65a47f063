#include "hoist/checkpoint/save/save_planner.h"

#include <cstring>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"

namespace hoist {
namespace {

// Save walks the caller's arrays on the caller's thread, each array's shard
// list and spec separate allocations that the training step has likely
// evicted from the caches, and compares the specs with the cached plan's
// (as cold): fetching them this many arrays ahead overlaps the misses.
constexpr size_t kPrefetchArrays = 8;

// Asks for the heap blocks an ArraySpec comparison reads first (its name,
// unless stored inline, its shape, and its sharding's list).
void PrefetchSpec(const ArraySpec& spec) {
  __builtin_prefetch(spec.name.data());
  __builtin_prefetch(spec.shape.data());
  if (const NamedSharding* named = spec.sharding.named()) {
    __builtin_prefetch(named->spec.data());
  } else if (const ExplicitSharding* shards = spec.sharding.explicit_shards()) {
    __builtin_prefetch(shards->shards.data());
  }
}

int TierIndex(Tier tier) { return tier == Tier::kLocal ? 1 : 0; }

}  // namespace

absl::StatusOr<Topology> GatherTopology(Backend& backend,
                                        Coordinator& coordinator) {
  std::string mine;
  for (Device* device : backend.devices()) {
    const DeviceId id = device->id();
    mine.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   coordinator.AllGather("devices", mine));
  std::vector<std::vector<DeviceId>> process_devices(all.size());
  for (size_t p = 0; p < all.size(); ++p) {
    for (size_t at = 0; at + sizeof(DeviceId) <= all[p].size();
         at += sizeof(DeviceId)) {
      DeviceId id;
      std::memcpy(&id, all[p].data() + at, sizeof id);
      process_devices[p].push_back(id);
    }
  }
  return Topology::Create(std::move(process_devices));
}

absl::StatusOr<Topology> PartTopology(const Topology& topology, int rank) {
  std::vector<std::vector<DeviceId>> processes(1);
  for (int p = 0; p < topology.num_processes(); ++p) {
    const std::vector<DeviceId>& devices = topology.devices(p);
    if (p != rank) {
      if (processes.size() == 1) processes.emplace_back();
      processes[1].insert(processes[1].end(), devices.begin(), devices.end());
    } else {
      processes[0] = devices;
    }
  }
  return Topology::Create(std::move(processes));
}

SavePlanner::SavePlanner(SavePlanOptions options, int part_writer_streams,
                         Topology topology, Topology part_topology, int rank,
                         const TransferEngine& engine, Backend& backend,
                         std::function<bool(std::string_view)> frozen)
    : options_(std::move(options)),
      part_writer_streams_(part_writer_streams),
      frozen_(std::move(frozen)),
      topology_(std::move(topology)),
      part_topology_(std::move(part_topology)),
      rank_(rank),
      engine_(engine),
      backend_(backend),
      local_devices_([&backend] {
        std::vector<DeviceId> ids;
        for (Device* device : backend.devices()) ids.push_back(device->id());
        return ids;
      }()) {}

absl::Status SavePlanner::AddShards(const SaveArray& array, int a,
                                    ShardSources& sources) {
  for (const SaveArray::Shard& shard : array.shards) {
    if (shard.data == nullptr && !shard.produced &&
        absl::c_linear_search(array.spec.shape, int64_t{0})) {
      continue;
    }
    const void* source = shard.produced ? ProducedSource() : shard.data;
    if (source == nullptr || !sources.Add(a, shard.device, source)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array '%s': shard on device %d is not on this process's "
          "devices or has no data",
          array.spec.name, shard.device));
    }
  }
  return absl::OkStatus();
}

int SavePlanner::PlanProcess(Tier tier) const {
  return tier == Tier::kLocal ? 0 : rank_;
}

absl::StatusOr<TierPlan> SavePlanner::PlanTier(
    std::shared_ptr<const std::vector<ArraySpec>> specs, Tier tier) const {
  const bool part = tier == Tier::kLocal;
  SavePlanOptions plan_options = options_;
  if (part) {
    plan_options.part_of_process = 0;  // see PartTopology
    plan_options.writer_streams = part_writer_streams_;
  }
  TierPlan planned;
  ASSIGN_OR_RETURN(
      SavePlan plan,
      MakeSavePlan(*specs, part ? part_topology_ : topology_, plan_options));
  planned.plan = std::make_shared<const SavePlan>(std::move(plan));
  planned.specs = std::move(specs);
  absl::StatusOr<std::shared_ptr<const StagingLayout>> layout =
      engine_.Lay(*planned.plan, PlanProcess(tier), backend_.devices());
  if (layout.ok()) {
    planned.layout = *std::move(layout);
  } else {
    planned.refused = layout.status();
  }
  // Frozen arrays are the durable tier's (a local part is always whole).
  if (frozen_ == nullptr || part || !layout.ok()) return planned;
  std::vector<bool> frozen_array(planned.plan->arrays.size());
  bool any = false;
  for (size_t a = 0; a < frozen_array.size(); ++a) {
    frozen_array[a] = frozen_(planned.plan->arrays[a].name);
    any = any || frozen_array[a];
  }
  if (!any) return planned;
  auto frozen = std::make_shared<std::vector<uint8_t>>();
  frozen->reserve(planned.plan->slices.size());
  for (const PlannedSlice& slice : planned.plan->slices) {
    frozen->push_back(frozen_array[slice.array]);
  }
  absl::StatusOr<std::shared_ptr<const StagingLayout>> unfrozen = engine_.Lay(
      *planned.plan, PlanProcess(tier), backend_.devices(), frozen.get());
  if (unfrozen.ok()) planned.unfrozen_layout = *std::move(unfrozen);
  planned.frozen = std::move(frozen);
  return planned;
}

absl::StatusOr<PlannedSave> SavePlanner::PlanFor(
    absl::Span<const SaveArray> arrays, Tier tier) {
  MutexLock lock(&mu_);
  TierPlan& planned = planned_[TierIndex(tier)];
  const std::vector<ArraySpec>* cached =
      planned.plan != nullptr && planned.specs->size() == arrays.size()
          ? planned.specs.get()
          : nullptr;
  auto sources = std::make_shared<ShardSources>(local_devices_);
  sources->Reserve(static_cast<int>(arrays.size()));
  for (size_t a = 0; a < arrays.size(); ++a) {
    if (a + kPrefetchArrays < arrays.size()) {
      __builtin_prefetch(arrays[a + kPrefetchArrays].shards.data());
      PrefetchSpec(arrays[a + kPrefetchArrays].spec);
      if (cached != nullptr) PrefetchSpec((*cached)[a + kPrefetchArrays]);
    }
    RETURN_IF_ERROR(AddShards(arrays[a], static_cast<int>(a), *sources));
    if (cached != nullptr && !((*cached)[a] == arrays[a].spec)) {
      cached = nullptr;
    }
  }
  if (cached == nullptr) {
    auto specs = std::make_shared<std::vector<ArraySpec>>();
    specs->reserve(arrays.size());
    for (const SaveArray& array : arrays) specs->push_back(array.spec);
    ASSIGN_OR_RETURN(planned, PlanTier(std::move(specs), tier));
  }
  PlannedSave save;
  save.specs = planned.specs;
  save.plan = planned.plan;
  save.layout = planned.layout;
  save.sources = std::move(sources);
  save.frozen = planned.frozen;
  save.unfrozen_layout = planned.unfrozen_layout;
  return save;
}

absl::Status SavePlanner::PlanTierOf(RegisteredArrays::State& state,
                                     Tier tier) const {
  const int t = TierIndex(tier);
  if (state.tiers[t].plan != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(TierPlan planned, PlanTier(state.specs, tier));
  RETURN_IF_ERROR(planned.refused);
  state.tiers[t] = std::move(planned);
  state.stable[t] = std::make_shared<StableSources>();
  state.unfrozen_stable[t] = std::make_shared<StableSources>();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<RegisteredArrays::State>> SavePlanner::Register(
    absl::Span<const SaveArray> arrays, uint64_t owner) const {
  auto state = std::make_shared<RegisteredArrays::State>();
  state->owner = owner;
  auto sources = std::make_shared<ShardSources>(local_devices_);
  sources->Reserve(static_cast<int>(arrays.size()));
  auto specs = std::make_shared<std::vector<ArraySpec>>();
  specs->reserve(arrays.size());
  for (size_t a = 0; a < arrays.size(); ++a) {
    for (const SaveArray::Shard& shard : arrays[a].shards) {
      if (shard.produced) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': its shard on device %d is to be produced; "
            "registered arrays stay where they are (save it with Save)",
            arrays[a].spec.name, shard.device));
      }
    }
    RETURN_IF_ERROR(AddShards(arrays[a], static_cast<int>(a), *sources));
    specs->push_back(arrays[a].spec);
  }
  state->specs = std::move(specs);
  state->sources = std::move(sources);
  MutexLock lock(&state->mu);
  RETURN_IF_ERROR(PlanTierOf(*state, Tier::kDurable));
  return state;
}

absl::StatusOr<PlannedSave> SavePlanner::PlanRegistered(
    RegisteredArrays::State& state, Tier tier) const {
  MutexLock lock(&state.mu);
  RETURN_IF_ERROR(PlanTierOf(state, tier));
  const int t = TierIndex(tier);
  PlannedSave save;
  save.specs = state.specs;
  save.sources = state.sources;
  save.plan = state.tiers[t].plan;
  save.layout = state.tiers[t].layout;
  save.stable = state.stable[t];
  save.frozen = state.tiers[t].frozen;
  save.unfrozen_layout = state.tiers[t].unfrozen_layout;
  save.unfrozen_stable = state.unfrozen_stable[t];
  return save;
}

}  // namespace hoist
