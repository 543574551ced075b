"""Tests that need the compiled stub libnvidia-ml (a package so its conftest does not clash with tests/conftest.py)."""
