"""kvplan.sim: the SimPy model (planning on top of it lives in kvplan.plan).

Importing :mod:`kvplan.sim.engine` first lets :mod:`kvplan.sim.native` serve the hot modules from a compiled build
of exactly the current sources, if one exists (pure Python otherwise; ``KVPLAN_NATIVE=0`` forces it).
"""
