"""kvplan: simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D serving."""

__version__ = "0.1.0"

# Nothing is imported here: the compiled build of the hot path is installed by the engine (sim/engine.py).

import os as _os

# Arrow allocates from malloc rather than from its default mimalloc pool, which keeps freed segments for reuse
# (sim/alloc.py). Arrow reads this when pyarrow (which pandas imports) is loaded, so it is set here, before;
# a choice the user made stays.
_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
