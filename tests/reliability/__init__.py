"""Issue 6: every known NVML and nvidia-smi failure, proven end to end on the stub libnvidia-ml and the fake
nvidia-smi (a package so its conftest does not clash with tests/conftest.py). docs/reliability.md maps each scenario
to its test."""
