"""Instructions per look of a reader, or per catch-up of a writer, counted by callgrind on
``bench_manifest_look``'s fixture (where thread CPU time is too noisy to tell 5% apart).

Run (one count; the figure is (count of N steps - count of 0 steps) / N)::

    PYTHONHASHSEED=0 PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        --collect-atstart=no --toggle-collect=map_next \\
        .venv/bin/python -m bench.bench_manifest_look_cg FIXTURE {look,catch} N

``FIXTURE`` is a folder ``python -m bench.bench_manifest_look --fixture FIXTURE`` wrote. The
manifest holds the fixture's records up to the 300th; then ``N`` steps (N=200: the numbers in
the commits) each write 1-3 more records (seeded, as the bench's rounds) and time one
``ManagedLedger.state()`` (``look``) or one writer's aborted commit (``catch``). Only those
calls are counted: each runs under a ``map`` (callgrind collects inside ``map_next`` only;
imports run a few too, the same count with any ``N``: hence the count of 0 steps subtracted).
To count another checkout on the same bytes (one without this file), run this file by its
path, with that checkout's python from its folder and this one's folder first on the path
(``bench`` is then this one's, ``filepulsar`` that checkout's editable install): ``cd OTHER
&& PYTHONHASHSEED=0 PYTHONPATH=THIS valgrind ... .venv/bin/python
THIS/bench/bench_manifest_look_cg.py FIXTURE look N``.
"""

from __future__ import annotations

import os
import random
import sys

from bench.bench_manifest_look import _abort, fixture_copy, reader_and_writer

_START = 300  # records there before the first step


def main(argv: list[str]) -> None:
    fixture, mode, steps = argv[0], argv[1], int(argv[2])
    with fixture_copy(fixture, _START) as (root, fd, orig, recs):
        at, i = recs[_START].end, _START
        reader, writer = reader_and_writer(root)

        def look(_: int) -> None:
            reader.state()

        def catch(_: int) -> None:
            writer.commit(_abort)

        timed = look if mode == "look" else catch
        rng = random.Random(7)
        for k in [rng.choice((1, 2, 3)) for _ in range(steps)]:
            end = recs[i + k].end
            os.pwrite(fd, orig[at:end], at)  # (k records land, marked)
            at, i = end, i + k
            list(map(timed, (k,)))  # (counted: see the module's docstring)


if __name__ == "__main__":
    main(sys.argv[1:])
