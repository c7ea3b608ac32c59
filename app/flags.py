"""Checks of numeric command-line flags, before any work: one-line errors that name the flag."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import PurePath
from typing import Any, get_args

from kvplan.errors import input_error
from kvplan.plan.grid import MAX_REPLICATIONS
from kvplan.sim.scenario import MAX_CONVERSATIONS, MAX_SIM_TIME_S

MAX_WORKERS = 256
MAX_LIST_VALUES = 50


def positive_finite(flag: str, value: float | None, upper: float = 1e12, allow_zero: bool = False) -> None:
    """Refuse NaN, infinities, values <= 0 (or < 0 with ``allow_zero``) and values above ``upper``."""
    if value is None:
        return
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0) and value <= upper
    if not ok:
        low = ">= 0" if allow_zero else "> 0"
        raise input_error(flag, f"is {value!r}", f"give a finite number {low} and at most {upper:g}")


def int_range(flag: str, value: int | None, low: int, high: int) -> None:
    """Refuse an integer flag outside ``[low, high]``."""
    if value is not None and not low <= value <= high:
        raise input_error(flag, f"is {value:,}", f"give an integer in {low:,}..{high:,}")


def seconds_list(
    flag: str, text: str, upper: float = MAX_SIM_TIME_S, max_values: int = MAX_LIST_VALUES
) -> tuple[float, ...]:
    """Parse a comma-separated list of positive finite seconds (at most ``max_values`` of them)."""
    parts = [x for x in text.replace(" ", "").split(",") if x]
    if not parts:
        raise input_error(flag, f"'{text}' is empty", "give comma-separated seconds, e.g. 30,60,120")
    if len(parts) > max_values:
        raise input_error(flag, f"{len(parts):,} values (more than {max_values})", "give fewer values")
    try:
        values = tuple(float(x) for x in parts)
    except ValueError:
        raise input_error(flag, f"'{text[:60]}' is not a comma-separated list of seconds") from None
    bad = [v for v in values if not (math.isfinite(v) and 0 < v <= upper)]
    if bad:
        raise input_error(flag, f"{bad[0]!r} is not a positive finite number of seconds <= {upper:g}")
    return values


#: How long ``--ray-address`` may take to accept a TCP connection before the sweep is refused.
RAY_CONNECT_TIMEOUT_S = 3.0


def check_ray_address(address: str | None, backend: str) -> None:
    """Refuse, before any work, a ``--ray-address`` that is malformed, given without ``--backend ray``, or
    that nothing listens on (Ray itself retries a dead GCS address for minutes). ``auto`` is left to Ray;
    ``host:port`` and ``ray://host:port`` get one TCP connection attempt of :data:`RAY_CONNECT_TIMEOUT_S`."""
    import socket

    if address is None:
        return
    flag = f"--ray-address {address[:80]}"
    if backend != "ray":
        raise input_error(flag, "is only used with --backend ray", "add --backend ray or drop --ray-address")
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port_text = hostport.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise input_error(flag, "is not host:port, ray://host:port or auto", "e.g. --ray-address 10.0.0.5:6379")
    try:
        with socket.create_connection((host, int(port_text)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise input_error(flag, f"nothing answers there ({exc.strerror or type(exc).__name__})",
                          "start the Ray head (ray start --head) or give its GCS address") from None


def common_run_flags(replications: int | None, workers: int | None, conversations: int | None) -> None:
    """Bounds shared by recommend and capacity."""
    int_range("--replications", replications, 1, MAX_REPLICATIONS)
    int_range("--workers", workers, 0, MAX_WORKERS)
    int_range("--conversations", conversations, 1, MAX_CONVERSATIONS)


def flag_given(ctx: Any, name: str) -> bool:
    """Whether the user gave parameter ``name`` (command line or environment), not its default."""
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def refuse_preset_flags(ctx: Any, scenario: Any) -> None:
    """--model / --hardware pick the --workload preset's model and hardware: given with SCENARIO.yaml they were
    silently ignored (the scenario names its own), so they are refused."""
    if scenario is None:
        return
    for name in ("model", "hardware"):
        if flag_given(ctx, name):
            raise input_error(f"--{name}", "is only for a --workload preset (SCENARIO.yaml names its own model and "
                              "hardware, which the run uses)", f"set '{name}:' in the scenario, or drop --{name}")


def refuse_conversations_with_trace(conversations: int | None, trace_replayed: bool) -> None:
    """--conversations with a trace replay (--trace, or the scenario's workload.trace) did nothing: refused."""
    if conversations is not None and trace_replayed:
        raise input_error("--conversations", "the run replays a trace, which brings its own conversations (the "
                          "flag would change nothing)", "drop --conversations (cut the trace with workload.trace.window_s "
                          "in a scenario)")


def _takes_paths(param: Any) -> bool:
    """Whether a parameter of the Typer-built command tree holds a path (``Path``, ``Path | None``, ``list[Path]``)."""
    desc = getattr(param, "type_descriptor", None)  # typer >= 0.20 (its own click): the Python annotation
    if desc is not None:
        ann = desc.annotation
        return any(isinstance(a, type) and issubclass(a, PurePath) for a in (ann, *get_args(ann)))
    return type(getattr(param, "type", None)).__name__ == "Path"  # typer on click: click.Path


def _flag_name(param: Any) -> str:
    opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
    return max(opts, key=len) if opts else str(getattr(param, "name", "argument") or "argument").upper()


def refuse_empty_paths(command: Any) -> Any:
    """Make every path argument and option of the command tree refuse an empty value (``--out ""``).

    Typer turns ``""`` into ``Path("")``, which is ``Path(".")``: a command would read or write the current
    directory without being told to. The raw value is checked here, before that conversion, with the same
    one-line error as the other flag checks. Returns ``command``.
    """
    subcommands = getattr(command, "commands", None)
    if isinstance(subcommands, dict):
        for sub in subcommands.values():
            refuse_empty_paths(sub)
        return command
    for param in getattr(command, "params", []):
        if _takes_paths(param):
            param.process_value = _refusing_empty(param, param.process_value)
    return command


def _refusing_empty(param: Any, process: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    flag = _flag_name(param)

    def process_value(ctx: Any, value: Any) -> Any:
        values = value if isinstance(value, list | tuple) else (value,)
        if any(isinstance(v, str) and not v.strip() for v in values):
            raise input_error(flag, "is empty", "give a path (an empty one would mean the current directory)")
        return process(ctx, value)

    return process_value
