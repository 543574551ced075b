"""``python -m nvmlcheck``: the same as the ``nvmlcheck`` command."""

from .cli import script

script()
