"""Parser of Prometheus text exposition (``/metrics`` of vLLM; VLLM_BEHAVIOUR.md 2.5).

One file holds one scrape or several. Scrapes are separated by a ``# scrape <unix_ts>`` comment line
(the timestamp is kept), by ``# EOF``, or simply by repetition: when a series (name + labels) shows up
a second time, a new scrape begins. Samples are ``name{label="value",...} value [timestamp_ms]``.

Families are typed from ``# TYPE`` lines, else from their shape: ``_bucket`` samples with an ``le``
label make a histogram (with its ``_sum`` and ``_count``), ``_total`` makes a counter, anything else a
gauge. ``_created`` samples (creation timestamps written by prometheus_client) are skipped.
Validation: values are finite and non-negative; per histogram the buckets are cumulative
(non-decreasing in ``le``), the ``+Inf`` bucket exists and equals ``_count``, and ``_sum`` exists.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, PathLike, file_label, read_text

Labels = tuple[tuple[str, str], ...]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(
    r"^(?P<name>" + _NAME + r")\s*(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<val>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_TYPE = re.compile(r"^#\s*TYPE\s+(?P<name>" + _NAME + r")\s+(?P<type>\w+)\s*$")
_SCRAPE = re.compile(r"^#\s*scrape\b\s*(?P<ts>\S+)?")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, eq=False)
class HistogramSeries:
    """One histogram series (metric + labels) of one scrape.

    Attributes:
        name: family name, e.g. ``vllm:time_to_first_token_seconds`` (the unit is in the name).
        labels: sorted ``(label, value)`` pairs without ``le``.
        upper_bounds: bucket upper bounds, increasing, the last one ``inf``.
        cumulative_counts: observations <= each bound (non-decreasing; the last equals ``count``).
        sum: sum of the observations, in the metric's unit.
        count: number of observations.
        scrape: index of the scrape in the file.
    """

    name: str
    labels: Labels
    upper_bounds: np.ndarray
    cumulative_counts: np.ndarray
    sum: float
    count: float
    scrape: int

    @property
    def label_dict(self) -> dict[str, str]:
        """The labels as a dict."""
        return dict(self.labels)

    def bucket_counts(self) -> np.ndarray:
        """Observations per bucket (not cumulative)."""
        return np.diff(self.cumulative_counts, prepend=0.0)

    def mean(self) -> float:
        """Exact mean ``sum / count`` (NaN when the histogram is empty)."""
        return self.sum / self.count if self.count > 0 else math.nan

    def approx_mean(self) -> float:
        """Mean estimated from the buckets alone (bucket midpoints; lower edge 0 for the first bucket;
        the ``+Inf`` bucket counts at the last finite bound). Use when ``sum`` is not trusted."""
        if self.count <= 0:
            return math.nan
        finite = self.upper_bounds[np.isfinite(self.upper_bounds)]
        lower = np.concatenate(([0.0], finite))[: len(self.upper_bounds)]
        upper = np.where(
            np.isfinite(self.upper_bounds), self.upper_bounds, finite[-1] if finite.size else 0.0
        )
        mid = (lower + upper) / 2.0
        mid[~np.isfinite(self.upper_bounds)] = upper[~np.isfinite(self.upper_bounds)]
        return float((self.bucket_counts() * mid).sum() / self.count)

    def quantile(self, q: float) -> float:
        """Quantile estimated like PromQL ``histogram_quantile``: linear within the bucket holding the rank
        ``q * count``, lower edge 0 for the first bucket; a rank in the ``+Inf`` bucket returns the last
        finite bound. NaN when the histogram is empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q}")
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        cum = self.cumulative_counts
        i = int(np.searchsorted(cum, rank, side="left"))
        i = min(i, len(cum) - 1)
        upper = float(self.upper_bounds[i])
        if math.isinf(upper):
            finite = self.upper_bounds[np.isfinite(self.upper_bounds)]
            return float(finite[-1]) if finite.size else math.nan
        lower = float(self.upper_bounds[i - 1]) if i > 0 else 0.0
        below = float(cum[i - 1]) if i > 0 else 0.0
        in_bucket = float(cum[i]) - below
        if in_bucket <= 0:
            return upper
        return lower + (upper - lower) * (rank - below) / in_bucket

    def minus(self, earlier: HistogramSeries) -> HistogramSeries:
        """Observations made between ``earlier`` and this scrape (same series and bounds).

        Raises ValueError if the bounds differ or a count went down (a restarted server)."""
        if not np.array_equal(self.upper_bounds, earlier.upper_bounds):
            raise ValueError(f"{self.name}: bucket bounds differ between the two scrapes")
        cum = self.cumulative_counts - earlier.cumulative_counts
        if (cum < 0).any() or self.count < earlier.count:
            raise ValueError(f"{self.name}: counts decreased between scrapes (server restart?)")
        return replace(
            self, cumulative_counts=cum, sum=self.sum - earlier.sum, count=self.count - earlier.count
        )


