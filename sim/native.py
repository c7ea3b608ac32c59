"""The compiled build of the simulator's hot path: the same source, compiled by mypyc, used only when current.

The model's hot modules (:data:`HOT_MODULES`: the request record, the prefill and decode engines, the decode batch,
block pools, retention and its policy, links, router and driver) are plain typed Python. ``kvplan native build``
(run by ``python3 dev.py``) compiles exactly those files with mypyc (the compiler shipped with mypy, ``pip install
'kvplan[native]'``) into a cache directory (``$KVPLAN_NATIVE_DIR``, else inside the virtual environment) named by a
digest of every source file the hot path can import (:data:`_PKG_DIRS`: the package root, ``models``, ``sim`` and
``traces``; not ``plan``, ``calibration`` or ``app``, which the layer contract keeps out of its reach) plus the
Python and mypyc versions. The engine (``kvplan.sim.engine``, at its import) calls :func:`install`, which serves
the hot modules from that build only when its digest equals the digest of those sources on disk now; after any edit
to one of them (or with ``KVPLAN_NATIVE=0``) the pure-Python modules are imported instead, so a stale build can
never run. Compiled and pure hot modules never mix: :func:`install` serves the build only when no hot module has
been imported yet, and then serves every one of them (compiled modules reach each other through their group's
shared library, so a pure copy of one would split its classes and globals in two). The two are the same program:
``tests/test_native.py`` requires byte-identical outputs from both. The build is compiled with
``-ffp-contract=off`` so that the C compiler never fuses a multiply and an add (which would change the last bit of
a float on CPUs with FMA). The manifest records the SHA-256 of every artefact and a build is used only when each
file still has it (:func:`artefact_ok`): a truncated or altered ``.so`` falls back to pure Python instead of a
SIGBUS.

What it buys: about 6x on the reference workload (``benchmarks/bench_sim.py``, ``benchmarks/results/sim.json``: 0.29
against 1.84 CPU s; README, "Performance").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

HOT_MODULES: tuple[str, ...] = (
    "kvplan.models.formulas",
    "kvplan.sim.fifo",
    "kvplan.sim.request",
    "kvplan.sim.evlog",
    "kvplan.sim.itl",
    "kvplan.sim.clock",
    "kvplan.sim.blocks",
    "kvplan.sim.batch",
    "kvplan.sim.retention",
    "kvplan.sim.retention_policy",
    "kvplan.sim.shared",
    "kvplan.sim.link",
    "kvplan.sim.xfer",
    "kvplan.sim.router",
    "kvplan.sim.scheduler",
    "kvplan.sim.peers",
    "kvplan.sim.decode",
    "kvplan.sim.prefill",
    "kvplan.sim.driver",
    "kvplan.sim.aggregated",
)
GROUP = "kvplan_native"  # mypyc's shared library of the group: kvplan_native__mypyc
MANIFEST = "build.json"
_PKG_DIRS = ("", "models", "sim", "traces")  # every module the hot path can import (mypy analyses them)
ENV_SWITCH = "KVPLAN_NATIVE"  # "0": always pure Python
ENV_DIR = "KVPLAN_NATIVE_DIR"  # where builds live (default: inside the virtual environment)


def package_root() -> Path:
    """The directory of the ``kvplan`` package (the repository root in an editable install)."""
    return Path(__file__).resolve().parent.parent


def _sources(root: Path) -> list[Path]:
    out: list[Path] = []
    for d in _PKG_DIRS:
        out.extend(sorted((root / d).glob("*.py")))
    return out


def source_digest(root: Path | None = None) -> str:
    """Digest of every source file a build depends on, the interpreter and the compiler version."""
    root = root or package_root()
    h = hashlib.sha256()
    h.update(f"{sys.implementation.cache_tag} {platform.machine()} {sysconfig.get_config_var('SOABI')}".encode())
    h.update(_mypyc_version().encode())
    for p in _sources(root):
        h.update(str(p.relative_to(root)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _mypyc_version() -> str:
    try:
        from importlib.metadata import version

        return "mypy " + version("mypy")
    except Exception:  # noqa: BLE001 - not installed: builds are impossible, the digest still names that
        return "mypy absent"


def cache_dir() -> Path:
    """Where builds live: ``$KVPLAN_NATIVE_DIR``, else ``<sys.prefix>/kvplan-native`` (the venv) when that is
    writable, else ``~/.cache/kvplan/native``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    prefix = Path(sys.prefix)
    if os.access(prefix, os.W_OK):
        return prefix / "kvplan-native"
    return Path.home() / ".cache" / "kvplan" / "native"


