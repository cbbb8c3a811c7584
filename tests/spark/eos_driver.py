"""A Spark driver in a process of its own, for the test that SIGKILLs the driver in the middle of a batch.

Runs source topic -> oncelog sink (exactly once) with Trigger.AvailableNow from a checkpoint. With `--slow V`
the task meeting value V (on its first attempt) creates `<flags>/sleeping` and sleeps for a minute: the
test kills this process then, while the task's transaction holds the rows produced before V.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from oncelog.spark import register
from tests.spark.session import start_session, stop_session


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--source", "--sink", "--checkpoint", "--flags", "--slow", "--per-trigger"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    work = Path(args.checkpoint).parent / f"driver-{os.getpid()}"
    spark = start_session(work, conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "25"})
    register(spark)
    from pyspark.sql.functions import udf

    slow = args.slow.encode() if args.slow else None
    flag = os.path.join(args.flags, "sleeping")

    def passthrough(value: bytes) -> bytes:
        from pyspark import TaskContext

        if slow is not None and value.startswith(slow + b"|") and TaskContext.get().attemptNumber() == 0:
            with open(flag, "w"):
                pass
            time.sleep(60)
        return value

    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", args.per_trigger).load())
    query = (src.select("key", udf(passthrough, "binary")(src.value).alias("value")).writeStream
             .format("oncelog").option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.sink)
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    failure = query.exception()
    stop_session(spark)
    if failure is not None:
        raise SystemExit(f"query failed: {failure}")
    print("query finished", flush=True)


if __name__ == "__main__":
    main()
