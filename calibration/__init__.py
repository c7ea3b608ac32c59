"""kvplan.calibration."""
