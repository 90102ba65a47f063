// hoist._hoist's observability: phases as dicts, the phase reports a
// manager keeps for Python (its Prometheus collector takes them), live
// progress counters (hoist._hoist.Progress), warnings sent to Python's
// logging, and diff_at.
#ifndef HOIST_PYTHON_PY_OBSERVE_H_
#define HOIST_PYTHON_PY_OBSERVE_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "hoist/checkpoint_types.h"
#include "hoist/mutex.h"

namespace hoist {

// {"planning": {"seconds": s, "bytes": b, "rank": r}, ...}, in order.
nanobind::dict PhasesDict(const std::vector<PhaseStat>& phases);

// One manager's phase reports (CheckpointManagerOptions::on_phases), kept
// until Python takes them: the newest kMaxKept; older ones are dropped and
// counted.
class PhaseReports {
 public:
  static constexpr size_t kMaxKept = 10000;
  // On the saver's thread, or a restore's: no GIL taken.
  void Add(const PhaseReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  // The reports since the last Take, as dicts (kind, step, tier,
  // elapsed_s, phases, slowest), oldest first; with the GIL.
  nanobind::list Take() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t dropped() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  std::deque<PhaseReport> kept_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// A manager's warning, logged on Python's "hoist" logger (the GIL taken on
// the warning thread); on stderr while Python shuts down.
void WarnToPythonLog(const std::string& message);

// hoist._hoist.Progress (OperationProgress) and diff_at.
void BindObserve(nanobind::module_& m);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_OBSERVE_H_
