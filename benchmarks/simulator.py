"""Simulator speed: how long one discrete-event run of a K-chunk schedule takes.

Prints a card, then one JSON line. Goal (issue 2): a 64-chunk, 4-dimension AllReduce
simulates in milliseconds.
"""

import argparse
import json
import platform
import statistics
import time

from hipipe.planners.baselines import equal_chunks, themis_orders
from hipipe.presets import libra_4d
from hipipe.simulator import Policy, simulate, simulate_chunks

MESSAGE_BYTES = 2**30


def time_runs_s(function, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    topology = libra_4d()
    rows = []
    for num_chunks in (16, 64, 256):
        chunks = equal_chunks(MESSAGE_BYTES, num_chunks, themis_orders(topology, MESSAGE_BYTES, num_chunks))
        for policy in (Policy.FIFO, Policy.SCF):
            samples = time_runs_s(
                lambda chunks=chunks, policy=policy: simulate_chunks(
                    topology, MESSAGE_BYTES, chunks, policy=policy
                ),
                args.repeats,
            )
            rows.append(
                {"num_chunks": num_chunks, "policy": policy.value, "median_s": statistics.median(samples)}
            )
        schedule = simulate_chunks(topology, MESSAGE_BYTES, chunks, policy=Policy.SCF)
        samples = time_runs_s(lambda schedule=schedule: simulate(schedule), args.repeats)
        rows.append({"num_chunks": num_chunks, "policy": "fixed", "median_s": statistics.median(samples)})
    print(f"simulator speed on libra-4d (4 dims, 4096 NPUs), {platform.processor() or platform.machine()}")
    print(f"{'chunks':>7} {'ops':>6} {'policy':>7} {'median':>10}")
    for row in rows:
        print(
            f"{row['num_chunks']:>7} {row['num_chunks'] * 8:>6} {row['policy']:>7} {row['median_s'] * 1e3:>8.2f} ms"
        )
    goal = next(r for r in rows if r["num_chunks"] == 64 and r["policy"] == "scf")
    print(f"goal: 64 chunks x 4 dims in milliseconds -> {goal['median_s'] * 1e3:.2f} ms")
    print(json.dumps({"benchmark": "simulator", "topology": "libra-4d", "results": rows}))


if __name__ == "__main__":
    main()
