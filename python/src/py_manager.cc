#include "py_manager.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/coordinator.h"
#include "hoist/dtype.h"
#include "py_arrays.h"
#include "py_backend.h"
#include "py_coordinator.h"
#include "py_observe.h"
#include "py_producer.h"
#include "py_status.h"

namespace nb = nanobind;

namespace hoist {
namespace {

nb::dict InfoDict(const SaveInfo& info) {
  nb::dict d;
  d["step"] = info.step;
  d["path"] = info.path;
  d["bytes"] = info.bytes;
  d["referenced_bytes"] = info.referenced_bytes;
  if (info.skipped) {
    d["tier"] = nb::none();
  } else {
    d["tier"] = TierName(info.tier).data();
  }
  d["replicated_bytes"] = info.replicated_bytes;
  d["dispatches"] = info.dispatches;
  d["waves"] = info.waves;
  d["overflow_bytes"] = info.overflow_bytes;
  d["stalled_bytes"] = info.stalled_bytes;
  if (info.blocked_reason.empty()) {
    d["blocked_reason"] = nb::none();
  } else {
    d["blocked_reason"] = info.blocked_reason;
  }
  d["dispatched_s"] = absl::ToDoubleSeconds(info.dispatched);
  d["staged_s"] = absl::ToDoubleSeconds(info.staged);
  d["committed_s"] = absl::ToDoubleSeconds(info.committed);
  d["elapsed_s"] = absl::ToDoubleSeconds(info.elapsed);
  d["phases"] = PhasesDict(info.phases);
  d["slowest"] = PhasesDict(info.slowest);
  d["skipped"] = info.skipped;
  return d;
}

// A save in flight, holding the shards' arrays until they are staged.
//
// Only a dispatched save holds them: once a save is staged nothing may, as a
// view of a JAX array silently defeats the buffer donation of the step that
// follows (jit's donate_argnums then allocates anew).
class PyHandle {
 public:
  // `sources` and `keep` (arrays given by address: their owners) hold what
  // the copies read; empty for a staged save.
  PyHandle(SaveHandle handle, std::vector<SavedData> sources,
           nb::object keep = nb::object())
      : handle_(std::move(handle)),
        sources_(std::move(sources)),
        keep_(std::move(keep)) {}
  ~PyHandle() {
    // The copies may still read the arrays: never let them go earlier.
    if (!sources_.empty() || keep_.is_valid()) {
      nb::gil_scoped_release release;
      (void)handle_.WaitStaged();
    }
  }
  int64_t step() const { return handle_.step(); }
  bool skipped() const { return handle_.skipped(); }
  // Where the step goes: "durable" or "local" (the engine's choice, the
  // preemption save's included).
  std::string tier() const { return std::string(TierName(handle_.tier())); }

  void WaitStaged() {
    absl::Status status;
    {
      nb::gil_scoped_release release;
      status = handle_.WaitStaged();
    }
    sources_.clear();  // with the GIL: may run DLPack deleters
    keep_.reset();
    Check(status);
  }
  // `stream`: a cudaStream_t's address (0: the legacy default stream).
  void WaitStagedOn(uintptr_t stream) {
    absl::Status status;
    {
      nb::gil_scoped_release release;
      status = handle_.WaitStagedOn(reinterpret_cast<void*>(stream));
    }
    // The copies may still be reading the sources on the device when a
    // stream was ordered after them: they are let go at wait() (or when the
    // handle goes), not here.
    Check(status);
  }
  nb::dict Wait() {
    absl::StatusOr<SaveInfo> info;
    {
      nb::gil_scoped_release release;
      info = handle_.WaitCommitted();
    }
    sources_.clear();
    keep_.reset();
    return InfoDict(Check(std::move(info)));
  }
  bool Done() const {
    return handle_.status().code() != absl::StatusCode::kUnavailable;
  }
  std::tuple<int64_t, int64_t, int64_t> Progress() const {
    const SaveProgress& p = handle_.progress();
    return {p.staged_bytes.load(), p.written_bytes.load(), p.total_bytes};
  }
  // Bytes whose staging waited for storage (once the save is staged).
  int64_t StalledBytes() const {
    return handle_.progress().stalled_bytes.load();
  }

