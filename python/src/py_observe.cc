#include "py_observe.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <map>
#include <optional>
#include <utility>

#include "absl/time/time.h"
#include "hoist/diff.h"
#include "py_status.h"
#include "py_storage.h"

namespace nb = nanobind;

namespace hoist {

nb::dict PhasesDict(const std::vector<PhaseStat>& phases) {
  nb::dict d;
  for (const PhaseStat& phase : phases) {
    nb::dict one;
    one["seconds"] = absl::ToDoubleSeconds(phase.elapsed);
    one["bytes"] = phase.bytes;
    one["rank"] = phase.rank;
    d[phase.phase.c_str()] = one;
  }
  return d;
}

void PhaseReports::Add(const PhaseReport& report) {
  MutexLock lock(&mu_);
  if (kept_.size() == kMaxKept) {
    kept_.pop_front();
    ++dropped_;
  }
  kept_.push_back(report);
}

nb::list PhaseReports::Take() {
  std::deque<PhaseReport> taken;
  {
    MutexLock lock(&mu_);
    taken.swap(kept_);
  }
  nb::list out;
  for (const PhaseReport& report : taken) {
    nb::dict d;
    d["kind"] = report.kind;
    d["step"] = report.step;
    d["tier"] = std::string(TierName(report.tier));
    d["elapsed_s"] = absl::ToDoubleSeconds(report.elapsed);
    d["phases"] = PhasesDict(report.phases);
    d["slowest"] = PhasesDict(report.slowest);
    out.append(d);
  }
  return out;
}

int64_t PhaseReports::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

// Whether the interpreter is shutting down (public from Python 3.13, where
// the underscored name is gone).
bool PythonFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void WarnToPythonLog(const std::string& message) {
  if (!Py_IsInitialized() || PythonFinalizing()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    return;
  }
  nb::gil_scoped_acquire gil;
  try {
    nb::module_::import_("logging").attr("getLogger")("hoist").attr("warning")(
        message);
  } catch (nb::python_error& e) {
    e.discard_as_unraisable("hoist's warning");
  }
}

namespace {

nb::dict ArrayDiffDict(const ArrayDiff& array, bool values) {
  nb::dict d;
  d["name"] = array.name;
  d["dtype_a"] = std::string(DTypeName(array.dtype_a));
  d["dtype_b"] = std::string(DTypeName(array.dtype_b));
  d["shape_a"] = nb::tuple(nb::cast(array.shape_a));
  d["shape_b"] = nb::tuple(nb::cast(array.shape_b));
  d["retyped"] = array.retyped;
  d["resharded"] = array.resharded;
  d["extents"] = array.extents;
  nb::list boxes;
  for (const Box& box : array.changed_extents) {
    boxes.append(nb::make_tuple(nb::tuple(nb::cast(box.origin())),
                                nb::tuple(nb::cast(box.shape()))));
  }
  d["changed_extents"] = boxes;
  d["changed_bytes"] = array.changed_bytes;
  if (values) {
    d["max_abs_diff"] =
        array.values_compared ? nb::cast(array.max_abs_diff) : nb::none();
    d["max_rel_diff"] =
        array.values_compared ? nb::cast(array.max_rel_diff) : nb::none();
  }
  return d;
}

// The difference from step `step_a` of `path_a` to `step_b` of `path_b`
// (nullopt: the newest), as the CLI's --json has it.
nb::dict DiffAt(const std::string& path_a, std::optional<int64_t> step_a,
                const std::string& path_b, std::optional<int64_t> step_b,
                bool values,
                const std::map<std::string, std::string>& storage_options,
                OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const StepDiff diff = WithoutGil([&] {
    return DiffSteps({path_a, step_a}, {path_b, step_b}, storage, values,
                     progress);
  });
  nb::dict d;
  d["step_a"] = diff.step_a;
  d["step_b"] = diff.step_b;
  d["added"] = diff.added;
  d["removed"] = diff.removed;
  nb::list changed;
  for (const ArrayDiff& array : diff.changed) {
    changed.append(ArrayDiffDict(array, values));
  }
  d["changed"] = changed;
  d["unchanged"] = diff.unchanged;
  return d;
}

}  // namespace

void BindObserve(nb::module_& m) {
  // Live counts of a long call, read by Python while the call runs on
  // another thread (hoist's progress=).
  nb::class_<OperationProgress>(m, "Progress")
      .def(nb::init<>())
      .def_prop_ro("done",
                   [](const OperationProgress& p) { return p.done.load(); })
      .def_prop_ro("total",
                   [](const OperationProgress& p) { return p.total.load(); })
      .def_prop_ro("bytes", [](const OperationProgress& p) { return p.bytes; })
      .def_prop_ro("current",
                   [](const OperationProgress& p) { return p.current.Get(); });
  m.def("diff_at", &DiffAt, nb::arg("path_a"), nb::arg("step_a").none(),
        nb::arg("path_b"), nb::arg("step_b").none(), nb::arg("values"),
        nb::arg("storage_options"), nb::arg("progress").none());
}

}  // namespace hoist
