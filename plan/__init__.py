"""kvplan.plan: planning on top of the simulator (a layer above :mod:`kvplan.sim`, below the app).

Grids and sweeps (``grid``, ``grid_ties``, ``sweep``, ``executor``), the analytic screen and the
pull-vs-recompute break-even (``screen``, ``breakeven``), the advisor (``advice`` and its ``advice_*``
parts), policy comparison (``compare``, ``compare_rules``), the capacity search (``capacity``,
``capacity_eval``) and the one cost basis (``pricing``). No module of :mod:`kvplan.sim` imports from here
(``pyproject.toml [tool.importlinter]``).
"""
