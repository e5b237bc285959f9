"""The executor on 8 (and 16) local Gloo processes: every planner's schedule, checked against all_reduce.

Processes start once per topology (a module-scoped job runs every case and returns one
verdict per case and rank); each test then looks up its case. int64 must match
``torch.distributed.all_reduce`` bit for bit; float32 and bfloat16 within a tolerance.
Lengths are not multiples of N, and random schedules give uneven chunk sizes, empty
chunks and mixed orders beside the LP's own.
"""

import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hipipe.planners import PLANNERS, plan
from hipipe.schedule import Chunk, Schedule
from hipipe.simulator import simulate_chunks
from hipipe.topology_io import load_topology

torch = pytest.importorskip("torch")

from hipipe.torch import element_bounds, split, trace_to_schedule  # noqa: E402
from hipipe.torch.launch import raise_on_failure, spawn  # noqa: E402

TOPOLOGIES = {
    "2x2x2": "ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us",
    "2x4": "ring:2:4GB/s:1us,ring:4:1GB/s:1us",
    "2x2x2x2": "ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us,ring:2:1GB/s:1us",
}
"""The 16-rank one runs only int64 cases: 16 processes on 2 cores are slow to exchange."""

DTYPE_LENGTHS = (("int64", 40003), ("float32", 10007), ("bfloat16", 5003))
"""Element counts: none is a multiple of 8."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One AllReduce to run on every rank; ``schedule_json`` is planned once, in the parent."""

    name: str
    schedule_json: str
    dtype: str
    op: str = "sum"
    mesh: str = ""
    """'' for the topology's groups; 'standard' for init_device_mesh; 'permuted' for ranks placed at random."""
    trace: bool = False
    collectives: str = "auto"
    flat_group: bool = False
    """Pass the all-dims group made by ``group_for_dims`` in a mapping, as the testbed does."""


def random_schedule(topology_spec: str, message_bytes: int, seed: int) -> Schedule:
    """Uneven chunk sizes (one of them empty), a random order per chunk, FIFO sequences."""
    topology = load_topology(topology_spec)
    rng = random.Random(seed)
    weights = [rng.random() ** 3 for _ in range(rng.randint(3, 9))]
    weights[rng.randrange(len(weights))] = 0.0
    sizes = [message_bytes * w / sum(weights) for w in weights]
    chunks = []
    for j, size in enumerate(sizes):
        order = list(range(topology.num_dims))
        rng.shuffle(order)
        chunks.append(Chunk(index=j, size_bytes=size, order=tuple((k,) for k in order)))
    return simulate_chunks(topology, message_bytes, chunks, planner=f"random-{seed}")


def itemsize(dtype: str) -> int:
    return {"int64": 8, "float32": 4, "bfloat16": 2}[dtype]