 private:
  SaveHandle handle_;
  std::vector<SavedData> sources_;
  nb::object keep_;
};

class PyManager {
 public:
  // `options`: a ManagerOptions (BindManagerOptions); `coordinator`: a
  // Python coordinator (py_coordinator.h), or None for a single process.
  // Warnings go to Python's logging; each save's and restore's phases
  // wait in `reports_` for Python (take_phase_reports).
  PyManager(const std::string& root, std::shared_ptr<PyBackend> backend,
            const CheckpointManagerOptions& options, nb::object coordinator)
      : backend_(std::move(backend)),
        coordinator_(coordinator.is_none()
                         ? MakeSingleProcessCoordinator()
                         : Check(MakePyCoordinator(coordinator))),
        options_(options) {
    options_.on_warning = &WarnToPythonLog;
    options_.on_phases = [reports = reports_](const PhaseReport& report) {
      reports->Add(report);
    };
    nb::gil_scoped_release release;
    manager_ = Check(CheckpointManager::Open(root, backend_->get(),
                                             *coordinator_, options_));
  }

  nb::list TakePhaseReports() { return reports_->Take(); }
  int64_t DroppedPhaseReports() const { return reports_->dropped(); }

  // Closing (or dropping) the manager waits for the saves in flight, whose
  // commits may need the GIL (a Python coordinator): never hold it then.
  ~PyManager() {
    nb::gil_scoped_release release;
    manager_.reset();
  }

  // arrays: (name, dtype, shape, [(device, origin, shape, data)]), with data
  // None for a shard on another process's device: such a shard only tells
  // the plan where the array lives (every process plans the whole save).
  // produced: (array index, device, token) of the local shards (data None)
  // that `produce` puts in host memory when staging asks for them
  // (PyProducer).
  std::unique_ptr<PyHandle> Save(
      int64_t step,
      const std::vector<PyArrayOf<std::optional<SavedData>>>& arrays,
      const std::string& metadata_json, bool dispatched,
      std::optional<bool> deltas, const std::string& per_rank_json,
      const std::vector<std::tuple<int, int64_t, int64_t>>& produced,
      std::optional<nb::callable> produce) {
    Live();
    std::map<PyProducer::Key, int64_t> tokens;
    for (const auto& [a, device, token] : produced) {
      tokens[{a, static_cast<DeviceId>(device)}] = token;
    }
    std::map<PyProducer::Key, PyProducer::Shard> to_produce;
    std::vector<SaveArray> save;
    std::vector<SavedData> sources;
    std::vector<int64_t> shard_bytes;  // of each local shard, in order
    for (const auto& [name, dtype_name, shape, shards] : arrays) {
      const DType dtype = Check(ParseDType(dtype_name));
      ExplicitSharding sharding;
      SaveArray array{{name, dtype, shape, sharding}, {}};
      const int a = static_cast<int>(save.size());
      for (const auto& [device, origin, box_shape, data] : shards) {
        const std::string where =
            absl::StrFormat("array '%s' on device %d", name, device);
        const Box box = ToBox(origin, box_shape, where);
        sharding.shards.push_back({static_cast<DeviceId>(device), box});
        if (auto it = tokens.find({a, static_cast<DeviceId>(device)});
            it != tokens.end()) {
          const int64_t bytes = box.num_elements() * ItemSize(dtype);
          to_produce[it->first] = {it->second, bytes, name};
          array.shards.push_back(
              {static_cast<DeviceId>(device), nullptr, /*produced=*/true});
          shard_bytes.push_back(bytes);
          continue;
        }
        if (!data.has_value()) continue;  // another process's shard
        const int64_t bytes = box.num_elements() * ItemSize(dtype);
        const void* pointer = DenseData(*data, bytes, where);
        CheckDevice(*data, device, where);
        array.shards.push_back({static_cast<DeviceId>(device), pointer});
        sources.push_back(*data);
        shard_bytes.push_back(bytes);
      }
      array.spec.sharding = std::move(sharding);
      save.push_back(std::move(array));
    }
    if (to_produce.size() != tokens.size()) {
      Invalid("save: a produced shard is not one of the arrays' shards");
    }
    SaveHandle accepted =
        Submit(step, save, metadata_json, dispatched, deltas, per_rank_json,
               Producer(produce, std::move(to_produce)));
    // Kept for save_again: the same arrays with new data.
    last_save_ = std::move(save);
    last_bytes_ = std::move(shard_bytes);
    ++generation_;
    return NewHandle(std::move(accepted), dispatched, std::move(sources));
  }