def portable_cache_dir() -> str:
    """:func:`cache_dir` by the rule that chose it, not as this machine's path, for files that record it (benchmark
    results): ``$KVPLAN_NATIVE_DIR``, ``<venv>/kvplan-native`` or ``~/.cache/kvplan/native``. The build itself is
    named by its digest, which :func:`status` records beside it."""
    if os.environ.get(ENV_DIR):
        return f"${ENV_DIR}"
    if os.access(Path(sys.prefix), os.W_OK):
        return "<venv>/kvplan-native"
    return "~/.cache/kvplan/native"


def current_build(root: Path | None = None) -> Path | None:
    """The build directory matching the sources on disk now, or None."""
    d = cache_dir() / source_digest(root)
    try:
        meta = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):  # a damaged manifest: no build, never a crash at import
        return None
    if not isinstance(meta, dict) or sorted(meta.get("files", {})) != sorted(HOT_MODULES + (f"{GROUP}__mypyc",)):
        return None
    digests = meta.get("sha256")
    if not isinstance(digests, dict):
        return None  # a build from before artefact digests: rebuilt, never trusted
    for name, f in meta["files"].items():
        if not isinstance(f, str) or "/" in f or not artefact_ok(d / f, digests.get(name)):
            return None
    return d


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1024**2), b""):
            h.update(block)
    return h.hexdigest()


def artefact_ok(path: Path, expected: object) -> bool:
    """True when ``path`` is a regular file whose SHA-256 is ``expected`` (the build manifest's): a truncated
    or altered shared library is never loaded (mapping a truncated ``.so`` ends the process with SIGBUS)."""
    try:
        return path.is_file() and not path.is_symlink() and isinstance(expected, str) and file_sha256(path) == expected
    except OSError:
        return False


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the compiled hot modules (and their shared library) from one build directory."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None):  # noqa: D102
        f = self.files.get(fullname)
        if f is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(f))
        return importlib.util.spec_from_file_location(fullname, f, loader=loader)


_STATE: dict[str, object] = {"active": False, "reason": "not checked"}


def install() -> bool:
    """Serve the hot modules from the current build if there is one (called once, by ``kvplan.sim.engine``).

    All or nothing: when a hot module is already imported (pure Python, by whoever ran before the engine),
    no build is served and the reason is recorded for :func:`status`."""
    if _STATE["reason"] != "not checked":
        return bool(_STATE["active"])
    switch = os.environ.get(ENV_SWITCH, "1").strip()
    if switch == "0":
        _STATE.update(active=False, reason=f"{ENV_SWITCH}=0")
        return False
    if switch not in ("1", ""):  # a typo must not pass unnoticed: said once, then the default (compiled when current)
        logging.getLogger(__name__).warning("warning: %s=%r is neither 0 (pure Python) nor 1 (the compiled build when "
                                            "current): taken as 1", ENV_SWITCH, switch)
    if any(m in sys.modules for m in HOT_MODULES):
        first = next(m for m in HOT_MODULES if m in sys.modules)
        _STATE.update(active=False, reason=f"a hot module ({first}) was imported before the engine (kvplan.sim.engine): "
                                           "import the engine first")
        return False
    try:
        d = current_build()
    except OSError as e:
        _STATE.update(active=False, reason=f"sources unreadable: {e}")
        return False
    if d is None:
        _STATE.update(active=False, reason="no build for the current sources (run `kvplan native build`)")
        return False
    meta = json.loads((d / MANIFEST).read_text())
    sys.meta_path.insert(0, _Finder({name: d / f for name, f in meta["files"].items()}))
    _STATE.update(active=True, reason=f"compiled build {d.name}")
    return True


