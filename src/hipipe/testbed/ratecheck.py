"""Measure the rate each dimension really delivers, with plain TCP sockets.

For each dimension, every rank streams to its ring neighbour along that dimension at
the same time (one flow per rank, as a ring ReduceScatter does), and the receivers
count bytes. The rate is taken at the receiver over a window that starts after a
short warm-up, because a sender's socket buffer absorbs megabytes before the shaper
pushes back and would inflate a sender-side figure. The result is TCP goodput: about
3.5% below the shaped wire rate (IP and TCP headers in every 1500-byte packet).

Each flow end runs in its own thread that first enters its rank's namespace
(:func:`hipipe.testbed.nsenter.enter_netns`), so one process serves every rank. Every
socket has a timeout and every thread a deadline: a check never hangs.
"""

import socket
import statistics
import threading
import time
from dataclasses import dataclass

from hipipe.testbed.layout import Layout, TestbedError
from hipipe.testbed.nsenter import enter_netns

RATECHECK_PORT = 29_500
"""Port of the check's listeners inside the rank namespaces (they are private to us)."""

BUFFER_BYTES = 256 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class DimRate:
    """Measured goodput of one dimension's flows (every rank sending at once)."""

    dim: int
    target_bits_per_s: float
    median_bits_per_s: float
    min_bits_per_s: float
    max_bits_per_s: float
    num_flows: int

    @property
    def ratio(self) -> float:
        """Measured / target (about 0.96 for a correct shaper: TCP/IP headers)."""
        return self.median_bits_per_s / self.target_bits_per_s


@dataclass(kw_only=True)
class _Flow:
    """One sender -> receiver stream; the receiver thread fills in the samples."""

    src: int
    dst: int
    dim: int
    port: int
    samples: list[tuple[float, int]]
    error: str = ""


def _receive(layout: Layout, flow: _Flow, ready: threading.Barrier, deadline: float) -> None:
    try:
        enter_netns(layout.rank_netns(flow.dst))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((layout.rank_address(flow.dst), flow.port))
            server.listen(1)
            server.settimeout(max(0.1, deadline - time.monotonic()))
            ready.wait(timeout=10)
            conn, _ = server.accept()
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                buffer = bytearray(BUFFER_BYTES)
                total = 0
                while time.monotonic() < deadline:
                    n = conn.recv_into(buffer)
                    if n == 0:
                        break
                    total += n
                    flow.samples.append((time.monotonic(), total))
    except (OSError, threading.BrokenBarrierError) as exc:
        flow.error = f"receiver {flow.dst}: {exc}"


def _send(layout: Layout, flow: _Flow, ready: threading.Barrier, stop_at: float, deadline: float) -> None:
    try:
        enter_netns(layout.rank_netns(flow.src))
        ready.wait(timeout=10)
        with socket.create_connection(
            (layout.rank_address(flow.dst), flow.port), timeout=max(0.1, deadline - time.monotonic())
        ) as conn:
            payload = bytes(BUFFER_BYTES)
            while time.monotonic() < stop_at:
                conn.sendall(payload)
    except (OSError, threading.BrokenBarrierError) as exc:
        flow.error = f"sender {flow.src}: {exc}"


def _rate_bits_per_s(samples: list[tuple[float, int]], start: float, stop: float) -> float:
    """Bytes received between ``start`` and ``stop`` (by sample timestamps), in bits/s."""
    window = [(t, b) for t, b in samples if start <= t <= stop]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return 0.0
    (t0, b0), (t1, b1) = window[0], window[-1]
    return (b1 - b0) * 8 / (t1 - t0)


def measure_flows(
    layout: Layout, dims: list[int], *, duration_s: float = 2.0, warmup_s: float = 0.5
) -> list[_Flow]:
    """Run one ring flow per rank on each of ``dims`` at once; return the flows."""
    flows = [
        _Flow(src=rank, dst=layout.neighbor(rank, dim), dim=dim, port=RATECHECK_PORT + dim, samples=[])
        for dim in dims
        for rank in range(layout.num_ranks)
    ]
    ready = threading.Barrier(2 * len(flows))
    start = time.monotonic()
    stop_at = start + warmup_s + duration_s
    deadline = stop_at + 10.0
    threads = [
        threading.Thread(target=_receive, args=(layout, f, ready, deadline), daemon=True) for f in flows
    ] + [
        threading.Thread(target=_send, args=(layout, f, ready, stop_at, deadline), daemon=True) for f in flows
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.1, deadline + 5.0 - time.monotonic()))
    errors = [f.error for f in flows if f.error]
    if errors or any(t.is_alive() for t in threads):
        raise TestbedError(f"rate check failed: {errors[0] if errors else 'a flow did not finish in time'}")
    return flows


def check_rates(
    layout: Layout, *, duration_s: float = 2.0, warmup_s: float = 0.5, concurrent: bool = False
) -> list[DimRate]:
    """Measured goodput per dimension; ``concurrent`` loads every dimension at once."""
    groups = [list(range(layout.num_dims))] if concurrent else [[k] for k in range(layout.num_dims)]
    results: list[DimRate] = []
    for dims in groups:
        flows = measure_flows(layout, dims, duration_s=duration_s, warmup_s=warmup_s)
        for dim in dims:
            rates = []
            for flow in (f for f in flows if f.dim == dim):
                first = flow.samples[0][0] if flow.samples else 0.0
                rates.append(_rate_bits_per_s(flow.samples, first + warmup_s, first + warmup_s + duration_s))
            results.append(
                DimRate(
                    dim=dim,
                    target_bits_per_s=layout.rates_bits_per_s[dim],
                    median_bits_per_s=statistics.median(rates),
                    min_bits_per_s=min(rates),
                    max_bits_per_s=max(rates),
                    num_flows=len(rates),
                )
            )
    return sorted(results, key=lambda r: r.dim)
