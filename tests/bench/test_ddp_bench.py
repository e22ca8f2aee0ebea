"""`robocache bench ddp`'s fair baseline: alternating rounds, and rates that a cold first run
cannot turn into a superlinear speedup."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_ddp  # noqa: E402


def test_rounds_alternate_their_order():
    assert bench_ddp.round_orders([1, 2, 4], 3) == [[1, 2, 4], [4, 2, 1], [1, 2, 4]]
    assert bench_ddp.world_sizes(4) == [1, 2, 4] and bench_ddp.world_sizes(3) == [1, 2, 3]


def test_a_cold_round_does_not_make_a_superlinear_speedup():
    """One GPU at 37.1 ms a step in its first (cold) round and 32.1 ms after, as every rank on
    2 and 4 GPUs: the median over rounds gives 2x and 4x, not 2.31x and 4.70x."""
    def ranks(world, ms):
        return [{"step_ms": ms} for _ in range(world)]

    runs = {1: [ranks(1, 37.1), ranks(1, 32.1), ranks(1, 32.1)],
            2: [ranks(2, 32.1)] * 3,
            4: [ranks(4, 32.1), ranks(4, 32.2), ranks(4, 32.1)]}
    rate = bench_ddp.rates(runs, 256)
    assert rate[2] / rate[1] == 2.0 and rate[4] / rate[1] == 4.0
    # the slowest rank sets a run's rate
    assert bench_ddp.rates({2: [[{"step_ms": 30.0}, {"step_ms": 40.0}]]}, 256)[2] == 2 * 256 / 0.04