  // Starts pinning the pool if it is still to pin (see
  // RestoreOptions::pin_pool_after). Never raises: a closed manager has
  // nothing to pin.
  void PinPool() {
    if (manager_ != nullptr) manager_->PinPool();
  }

  // Which save() save_again repeats (it changes with every accepted save).
  int64_t generation() const { return generation_; }

  // The last accepted save's arrays again, with new data: `data` holds
  // every local shard of that save, in order (array by array, each array's
  // shards as save() was given them), each the same device, dtype and size
  // (what the Python side's structure cache checks: the same names, dtypes,
  // shapes and shardings). `generation` must be generation(); else, or for
  // data that does not fit, ValueError, and nothing is saved.
  // A shard may be given by its address (an int: a JAX shard whose layout
  // the Python side checked is row-major, 3.5x cheaper to take than a
  // DLPack capsule), unchecked here; `keep` then holds its owner until the
  // copies have read it.
  // produced: (position in `data`, token) of shards `produce` puts in host
  // memory when staging asks for them (their `data` entries are ignored).
  std::unique_ptr<PyHandle> SaveAgain(
      int64_t step, int64_t generation, const nb::list& data,
      const std::string& metadata_json, bool dispatched,
      std::optional<bool> deltas, nb::object keep,
      const std::vector<std::pair<int64_t, int64_t>>& produced,
      std::optional<nb::callable> produce) {
    Live();
    if (generation != generation_ ||
        nb::len(data) != static_cast<size_t>(last_bytes_.size())) {
      Invalid("save_again: not the arrays of the last save");
    }
    const std::map<int64_t, int64_t> tokens(produced.begin(), produced.end());
    std::map<PyProducer::Key, PyProducer::Shard> to_produce;
    std::vector<SavedData> sources;
    sources.reserve(last_bytes_.size());
    const bool host = backend_->kind() == "host";
    size_t at = 0;
    for (size_t a = 0; a < last_save_.size(); ++a) {
      SaveArray& array = last_save_[a];
      for (SaveArray::Shard& shard : array.shards) {
        shard.produced = false;
        if (auto it = tokens.find(static_cast<int64_t>(at));
            it != tokens.end()) {
          to_produce[{static_cast<int>(a), shard.device}] = {
              it->second, last_bytes_[at], array.spec.name};
          shard.data = nullptr;
          shard.produced = true;
          ++at;
          continue;
        }
        if (nb::isinstance<nb::int_>(data[at])) {
          shard.data =
              reinterpret_cast<const void*>(nb::cast<uintptr_t>(data[at]));
          ++at;
          continue;
        }
        SavedData item;
        if (!nb::try_cast(data[at], item)) {
          Invalid(absl::StrFormat("save_again: array '%s' is not an array",
                                  array.spec.name));
        }
        // The checks save() makes, with their message made only when one
        // fails: 100,000 arrays should not format 100,000 strings.
        if (!host || item.device_type() != nb::device::cpu::value ||
            static_cast<int64_t>(item.nbytes()) != last_bytes_[at] ||
            !CContiguous(item)) {
          const std::string where = absl::StrFormat(
              "array '%s' on device %d", array.spec.name, shard.device);
          CheckDevice(item, shard.device, where);
          (void)DenseData(item, last_bytes_[at], where);
        }
        shard.data = item.data();
        sources.push_back(std::move(item));
        ++at;
      }
    }
    if (to_produce.size() != tokens.size()) {
      Invalid("save_again: a produced shard is not one of the arrays'");
    }
    return NewHandle(Submit(step, last_save_, metadata_json, dispatched, deltas,
                            "", Producer(produce, std::move(to_produce))),
                     dispatched, std::move(sources),
                     keep.is_none() ? nb::object() : std::move(keep));
  }

