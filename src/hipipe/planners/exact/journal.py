"""A proof's journal: the regions a floor proof has answered, so a later run resumes it.

Why: the floors still open on the reference grid need hours of MIPs (libra-4d at 256 MiB,
AllReduce, five chunks: 3851 s on two processes; at 1 GiB and seven chunks, 5 of 120
first-dim regions in 300 s), more than one sitting of a 2-core host holds. A floor's
regions are independent facts ("no schedule whose chunks' orders begin with these prefixes
is faster than X"), true whichever run found them, so a run that stops early (a time limit,
Ctrl-C, a reboot) need not lose them.

The file is JSON lines. The first names the question (topology, message, collective, the
most chunks, the floor, and :data:`REGION_CONVENTION`); a journal is only ever read for the
question it was written for, anything else is refused with one line. Every later line is
one region's answer: ``settled`` (its MIP pruned or solved it: nothing there below the floor)
or ``refined`` (it was split by the next dim of the orders, which covers it: a resumed run
splits it at once instead of spending its refinement time again). Lines are appended and
flushed to disk one by one, so a run killed at any moment leaves every answer before the
last line; a torn last line (killed mid-write) is dropped when the journal is read, a torn
line anywhere else is refused. Regions left open (a leaf at its time limit, regions never
reached) are not written: a resumed run tries them again. A schedule found below the floor
is not written either: it ends the proof, and the run that found it reports it.
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hipipe.errors import HipipeError
from hipipe.planners.exact.model import Order

REGION_CONVENTION = 1
"""What a region's prefixes mean: chunk j's order (used chunks first, sorted by order
index, unused chunks last with free orders; :mod:`~hipipe.planners.exact.first_dims`)
begins with ``prefixes[j]``. Bumped if that convention ever changes, so that old journals
are refused rather than misread."""

Outcome = Literal["settled", "refined"]
OUTCOMES: tuple[Outcome, ...] = ("settled", "refined")


class ProofJournal:
    """The answered regions of one floor proof, read from ``path`` and appended to it."""

    def __init__(self, path: str | Path, question: dict[str, Any]) -> None:
        """Open (or start) the journal at ``path`` for ``question`` (JSON-serializable)."""
        self.path = Path(path)
        self.question = json.loads(json.dumps(question))  # as it reads back from the file
        self._outcomes: dict[tuple[Order, ...], Outcome] = {}
        if self.path.exists():
            self._read()
        else:
            self._start()

    def _start(self) -> None:
        """Write the question line to a file of its own, then link it in: a journal is
        either whole or absent, and a journal another run started meanwhile is kept."""
        header = json.dumps({"question": self.question}, sort_keys=True) + "\n"
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        try:
            with open(staging, "w", encoding="utf-8") as stream:
                stream.write(header)
                stream.flush()
                os.fsync(stream.fileno())
            os.link(staging, self.path)
        except FileExistsError:
            self._read()  # started by another run since we looked: join it
        except OSError as error:
            raise HipipeError(f"cannot start the proof journal {self.path}: {error.strerror}") from None
        finally:
            staging.unlink(missing_ok=True)

    def _read(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise HipipeError(f"cannot read the proof journal {self.path}: {error}") from None
        lines = text.split("\n")
        torn = lines.pop()  # "" when the file ends with a newline, else a line cut short
        if not lines:
            raise HipipeError(f"the proof journal {self.path} has no question line: not a journal")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            raise HipipeError(f"the proof journal {self.path} does not start with a question line") from None
        if not isinstance(header, dict) or header.get("question") != self.question:
            raise HipipeError(
                f"the proof journal {self.path} was written for another question"
                f" ({_describe(header.get('question') if isinstance(header, dict) else None)});"
                f" this proof asks {_describe(self.question)}: give it another file"
            )
        for number, line in enumerate(lines[1:], start=2):
            prefixes, outcome = _parse_entry(line, self.path, number)
            self._outcomes[prefixes] = outcome
        if torn:
            # A run killed mid-write: drop the partial line so the next append starts clean.
            with open(self.path, "r+", encoding="utf-8") as stream:
                stream.truncate(len(text.encode("utf-8")) - len(torn.encode("utf-8")))

    def outcome(self, prefixes: Sequence[Order]) -> Outcome | None:
        """What an earlier run answered for the region ``prefixes``; None if it did not."""
        return self._outcomes.get(tuple(tuple(p) for p in prefixes))

    def record(self, prefixes: Sequence[Order], outcome: Outcome) -> None:
        """Append the answer for region ``prefixes`` and flush it to disk."""
        key = tuple(tuple(int(d) for d in p) for p in prefixes)
        line = json.dumps({"prefixes": [list(p) for p in key], "outcome": outcome}) + "\n"
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(line)
            stream.flush()
            os.fsync(stream.fileno())
        self._outcomes[key] = outcome

    def __len__(self) -> int:
        return len(self._outcomes)


def _parse_entry(line: str, path: Path, number: int) -> tuple[tuple[Order, ...], Outcome]:
    """One region line: its prefixes (lists of dims) and its outcome."""
    try:
        entry = json.loads(line)
        prefixes = tuple(tuple(int(d) for d in prefix) for prefix in entry["prefixes"])
        outcome = entry["outcome"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise HipipeError(f"the proof journal {path} has a malformed line {number}") from None
    if outcome not in OUTCOMES:
        raise HipipeError(f"the proof journal {path} line {number}: unknown outcome {outcome!r}")
    return prefixes, outcome


def _describe(question: object) -> str:
    """A short account of a question for an error line."""
    if not isinstance(question, dict):
        return "no question"
    keys = ("topology_name", "message_bytes", "collective", "max_chunks", "floor_s")
    return ", ".join(f"{key} {question.get(key)}" for key in keys)
