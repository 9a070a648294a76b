"""Read Prometheus text exposition: samples, histogram deltas between two scrapes, and
quantile estimates from buckets (bucket resolution: the result is interpolated linearly inside
the bucket that holds the quantile, as Prometheus' `histogram_quantile` does)."""

from __future__ import annotations

import math
import re

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> Samples:
    """Every sample line as {(name, sorted labels): value}; comments and junk lines skipped."""
    samples: Samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        name, label_text, value_text = match.groups()
        labels = tuple(sorted(_LABEL.findall(label_text or "")))
        try:
            samples[(name, labels)] = float(value_text)
        except ValueError:
            continue
    return samples


def select(samples: Samples, name: str, **labels: str) -> dict[Labels, float]:
    """The series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return {lab: v for (n, lab), v in samples.items() if n == name and wanted <= set(lab)}


def counter_delta(before: Samples, after: Samples, name: str, **labels: str) -> float | None:
    """Sum of the matching series' increase; None when the metric is absent (unknown)."""
    end = select(after, name, **labels)
    if not end:
        return None
    start = select(before, name, **labels)
    return sum(value - start.get(lab, 0.0) for lab, value in end.items())


def histogram_delta(
    before: Samples, after: Samples, name: str, **labels: str
) -> list[tuple[float, float]] | None:
    """Cumulative (upper bound, count) pairs of the observations made between two scrapes,
    sorted by bound (+Inf last); None when the histogram is absent."""
    end = select(after, f"{name}_bucket", **labels)
    if not end:
        return None
    start = select(before, f"{name}_bucket", **labels)
    by_bound: dict[float, float] = {}
    for lab, value in end.items():
        bound = float(dict(lab)["le"])
        by_bound[bound] = by_bound.get(bound, 0.0) + value - start.get(lab, 0.0)
    return sorted(by_bound.items())


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Estimate quantile q (0..1) from cumulative buckets; None when there are no observations.
    Inside a bucket the estimate is linear from its lower to its upper bound; a quantile in the
    +Inf bucket is reported as the highest finite bound (a lower bound on the truth)."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_count(buckets: list[tuple[float, float]] | None) -> float | None:
    return None if not buckets else buckets[-1][1]
