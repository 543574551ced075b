"""Private: the nvidia-smi backend's parsers. Text in, plain records out; no I/O, no ``DeviceState``.

* :mod:`.text`: what every output shares (lines, placeholders, deprecation notes, bus ids, lost-GPU lines, PIDs).
* :mod:`.aliases`: every spelling of a field mapped to its canonical name, and each field's unit.
* :mod:`.table`: the CSV engine (header-keyed columns, free-text column, typed cells).
* :mod:`.queries`: the ``--query-gpu``, ``--query-compute-apps``, ``--query-retired-pages`` and
  ``--query-remapped-rows`` parsers.
* :mod:`.pids`: the ``-q`` text parser (``-q -d PIDS``, MIG parts of a full ``-q``).
* :mod:`.small`: ``--version`` and ``-L``.
* :mod:`.ssh`: why ssh failed (its exit 255), from its stderr: shared with :mod:`nvmlcheck.hosts`.

:mod:`nvmlcheck.backends._smi_state` assembles the model from these parts; ``nvmlcheck.backends.smi_csv`` re-exports
the public names for older imports. docs/backends.md ("How nvidia-smi output is read") gives the rules and reasons.
"""
