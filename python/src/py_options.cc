#include "py_options.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/option_names.h"
#include "py_status.h"
#include "py_storage.h"

namespace nb = nanobind;

namespace hoist {
namespace {

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

// An enum option as a string property, through its one table of names
// (hoist/option_names.h).
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

}  // namespace

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

}  // namespace hoist
