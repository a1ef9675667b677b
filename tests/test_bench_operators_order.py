"""``bench.bench_operators``: the order of the cases alternates from round to round."""

from __future__ import annotations

import pytest

from bench.bench_operators import ROUNDS, round_order

pytestmark = pytest.mark.unit


def test_each_case_runs_first_and_last_in_alternate_rounds() -> None:
    """A case and the built-in it is compared with swap places every round, so neither always
    runs before the other while the host's load drifts through a round."""
    names = ["source_noop", "dedup_by_sequence", "dropDuplicatesWithinWatermark"]
    orders = [round_order(names, r) for r in range(4)]
    assert orders[0] == orders[2] == names
    assert orders[1] == orders[3] == names[::-1]
    ahead = sum(
        o.index("dedup_by_sequence") < o.index("dropDuplicatesWithinWatermark") for o in orders
    )
    assert ahead == 2
    assert ROUNDS % 2 == 1  # an odd count: the median is one round's ratio
