"""The simulator (private): the stub libnvidia-ml's build, the scenario language, running the stub, its call log
and probe. :mod:`nvmlcheck.testing` is its public face; ``--simulate`` and ``nvmlcheck demo`` use it directly.

Modules: ``symbols`` (the stub's exports and build variants), ``build`` (compiling, cached), ``scenario`` (the
scenario language), ``session`` (running the stub: :class:`~nvmlcheck._sim.session.StubSession`, ``simulation``,
``use_stub``), ``calllog``, ``probe`` (ctypes). Nothing heavy is imported here.
"""