  // The save's producer of `shards` through `produce` (none when there are
  // none); ValueError for shards without a callable.
  static std::shared_ptr<ShardProducer> Producer(
      const std::optional<nb::callable>& produce,
      std::map<PyProducer::Key, PyProducer::Shard> shards) {
    if (shards.empty()) return nullptr;
    if (!produce.has_value())
      Invalid("produced shards need a produce callable");
    return std::make_shared<PyProducer>(*produce, std::move(shards));
  }

  // The handle of an accepted save: a staged save's copies have read the
  // arrays, so their views and owners go now (with the GIL: DLPack
  // deleters run), and the handle holds none.
  static std::unique_ptr<PyHandle> NewHandle(SaveHandle accepted,
                                             bool dispatched,
                                             std::vector<SavedData> sources,
                                             nb::object keep = nb::object()) {
    if (!dispatched) {
      sources.clear();
      keep.reset();
    }
    return std::make_unique<PyHandle>(std::move(accepted), std::move(sources),
                                      std::move(keep));
  }

  // The engine's Save, without the GIL; its error raised.
  // `deltas`: SaveOptions::deltas (None: the manager's); `per_rank_json`:
  // SaveOptions::per_rank_json.
  SaveHandle Submit(int64_t step, const std::vector<SaveArray>& arrays,
                    const std::string& metadata_json, bool dispatched,
                    std::optional<bool> deltas,
                    const std::string& per_rank_json = "",
                    std::shared_ptr<ShardProducer> producer = nullptr) {
    SaveOptions options;
    options.deltas = deltas;
    options.per_rank_json = per_rank_json;
    options.producer = std::move(producer);
    absl::StatusOr<SaveHandle> handle;
    {
      nb::gil_scoped_release release;
      handle = manager_->Save(
          step, arrays, metadata_json,
          dispatched ? ReturnWhen::kDispatched : ReturnWhen::kStaged, options);
    }
    return Check(std::move(handle));
  }

  // targets: (name, dtype, shape, [(device or -1, origin, shape, data)]);
  // received_targets: (name, dtype, shape, [(origin, shape, token)]): boxes the
  // caller places itself (JAX's arrays are immutable, so they cannot be
  // filled in place). The engine stages them in its pool, whole or in parts
  // when a box is larger than half of it, and calls `receive([(token, offset,
  // bytes), ...])` under the GIL once per wave with every staged part of the
  // wave; `bytes` views pool memory valid during the call only.
  nb::dict Restore(std::optional<int64_t> step,
                   const std::vector<PyArray>& arrays,
                   const std::vector<PyReceivedArray>& received_arrays,
                   std::optional<nb::callable> receive,
                   OperationProgress* progress) {
    Live();
    std::vector<RestoreTarget> targets;
    for (const auto& [name, dtype_name, shape, dests] : received_arrays) {
      const DType dtype = Check(ParseDType(dtype_name));
      RestoreTarget target{name, dtype, shape, {}};
      for (const auto& [origin, box_shape, token] : dests) {
        if (!receive || token == 0) {
          Invalid(
              "received targets need a receive callback and non-zero tokens");
        }
        target.destinations.push_back(
            {ToBox(origin, box_shape, name), nullptr, nullptr, token});
      }
      targets.push_back(std::move(target));
    }
    RestoreReceiver receiver;
    if (receive) {
      receiver =
          [&receive](absl::Span<const StagedPart> parts) -> absl::Status {
        nb::gil_scoped_acquire gil;
        try {
          nb::list items;
          for (const StagedPart& part : parts) {
            const size_t size = static_cast<size_t>(part.size_bytes);
            nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>> bytes(
                part.bytes, {size}, nb::handle());
            items.append(nb::make_tuple(part.destination->tag,
                                        part.offset_bytes, nb::cast(bytes)));
          }
          (*receive)(items);
          return absl::OkStatus();
        } catch (nb::python_error& e) {
          return absl::InternalError(
              absl::StrFormat("placing restored shards: %s", e.what()));
        }
      };
    }
    AppendTargets(
        arrays,
        [&](int64_t device, const nb::ndarray<>& data,
            const std::string& where) {
          Device* on = backend_->device(device, where);
          CheckDevice(data, device, where);
          return on;
        },
        targets);
    RestoreOptions restore_options = options_.restore;
    restore_options.progress = progress;
    return RestoreStatsDict(WithoutGil([&] {
      return manager_->Restore(step, targets, receiver, restore_options);
    }));
  }

