"""kvplan.sim."""
