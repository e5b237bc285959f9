"""Shared pytest hooks: a failed multi-process test shows the logs its processes left; and
the optimality benchmark script as a fixture."""

import importlib.util
from collections.abc import Generator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

LOG_TAIL_LINES = 40
"""Enough for a worker's traceback and torchrun's failure summary."""
MAX_LOGS = 8


def log_tails(root: Path) -> str:
    """The last lines of every ``*.log`` under ``root`` (the first few, by path)."""
    parts = []
    for log in sorted(root.rglob("*.log"))[:MAX_LOGS]:
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"--- {log.relative_to(root)} (last {LOG_TAIL_LINES} of {len(lines)} lines)")
        parts.extend(lines[-LOG_TAIL_LINES:])
    return "\n".join(parts)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, each group in its collected order.

    ``make test`` runs the slow tests that keep one core busy beside the fast ones on two
    workers, which take tests in this order as they free up (``--maxschedchunk 1``): a
    4-minute test started last would leave the other worker idle for its whole length.
    Longest first balances the two. The order is the same on every worker, as
    pytest-xdist requires.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """On a failed test with a ``tmp_path``, add its processes' logs to the report.

    A testbed or torchrun job fails with one line naming its log; on CI the log is gone
    with the machine, so the report carries the logs' tails instead.
    """
    outcome = yield
    report = outcome.get_result()
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and isinstance(tmp_path, Path):
        tails = log_tails(tmp_path)
        if tails:
            report.sections.append(("logs under tmp_path", tails))


@pytest.fixture(scope="session")
def optimality_benchmark() -> ModuleType:
    """``benchmarks/optimality.py`` as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "optimality.py"
    spec = importlib.util.spec_from_file_location("optimality_benchmark", path)
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    return benchmark