@dataclass(frozen=True, eq=False)
class PrometheusScrape:
    """All samples of a Prometheus text file, possibly several scrapes.

    Attributes:
        source: the file, as given.
        scrape_times_s: unix time of each scrape from ``# scrape <ts>`` lines (NaN where unknown).
        counters: ``scrape``, ``name`` (family name, without ``_total``), ``labels`` (sorted pairs),
            ``value``, ``line``.
        gauges: same columns, for gauges (and untyped samples).
        histograms: every histogram series of every scrape.
    """

    source: str
    scrape_times_s: np.ndarray
    counters: pd.DataFrame
    gauges: pd.DataFrame
    histograms: tuple[HistogramSeries, ...]

    @property
    def n_scrapes(self) -> int:
        """Number of scrapes in the file."""
        return len(self.scrape_times_s)

    def counter(self, name: str, *, scrape: int = -1, **labels: str) -> float:
        """Sum of the counter series ``name`` whose labels include ``labels`` in one scrape (default last).

        ``name`` may be given with or without the ``_total`` suffix. KeyError if nothing matches."""
        return self._sum(self.counters, name.removesuffix("_total"), scrape, labels)

    def gauge(self, name: str, *, scrape: int = -1, **labels: str) -> float:
        """Sum of the gauge series of ``name`` matching ``labels`` in one scrape (default last)."""
        return self._sum(self.gauges, name, scrape, labels)

    def histogram(self, name: str, *, scrape: int = -1, **labels: str) -> HistogramSeries:
        """The histogram ``name`` in one scrape, summed over the series matching ``labels``.

        Series with different bucket bounds cannot be summed (KvplanInputError). KeyError if none match."""
        idx = self._scrape_index(scrape)
        found = [
            h for h in self.histograms if h.name == name and h.scrape == idx and _matches(h.labels, labels)
        ]
        if not found:
            raise KeyError(f"no histogram {name!r} with labels {labels} in scrape {idx}")
        first = found[0]
        for h in found[1:]:
            if not np.array_equal(h.upper_bounds, first.upper_bounds):
                raise input_error(
                    self.source, f"histogram '{name}' has different buckets for {first.labels} and {h.labels}"
                )
        common = tuple(kv for kv in first.labels if all(kv in h.labels for h in found))
        return HistogramSeries(
            name=name,
            labels=common,
            upper_bounds=first.upper_bounds,
            cumulative_counts=np.sum([h.cumulative_counts for h in found], axis=0),
            sum=float(sum(h.sum for h in found)),
            count=float(sum(h.count for h in found)),
            scrape=idx,
        )

    def histogram_delta(self, name: str, *, first: int = 0, last: int = -1, **labels: str) -> HistogramSeries:
        """Observations of histogram ``name`` made between scrape ``first`` and scrape ``last``.

        Raises :class:`~kvplan.errors.KvplanInputError` if the counts went down (a server restart)."""
        later = self.histogram(name, scrape=last, **labels)
        try:
            return later.minus(self.histogram(name, scrape=first, **labels))
        except ValueError as exc:
            raise input_error(
                self.source, f"scrapes {first} and {last}: {exc}", "use scrapes of one run"
            ) from None

    def names(self) -> list[str]:
        """Sorted family names of all counters, gauges and histograms."""
        out = set(self.counters["name"]) | set(self.gauges["name"]) | {h.name for h in self.histograms}
        return sorted(out)

    def _scrape_index(self, scrape: int) -> int:
        n = self.n_scrapes
        if not -n <= scrape < n:
            raise IndexError(f"scrape {scrape} out of range: the file has {n} scrape(s)")
        return scrape % n

    def _sum(self, frame: pd.DataFrame, name: str, scrape: int, labels: dict[str, str]) -> float:
        idx = self._scrape_index(scrape)
        sel = frame[(frame["name"] == name) & (frame["scrape"] == idx)]
        values = [v for lab, v in zip(sel["labels"], sel["value"], strict=True) if _matches(lab, labels)]
        if not values:
            raise KeyError(f"no series {name!r} with labels {labels} in scrape {idx}")
        return float(sum(values))


