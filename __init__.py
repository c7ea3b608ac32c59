"""kvplan: simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D serving."""

__version__ = "0.1.0"

# Serve the simulator's hot modules from a compiled build of exactly these sources, if one exists, before any
# of them (kvplan.models.formulas is one) can be imported through another path (sim/native.py).
from kvplan.sim import native as _native  # noqa: E402

_native.install()
