"""ReduceScatter and AllGather on local Gloo processes, checked against torch's own collectives.

(AllReduce too, for the single-issuer path only: the threaded AllReduce has its own file.)

One spawned job per topology runs every case (the process groups are made once) and
returns one verdict per case and rank. int64 (and every AllGather, which only copies)
must match ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` bit for bit; float32
and bfloat16 ReduceScatters within a tolerance. Shard lengths are odd, random schedules
bring uneven and empty chunks and mixed orders. Every RS/AG case counts the bytes each
rank hands to ``isend``: the ring's ``(n-1)/n`` per level, (N-1)/N of the message in
all, and no more. Misuse is refused in one line on every rank.
"""

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hipipe.errors import HipipeError
from hipipe.planners import PLANNERS, plan
from hipipe.schedule import Chunk, Collective, Schedule
from hipipe.simulator import simulate_chunks
from hipipe.topology_io import load_topology

torch = pytest.importorskip("torch")

from hipipe.torch.launch import raise_on_failure, spawn  # noqa: E402

TOPOLOGIES = {
    "2x2x2": "ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us",
    "2x4": "ring:2:4GB/s:1us,ring:4:1GB/s:1us",
}
BASELINES = ("ring", "hierarchical", "pipelined", "themis")
KINDS = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER)
SHARD_NUMEL = {"int64": 5001, "float32": 1251, "bfloat16": 627}
"""Elements per shard: odd, so no chunk split is a round number."""
ITEMSIZE = {"int64": 8, "float32": 4, "bfloat16": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One RS or AG on every rank; the schedule is planned once, in the parent."""

    name: str
    schedule_json: str
    dtype: str
    op: str = "sum"
    mesh: bool = False
    """Run on a DeviceMesh whose ranks are placed at random (ring order from the mesh)."""
    issue: str = "auto"
    """``ordered``: one thread issues every op in the global order (the CUDA path, serial on CPU)."""


def planners_for(collective: Collective, topology: Any) -> list[str]:
    """Every planner that plans this collective; every baseline must be among them."""
    names = []
    for name in PLANNERS:
        try:
            plan(topology, 8 * 64, name, collective=collective)
        except HipipeError:
            continue
        names.append(name)
    assert set(BASELINES) <= set(names), names
    return names


def random_schedule(spec: str, message_bytes: int, seed: int, collective: Collective) -> Schedule:
    """Uneven chunks (one empty), a random order of single dims per chunk, FIFO sequences."""
    topology = load_topology(spec)
    rng = random.Random(seed)
    weights = [rng.random() ** 3 for _ in range(rng.randint(3, 9))]
    weights[rng.randrange(len(weights))] = 0.0
    chunks = []
    for j, weight in enumerate(weights):
        order = list(range(topology.num_dims))
        rng.shuffle(order)
        chunks.append(
            Chunk(index=j, size_bytes=message_bytes * weight / sum(weights), order=tuple((k,) for k in order))
        )
    return simulate_chunks(topology, message_bytes, chunks, planner=f"random-{seed}", collective=collective)


def build_cases(spec: str, *, planned: bool = True) -> list[Case]:
    """Every case on one topology. ``planned=False`` names them without planning (their
    ``schedule_json`` is empty): collection needs the names only, and it runs in every
    pytest process, xdist workers included."""
    topology = load_topology(spec)

    def schedule_json(make: Callable[..., Schedule], *args: Any, **kwargs: Any) -> str:
        return make(*args, **kwargs).to_json() if planned else ""

    n = topology.num_npus
    cases = []
    for kind in KINDS:
        tag = "rs" if kind is Collective.REDUCE_SCATTER else "ag"
        for planner in planners_for(kind, topology):
            for dtype, shard in SHARD_NUMEL.items():
                planned_json = schedule_json(
                    plan, topology, n * shard * ITEMSIZE[dtype], planner, collective=kind
                )
                cases.append(Case(name=f"{tag}-{planner}-{dtype}", schedule_json=planned_json, dtype=dtype))
        for seed in range(3):
            random_json = schedule_json(random_schedule, spec, n * 5001 * 8, seed, kind)
            cases.append(Case(name=f"{tag}-random{seed}-int64", schedule_json=random_json, dtype="int64"))
        if topology.num_dims == 3:  # multi-dim groups beside single dims
            orders = [((0, 1), (2,)), ((2,), (0, 1)), ((1,), (0, 2)), ((0, 1, 2),)]
            chunks = [
                Chunk(index=j, size_bytes=n * 5001 * 8 * share, order=order)
                for j, (share, order) in enumerate(zip((0.4, 0.1, 0.3, 0.2), orders, strict=True))
            ]
            grouped = schedule_json(
                simulate_chunks, topology, n * 5001 * 8, chunks, planner="grouped", collective=kind
            )
            cases.append(Case(name=f"{tag}-grouped-int64", schedule_json=grouped, dtype="int64"))
        # 3 elements a shard, 64 chunks
        tiny = schedule_json(plan, topology, n * 3 * 8, "pipelined", collective=kind)
        cases.append(Case(name=f"{tag}-tiny-int64", schedule_json=tiny, dtype="int64"))
        mesh = schedule_json(random_schedule, spec, n * 5001 * 8, 7, kind)
        cases.append(Case(name=f"{tag}-mesh-int64", schedule_json=mesh, dtype="int64", mesh=True))
        themis5 = schedule_json(plan, topology, n * 5001 * 8, "themis", num_chunks=5, collective=kind)
        cases.append(Case(name=f"{tag}-themis5-int64", schedule_json=themis5, dtype="int64"))
    # The single-issuer path NCCL gets, run serially on Gloo: the three collectives, random
    # chunkings (grouped dims too on 3 dims), bit-exact like the threaded path.
    for kind in Collective:
        tag = {Collective.ALL_REDUCE: "ar", Collective.REDUCE_SCATTER: "rs", Collective.ALL_GATHER: "ag"}[
            kind
        ]
        ordered = schedule_json(random_schedule, spec, n * 5001 * 8, 3, kind)
        cases.append(Case(name=f"{tag}-ordered-int64", schedule_json=ordered, dtype="int64", issue="ordered"))
        if topology.num_dims == 3:
            grouped = schedule_json(plan, topology, n * 5001 * 8, "ring", collective=kind)
            cases.append(
                Case(
                    name=f"{tag}-ordered-ring-int64",
                    schedule_json=grouped,
                    dtype="int64",
                    issue="ordered",
                )
            )
    floats = schedule_json(
        plan, topology, n * 1251 * 4, "themis", num_chunks=4, collective=Collective.REDUCE_SCATTER
    )
    for op in ("avg", "min", "max"):
        cases.append(Case(name=f"rs-themis4-float32-{op}", schedule_json=floats, dtype="float32", op=op))
    return cases


def _data(rank: int, numel: int, dtype: Any) -> Any:
    generator = torch.Generator().manual_seed(31 * rank + numel)
    if dtype == torch.int64:
        return torch.randint(-(2**40), 2**40, (numel,), generator=generator)
    return (torch.rand(numel, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype)


class SentBytes:
    """Counts the bytes this process hands to ``dist.isend`` while installed."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.original = dist.isend
        self.lock = threading.Lock()
        self.total_bytes = 0

    def __enter__(self) -> "SentBytes":
        def counting_isend(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.total_bytes += tensor.numel() * tensor.element_size()
            return self.original(tensor, *args, **kwargs)

        self.dist.isend = counting_isend
        return self

    def __exit__(self, *exc: object) -> None:
        self.dist.isend = self.original


def _torch_collective(kind: Collective, output: Any, input: Any, op: str) -> None:
    """torch's own collective (the ``*_single`` names where this torch has them: same semantics)."""
    import torch.distributed as dist

    if kind is Collective.ALL_GATHER:
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(output, input)
        return
    if kind is Collective.ALL_REDUCE:
        dist.all_reduce(output)  # the sum in place: output starts as a copy of input
        return
    torch_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}
    reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    reduce_scatter(output, input, op=torch_op.get(op, dist.ReduceOp.MAX))
    if op == "avg":
        output /= dist.get_world_size()


def run_case(rank: int, world: int, case: Case, groups: list[Any], mesh: Any) -> str:
    """One case on this rank: '' if it matches torch, else what went wrong."""
    from hipipe.torch import HierarchicalCollective

    schedule = Schedule.from_json(case.schedule_json)
    kind = schedule.collective
    if case.mesh:
        executor = HierarchicalCollective(mesh, schedule, timeout_s=30, issue=case.issue)
    else:
        executor = HierarchicalCollective(None, schedule, groups=groups, timeout_s=30, issue=case.issue)
    dtype = {"int64": torch.int64, "float32": torch.float32, "bfloat16": torch.bfloat16}[case.dtype]
    wide_numel = schedule.message_bytes // ITEMSIZE[case.dtype]
    if kind is Collective.ALL_REDUCE:
        source = _data(rank, wide_numel, dtype)
        ours, reference = source.clone(), source.clone()
        with SentBytes() as sent:
            executor.all_reduce(ours, op=case.op)
    elif kind is Collective.REDUCE_SCATTER:
        source = _data(rank, wide_numel, dtype)
        ours, reference = (
            torch.empty(wide_numel // world, dtype=dtype),
            torch.empty(wide_numel // world, dtype=dtype),
        )
        untouched = source.clone()
        with SentBytes() as sent:
            executor.reduce_scatter(ours, source, op=case.op)
        if not torch.equal(source, untouched):
            return "reduce_scatter modified its input"
    else:
        source = _data(rank, wide_numel // world, dtype)
        ours, reference = torch.empty(wide_numel, dtype=dtype), torch.empty(wide_numel, dtype=dtype)
        with SentBytes() as sent:
            executor.all_gather(ours, source)
    _torch_collective(kind, reference, source, case.op)
    if kind is not Collective.ALL_REDUCE:
        # Every ring split is exact in the work buffer, so each level sends the ring's (n-1)/n of
        # its piece: (N-1)/N of the message in all, whatever the chunking (Gloo's own RS sends 2x).
        ideal = schedule.message_bytes * (world - 1) // world
        if sent.total_bytes != ideal:
            return f"sent {sent.total_bytes} bytes, the ring's (N-1)/N of the message is {ideal}"
    if dtype == torch.int64 or kind is Collective.ALL_GATHER:
        return "" if torch.equal(ours, reference) else f"{kind.value} differs from torch's bit for bit"
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
    worst = float((ours.double() - reference.double()).abs().max())
    return "" if worst <= tolerance * world else f"max error {worst:g}"


def run_cases(rank: int, world: int, spec: str, cases: list[Case]) -> dict[str, str]:
    """Worker: groups and a randomly placed mesh made once, then every case."""
    from torch.distributed.device_mesh import DeviceMesh

    from hipipe.torch import dimension_groups

    sizes = load_topology(spec).sizes
    groups = dimension_groups(sizes, timeout_s=30)
    placement = torch.randperm(world, generator=torch.Generator().manual_seed(11))
    mesh = DeviceMesh("cpu", placement.reshape(sizes))
    verdicts = {}
    for case in cases:
        try:
            verdicts[case.name] = run_case(rank, world, case, groups, mesh)
        except Exception as exc:
            verdicts[case.name] = f"{type(exc).__name__}: {exc}"
    verdicts[MISUSE] = misuse(spec, groups)
    return verdicts


MISUSE = "misuse"
"""Not a case: the verdict of the refused calls, made after the cases on the same groups."""


def misuse(spec: str, groups: list[Any]) -> str:
    """Calls the executor must refuse in one line, before any traffic (so every rank refuses)."""
    from hipipe.torch import HierarchicalCollective

    topology = load_topology(spec)
    n = topology.num_npus
    rs = HierarchicalCollective(
        None, plan(topology, n * 16 * 8, "themis", collective="reduce_scatter"), groups=groups, timeout_s=30
    )
    ag = HierarchicalCollective(
        None, plan(topology, n * 16 * 8, "themis", collective="all_gather"), groups=groups, timeout_s=30
    )
    wide, shard = torch.zeros(n * 16, dtype=torch.int64), torch.zeros(16, dtype=torch.int64)
    attempts = {
        "plans reduce_scatter, not all_reduce": lambda: rs.all_reduce(wide),
        "plans all_gather, not reduce_scatter": lambda: ag.reduce_scatter(shard, wide),
        "planned for 1024 bytes": lambda: rs.reduce_scatter(
            shard, torch.zeros(n * 16 + n, dtype=torch.int64)
        ),
        "must be 8 x the": lambda: ag.all_gather(torch.zeros(n * 16, dtype=torch.int64), shard[:15]),
        "share dtype and device": lambda: rs.reduce_scatter(shard.float(), wide),
        "avg needs a floating-point dtype": lambda: rs.reduce_scatter(shard, wide, op="avg"),
        "cannot reduce-scatter dtype bool": lambda: rs.reduce_scatter(
            torch.zeros(128, dtype=torch.bool), torch.zeros(n * 128, dtype=torch.bool)
        ),
        # plan() refuses such a size itself; a schedule built by hand reaches the executor's check.
        "does not split into 8 equal shards": lambda: HierarchicalCollective(
            None,
            simulate_chunks(
                topology,
                1001,
                [Chunk(index=0, size_bytes=1001.0, order=tuple((k,) for k in range(topology.num_dims)))],
                collective="all_gather",
            ),
            groups=groups,
            timeout_s=30,
        ),
    }
    for fragment, attempt in attempts.items():
        try:
            attempt()
        except HipipeError as exc:
            if fragment not in str(exc) or "\n" in str(exc):
                return f"expected {fragment!r}, got {exc}"
            continue
        return f"no error for {fragment!r}"
    # Still usable after all that: AllGather of any dtype, bool included, bit for bit.
    mine = torch.tensor([bool((dist_rank() + i) % 3) for i in range(16)])
    gathered, reference = torch.empty(n * 16, dtype=torch.bool), torch.empty(n * 16, dtype=torch.bool)
    ag_bool = HierarchicalCollective(
        None, plan(topology, n * 16, "pipelined", collective="all_gather"), groups=groups, timeout_s=30
    )
    ag_bool.all_gather(gathered, mine)
    _torch_collective(Collective.ALL_GATHER, reference, mine, "sum")
    return "" if torch.equal(gathered, reference) else "bool all_gather differs from torch's"


def dist_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _run_job(spec: str) -> dict[str, list[str]]:
    cases = build_cases(spec)
    nproc = load_topology(spec).num_npus
    started = time.monotonic()
    values = raise_on_failure(spawn(run_cases, nproc, args=(spec, cases), timeout_s=240, pg_timeout_s=30))
    print(f"{nproc}-process job on {spec}: {len(cases)} cases in {time.monotonic() - started:.1f} s")
    return {name: [v[name] for v in values] for name in [*(case.name for case in cases), MISUSE]}


@pytest.fixture(scope="module")
def jobs() -> dict[str, Any]:
    """Lazily run one job per topology, the first time a test asks for it."""
    return {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Cases are named at collection and planned by the job that runs them."""
    if "case" in metafunc.fixturenames:
        pairs = [
            (shape, c.name) for shape, spec in TOPOLOGIES.items() for c in build_cases(spec, planned=False)
        ]
        pairs += [(shape, MISUSE) for shape in TOPOLOGIES]
        metafunc.parametrize(("shape", "case"), pairs)


@pytest.mark.torch
@pytest.mark.slow
def test_matches_torch_collective(jobs: dict[str, Any], shape: str, case: str) -> None:
    if shape not in jobs:
        try:
            jobs[shape] = _run_job(TOPOLOGIES[shape])
        except Exception as exc:  # one failed job fails its tests once each, without restarting it
            jobs[shape] = exc
    if isinstance(jobs[shape], Exception):
        raise jobs[shape]
    failures = {rank: v for rank, v in enumerate(jobs[shape][case]) if v}
    assert not failures, failures