  // What restore(step) would restore: (step, tier, manifest JSON, note,
  // bytes received from peers); collective with a local tier (see
  // CheckpointManager::PrepareRestore).
  std::tuple<int64_t, std::string, std::string, std::string, int64_t>
  PrepareRestore(std::optional<int64_t> step) {
    Live();
    const CheckpointManager::PreparedRestore prepared =
        WithoutGil([&] { return manager_->PrepareRestore(step); });
    return {prepared.step, std::string(TierName(prepared.tier)),
            Check(EncodeManifest(prepared.manifest, kOneDocument)),
            prepared.note, prepared.bytes_received};
  }

  // Committed step `step`'s manifest, as JSON text.
  std::string Manifest(int64_t step) {
    Live();
    return Check(
        EncodeManifest(WithoutGil([&] { return manager_->ReadManifest(step); }),
                       kOneDocument));
  }

  // How far the committed steps trail the saves (see Durability).
  nb::dict DurabilityDict() {
    Live();
    const Durability lag = manager_->durability();
    nb::dict d;
    d["skipped_saves"] = lag.skipped_saves;
    d["in_flight"] = lag.in_flight;
    if (lag.last_committed_step.has_value()) {
      d["last_committed_step"] = *lag.last_committed_step;
      d["last_committed_unix_s"] = absl::ToUnixMicros(lag.last_committed) / 1e6;
    } else {
      d["last_committed_step"] = nb::none();
      d["last_committed_unix_s"] = nb::none();
    }
    return d;
  }

  std::vector<int64_t> Steps() {
    Live();
    return Check(manager_->List());
  }
  std::vector<std::string> Verify(int64_t step, OperationProgress* progress) {
    Live();
    return WithoutGil([&] { return manager_->Verify(step, progress); })
        .problems;
  }
  void Delete(int64_t step) {
    Live();
    nb::gil_scoped_release release;
    Check(manager_->Delete(step));
  }
  void WaitUntilFinished() {
    Live();
    nb::gil_scoped_release release;
    Check(manager_->WaitUntilFinished());
  }
  // Waits for the other ranks without the GIL once a preemption is known.
  bool ReachedPreemption(int64_t step) {
    Live();
    nb::gil_scoped_release release;
    return Check(manager_->ReachedPreemption(step));
  }
  void NotePreemption() {
    Live();
    Check(manager_->NotePreemption());
  }
  // Waits for every save, then releases the root.
  void Close() {
    if (manager_ == nullptr) return;
    absl::Status finished;
    {
      nb::gil_scoped_release release;
      finished = manager_->WaitUntilFinished();
      manager_.reset();
    }
    Check(finished);
  }
  std::string Root() {
    Live();
    return manager_->root();
  }

 private:
  void Live() const {
    if (manager_ == nullptr) {
      Check(absl::FailedPreconditionError("the checkpoint manager is closed"));
    }
  }
  // Host arrays for the host backend; the device's own memory for cuda.
  template <typename... Args>
  void CheckDevice(const nb::ndarray<Args...>& data, int64_t device,
                   const std::string& where) {
    const bool on_cpu = data.device_type() == nb::device::cpu::value;
    if (backend_->kind() == "host" && !on_cpu) {
      Invalid(absl::StrFormat(
          "%s: the data is on an accelerator but this manager's backend is "
          "'host' (use backend='cuda')",
          where));
    }
    if (backend_->kind() == "cuda" &&
        (data.device_type() != nb::device::cuda::value ||
         data.device_id() != backend_->ordinal(device))) {
      Invalid(absl::StrFormat("%s: the data is not in CUDA device %d's memory",
                              where, device));
    }
  }

