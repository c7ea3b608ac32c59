"""kvplan: simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D serving."""

__version__ = "0.1.0"

# Nothing is imported here: the compiled build of the hot path is installed by the engine (sim/engine.py).