def status(portable: bool = False) -> dict[str, object]:
    """Whether the compiled build is in use, and why (for ``kvplan native status`` and benchmarks). ``cache_dir`` is
    this machine's directory, or with ``portable`` (what a results file records) :func:`portable_cache_dir`."""
    importlib.import_module("kvplan.sim.engine")  # the engine decides (install) first; a no-op once imported
    import kvplan.sim.decode as dec

    compiled = not str(getattr(dec, "__file__", "")).endswith(".py")
    return {"active": bool(_STATE["active"]) and compiled, "reason": _STATE["reason"], "digest": source_digest(),
            "cache_dir": portable_cache_dir() if portable else str(cache_dir())}


def _prune(keep: int) -> None:
    """Remove all but the ``keep`` newest builds (only directories carrying kvplan's build manifest)."""
    builds = [d for d in cache_dir().iterdir() if d.is_dir() and (d / MANIFEST).is_file()]
    builds.sort(key=lambda d: (d / MANIFEST).stat().st_mtime, reverse=True)
    for d in builds[keep:]:
        shutil.rmtree(d, ignore_errors=True)


def check_cache_dir() -> Path:
    """The build cache directory, created if needed; a one-line error naming ``$KVPLAN_NATIVE_DIR`` (or the default
    location) when it is not a directory or cannot be created, raised before the ~30 s compile rather than after."""
    from kvplan.errors import input_error

    d = cache_dir()
    where = f"{ENV_DIR} {d}" if os.environ.get(ENV_DIR) else f"build cache {d}"
    if d.exists() and not d.is_dir():
        raise input_error(where, "is not a directory", f"point {ENV_DIR} at a directory (or unset it)")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise input_error(where, f"cannot be created ({exc.strerror or exc})",
                          f"point {ENV_DIR} at a directory you can write to") from None
    return d


def build(quiet: bool = True) -> Path:
    """Compile :data:`HOT_MODULES` with mypyc into the cache (a no-op when the current build exists).

    Works on a copy of the sources in a temporary directory laid out as the package ``kvplan``; the build
    directory is filled beside its final place and renamed in only when complete (manifest last).
    """
    root = package_root()
    digest = source_digest(root)
    final = cache_dir() / digest
    if current_build(root) is not None:
        return final
    check_cache_dir()
    try:
        import mypyc  # noqa: F401
    except ImportError as e:
        raise RuntimeError("mypyc is not installed: pip install 'kvplan[native]' (it comes with mypy)") from e
    with tempfile.TemporaryDirectory(prefix="kvplan-native-") as tmp:
        work = Path(tmp)
        for p in _sources(root):
            dest = work / "kvplan" / p.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
        # mypy options first (mypycify takes them with the paths): a library without stubs (pandas, PyYAML in an
        # environment without the dev extra) is Any to mypy; no hot module uses one
        paths = ["--ignore-missing-imports", *(str(Path(*m.split("."))) + ".py" for m in HOT_MODULES)]
        script = (
            "import sys\nfrom setuptools import setup\nfrom mypyc.build import mypycify\n"
            f"setup(name={GROUP!r}, ext_modules=mypycify({paths!r}, opt_level='3', group_name={GROUP!r}),"
            " script_args=['build_ext', '--inplace'])\n"
        )
        env = dict(os.environ, CFLAGS=(os.environ.get("CFLAGS", "") + " -ffp-contract=off").strip())
        env.pop(ENV_SWITCH, None)
        res = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"mypyc build failed:\n{tail}")
        files: dict[str, str] = {}
        stage = final.parent / f".{digest}.tmp{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        for name in HOT_MODULES + (f"{GROUP}__mypyc",):
            src = work / (str(Path(*name.split("."))) + suffix)
            if not src.is_file():
                raise RuntimeError(f"mypyc build produced no {src.name}")
            shutil.copy2(src, stage / src.name)
            files[name] = src.name
        sha = {name: file_sha256(stage / f) for name, f in files.items()}
        (stage / MANIFEST).write_text(json.dumps({"digest": digest, "files": files, "sha256": sha,
                                                  "mypyc": _mypyc_version()}))
        if final.exists():
            shutil.rmtree(final)  # an incomplete build of the same digest (no valid manifest): ours, replace it
        stage.rename(final)
    _prune(keep=3)
    if not quiet:
        print(f"compiled {len(HOT_MODULES)} modules into {final}")
    return final
