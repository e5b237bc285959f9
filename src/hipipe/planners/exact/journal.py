"""A proof's journal: the regions a floor proof has answered, so a later run resumes it.

Why: the floors still open on the reference grid need hours of MIPs (libra-4d at 256 MiB,
AllReduce, five chunks: 3851 s on two processes; at 1 GiB and seven chunks, 5 of 120
first-dim regions in 300 s), more than one sitting of a 2-core host holds. A floor's
regions are independent facts ("no schedule whose chunks' orders begin with these prefixes
is faster than X"), true whichever run found them, so a run that stops early (a time limit,
Ctrl-C, a reboot) need not lose them.

The file is JSON lines. The first names the instance (topology, message, collective, the
most chunks, and :data:`REGION_CONVENTION`); a journal is only ever read for the instance
it was written for, anything else is refused with one line. Every later line is one
region's answer: ``settled`` at a floor (its MIP pruned or solved it: nothing there below
that floor, hence below any lower one either) or ``refined`` (it was split by the next dim
of the orders, which covers it whatever the floor: a resumed run splits it at once instead
of spending its refinement time again). The floor is per line, not per file, because the
floors asked of one instance move: the optimality benchmark asks hipipe's makespan less 5%,
or hipipe's makespan itself, and a run that answers the higher floor answers the lower.
Lines are appended and flushed to disk one by one, so a run killed at any moment leaves
every answer before the last line; a torn last line (killed mid-write) is dropped when the
journal is read, a damaged line anywhere else is refused. A leaf left open at its time
limit is written ``open``, with that limit and the MIP's bound: a resumed run asking the
same floor or a higher one with no longer a limit counts it open at once instead of
spending the limit again (at 1 GiB on libra-4d each such leaf held its 900 s), and a
longer limit tries it again. Regions never reached are not written. A schedule found below
the floor is not written either: it ends the proof, and the run that found it reports it.
"""

import json
import math
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

Outcome = Literal["settled", "refined", "open"]
OUTCOMES: tuple[Outcome, ...] = ("settled", "refined", "open")
Region = tuple[Order, ...]


class ProofJournal:
    """The answered regions of floor proofs on one instance, read from ``path`` and
    appended to it."""

    def __init__(self, path: str | Path, question: dict[str, Any]) -> None:
        """Open (or start) the journal at ``path`` for the instance ``question``
        (JSON-serializable: everything a floor proof asks but the floor)."""
        self.path = Path(path)
        self.question = json.loads(json.dumps(question))  # as it reads back from the file
        self._settled_s: dict[Region, float] = {}
        """Each settled region's highest floor."""
        self._refined: set[Region] = set()
        self._open: dict[Region, list[tuple[float, float, float]]] = {}
        """Each leaf left open: (floor, time limit, the MIP's bound), all in seconds."""
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
                f"the proof journal {self.path} was written for another instance"
                f" ({_describe(header.get('question') if isinstance(header, dict) else None)});"
                f" this proof asks about {_describe(self.question)}: give it another file"
            )
        for number, line in enumerate(lines[1:], start=2):
            self._note(*_parse_entry(line, self.path, number))
        if torn:
            # A run killed mid-write: drop the partial line so the next append starts clean.
            with open(self.path, "r+", encoding="utf-8") as stream:
                stream.truncate(len(text.encode("utf-8")) - len(torn.encode("utf-8")))

    def _note(self, region: Region, outcome: Outcome, floor_s: float, limit_s: float, bound_s: float) -> None:
        if outcome == "settled":
            self._settled_s[region] = max(floor_s, self._settled_s.get(region, floor_s))
        elif outcome == "refined":
            self._refined.add(region)
        else:
            self._open.setdefault(region, []).append((floor_s, limit_s, bound_s))

    def outcome(self, prefixes: Sequence[Order], floor_s: float) -> Outcome | None:
        """What earlier runs answered for the region ``prefixes`` asked about ``floor_s``:
        settled at that floor or a higher one, else split, else None."""
        region = _region(prefixes)
        if self._settled_s.get(region, -math.inf) >= floor_s:
            return "settled"
        return "refined" if region in self._refined else None

    def open_bound_s(self, prefixes: Sequence[Order], floor_s: float, limit_s: float) -> float | None:
        """The bound (seconds) an earlier run left the leaf ``prefixes`` open with, if it
        asked ``floor_s`` or a lower floor (an easier question) for ``limit_s`` or longer;
        None if no such run: the leaf is to be tried."""
        bounds = [
            bound_s
            for asked_s, given_s, bound_s in self._open.get(_region(prefixes), [])
            if asked_s <= floor_s and given_s >= limit_s
        ]
        return max(bounds) if bounds else None

    def record(
        self, prefixes: Sequence[Order], outcome: Literal["settled", "refined"], floor_s: float
    ) -> None:
        """Append the answer for region ``prefixes`` at ``floor_s`` and flush it to disk."""
        self._append(_region(prefixes), outcome, float(floor_s))

    def record_open(self, prefixes: Sequence[Order], floor_s: float, limit_s: float, bound_s: float) -> None:
        """Append that the leaf ``prefixes`` stayed open at ``floor_s`` after ``limit_s``
        seconds, its MIP's bound ``bound_s``, and flush it to disk."""
        self._append(_region(prefixes), "open", float(floor_s), float(limit_s), float(bound_s))

    def _append(
        self, region: Region, outcome: Outcome, floor_s: float, limit_s: float = 0.0, bound_s: float = 0.0
    ) -> None:
        entry: dict[str, Any] = {
            "prefixes": [list(p) for p in region],
            "outcome": outcome,
            "floor_s": floor_s,
        }
        if outcome == "open":
            entry |= {"limit_s": limit_s, "bound_s": bound_s}
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(entry) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        self._note(region, outcome, floor_s, limit_s, bound_s)


def _region(prefixes: Sequence[Order]) -> Region:
    return tuple(tuple(int(d) for d in p) for p in prefixes)


def _parse_entry(line: str, path: Path, number: int) -> tuple[Region, Outcome, float, float, float]:
    """One region line: its prefixes (lists of dims), its outcome, the floor asked, and for
    an open leaf its time limit and bound (0 otherwise)."""
    try:
        entry = json.loads(line)
        region = _region(entry["prefixes"])
        outcome = entry["outcome"]
        floor_s = float(entry["floor_s"])
        open_leaf = outcome == "open"
        limit_s = float(entry["limit_s"]) if open_leaf else 0.0
        bound_s = float(entry["bound_s"]) if open_leaf else 0.0
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise HipipeError(f"the proof journal {path} has a malformed line {number}") from None
    if outcome not in OUTCOMES:
        raise HipipeError(f"the proof journal {path} line {number}: unknown outcome {outcome!r}")
    for name, value in (("floor", floor_s), *((("limit", limit_s), ("bound", bound_s)) if open_leaf else ())):
        if not (value > 0 and math.isfinite(value)):
            raise HipipeError(f"the proof journal {path} line {number}: {name} {value!r} is not a time")
    return region, outcome, floor_s, limit_s, bound_s


def _describe(question: object) -> str:
    """A short account of a question for an error line."""
    if not isinstance(question, dict):
        return "no question"
    keys = ("topology_name", "message_bytes", "collective", "max_chunks")
    return ", ".join(f"{key} {question.get(key)}" for key in keys)
