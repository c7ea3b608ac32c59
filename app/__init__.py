"""kvplan.app."""