def _matches(have: Labels, want: dict[str, str]) -> bool:
    got = dict(have)
    return all(got.get(k) == str(v) for k, v in want.items())


@dataclass
class _Sample:
    name: str
    labels: Labels
    value: float
    line: int


def parse_prometheus(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> PrometheusScrape:
    """Parse a Prometheus text exposition file (one or several scrapes) and validate its histograms.

    Raises :class:`~kvplan.errors.KvplanInputError` naming the file, the line and the metric for:
    unreadable sample lines, NaN/Infinity or negative values, decreasing cumulative buckets, a missing
    ``+Inf`` bucket, ``_sum`` or ``_count``, an ``+Inf`` bucket that differs from ``_count``, and files
    without any sample.
    """
    where = file_label(path)
    text = read_text(path, max_bytes)
    types: dict[str, str] = {}
    scrapes: list[list[_Sample]] = [[]]
    times: list[float] = [math.nan]
    seen: set[tuple[str, Labels]] = set()

    def new_scrape(ts: float) -> None:
        if scrapes[-1]:
            scrapes.append([])
            times.append(ts)
            seen.clear()
        else:
            times[-1] = ts

    for lineno, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("#"):
            scrape = _SCRAPE.match(line)
            if scrape is not None:
                new_scrape(_scrape_time(where, lineno, scrape.group("ts")))
            elif line.startswith("# EOF"):
                new_scrape(math.nan)
            else:
                typed = _TYPE.match(line)
                if typed is not None:
                    types[typed.group("name")] = typed.group("type").lower()
            continue
        sample = _parse_sample(where, lineno, line)
        key = (sample.name, sample.labels)
        if key in seen:  # the same series again: a new scrape without a separator
            new_scrape(math.nan)
        seen.add(key)
        scrapes[-1].append(sample)

    if not scrapes[-1] and len(scrapes) > 1:
        scrapes.pop()
        times.pop()
    if not any(scrapes):
        raise input_error(where, "no metric sample found", "pass the text of a /metrics scrape")

    counters: list[dict[str, Any]] = []
    gauges: list[dict[str, Any]] = []
    histograms: list[HistogramSeries] = []
    for index, samples in enumerate(scrapes):
        _collect(where, index, samples, types, counters, gauges, histograms)
    columns = ["scrape", "name", "labels", "value", "line"]
    return PrometheusScrape(
        source=where,
        scrape_times_s=np.asarray(times, dtype=np.float64),
        counters=pd.DataFrame(counters, columns=columns),
        gauges=pd.DataFrame(gauges, columns=columns),
        histograms=tuple(histograms),
    )


def _scrape_time(where: str, lineno: int, text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        ts = float(text)
    except ValueError:
        raise input_error(where, f"line {lineno}: '# scrape {text}' does not carry a unix time") from None
    if not math.isfinite(ts) or ts < 0:
        raise input_error(where, f"line {lineno}: scrape time {text} is not a valid unix time")
    return ts


def _parse_sample(where: str, lineno: int, line: str) -> _Sample:
    match = _SAMPLE.match(line)
    if match is None:
        raise input_error(where, f"line {lineno}: cannot read {line[:60]!r} as 'name{{labels}} value'")
    name = match.group("name")
    labels: list[tuple[str, str]] = []
    body = match.group("labels")
    if body:
        pos = 0
        while pos < len(body):
            lab = _LABEL.match(body, pos)
            if lab is None:
                raise input_error(
                    where, f"line {lineno}: metric '{name}' has malformed labels {{{body[:60]}}}"
                )
            unescaped = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], lab.group("val"))
            labels.append((lab.group("key"), unescaped))
            pos = lab.end()
    text = match.group("value")
    try:
        value = float(text)
    except ValueError:
        raise input_error(where, f"line {lineno}: metric '{name}' has value {text!r}, not a number") from None
    if not math.isfinite(value):
        raise input_error(
            where, f"line {lineno}: metric '{name}' is {text}: NaN/Infinity is not a valid value"
        )
    if value < 0:
        raise input_error(where, f"line {lineno}: metric '{name}' is negative ({value:g})")
    return _Sample(name=name, labels=tuple(sorted(labels)), value=value, line=lineno)


