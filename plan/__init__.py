"""kvplan.plan: planning on top of the simulator (a layer above :mod:`kvplan.sim`, below the app).

Grids and sweeps (``grid``, ``grid_ties``, ``sweep``, ``executor``), the analytic screen and the
pull-vs-recompute break-even (``screen``, ``breakeven``), the advisor (``advice`` and its ``advice_*``
parts), policy comparison (``compare``, ``compare_rules``), the capacity search (``capacity``,
``capacity_eval``) and the one cost basis (``pricing``). No module of :mod:`kvplan.sim` imports from here
(``pyproject.toml [tool.importlinter]``).
"""

# Planning simulates: the engine installs the compiled build before any hot module is imported (sim/native.py),
# so importing a planning module first (it imports models.costs -> the hot models.formulas) still gets it.
import kvplan.sim.engine  # noqa: E402, F401
