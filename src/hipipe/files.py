"""Writing output files so that a failure never leaves a half-written file behind, and
scratch directories that do not outlive a successful run."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _default_mode() -> int:
    """Mode a plain ``open(path, "w")`` would give: 0o666 less the process umask.

    mkstemp creates 0o600 files; outputs meant to be shared (reports, plots) should not
    silently become private. The umask can only be read by setting it, so it is set back.
    """
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, _default_mode())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextmanager
def scratch_dir(given: Path | None, *, prefix: str) -> Iterator[Path]:
    """``given`` as is, or a new temporary directory (``prefix`` + random) that is removed
    when the block succeeds. After an error it stays unless empty: testbed errors name the
    worker logs in it, and those logs are what the user needs next."""
    if given is not None:
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        if not any(path.iterdir()):  # nothing to read: no reason to keep it
            path.rmdir()
        raise
    shutil.rmtree(path, ignore_errors=True)