def _family(name: str, types: dict[str, str], hist_bases: set[str]) -> tuple[str, str, str]:
    """Return (kind, family, suffix) of a sample name."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and (base in hist_bases or types.get(base) == "histogram"):
            return "histogram", base, suffix
    if name.endswith("_created") and types.get(name, "gauge") == "gauge":
        # prometheus_client's creation times of counters and histograms (written as a gauge family of
        # their own): not measurements.
        base = name.removesuffix("_created")
        if (
            base in hist_bases
            or types.get(base) in ("counter", "histogram", "summary")
            or types.get(base + "_total") == "counter"
        ):
            return "skip", base, "_created"
    if name.endswith("_total"):
        base = name.removesuffix("_total")
        if types.get(base, "counter") == "counter" or types.get(name) == "counter":
            return "counter", base, "_total"
    if types.get(name) == "counter":
        return "counter", name, ""
    return "gauge", name, ""


def _collect(
    where: str,
    index: int,
    samples: Iterable[_Sample],
    types: dict[str, str],
    counters: list[dict[str, Any]],
    gauges: list[dict[str, Any]],
    histograms: list[HistogramSeries],
) -> None:
    """Sort one scrape's samples into counters, gauges and validated histograms."""
    samples = list(samples)
    hist_bases = {
        s.name.removesuffix("_bucket")
        for s in samples
        if s.name.endswith("_bucket") and "le" in dict(s.labels)
    }
    parts: dict[tuple[str, Labels], dict[str, Any]] = {}
    for s in samples:
        kind, family, suffix = _family(s.name, types, hist_bases)
        if kind == "skip":
            continue
        if kind != "histogram":
            target = counters if kind == "counter" else gauges
            target.append(
                {"scrape": index, "name": family, "labels": s.labels, "value": s.value, "line": s.line}
            )
            continue
        lab = dict(s.labels)
        le = lab.pop("le", None)
        key = (family, tuple(sorted(lab.items())))
        entry = parts.setdefault(key, {"buckets": [], "sum": None, "count": None, "line": s.line})
        if suffix == "_bucket":
            if le is None:
                raise input_error(where, f"line {s.line}: histogram bucket '{s.name}' has no 'le' label")
            try:
                bound = float(le)
            except ValueError:
                raise input_error(where, f"line {s.line}: '{s.name}' has le={le!r}, not a number") from None
            if math.isnan(bound):
                raise input_error(where, f"line {s.line}: '{s.name}' has le=NaN")
            entry["buckets"].append((bound, s.value, s.line))
        else:
            entry[suffix[1:]] = (s.value, s.line)
    for (family, labels), entry in parts.items():
        histograms.append(_histogram(where, index, family, labels, entry))


def _histogram(where: str, index: int, family: str, labels: Labels, entry: dict[str, Any]) -> HistogramSeries:
    series = family + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
    buckets = sorted(entry["buckets"])
    if not buckets:
        raise input_error(where, f"line {entry['line']}: histogram {series} has no _bucket samples")
    bounds = np.array([b for b, _, _ in buckets])
    dup = np.flatnonzero(np.diff(bounds) == 0)
    if dup.size:
        raise input_error(
            where, f"line {buckets[dup[0] + 1][2]}: histogram {series} repeats bucket le={bounds[dup[0]]:g}"
        )
    counts = np.array([c for _, c, _ in buckets])
    drop = np.flatnonzero(np.diff(counts) < 0)
    if drop.size:
        i = int(drop[0]) + 1
        raise input_error(
            where,
            f"line {buckets[i][2]}: histogram {series} bucket le={bounds[i]:g} has count {counts[i]:g}, "
            f"below the {counts[i - 1]:g} of le={bounds[i - 1]:g}: cumulative bucket counts must not "
            f"decrease",
        )
    if not math.isinf(bounds[-1]):
        raise input_error(where, f'line {buckets[-1][2]}: histogram {series} has no le="+Inf" bucket')
    if entry["count"] is None or entry["sum"] is None:
        missing = "_count" if entry["count"] is None else "_sum"
        raise input_error(where, f"line {entry['line']}: histogram {series} has no {missing} sample")
    count, count_line = entry["count"]
    if not math.isclose(counts[-1], count, rel_tol=1e-9, abs_tol=1e-9):
        raise input_error(
            where,
            f"line {count_line}: histogram {series} has _count {count:g} but its +Inf bucket holds "
            f"{counts[-1]:g}",
        )
    return HistogramSeries(
        name=family,
        labels=labels,
        upper_bounds=bounds,
        cumulative_counts=counts,
        sum=float(entry["sum"][0]),
        count=float(count),
        scrape=index,
    )
