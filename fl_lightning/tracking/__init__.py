"""Loggers (W&B, run-directory files), console output, comparison tables and plots."""
