"""Print the ``coding-agent`` preset's parameters fitted from the AgentX / Weka sample (sim/presets.py holds them).

    .venv/bin/python benchmarks/derive_agentx_preset.py [TRACE_DIR]

Default TRACE_DIR: ../shared/external_traces/agentx_weka (or KVPLAN_AGENTX). tests/test_weka.py checks that
the constants in sim/presets.py equal these numbers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = Path(os.environ.get("KVPLAN_AGENTX", HERE.parents[1] / "shared" / "external_traces" / "agentx_weka"))


def main() -> None:
    """Fit and print."""
    from kvplan.traces.weka import read_weka
    from kvplan.traces.weka_stats import coding_agent_fit

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not path.exists():
        sys.exit(f"traces not found: {path} (needs ../shared)")
    print(json.dumps(coding_agent_fit(read_weka(path)), indent=2))


if __name__ == "__main__":
    main()