def build_cases(topology_spec: str, *, planned: bool = True) -> list[Case]:
    """Every case on one topology. ``planned=False`` names them without planning (their
    ``schedule_json`` is empty): collection needs the names only, and it runs in every
    pytest process, xdist workers included, so planning there cost each one a minute."""
    topology = load_topology(topology_spec)

    def schedule_json(make: Callable[..., Schedule], *args: Any, **kwargs: Any) -> str:
        return make(*args, **kwargs).to_json() if planned else ""

    cases = []
    if topology.num_npus > 8:
        for planner in PLANNERS:
            cases.append(
                Case(
                    name=f"{planner}-int64",
                    schedule_json=schedule_json(plan, topology, 40003 * 8, planner),
                    dtype="int64",
                )
            )
        cases.append(
            Case(
                name="random0-int64",
                schedule_json=schedule_json(random_schedule, topology_spec, 40003 * 8, 0),
                dtype="int64",
            )
        )
        return cases
    for planner in PLANNERS:
        for dtype, numel in DTYPE_LENGTHS:
            cases.append(
                Case(
                    name=f"{planner}-{dtype}",
                    schedule_json=schedule_json(plan, topology, numel * itemsize(dtype), planner),
                    dtype=dtype,
                )
            )
    for seed in range(3):
        cases.append(
            Case(
                name=f"random{seed}-int64",
                schedule_json=schedule_json(random_schedule, topology_spec, 40003 * 8, seed),
                dtype="int64",
            )
        )
    if topology.num_dims == 3:  # ops over groups of dims mixed with single dims
        orders = [((0, 1), (2,)), ((2,), (0, 1)), ((1,), (0, 2)), ((0, 1, 2),)]
        sizes = [0.4, 0.1, 0.3, 0.2]
        chunks = [
            Chunk(index=j, size_bytes=40003 * 8 * size, order=order)
            for j, (size, order) in enumerate(zip(sizes, orders, strict=True))
        ]
        grouped = schedule_json(simulate_chunks, topology, 40003 * 8, chunks, planner="grouped")
        cases.append(Case(name="grouped-dims-int64", schedule_json=grouped, dtype="int64"))
    ring_schedule = schedule_json(plan, topology, 40003 * 8, "ring")
    cases.append(
        Case(
            name="ring-given-group-int64",
            schedule_json=ring_schedule,
            dtype="int64",
            flat_group=True,
        )
    )
    tiny = schedule_json(
        plan, topology, 5 * 8, "pipelined"
    )  # 5 elements, 64 chunks: most chunks and parts empty
    cases.append(Case(name="tiny-int64", schedule_json=tiny, dtype="int64"))
    floats = schedule_json(plan, topology, 10007 * 4, "themis", num_chunks=4)
    for op in ("avg", "min", "max"):
        cases.append(Case(name=f"themis4-float32-{op}", schedule_json=floats, dtype="float32", op=op))
    mesh_schedule = schedule_json(random_schedule, topology_spec, 40003 * 8, 7)
    cases.append(Case(name="mesh-int64", schedule_json=mesh_schedule, dtype="int64", mesh="standard"))
    for collectives in ("ring", "native"):
        cases.append(
            Case(
                name=f"mesh-permuted-{collectives}-int64",
                schedule_json=mesh_schedule,
                dtype="int64",
                mesh="permuted",
                collectives=collectives,
            )
        )
    cases.append(Case(name="trace-int64", schedule_json=mesh_schedule, dtype="int64", trace=True))
    # The backend's own collectives (what NCCL uses), padded to equal parts; Gloo runs them too.
    cases.append(Case(name="native-int64", schedule_json=mesh_schedule, dtype="int64", collectives="native"))
    cases.append(
        Case(
            name="native-float32-max",
            schedule_json=floats,
            dtype="float32",
            op="max",
            collectives="native",
        )
    )
    return cases


def _data(rank: int, numel: int, dtype: Any) -> Any:
    generator = torch.Generator().manual_seed(97 * rank + numel)
    if dtype == torch.int64:
        return torch.randint(-(2**40), 2**40, (numel,), generator=generator)
    return (torch.rand(numel, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype)


def _check_trace(schedule: Schedule, trace: Any) -> str:
    """Measured times respect chain precedence and every dim's sequence."""
    measured = trace_to_schedule(schedule, trace)
    for op in measured.ops:
        if op.end_s < op.start_s:
            return f"op {op.index} ends before it starts"
        if op.step > 0 and op.start_s < measured.ops[op.index - 1].end_s:
            return f"op {op.index} started before its chain predecessor ended"
    for seq in measured.sequences:
        for a, b in itertools.pairwise(seq):
            if measured.ops[b].start_s < measured.ops[a].end_s:
                return f"op {b} started before op {a} ended on the same dim"
    return ""


def _executor(case: Case, schedule: Schedule, groups: list[Any], mesh: Any) -> Any:
    """The executor a case asks for: on a mesh, on the per-dim groups, or on a mapping with the flat group."""
    from hipipe.torch import HierarchicalAllReduce, group_for_dims

    if mesh is not None:
        return HierarchicalAllReduce(mesh, schedule, timeout_s=30, collectives=case.collectives)
    if case.flat_group:
        everyone = tuple(range(schedule.topology.num_dims))
        given = {(k,): g for k, g in enumerate(groups)}
        given[everyone] = group_for_dims(schedule.topology.sizes, everyone, timeout_s=30)
        return HierarchicalAllReduce(None, schedule, groups=given, timeout_s=30)
    return HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=30, collectives=case.collectives)


