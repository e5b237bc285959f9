"""Output files and scratch directories (hipipe.files)."""

import tempfile
from pathlib import Path

import pytest

from hipipe.files import atomic_write_text, scratch_dir


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary-files root, so the tests see only their own directories."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_a_scratch_directory_is_removed_after_success(scratch: Path) -> None:
    with scratch_dir(None, prefix="hipipe-test-") as directory:
        assert directory.parent == scratch and directory.name.startswith("hipipe-test-")
        atomic_write_text(directory / "rank0.log", "fine\n")
    assert list(scratch.iterdir()) == []


def test_a_scratch_directory_with_logs_is_kept_after_an_error(scratch: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="rank 0 failed"),
        scratch_dir(None, prefix="hipipe-test-") as directory,
    ):
        (directory / "rank0.log").write_text("Traceback ...\n")
        raise RuntimeError(f"rank 0 failed (logs in {directory})")
    assert [p.name for p in directory.iterdir()] == ["rank0.log"]


def test_an_empty_scratch_directory_is_removed_after_an_error(scratch: Path) -> None:
    with pytest.raises(KeyboardInterrupt), scratch_dir(None, prefix="hipipe-test-"):
        raise KeyboardInterrupt
    assert list(scratch.iterdir()) == []


def test_a_given_directory_is_never_removed(tmp_path: Path) -> None:
    given = tmp_path / "work"
    given.mkdir()
    with scratch_dir(given, prefix="hipipe-test-") as directory:
        assert directory == given
        (directory / "job.json").write_text("{}")
    assert (given / "job.json").exists()
