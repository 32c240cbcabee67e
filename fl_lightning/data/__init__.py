"""Datasets, partitioners, per-client splits and partition statistics."""
