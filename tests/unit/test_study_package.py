"""``nvmlcheck.study`` as a package: the names it had as one module still import from it, the old module paths
(``nvmlcheck.holder``, ``nvmlcheck.compare``, ``nvmlcheck.simulate.StubHolderFactory``) still work, and importing it
(or running the holder child through it) stays light."""

from __future__ import annotations

import subprocess
import sys

from nvmlcheck import study

# nvmlcheck.study.__all__ when it was one module (issue 13): every name must keep importing from the package.
OLD_NAMES = {
    "ENDINGS", "MEASURES", "RECORD_SCHEMA", "RECORD_VERSION", "SLEEP_REFERENCE_NS", "BaselineNotClean",
    "Concurrency", "CudaHolderFactory", "DeviceRun", "Ending", "Holder", "HolderError", "HolderFactory",
    "PlotUnavailable", "RecordFormatError", "RunRecord", "Stats", "StudyConfig", "StudyError", "StudyProgress",
    "StudyResult", "SummaryRow", "WarmUp", "format_summary", "load_records", "median_run", "parse_ending",
    "percentile", "plot_run_trace", "plot_time_to_clean", "record_writer", "run_study", "summarize",
    "write_records",
}


def test_every_old_name_resolves_from_the_package() -> None:
    assert OLD_NAMES <= set(study.__all__) == set(study._LAZY)  # the third edition added names (issue 26)
    for name in study.__all__:
        value = getattr(study, name)
        assert value is getattr(__import__(f"nvmlcheck.study.{study._LAZY[name]}", fromlist=[name]), name)
    assert study.run_study.__module__ == "nvmlcheck.study.runner"


def test_old_module_paths_are_the_new_objects() -> None:
    import nvmlcheck.compare
    import nvmlcheck.holder
    import nvmlcheck.simulate
    from nvmlcheck.study import child, compare, stub_holder

    assert all(getattr(nvmlcheck.compare, n) is getattr(compare, n) for n in nvmlcheck.compare.__all__)
    assert set(nvmlcheck.compare.__all__) == set(compare.__all__)
    assert all(getattr(nvmlcheck.holder, n) is getattr(child, n) for n in nvmlcheck.holder.__all__)
    assert set(nvmlcheck.holder.__all__) == set(child.__all__)
    assert nvmlcheck.simulate.StubHolderFactory is stub_holder.StubHolderFactory
    assert nvmlcheck.simulate.CONTEXT_BYTES == stub_holder.CONTEXT_BYTES


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_holder_child_and_the_package_import_light() -> None:
    heavy = {"nvmlcheck.study.runner", "nvmlcheck.predicates", "nvmlcheck.model", "nvmlcheck.wait"}
    assert not heavy & _loaded_after("import nvmlcheck.holder")
    assert not heavy & _loaded_after("import nvmlcheck.study")
    assert "matplotlib" not in _loaded_after("import nvmlcheck.study.plots")


def test_python_m_nvmlcheck_holder_still_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "nvmlcheck.holder", "--help"], check=False, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "python -m nvmlcheck.holder" in done.stdout