  std::shared_ptr<PyBackend> backend_;
  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<PhaseReports> reports_ = std::make_shared<PhaseReports>();
  CheckpointManagerOptions options_;
  std::unique_ptr<CheckpointManager> manager_;
  // The last accepted save's arrays (their data pointers stale once it has
  // been staged) and the bytes of each local shard, in order, for
  // save_again; generation_ counts them.
  std::vector<SaveArray> last_save_;
  std::vector<int64_t> last_bytes_;
  int64_t generation_ = 0;
};

}  // namespace

void BindManager(nb::module_& m) {
  nb::class_<PyHandle>(m, "SaveHandle")
      .def_prop_ro("step", &PyHandle::step)
      .def_prop_ro("tier", &PyHandle::tier)
      .def_prop_ro("skipped", &PyHandle::skipped)
      .def("wait_staged", &PyHandle::WaitStaged)
      .def("wait_staged_on", &PyHandle::WaitStagedOn, nb::arg("stream"))
      .def("wait", &PyHandle::Wait)
      .def("done", &PyHandle::Done)
      .def("progress", &PyHandle::Progress)
      .def("stalled_bytes", &PyHandle::StalledBytes);

  nb::class_<PyManager>(m, "Manager")
      .def(nb::init<const std::string&, std::shared_ptr<PyBackend>,
                    const CheckpointManagerOptions&, nb::object>(),
           nb::arg("root"), nb::arg("backend"), nb::arg("options"),
           nb::arg("coordinator").none() = nb::none())
      .def("durability", &PyManager::DurabilityDict)
      .def("save", &PyManager::Save, nb::arg("step"), nb::arg("arrays"),
           nb::arg("metadata_json"), nb::arg("dispatched"),
           nb::arg("deltas").none() = nb::none(), nb::arg("per_rank_json") = "",
           nb::arg("produced") =
               std::vector<std::tuple<int, int64_t, int64_t>>(),
           nb::arg("produce").none() = nb::none())
      .def("save_again", &PyManager::SaveAgain, nb::arg("step"),
           nb::arg("generation"), nb::arg("data"), nb::arg("metadata_json"),
           nb::arg("dispatched"), nb::arg("deltas").none() = nb::none(),
           nb::arg("keep").none() = nb::none(),
           nb::arg("produced") = std::vector<std::pair<int64_t, int64_t>>(),
           nb::arg("produce").none() = nb::none())
      .def_prop_ro("generation", &PyManager::generation)
      .def("pin_pool", &PyManager::PinPool)
      .def("restore", &PyManager::Restore, nb::arg("step").none(),
           nb::arg("targets"),
           nb::arg("received_targets") = std::vector<PyReceivedArray>(),
           nb::arg("receive").none() = nb::none(),
           nb::arg("progress").none() = nb::none())
      .def("steps", &PyManager::Steps)
      .def("manifest", &PyManager::Manifest, nb::arg("step"))
      .def("prepare_restore", &PyManager::PrepareRestore,
           nb::arg("step").none())
      .def("verify", &PyManager::Verify, nb::arg("step"),
           nb::arg("progress").none() = nb::none())
      .def("take_phase_reports", &PyManager::TakePhaseReports)
      .def_prop_ro("dropped_phase_reports", &PyManager::DroppedPhaseReports)
      .def("delete", &PyManager::Delete)
      .def("wait_until_finished", &PyManager::WaitUntilFinished)
      .def("reached_preemption", &PyManager::ReachedPreemption, nb::arg("step"))
      .def("note_preemption", &PyManager::NotePreemption)
      .def("close", &PyManager::Close)
      .def_prop_ro("root", &PyManager::Root);
}

}  // namespace hoist
