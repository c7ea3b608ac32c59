"""kvplan.models."""
