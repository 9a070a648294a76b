"""A small Prometheus registry: counters, gauges and histograms with labels, rendered in the
text exposition format (version 0.0.4).

Every metric guards its series with its own lock, so the engine thread can update while the
server's event loop renders. Label values are strings; a series missing from `label_values`
appears the first time it is updated.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

LabelValues = tuple[str, ...]


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1 << 53:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


class Metric:
    """One metric family: a name, help text, label names and a series per label combination."""

    kind = "untyped"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        label_values: Iterable[Sequence[str]] = (),
    ) -> None:
        self.name = name
        self.help_text = help_text
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()
        self._series: dict[LabelValues, Any] = {}
        if not self.label_names:
            self._series[()] = self._new_series()
        for values in label_values:
            self._series[self._key_of(tuple(values))] = self._new_series()

    def _new_series(self) -> object:
        return 0.0

    def _key_of(self, values: LabelValues) -> LabelValues:
        if len(values) != len(self.label_names):
            raise ValueError(f"{self.name}: labels {self.label_names}, got values {values}")
        return values

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name}: labels {self.label_names}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def render(self) -> list[str]:
        """The `# HELP`, `# TYPE` and sample lines of this family."""
        lines = [
            f"# HELP {self.name} {_escape_help(self.help_text)}",
            f"# TYPE {self.name} {self.kind}",
        ]
        with self._lock:
            snapshot = {key: self._copy(series) for key, series in self._series.items()}
        for key, series in snapshot.items():
            lines.extend(self._sample_lines(key, series))
        return lines

    def _copy(self, series: object) -> object:
        return series

    def _sample_lines(self, key: LabelValues, series: object) -> list[str]:
        assert isinstance(series, float), f"{self.name}: series {series!r}"
        return [f"{self.name}{_label_text(self.label_names, key)} {_format_value(series)}"]


class Counter(Metric):
    """A monotonic count. Name it with the `_total` suffix."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease (inc by {amount})")
        key = self._key(labels)
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + amount

    def set_total(self, total: float, **labels: str) -> None:
        """Mirror a count kept elsewhere (e.g. the cache's own counters); never goes down."""
        key = self._key(labels)
        with self._lock:
            self._series[key] = max(float(total), self._series.get(key, 0.0))

    def value(self, **labels: str) -> float:
        with self._lock:
            return float(self._series.get(self._key(labels), 0.0))


class Gauge(Metric):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._series[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return float(self._series.get(self._key(labels), 0.0))


class _HistogramSeries:
    __slots__ = ("bucket_counts", "count", "total")

    def __init__(self, num_buckets: int) -> None:
        self.bucket_counts = [0] * num_buckets  # non-cumulative, one per upper bound
        self.count = 0
        self.total = 0.0


class Histogram(Metric):
    """Observations counted into cumulative buckets (`le` upper bounds, +Inf added)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        buckets: Sequence[float],
        label_names: Sequence[str] = (),
        label_values: Iterable[Sequence[str]] = (),
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be non-empty and distinct, got {buckets}")
        self.buckets = (*[b for b in bounds if not math.isinf(b)], math.inf)
        super().__init__(name, help_text, label_names, label_values)

    def _new_series(self) -> _HistogramSeries:
        return _HistogramSeries(len(self.buckets))

    def observe(self, value: float, **labels: str) -> None:
        if math.isnan(value):
            raise ValueError(f"{self.name}: cannot observe NaN")
        key = self._key(labels)
        index = next(i for i, bound in enumerate(self.buckets) if value <= bound)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._new_series()
            assert isinstance(series, _HistogramSeries)
            series.bucket_counts[index] += 1
            series.count += 1
            series.total += value

    def count(self, **labels: str) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return series.count if isinstance(series, _HistogramSeries) else 0

    def _copy(self, series: object) -> object:
        assert isinstance(series, _HistogramSeries)
        copy = _HistogramSeries(len(self.buckets))
        copy.bucket_counts = list(series.bucket_counts)
        copy.count, copy.total = series.count, series.total
        return copy

    def _sample_lines(self, key: LabelValues, series: object) -> list[str]:
        assert isinstance(series, _HistogramSeries)
        names = (*self.label_names, "le")
        lines, cumulative = [], 0
        for bound, count in zip(self.buckets, series.bucket_counts, strict=True):
            cumulative += count
            labels = _label_text(names, (*key, _format_value(bound)))
            lines.append(f"{self.name}_bucket{labels} {cumulative}")
        labels = _label_text(self.label_names, key)
        lines.append(f"{self.name}_sum{labels} {_format_value(series.total)}")
        lines.append(f"{self.name}_count{labels} {series.count}")
        return lines


class Registry:
    """An ordered set of metric families with unique names."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def register(self, metric: Metric) -> Metric:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        """The text exposition of every family, newline-terminated."""
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"
