"""kvplan.app.pages."""
