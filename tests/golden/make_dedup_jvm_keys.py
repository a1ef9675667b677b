"""Write tests/golden/dedup-jvm-keys: a dedup_by_sequence query (``input/``, ``checkpoint/``)
whose state groups were named by the JVM (``to_json`` of the group columns, before the
operators named them in Python; run with the code before, 2026-11).

Kept for the record; the files it wrote are committed and must not be regenerated with newer
code (they pin a checkpoint whose state keys the JVM spelled, which the current code must find
again). Usage, from a checkout before Python-made group names, with that checkout's package and
tests importable::

    PYTHONPATH=. python tests/golden/make_dedup_jvm_keys.py /tmp/dedup-jvm-keys

then copy that folder's ``input`` and ``checkpoint`` here. The test relocates the absolute paths
Spark wrote into the checkpoint.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF, dedup_by_sequence
from filepulsar.dispatch.spark import blocks as blocks_module
from filepulsar.jobs.spark import local_spark
from tests.test_spark_ops_support import flat, message, run_available_now, source, write_messages

assert not hasattr(blocks_module, "split_rows"), "run with the code whose JVM names groups"
AWKWARD = 'q"\\\n\x01é'  # a producer name JSON escapes
out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
folder = out / "input"
plans = [
    [(0, "a", 0), (0, "a", 1), (0, AWKWARD, 5), (0, "a", 2), (1, "a", 0)],
    [(0, "a", 3), (0, "b", 0), (1, "a", 0)],
]
entry = 0
for number, plan in enumerate(plans):
    rows = []
    for partition, producer, seq in plan:
        rows.append(message(entry, partition=partition, producerName=producer, sequenceId=seq))
        entry += 1
    # Names the tests' own files (part-NNNNN) never take.
    write_messages(folder, rows).rename(folder / f"jvm-keys-{number}.parquet")
spark = local_spark("make-dedup-jvm-keys", **{NO_DATA_BATCHES_CONF: "false"})
df = dedup_by_sequence(source(spark, folder, files_per_batch=1))
print(sorted(r.entryId for r in flat(run_available_now(df, out / "checkpoint"))))  # 0-6
spark.stop()
