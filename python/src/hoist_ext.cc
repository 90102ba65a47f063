// hoist._hoist: the C++ engine for Python (nanobind). The Python package
// (python/hoist/) turns pytrees of JAX, PyTorch and NumPy arrays into the
// flat lists this module takes: per array its name, dtype, global shape and
// every shard as (device id, box origin, box shape, data). Shard data comes
// in as nanobind ndarrays, i.e. through DLPack (or the buffer protocol),
// without a copy; a save holds them until its copies have landed, then
// drops them (which calls each DLPack deleter). The GIL is released while
// hoist stages, waits, restores and verifies.
//
// Errors: every failed call raises hoist._hoist.Error(code, message), code
// being absl's status code; python/hoist/_errors.py maps it to ValueError,
// OSError, hoist.DataLossError, ...
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "hoist/checkpoint/option_names.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/cuda_backend.h"
#include "hoist/host_backend.h"
#include "hoist/huge_pages.h"
#include "hoist/interop.h"
#include "hoist/transfer/staging_pool.h"
#include "py_coordinator.h"
#include "py_observe.h"
#include "py_status.h"
#include "py_storage.h"

namespace nb = nanobind;

namespace hoist {
namespace {

// What Python is given of a manifest: one JSON document (hoist/2), which
// json.loads reads, however many extents it has.
constexpr ManifestEncoding kOneDocument{.split_above_extents = INT64_MAX};

// (origin, shape) lists from Python as a Box.
Box ToBox(const std::vector<int64_t>& origin, const std::vector<int64_t>& shape,
          const std::string& where) {
  if (origin.size() != shape.size()) {
    Invalid(
        absl::StrFormat("%s: origin and shape of a box differ in rank", where));
  }
  return Box(origin, shape);
}

// Whether an ndarray's elements lie contiguous in C order (an array with no
// elements does, whatever strides its library gave it).
template <typename... Args>
bool CContiguous(const nb::ndarray<Args...>& array) {
  for (size_t d = 0; d < array.ndim(); ++d) {
    if (array.shape(d) == 0) return true;
  }
  int64_t expected = 1;
  for (int d = static_cast<int>(array.ndim()) - 1; d >= 0; --d) {
    if (array.shape(d) != 1 && array.stride(d) != expected) return false;
    expected *= static_cast<int64_t>(array.shape(d));
  }
  return true;
}

// The bytes an ndarray holds, checked to be dense (C order) and `bytes`
// long. Arrays to save may be read-only (nb::ro); restore destinations not.
template <typename... Args>
auto DenseData(const nb::ndarray<Args...>& array, int64_t bytes,
               const std::string& where) {
  if (!CContiguous(array)) {
    Invalid(absl::StrFormat(
        "%s: the data is not contiguous in C order (make it contiguous "
        "first, e.g. numpy.ascontiguousarray or tensor.contiguous())",
        where));
  }
  const int64_t have = static_cast<int64_t>(array.nbytes());
  if (have != bytes) {
    Invalid(absl::StrFormat("%s: the data has %d bytes, the box needs %d",
                            where, have, bytes));
  }
  return array.data();
}

// This process's devices. In a job of several processes every device has a
// job-wide id: `first_device_id` is this process's first (the others follow
// in order); `ordinals` picks the CUDA devices to drive (default all).
class PyBackend {
 public:
  PyBackend(const std::string& kind, int num_devices, int64_t first_device_id,
            const std::vector<int>& ordinals)
      : kind_(kind), first_device_id_(first_device_id), ordinals_(ordinals) {
    if (kind == "host") {
      // Host "devices" here hold the caller's own CPU arrays (NumPy, torch,
      // JAX's CPU devices): the cores the devices leave over copy a
      // device's arrays into the pool together (at most 4 per device).
      const int cores =
          static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      backend_ = Check(MakeHostBackend(
          {.num_devices = num_devices,
           .first_device_id = static_cast<DeviceId>(first_device_id),
           .copy_engines =
               std::clamp(cores / std::max(1, num_devices), 1, 4)}));
    } else if (kind == "cuda") {
      backend_ = Check(MakeCudaBackend(
          {.ordinals = ordinals,
           .first_device_id = static_cast<DeviceId>(first_device_id)}));
    } else {
      Invalid(absl::StrFormat("backend '%s': use 'host' or 'cuda'", kind));
    }
  }
  Backend& get() { return *backend_; }
  const std::string& kind() const { return kind_; }
  // The CUDA ordinal of the device with job-wide id `id`.
  int64_t ordinal(int64_t id) const {
    const int64_t at = id - first_device_id_;
    if (at < 0 || at >= static_cast<int64_t>(backend_->devices().size())) {
      return -1;
    }
    return ordinals_.empty() ? at : ordinals_[at];
  }
  std::vector<int64_t> device_ids() const {
    std::vector<int64_t> ids;
    for (Device* d : backend_->devices()) ids.push_back(d->id());
    return ids;
  }
  Device* device(int64_t id, const std::string& where) {
    for (Device* d : backend_->devices()) {
      if (d->id() == id) return d;
    }
    Invalid(absl::StrFormat("%s: device %d is not one of this backend's", where,
                            id));
    return nullptr;
  }

