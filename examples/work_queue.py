"""A work queue: one producer publishes 20 jobs, two consumers share them and acknowledge each.

Run from the repository root, with a broker and a worker on examples/queues.yaml:

    sowstream broker start
    sowstream worker --config examples/queues.yaml &
    python examples/work_queue.py

Jobs are published to the plain topic ``work``; the queue ``WQ`` leases each one to one consumer
at a time. A consumer asks for up to 5 jobs at once (``max_backlog=5``; the queue allows 10) and
acknowledges each when done, which removes it from the queue and makes room for the next.
See docs/queues.md.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

from sowstream import Client

JOBS = 20
TIMEOUT = 60.0
LOCK = threading.Lock()  # guards the log both consumers write to


def consume(name: str, run: str, done: threading.Event, log: dict[int, list[str]]) -> None:
    """Lease jobs from WQ until told to stop; 'process' and acknowledge each one."""
    client = Client(name=f"work-queue-{name}-{run}")
    with client, client.subscribe("WQ", options="max_backlog=5") as sub:
        while not done.is_set():
            msg = sub.next(timeout=0.5)
            if msg is None:
                continue
            job = msg.json()
            time.sleep(0.05)  # the work
            if job.get("run") != run:
                print(f"{name}: cleared job {job} left over from an earlier run")
            else:
                with LOCK:
                    log[job["job"]].append(name)
                print(
                    f"{name}: processed job {job['job']:2} "
                    f"(bookmark {msg.bookmark}, delivery {msg.deliveries})"
                )
            sub.ack(msg)  # done: the job leaves the queue
    # leaving the `with` sends the acknowledgements still batched, unsubscribes and disconnects


def main() -> None:
    run = uuid.uuid4().hex[:8]  # tells this run's jobs from any left in the queue before
    done = threading.Event()
    log: dict[int, list[str]] = defaultdict(list)
    consumers = [
        threading.Thread(target=consume, args=(name, run, done, log), name=name)
        for name in ("consumer-A", "consumer-B")
    ]
    for thread in consumers:
        thread.start()

    with Client(name=f"work-queue-producer-{run}") as producer:
        for n in range(1, JOBS + 1):
            producer.publish("work", {"run": run, "job": n, "task": f"resize image {n}"})
        producer.flush()
    print(f"producer: published {JOBS} jobs to work (run {run})")

    deadline = time.monotonic() + TIMEOUT
    while len(log) < JOBS and time.monotonic() < deadline:
        time.sleep(0.2)
    done.set()
    for thread in consumers:
        thread.join()

    print()
    for name in ("consumer-A", "consumer-B"):
        jobs = sorted(job for job, who in log.items() if name in who)
        print(f"{name} processed {len(jobs)} job(s): {jobs}")
    missing = sorted(set(range(1, JOBS + 1)) - set(log))
    repeated = sorted(job for job, who in log.items() if len(who) > 1)
    if missing:
        raise SystemExit(f"jobs not processed within {TIMEOUT:.0f}s: {missing}")
    if repeated:
        print(f"processed more than once (at-least-once delivery): {repeated}")
    print(f"all {JOBS} jobs processed")


if __name__ == "__main__":
    main()
