"""Differential privacy: accountants over well-kept libraries (`accountant.py`)."""
