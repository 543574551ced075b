"""nvmlcheck: tell precisely and fast whether NVIDIA GPUs are clean, and when they became clean."""

__version__ = "0.1.0"
