"""Prometheus metrics of a CheckpointManager's saves and restores.

    from prometheus_client import REGISTRY, start_http_server
    from hoist.metrics import PrometheusCollector
    REGISTRY.register(PrometheusCollector(mgr))
    start_http_server(9100)

Each scrape takes the phases the manager recorded since the last one (see
docs/observability.md) into histograms, labelled by phase and tier:

    hoist_save_phase_seconds, hoist_save_phase_bytes
    hoist_restore_phase_seconds, hoist_restore_phase_bytes
    hoist_save_seconds, hoist_restore_seconds   (the whole, by tier)

One collector per manager: it is the one reader of the manager's phase
reports (the engine keeps the newest 10,000 between scrapes).
"""

import math
import threading

SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)
BYTES_BUCKETS = tuple(float(2**k) for k in range(10, 41, 3)) + (math.inf,)


class _Histogram:
    """Cumulative bucket counts and sum of one labelled series."""

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value):
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value

    def buckets(self):
        return [("+Inf" if math.isinf(b) else repr(b), c)
                for b, c in zip(self.bounds, self.counts)]


class PrometheusCollector:
    """A prometheus_client collector of `manager`'s save and restore
    phases (a hoist.CheckpointManager)."""

    def __init__(self, manager):
        self._manager = manager
        self._lock = threading.Lock()
        # (metric, labels) -> _Histogram
        self._series = {}

    def _observe(self, metric, labels, value, bounds):
        key = (metric, labels)
        if key not in self._series:
            self._series[key] = _Histogram(bounds)
        self._series[key].observe(value)

    def _take(self):
        for report in self._manager._take_phase_reports():
            kind, tier = report["kind"], report["tier"]
            self._observe(f"hoist_{kind}_seconds", (tier,),
                          report["elapsed_s"], SECONDS_BUCKETS)
            for phase, figures in report["phases"].items():
                labels = (phase, tier)
                self._observe(f"hoist_{kind}_phase_seconds", labels,
                              figures["seconds"], SECONDS_BUCKETS)
                self._observe(f"hoist_{kind}_phase_bytes", labels,
                              figures["bytes"], BYTES_BUCKETS)

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily
        with self._lock:
            self._take()
            families = {}
            for (metric, labels), series in sorted(self._series.items()):
                if metric not in families:
                    phased = "_phase_" in metric
                    kind = metric.split("_")[1]
                    what = ("bytes moved" if metric.endswith("_bytes")
                            else "seconds")
                    families[metric] = HistogramMetricFamily(
                        metric,
                        f"hoist {kind}s: {what} per phase" if phased
                        else f"hoist {kind}s: seconds, whole",
                        labels=["phase", "tier"] if phased else ["tier"])
                families[metric].add_metric(list(labels), series.buckets(),
                                            series.sum)
        yield from families.values()
