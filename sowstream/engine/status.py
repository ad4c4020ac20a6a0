"""What a worker says about itself: the probes' readiness, its status rows and its announcements.

The readiness answers ``/ready``; the announcements on the workers topic are the worker's line in
``sowstream status`` (docs/deploy.md, *Status*); the rows answer ``/status``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson

from sowstream.engine.health import BEAT_SECONDS, Health, Readiness
from sowstream.engine.ports import Assignment, Sender
from sowstream.engine.topology import Topology

log = logging.getLogger("sowstream.engine")

ANNOUNCE_SECONDS = 2.0  # how often a worker announces itself on the workers topic


class WorkerStatus:
    """Readiness, status and announcements of one worker, read from its units."""

    def __init__(
        self,
        topology: Topology,
        assignment: Assignment,
        sender: Sender,
        restore_progress: Callable[[], list[dict[str, Any]]],
        *,
        worker_name: str,
        http: str | None,
    ) -> None:
        self._topology = topology
        self._assignment = assignment
        self._sender = sender
        self._restore_progress = restore_progress
        self.worker_name = worker_name
        self._http = http  # host:port of the probes and metrics, if served
        self._subscriptions_known = topology.ctx.subscriptions_known
        self.started = time.time()
        self.assigned = False  # the consumer group handed this worker its first assignment

    def readiness(self) -> Readiness:
        """Whether this worker owns its partitions and has restored them (``/ready``).

        Ready once faust has assigned partitions (none is an answer too), the rebalance and the
        changelog recovery are over, the subscription registry is read (or live changes would
        miss subscribers) and every SOW partition it owns is loaded.
        """
        if not self.assigned:
            return Readiness(False, "waiting for the consumer group to assign partitions")
        if not self._assignment.settled:
            return Readiness(False, "rebalancing: restoring tables from their changelogs")
        if not self._subscriptions_known.is_set():
            return Readiness(False, "reading the subscription registry")
        owned = 0
        for unit in list(self._topology.topics.values()):
            for partition in sorted(unit.pump.owned()):
                state = unit.proc.state(partition)
                if state is None or not state.ready:
                    name = unit.topic.name
                    return Readiness(False, f"loading topic {name} partition {partition}")
                owned += 1
        # A view or conflated topic's input partition is usable once its state is loaded and
        # its input read up to the end it had when assigned (warm), as a SOW partition is.
        inputs = 0
        for input_unit in self._topology.inputs:
            pending = input_unit.loading()
            if pending:
                what = f"{input_unit.kind} {input_unit.name}"
                return Readiness(False, f"loading {what} input partition {pending[0]}")
            inputs += len(input_unit.assigned())
        held = f", {inputs} view input partition(s) loaded" if inputs else ""
        return Readiness(True, f"ready: {owned} topic partition(s) owned and restored{held}")

    def worker_info(self) -> dict[str, Any]:
        """What this worker announces on the workers topic (docs/deploy.md, *Status*)."""
        readiness = self.readiness()
        partitions: list[dict[str, Any]] = []
        inputs: list[dict[str, Any]] = []
        topics = list(self._topology.topics.values())
        if self.assigned:
            for unit in topics:
                for partition in sorted(unit.pump.owned()):
                    state = unit.proc.state(partition)
                    partitions.append(
                        {
                            "topic": unit.topic.name,
                            "partition": partition,
                            "watermark": state.watermark if state is not None else None,
                            "loaded": state is not None and state.ready,
                        }
                    )
            for input_unit in self._topology.inputs:
                loading = set(input_unit.loading())
                inputs.extend(
                    {"topic": input_unit.name, "partition": p, "loaded": p not in loading}
                    for p in input_unit.assigned()
                )
        subscriptions = {u.topic.name: len(u.proc.subs) for u in topics if u.proc.subs}
        for queue in self._topology.queues.values():
            if queue.subscription_count():
                subscriptions[queue.name] = queue.subscription_count()
        return {
            "worker": self.worker_name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": round(self.started, 3),
            "at": round(time.time(), 3),
            "ready": readiness.ready,
            "reason": readiness.reason,
            "http": self._http,
            "partitions": partitions,
            "inputs": inputs,
            "restore": self._restore_progress(),
            "subscriptions": subscriptions,
            # Per conflated topic, since this worker started: changes in, records written.
            "conflated": {
                u.conflated.name: {"incoming": u.runner.incoming, "published": u.runner.published}
                for u in self._topology.conflated()
            },
        }

    async def worker_status(self) -> list[dict[str, Any]]:
        """This worker's rows of ``sowstream status`` (``/status``): its partitions now."""
        rows = []
        for unit in list(self._topology.topics.values()):
            for partition in sorted(unit.pump.owned()):
                row = await unit.proc.partition_status(partition)
                rows.append({**row, "worker": self.worker_name})
        return rows

    async def announce(self) -> None:
        """Announce the worker on the workers topic every few seconds: readers judge it by the
        time it carries, so a worker that stops announcing shows as not answering."""
        topic = self._topology.ctx.names.workers
        failed = False
        while True:
            try:
                info = orjson.dumps(self.worker_info())
                await self._sender.send(topic, info, key=self.worker_name.encode())
                failed = False
            except Exception as exc:  # the broker may be away: try again at the next beat
                if not failed:
                    log.warning("could not announce the worker on %s: %s", topic, exc)
                failed = True
            await asyncio.sleep(ANNOUNCE_SECONDS)

    async def heartbeat(self, health: Health) -> None:
        """The probes' view of the worker (sowstream.engine.health): stamped from the loop, so a
        loop that stops turning stops the stamps."""
        health.serve_status(asyncio.get_running_loop(), self.worker_status)
        while True:
            health.beat(self.readiness())
            await asyncio.sleep(BEAT_SECONDS)
