"""Write tests/golden/delay-layout1: a delay_until_due query (``input/``, ``checkpoint/``) whose
state is in layout 1 (run with the code before layout 2, 2026-11).

Kept for the record; the files it wrote are committed and must not be regenerated with newer
code (they pin a checkpoint of the old layout, which the current code must restore). Usage,
from a checkout before layout 2, with that checkout's package and tests importable::

    PYTHONPATH=. python tests/golden/make_delay_layout1.py /tmp/delay-layout1

then copy that folder's ``input`` and ``checkpoint`` here. The test relocates the absolute paths
Spark wrote into the checkpoint.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF, delay_until_due
from filepulsar.dispatch.spark import delay as delay_module
from filepulsar.jobs.spark import local_spark
from tests.test_spark_ops_support import (
    flat,
    message,
    run_available_now,
    source,
    write_messages,
)

assert not hasattr(delay_module, "_LAYOUT"), "run with the layout-1 code"
Y2090_US = 3_786_825_600_000_000  # 2090-01-01
Y2100_US = 4_102_444_800_000_000  # 2100-01-01
out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
folder = out / "input"
batches = [
    [
        message(0),
        message(1, deliverAt=Y2090_US),
        message(2, deliverAt=Y2100_US),
        message(3, deliverAt=Y2090_US + 86_400_000_000, partition=1),
    ],
    [message(4, deliverAt=Y2090_US + 60_000_000), message(5)],
]
for number, rows in enumerate(batches):
    # Names the tests' own files (part-NNNNN) never take.
    write_messages(folder, rows).rename(folder / f"layout1-{number}.parquet")
spark = local_spark("make-delay-layout1", **{NO_DATA_BATCHES_CONF: "false"})
df = delay_until_due(source(spark, folder, files_per_batch=1))
print(sorted(r.entryId for r in flat(run_available_now(df, out / "checkpoint"))))  # [0, 5]
spark.stop()
