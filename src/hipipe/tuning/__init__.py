"""Autotuning: measure a few good schedules on the real network, keep the fastest.

- :mod:`.cache` -- the JSON cache keyed by (topology fingerprint, collective, size,
  dtype) and :func:`load_tuned`, the torch-free lookup ``hipipe run``, the DDP hook and
  FSDP comms use;
- :mod:`.candidates` -- what is measured (hipipe's best few, every baseline) and the
  selection (smallest median);
- :mod:`.testbed` -- ``hipipe tune --testbed`` (root); the torchrun form is
  :mod:`hipipe.torch.tune`.

Only :mod:`.cache` and :mod:`.candidates` are imported here: looking a schedule up must
not pull in the testbed or torch.
"""

from hipipe.tuning.cache import (
    Measurement,
    TunedEntry,
    TuningError,
    TuningKey,
    find_entry,
    load_tuned,
    read_cache,
    topology_fingerprint,
    write_entry,
)
from hipipe.tuning.candidates import Candidate, select_fastest, tuning_candidates

__all__ = [
    "Candidate",
    "Measurement",
    "TunedEntry",
    "TuningError",
    "TuningKey",
    "find_entry",
    "load_tuned",
    "read_cache",
    "select_fastest",
    "topology_fingerprint",
    "tuning_candidates",
    "write_entry",
]