 private:
  std::string kind_;
  int64_t first_device_id_;
  std::vector<int> ordinals_;
  std::unique_ptr<Backend> backend_;
};

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

// An array to save: read-only ones too.
using SavedData = nb::ndarray<nb::ro>;

// A save in flight, holding the shards' arrays until they are staged.
class PyHandle {
 public:
  // `sources` and `keep` (arrays given by address: their owners) hold what
  // the copies read.
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

// (device id, origin, shape, data): data read-only to save, written to
// restore.
template <typename Data>
using PyShardOf =
    std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>, Data>;
// (name, dtype, shape, shards)
template <typename Data>
using PyArrayOf = std::tuple<std::string, std::string, std::vector<int64_t>,
                             std::vector<PyShardOf<Data>>>;
using PyArray = PyArrayOf<nb::ndarray<>>;
// (origin, shape, token)
using PyReceivedBox =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, uint64_t>;
using PyReceivedArray =
    std::tuple<std::string, std::string, std::vector<int64_t>,
               std::vector<PyReceivedBox>>;

// CheckpointManagerOptions::frozen from Python: None (no frozen array), a
// list of array names, or a callable taking a name (called with the GIL
// taken, from the thread that saves, when a plan is made).
std::function<bool(std::string_view)> FrozenPredicate(nb::object frozen) {
  if (frozen.is_none()) return nullptr;
  if (PyCallable_Check(frozen.ptr())) {
    auto callable = std::make_shared<nb::object>(frozen);
    return [callable](std::string_view name) {
      nb::gil_scoped_acquire gil;
      try {
        return nb::cast<bool>((*callable)(nb::str(name.data(), name.size())));
      } catch (nb::python_error& error) {
        // Never through the engine: printed, and the array is not frozen.
        error.discard_as_unraisable("hoist: the frozen predicate");
        return false;
      } catch (nb::cast_error&) {
        return false;
      }
    };
  }
  auto names = std::make_shared<absl::flat_hash_set<std::string>>();
  for (nb::handle name : frozen) names->insert(nb::cast<std::string>(name));
  return [names](std::string_view name) {
    return names->contains(std::string(name));
  };
}

// The device a restore target's data outside host memory is on (or an
// error): given its device id, the data and where it is asked.
using DeviceOfData = absl::FunctionRef<Device*(
    int64_t device, const nb::ndarray<>& data, const std::string& where)>;

// `arrays` as restore targets, appended to `targets`: host memory, or the
// device `device_of` gives.
void AppendTargets(const std::vector<PyArray>& arrays, DeviceOfData device_of,
                   std::vector<RestoreTarget>& targets) {
  for (const auto& [name, dtype_name, shape, dests] : arrays) {
    const DType dtype = Check(ParseDType(dtype_name));
    RestoreTarget target{name, dtype, shape, {}};
    for (const auto& [device, origin, box_shape, data] : dests) {
      const std::string where = absl::StrFormat("restore of '%s'", name);
      const Box box = ToBox(origin, box_shape, where);
      void* pointer =
          DenseData(data, box.num_elements() * ItemSize(dtype), where);
      Device* on = nullptr;
      if (data.device_type() != nb::device::cpu::value) {
        on = device_of(device, data, where);
      }
      target.destinations.push_back({box, on, pointer});
    }
    targets.push_back(std::move(target));
  }
}

// A restore's figures as Python's last_restore dict.
nb::dict RestoreStatsDict(const RestoreStats& s) {
  nb::dict d;
  d["bytes_read"] = s.bytes_read;
  d["extents_read"] = s.extents_read;
  d["dispatches"] = s.dispatches;
  d["waves"] = s.waves;
  d["target_bytes"] = s.target_bytes;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  d["step"] = s.step;
  d["tier"] = TierName(s.restored_from).data();
  d["note"] = s.note;
  d["bytes_received"] = s.bytes_received;
  d["phases"] = PhasesDict(s.phases);
  return d;
}

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
  std::unique_ptr<PyHandle> Save(
      int64_t step,
      const std::vector<PyArrayOf<std::optional<SavedData>>>& arrays,
      const std::string& metadata_json, bool dispatched,
      std::optional<bool> deltas, const std::string& per_rank_json) {
    Live();
    std::vector<SaveArray> save;
    std::vector<SavedData> sources;
    std::vector<int64_t> shard_bytes;  // of each local shard, in order
    for (const auto& [name, dtype_name, shape, shards] : arrays) {
      const DType dtype = Check(ParseDType(dtype_name));
      ExplicitSharding sharding;
      SaveArray array{{name, dtype, shape, sharding}, {}};
      for (const auto& [device, origin, box_shape, data] : shards) {
        const std::string where =
            absl::StrFormat("array '%s' on device %d", name, device);
        const Box box = ToBox(origin, box_shape, where);
        sharding.shards.push_back({static_cast<DeviceId>(device), box});
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
    SaveHandle accepted =
        Submit(step, save, metadata_json, dispatched, deltas, per_rank_json);
    // Kept for save_again: the same arrays with new data.
    last_save_ = std::move(save);
    last_bytes_ = std::move(shard_bytes);
    ++generation_;
    return std::make_unique<PyHandle>(std::move(accepted), std::move(sources));
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
  std::unique_ptr<PyHandle> SaveAgain(int64_t step, int64_t generation,
                                      const nb::list& data,
                                      const std::string& metadata_json,
                                      bool dispatched,
                                      std::optional<bool> deltas,
                                      nb::object keep) {
    Live();
    if (generation != generation_ ||
        nb::len(data) != static_cast<size_t>(last_bytes_.size())) {
      Invalid("save_again: not the arrays of the last save");
    }
    std::vector<SavedData> sources;
    sources.reserve(last_bytes_.size());
    const bool host = backend_->kind() == "host";
    size_t at = 0;
    for (SaveArray& array : last_save_) {
      for (SaveArray::Shard& shard : array.shards) {
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
    return std::make_unique<PyHandle>(
        Submit(step, last_save_, metadata_json, dispatched, deltas),
        std::move(sources), keep.is_none() ? nb::object() : std::move(keep));
  }

  // The engine's Save, without the GIL; its error raised.
  // `deltas`: SaveOptions::deltas (None: the manager's); `per_rank_json`:
  // SaveOptions::per_rank_json.
  SaveHandle Submit(int64_t step, const std::vector<SaveArray>& arrays,
                    const std::string& metadata_json, bool dispatched,
                    std::optional<bool> deltas,
                    const std::string& per_rank_json = "") {
    SaveOptions options;
    options.deltas = deltas;
    options.per_rank_json = per_rank_json;
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

// The manifest, as JSON text, of the step directory `path` (ROOT/step_N),
// or of the newest committed step when `path` is a root.
std::string Inspect(const std::string& path,
                    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  return Check(EncodeManifest(
      WithoutGil([&] { return ReadManifestAt(path, storage); }), kOneDocument));
}

// Its head alike (ManifestHead): of a split manifest, every array's extents
// empty, and only the file's first bytes read.
std::string InspectHead(
    const std::string& path,
    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ManifestHead head =
      WithoutGil([&] { return ReadManifestHeadAt(path, storage); });
  return Check(EncodeManifest(head.manifest, kOneDocument));
}

// Re-reads every extent of the step at `path` (ROOT/step_N, or a root's
// newest step) against its hash, without the root's lock: (step, problems).
std::tuple<int64_t, std::vector<std::string>> VerifyAt(
    const std::string& path,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  auto opened = WithoutGil([&] { return OpenStepAt(path, storage); });
  VerifyReport report =
      WithoutGil([&] { return opened.first->Verify(opened.second, progress); });
  return {opened.second, std::move(report.problems)};
}

// Reads `arrays` (host memory only) of step `step` (or of the newest
// committed step) of the root at `path` (or of the step directory `path`)
// without the root's lock or a pool, beside a job that saves into it:
// (step, the restore's figures).
std::tuple<int64_t, nb::dict> ReadAt(
    const std::string& path, std::optional<int64_t> step,
    const std::vector<PyArray>& arrays,
    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  std::vector<RestoreTarget> targets;
  AppendTargets(
      arrays,
      [](int64_t, const nb::ndarray<>&, const std::string& where) -> Device* {
        Invalid(where + ": a read without a manager fills host memory only");
        return nullptr;
      },
      targets);
  auto opened = WithoutGil([&] { return OpenStepAt(path, storage); });
  const int64_t read = step.value_or(opened.second);
  const RestoreStats stats =
      WithoutGil([&] { return opened.first->Read(read, targets); });
  return {read, RestoreStatsDict(stats)};
}

// Exports step `step_dir` to safetensors in `out_dir` (see
// hoist/interop.h): the figures as a dict.
nb::dict ExportSafetensorsTo(
    const std::string& step_dir, const std::string& out_dir,
    int64_t max_shard_bytes, const std::string& prefix, int64_t memory_bytes,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ExportStats s = WithoutGil([&] {
    return ExportSafetensors(step_dir, out_dir,
                             {.max_shard_bytes = max_shard_bytes,
                              .prefix = prefix,
                              .memory_bytes = memory_bytes,
                              .storage = storage,
                              .progress = progress});
  });
  nb::dict d;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["bytes_read"] = s.bytes_read;
  d["files"] = s.files;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  return d;
}

// Imports the safetensors source `src` as step `step` of `root` (see
// hoist/interop.h): the figures as a dict.
nb::dict ImportSafetensorsFrom(
    const std::string& src, const std::string& root, int64_t step,
    int64_t pool_bytes,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ImportStats s = WithoutGil([&] {
    return ImportSafetensors(src, root, step, pool_bytes, storage, progress);
  });
  nb::dict d;
  d["step"] = s.step;
  d["path"] = s.path;
  d["arrays"] = s.arrays;
  d["bytes"] = s.bytes;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  return d;
}

// An enum option as a string property, through its one table of names
// (checkpoint/option_names.h).
template <typename E, typename Get, typename Set>
void EnumProperty(nb::class_<CheckpointManagerOptions>& c, const char* name,
                  Get get, Set set,
                  absl::StatusOr<E> (*parse)(std::string_view),
                  std::string (*spell)(E)) {
  c.def_prop_rw(
      name,
      [get, spell](const CheckpointManagerOptions& o) { return spell(get(o)); },
      [set, parse](CheckpointManagerOptions& o, const std::string& text) {
        set(o, Check(parse(text)));
      });
}

// CheckpointManagerOptions as hoist._hoist.ManagerOptions: constructed
// with the C++ defaults, which Python's CheckpointManager takes as its own
// (one source for every default); Python's names for the fields.
void BindManagerOptions(nb::module_& m) {
  using O = CheckpointManagerOptions;
  nb::class_<O> c(m, "ManagerOptions");
  c.def(nb::init<>())
      .def_rw("pool_bytes", &O::pool_bytes)
      .def_rw("host_memory_budget", &O::host_memory_budget)
      .def_rw("keep_last", &O::keep_last)
      .def_rw("keep_every", &O::keep_every)
      .def_rw("max_in_flight", &O::max_in_flight)
      .def_rw("deltas", &O::deltas)
      .def_rw("split_manifest_above_extents", &O::split_manifest_above_extents)
      .def_rw("frozen_check_every", &O::frozen_check_every)
      .def_rw("persist_every", &O::persist_every)
      .def_rw("metrics_path", &O::metrics_path)
      .def_prop_rw(
          "stall_warn_s",
          [](const O& o) { return absl::ToDoubleSeconds(o.stall_warn); },
          [](O& o, double s) { o.stall_warn = absl::Seconds(s); })
      .def_prop_rw(
          "preemption_signals", [](const O& o) { return o.preemption.signals; },
          [](O& o, std::vector<int> signals) {
            o.preemption.signals = std::move(signals);
          })
      .def_prop_rw(
          "preemption_deadline_s",
          [](const O& o) {
            return absl::ToDoubleSeconds(o.preemption.deadline);
          },
          [](O& o, double s) { o.preemption.deadline = absl::Seconds(s); })
      .def_prop_rw(
          "preemption_poll_s",
          [](const O& o) { return absl::ToDoubleSeconds(o.preemption.poll); },
          [](O& o, double s) { o.preemption.poll = absl::Seconds(s); })
      .def_prop_rw(
          "writers", [](const O& o) { return o.plan.writer_streams; },
          [](O& o, int n) { o.plan.writer_streams = n; })
      .def_prop_rw(
          "local_root", [](const O& o) { return o.local.root; },
          [](O& o, const std::string& root) { o.local.root = root; })
      .def_prop_rw(
          "local_every", [](const O& o) { return o.local.every; },
          [](O& o, int64_t every) { o.local.every = every; })
      .def_prop_rw(
          "replicas", [](const O& o) { return o.local.replicas; },
          [](O& o, int n) { o.local.replicas = n; })
      .def_prop_rw(
          "local_keep_last", [](const O& o) { return o.local.keep_last; },
          [](O& o, int n) { o.local.keep_last = n; })
      // storage_options (names to strings; see ObjectStoreOptionsOf): set
      // only, never read back (they may hold keys).
      .def("set_storage_options",
           [](O& o, const std::map<std::string, std::string>& given) {
             o.object_store = ObjectStoreOptionsOf(given);
           })
      // frozen: None, a list of names, or a callable (FrozenPredicate).
      .def(
          "set_frozen",
          [](O& o, nb::object frozen) {
            o.frozen = FrozenPredicate(std::move(frozen));
          },
          nb::arg("frozen").none());
  EnumProperty<IoEngine>(
      c, "io", [](const O& o) { return o.io; },
      [](O& o, IoEngine v) { o.io = v; }, &ParseIoEngine, &IoEngineName);
  EnumProperty<O::BackgroundPriority>(
      c, "background_priority",
      [](const O& o) { return o.background_priority; },
      [](O& o, O::BackgroundPriority v) { o.background_priority = v; },
      &ParseBackgroundPriority, &BackgroundPriorityName);
  EnumProperty<O::WhenBusy>(
      c, "when_busy", [](const O& o) { return o.when_busy; },
      [](O& o, O::WhenBusy v) { o.when_busy = v; }, &ParseWhenBusy,
      &WhenBusyName);
  EnumProperty<RestoreOptions::SharedReads>(
      c, "shared_reads", [](const O& o) { return o.restore.shared_reads; },
      [](O& o, RestoreOptions::SharedReads v) { o.restore.shared_reads = v; },
      &ParseSharedReads, &SharedReadsName);
}

}  // namespace
}  // namespace hoist

NB_MODULE(_hoist, m) {
  using namespace hoist;
  m.doc() = "hoist's C++ engine; use the hoist package instead.";
  // hoist._hoist.Error(message), with .code (absl's status code) and
  // .message.
  static nb::object error_type = nb::steal(
      PyErr_NewException("hoist._hoist.Error", PyExc_Exception, nullptr));
  m.attr("Error") = error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object error = error_type(e.message);
      error.attr("code") = e.code;
      error.attr("message") = e.message;
      PyErr_SetObject(error_type.ptr(), error.ptr());
    }
  });

  nb::class_<PyBackend>(m, "Backend")
      .def(
          nb::init<const std::string&, int, int64_t, const std::vector<int>&>(),
          nb::arg("kind"), nb::arg("num_devices") = 1,
          nb::arg("first_device_id") = 0,
          nb::arg("ordinals") = std::vector<int>())
      .def("ordinal", &PyBackend::ordinal, nb::arg("device_id"))
      .def_prop_ro("kind", &PyBackend::kind)
      .def("device_ids", &PyBackend::device_ids);

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

  BindManagerOptions(m);
  nb::class_<PyManager>(m, "Manager")
      .def(nb::init<const std::string&, std::shared_ptr<PyBackend>,
                    const CheckpointManagerOptions&, nb::object>(),
           nb::arg("root"), nb::arg("backend"), nb::arg("options"),
           nb::arg("coordinator").none() = nb::none())
      .def("durability", &PyManager::DurabilityDict)
      .def("save", &PyManager::Save, nb::arg("step"), nb::arg("arrays"),
           nb::arg("metadata_json"), nb::arg("dispatched"),
           nb::arg("deltas").none() = nb::none(), nb::arg("per_rank_json") = "")
      .def("save_again", &PyManager::SaveAgain, nb::arg("step"),
           nb::arg("generation"), nb::arg("data"), nb::arg("metadata_json"),
           nb::arg("dispatched"), nb::arg("deltas").none() = nb::none(),
           nb::arg("keep").none() = nb::none())
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

  m.def("inspect", &Inspect, nb::arg("path"), nb::arg("storage_options"));
  m.def("inspect_head", &InspectHead, nb::arg("path"),
        nb::arg("storage_options"));
  // Whether restored arrays are advised for huge pages (huge_pages.h).
  m.def("advise_huge_pages", &AdviseHugePages);
  m.def("verify_at", &VerifyAt, nb::arg("path"), nb::arg("storage_options"),
        nb::arg("progress").none() = nb::none());
  m.def("read_at", &ReadAt, nb::arg("path"), nb::arg("step").none(),
        nb::arg("arrays"), nb::arg("storage_options"));
  // Defaults the Python functions take from the engine.
  m.attr("POOL_ALIGNMENT") = StagingPool::kAlignment;
  m.attr("IMPORT_POOL_BYTES") = kImportPoolBytes;
  m.attr("EXPORT_MAX_SHARD_BYTES") = SafetensorsExportOptions{}.max_shard_bytes;
  m.attr("EXPORT_MEMORY_BYTES") = SafetensorsExportOptions{}.memory_bytes;
  m.def("export_safetensors", &ExportSafetensorsTo, nb::arg("step_dir"),
        nb::arg("out_dir"), nb::arg("max_shard_bytes"), nb::arg("prefix"),
        nb::arg("memory_bytes"), nb::arg("storage_options"),
        nb::arg("progress").none() = nb::none());
  m.def("import_safetensors", &ImportSafetensorsFrom, nb::arg("src"),
        nb::arg("root"), nb::arg("step"), nb::arg("pool_bytes"),
        nb::arg("storage_options"), nb::arg("progress").none() = nb::none());
  BindObserve(m);
}
