"""One collective's buffers, fill and check for timed runs on a rank.

A timed run is only worth its number if its result is right, so every measuring path
(the testbed worker, ``hipipe tune`` under torchrun) fills its buffers with values whose
result is known in closed form and checks them after the warm-ups and the last repeat,
with one small all_reduce and no reference copy of the data:

- AllReduce: rank r fills ``r + 1``; every element ends as ``N (N + 1) / 2``.
- ReduceScatter: rank r fills shard s of its input with ``(r + 1)(s + 1)``; rank r's
  output ends as ``(r + 1) N (N + 1) / 2``, which also proves it got shard r.
- AllGather: rank r fills its input with ``r + 1``; shard s of every output ends as
  ``s + 1``, which proves the order of the shards.

The values are small integers, exact in every dtype the executor runs.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hipipe.schedule import Collective
from hipipe.torch.executor import HierarchicalCollective, Trace


class Workload:
    """Buffers of one collective on this rank (mutable: they are refilled before every run)."""

    def __init__(self, collective: Collective, message_bytes: int, dtype: torch.dtype) -> None:
        self.collective = collective
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        itemsize = torch.empty(0, dtype=dtype).element_size()
        numel = message_bytes // itemsize
        shard = numel // self.world
        if collective is Collective.ALL_REDUCE:
            self.input = torch.empty(numel, dtype=dtype)
            self.output = self.input
        elif collective is Collective.REDUCE_SCATTER:
            self.input = torch.empty(shard * self.world, dtype=dtype)
            self.output = torch.empty(shard, dtype=dtype)
        else:
            self.input = torch.empty(shard, dtype=dtype)
            self.output = torch.empty(shard * self.world, dtype=dtype)

    def fill(self, index: int = 0) -> None:
        """Known inputs (see the module docstring); ``index`` is the run's (unused: same each run)."""
        del index
        if self.collective is Collective.REDUCE_SCATTER:
            shards = self.input.view(self.world, -1)
            for s in range(self.world):
                shards[s].fill_(float((self.rank + 1) * (s + 1)))
            self.output.zero_()
        else:
            self.input.fill_(float(self.rank + 1))
            if self.output is not self.input:
                self.output.zero_()

    def check(self) -> None:
        """Raise on every rank unless every rank's result is the closed form (collective)."""
        total = self.world * (self.world + 1) // 2
        if self.collective is Collective.ALL_REDUCE:
            wrong = int((self.output != total).sum().item())
        elif self.collective is Collective.REDUCE_SCATTER:
            wrong = int((self.output != (self.rank + 1) * total).sum().item())
        else:
            expected = torch.arange(1, self.world + 1, dtype=self.output.dtype).repeat_interleave(
                self.output.numel() // self.world
            )
            wrong = int((self.output != expected).sum().item())
        flags = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(flags)
        if int(flags.item()):
            raise RuntimeError(f"wrong {self.collective.value} result: {int(flags.item())} elements differ")

    def hipipe_run(
        self, executor: HierarchicalCollective, *, trace: bool = False
    ) -> Callable[[], Trace | None]:
        """The executor's call for this collective, on these buffers."""
        if self.collective is Collective.ALL_REDUCE:
            return lambda: executor.all_reduce(self.input, trace=trace)
        if self.collective is Collective.REDUCE_SCATTER:
            return lambda: executor.reduce_scatter(self.output, self.input, trace=trace)
        return lambda: executor.all_gather(self.output, self.input, trace=trace)

    def torch_run(self, group: Any = None) -> Callable[[], object]:
        """torch.distributed's own call for this collective, on these buffers."""
        if self.collective is Collective.ALL_REDUCE:
            return lambda: dist.all_reduce(self.input, group=group)
        if self.collective is Collective.REDUCE_SCATTER:
            return lambda: dist.reduce_scatter_tensor(self.output, self.input, group=group)
        return lambda: dist.all_gather_into_tensor(self.output, self.input, group=group)