def run_cases(rank: int, world_size: int, topology_spec: str, cases: list[Case]) -> dict[str, str]:
    """Worker: run every case; '' for a pass, else what went wrong on this rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from hipipe.torch import dimension_groups

    topology = load_topology(topology_spec)
    groups = dimension_groups(topology.sizes, timeout_s=30)
    meshes: dict[str, Any] = {}
    verdicts: dict[str, str] = {}
    dtypes = {"int64": torch.int64, "float32": torch.float32, "bfloat16": torch.bfloat16}
    for case in cases:
        try:
            schedule = Schedule.from_json(case.schedule_json)
            if case.mesh and case.mesh not in meshes:
                if case.mesh == "standard":
                    meshes[case.mesh] = init_device_mesh("cpu", topology.sizes)
                else:  # mesh coordinates unrelated to rank numbers: ring order must come from the mesh
                    placement = torch.randperm(world_size, generator=torch.Generator().manual_seed(5))
                    meshes[case.mesh] = DeviceMesh("cpu", placement.reshape(topology.sizes))
            executor = _executor(case, schedule, groups, meshes.get(case.mesh))
            dtype = dtypes[case.dtype]
            source = _data(rank, schedule.message_bytes // itemsize(case.dtype), dtype)
            ours = source.clone()
            trace = executor.run(ours, op=case.op, trace=case.trace)
            reference = source.clone()
            torch_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM}.get(case.op)
            if torch_op is None:
                torch_op = dist.ReduceOp.MIN if case.op == "min" else dist.ReduceOp.MAX
            dist.all_reduce(reference, op=torch_op)
            if case.op == "avg":
                reference /= world_size
            if dtype == torch.int64:
                verdict = "" if torch.equal(ours, reference) else "int64 result differs from all_reduce"
            else:
                tolerance = {torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
                worst = float((ours.double() - reference.double()).abs().max())
                verdict = "" if worst <= tolerance * world_size else f"max error {worst:g}"
            if not verdict and trace is not None:
                verdict = _check_trace(schedule, trace)
            verdicts[case.name] = verdict
        except Exception as exc:
            verdicts[case.name] = f"{type(exc).__name__}: {exc}"
    return verdicts


def _run_job(topology_spec: str) -> dict[str, list[str]]:
    cases = build_cases(topology_spec)
    nproc = load_topology(topology_spec).num_npus
    started = time.monotonic()
    values = raise_on_failure(
        spawn(run_cases, nproc, args=(topology_spec, cases), timeout_s=240, pg_timeout_s=30)
    )
    print(f"{nproc}-process job on {topology_spec}: {len(cases)} cases in {time.monotonic() - started:.1f} s")
    return {case.name: [v[case.name] for v in values] for case in cases}


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
        metafunc.parametrize(("shape", "case"), pairs)


@pytest.mark.torch
@pytest.mark.slow
def test_schedule_matches_all_reduce(jobs: dict[str, Any], shape: str, case: str) -> None:
    if shape not in jobs:
        try:
            jobs[shape] = _run_job(TOPOLOGIES[shape])
        except Exception as exc:  # one failed job fails its tests once each, without restarting it
            jobs[shape] = exc
    if isinstance(jobs[shape], Exception):
        raise jobs[shape]
    verdicts = jobs[shape][case]
    failures = {rank: v for rank, v in enumerate(verdicts) if v}
    assert not failures, failures


def test_element_bounds_partition_the_tensor_exactly() -> None:
    rng = random.Random(3)
    topology = load_topology(TOPOLOGIES["2x4"])
    for seed in range(50):
        message_bytes = rng.randint(1, 10**6)
        schedule = random_schedule(TOPOLOGIES["2x4"], message_bytes, seed)
        for numel in (1, 7, rng.randint(1, 10**5)):
            bounds = element_bounds(schedule, numel)
            assert bounds[0] == 0 and bounds[-1] == numel
            assert all(a <= b for a, b in itertools.pairwise(bounds))
            for j, chunk in enumerate(schedule.chunks):
                ideal = chunk.size_bytes * numel / message_bytes
                assert abs((bounds[j + 1] - bounds[j]) - ideal) <= 1.0 + 1e-9
    assert topology.num_npus == 8


def test_split_is_near_equal_and_exact() -> None:
    for start, stop, parts in ((0, 0, 4), (3, 10, 4), (5, 6, 8), (0, 1001, 8)):
        ranges = split(start, stop, parts)
        assert ranges[0][0] == start and ranges[-1][1] == stop
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        lengths = [b - a for a, b in ranges]
        assert max(lengths) - min(lengths) <= 1
        assert sum(lengths) == stop - start == math.fsum(lengths)


def test_reduce_ops_by_name_or_torch_enum() -> None:
    import torch.distributed as dist

    from hipipe.errors import HipipeError
    from hipipe.torch.collectives import ReduceOp, parse_reduce_op

    assert parse_reduce_op("avg") is ReduceOp.AVG
    assert parse_reduce_op(dist.ReduceOp.MAX) is ReduceOp.MAX
    with pytest.raises(HipipeError, match="unknown reduce op"):
        parse_reduce_op(dist.ReduceOp.PRODUCT)
