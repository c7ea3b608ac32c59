"""kvplan: simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D serving."""

__version__ = "0.1.0"
