"""The nemesis: the faults of a schedule, applied to a ``LocalCluster`` in namespaces (issue #29).

``Nemesis(network, cluster, ...)`` turns each ``schedule.Step`` into a ``Fault`` with
``start()`` (returns a line saying what it did, for the report) and ``heal()``. Faults:

=================  ===========================================================================
kind               what ``start`` does / what ``heal`` undoes
=================  ===========================================================================
isolate            the target broker cut (both ways) from every other broker and ZooKeeper:
                   a minority of one; clients still reach it
split              brokers split into a majority and a minority holding the target, ZooKeeper
                   on the side the step names; every cross-side pair cut
bridge             brokers in two sides, the target (the bridge) in neither: it sees both,
                   the sides do not see each other; ZooKeeper on the first side
one-way            the target drops only inbound (or only outbound) packets from/to the other
                   brokers and ZooKeeper (one nftables chain instead of two)
zk-cut             the target (the controller or a leader) cut from ZooKeeper only; brokers
                   and clients still reach it
peers-cut          the reverse: the target cut from the other brokers, ZooKeeper and clients
                   still reach it
netem              delay/jitter/loss/reordering of everything the target sends (clients'
                   traffic included): ``tc netem`` where the kernel has it, else the
                   NFQUEUE ``delayer`` (seeded by the step's pick), else a ``tbf`` rate
                   limit plus random loss (``netns.NamespaceNetwork.slow``); the report
                   says which, and at heal what the delayer accepted, dropped, reordered
kill               SIGKILL; heal restarts it (same port, same data)
pause              SIGSTOP; heal sends SIGCONT
restart            SIGTERM (a graceful shutdown, waited for up to ``GRACEFUL_STOP_S``, then
                   SIGKILL and a finding); heal restarts it
rolling-restart    every broker in turn SIGTERMed and restarted, spread over the step
power-loss         the broker on the lossy file system SIGKILLed, the file system told to
                   forget every unsynced write (``lossyfs.LossyFs.crash``); heal restarts it
disk-full          the data disk (``smalldisk``, a tmpfs) of a partition's leader or of one
                   of its followers filled to the last page; heal deletes the filler. The
                   broker keeps running: what it answers meanwhile is its business, what
                   it acknowledged is the checker's
=================  ===========================================================================

Targets are resolved when the fault starts: ``controller`` from the cluster's metadata,
``leader`` as the leader of partition ``pick % partitions`` of the watched topic, ``any``
as broker ``pick % n``; when the metadata cannot say (no controller during an election),
``any``. A ``disk-full`` step aims only at brokers with a small disk (the one on the lossy
file system has none): the leader (or a follower) of the first partition, from ``pick``
on, whose leader (a follower) has one, else such a broker by ``pick``. Partition rules
are placed in the brokers' namespaces only (one nftables table per broker, both
directions unless one-way), so ZooKeeper's namespace is never touched.

``heal_all()`` undoes everything whatever happened: every cut and netem queue removed,
paused brokers continued, stopped brokers started again (retried). Not thread-safe: the
schedule runs on one thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tests.faults import netns
from tests.faults.lossyfs import LossyFs
from tests.faults.netns import NamespaceNetwork
from tests.faults.schedule import Step
from tests.faults.smalldisk import SmallDisks
from tidelog.broker.cluster.testing import LocalCluster, zookeeper_available
from tidelog.client import AdminClient

__all__ = ["Fault", "LossyBroker", "Nemesis", "missing"]

log = logging.getLogger(__name__)

ZOOKEEPER = "zk"
_ADMIN_TIMEOUT_MS = 5_000
_RESTART_ATTEMPTS = 3
_RESTART_WAIT_S = 180.0
GRACEFUL_STOP_S = 30.0
_DELAYER_GRACE_S = 60.0


def missing() -> str | None:
    """What stops the harness here (root, ``ip``, ``nft``, ``tc``, ZooKeeper), or None."""
    reason = netns.missing()
    if reason is not None:
        return reason
    if not zookeeper_available():
        return "ZooKeeper is not installed (apt-get install libzookeeper-java, or `make venv`)"
    return None


def node(broker_id: int) -> str:
    """The network node name of broker ``broker_id`` (``netns.BrokerNodes``'s naming)."""
    return f"b{broker_id}"


class Fault(Protocol):
    def start(self) -> str:
        """Apply the fault; return what was done, for the report."""
        ...

    def heal(self) -> str | None:
        """Undo it (idempotent); return a line for the report, if there is one."""
        ...


@dataclass
class LossyBroker:
    """One broker whose data directory is on a lossy file system (``power-loss``)."""

    broker_id: int
    fs: LossyFs


@dataclass
class Nemesis:
    """Applies steps to ``cluster`` in ``network`` (module docstring). Not thread-safe.

    ``topic``/``partitions``: where ``leader`` targets are looked up.
    """

    network: NamespaceNetwork
    cluster: LocalCluster
    topic: str
    partitions: int
    lossy: LossyBroker | None = None
    disks: SmallDisks | None = None
    paused: set[int] = field(default_factory=set)
    events: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    """Misbehaviour the checker does not see (a graceful shutdown that hangs)."""

    # --- targets --------------------------------------------------------------------------

    def target(self, step: Step) -> int:
        ids = self.cluster.broker_ids
        if step.role == "lossy":
            if self.lossy is None:
                raise ValueError("a power-loss step needs a broker on the lossy file system")
            return self.lossy.broker_id
        if step.kind == "disk-full":
            return self._disk_target(step)
        found = -1
        try:
            with AdminClient(self.cluster.bootstrap, request_timeout_ms=_ADMIN_TIMEOUT_MS) as admin:
                if step.role == "controller":
                    found = admin.describe_cluster(timeout_ms=_ADMIN_TIMEOUT_MS).controller_id
                elif step.role == "leader":
                    described = admin.describe_topic(self.topic, timeout_ms=_ADMIN_TIMEOUT_MS)
                    found = described.partitions[step.pick % self.partitions].leader
        except Exception as error:  # the metadata may be unavailable mid-fault: fall back
            log.warning("cannot resolve the %s for %s: %s", step.role, step.kind, error)
        return found if found in ids else ids[step.pick % len(ids)]

    def _disk_target(self, step: Step) -> int:
        """The broker a ``disk-full`` step fills (module docstring)."""
        if self.disks is None or not self.disks.broker_ids:
            raise ValueError("a disk-full step needs brokers on small disks")
        with_disk = self.disks.broker_ids
        try:
            with AdminClient(self.cluster.bootstrap, request_timeout_ms=_ADMIN_TIMEOUT_MS) as admin:
                described = admin.describe_topic(self.topic, timeout_ms=_ADMIN_TIMEOUT_MS)
            partitions = described.partitions
            first = step.pick % len(partitions)
            for partition in [*partitions[first:], *partitions[:first]]:
                if step.role == "leader" and partition.leader in with_disk:
                    return partition.leader
                if step.role == "follower":
                    followers = [
                        b for b in partition.replicas if b != partition.leader and b in with_disk
                    ]
                    if followers:
                        return followers[step.pick % len(followers)]
        except Exception as error:  # the metadata may be unavailable mid-fault: fall back
            log.warning("cannot resolve the %s for %s: %s", step.role, step.kind, error)
        return with_disk[step.pick % len(with_disk)]

    def leads(self, broker_id: int) -> str:
        """Which partitions of the watched topic ``broker_id`` leads, as text (report)."""
        try:
            with AdminClient(self.cluster.bootstrap, request_timeout_ms=_ADMIN_TIMEOUT_MS) as admin:
                described = admin.describe_topic(self.topic, timeout_ms=_ADMIN_TIMEOUT_MS)
        except Exception as error:
            return f"leadership unknown ({error.__class__.__name__})"
        led = [p.partition for p in described.partitions if p.leader == broker_id]
        return f"leads {self.topic} {led}" if led else f"leads no {self.topic} partition"

    def others(self, target: int, step: Step) -> list[int]:
        """The other brokers, in an order drawn from ``step.pick`` (for sides)."""
        rest = [b for b in self.cluster.broker_ids if b != target]
        shift = step.pick % max(len(rest), 1)
        return rest[shift:] + rest[:shift]

    # --- faults ---------------------------------------------------------------------------

    def fault(self, step: Step) -> Fault:
        """The ``Fault`` for ``step`` (its target resolved when it starts)."""
        return _StepFault(self, step)

    def apply(self, step: Step, target: int) -> tuple[str, Callable[[], object]]:
        """Start ``step`` on ``target``: the report line and the heal (whose result, a
        string, is a line for the report too)."""
        kind = step.kind
        brokers = [node(b) for b in self.others(target, step)]
        me = node(target)
        if kind == "isolate":
            return self._grudge({me: [*brokers, ZOOKEEPER]}, f"isolated {me}")
        if kind == "split":
            minority_size = (len(self.cluster.broker_ids) - 1) // 2
            minority = [me, *brokers[: minority_size - 1]] if minority_size > 1 else [me]
            majority = [b for b in brokers if b not in minority]
            zk_side = step.param("zookeeper", "majority")
            grudge: dict[str, list[str]] = {m: list(majority) for m in minority}
            for m in minority if zk_side == "majority" else majority:
                grudge.setdefault(m, []).append(ZOOKEEPER)
            return self._grudge(
                grudge, f"split {minority} | {majority}, ZooKeeper with the {zk_side}"
            )
        if kind == "bridge":
            half = (len(brokers) + 1) // 2
            left, right = brokers[:half], brokers[half:]
            grudge = {b: [*right] for b in left}
            for b in right:
                grudge[b] = [*left, ZOOKEEPER]
            return self._grudge(
                {k: v for k, v in grudge.items() if v},
                f"bridge {me} between {left}+ZooKeeper and {right}",
            )
        if kind == "one-way":
            inbound = step.param("drop", "inbound") == "inbound"
            peers = [*brokers, ZOOKEEPER]
            self.network.cut(me, peers, inbound=inbound, outbound=not inbound)
            return (
                f"{me} drops {'inbound' if inbound else 'outbound'} packets of {peers}",
                lambda: self.network.heal(me),
            )
        if kind == "zk-cut":
            return self._grudge({me: [ZOOKEEPER]}, f"{me} ({step.role}) cut from ZooKeeper")
        if kind == "peers-cut":
            return self._grudge({me: brokers}, f"{me} ({step.role}) cut from brokers {brokers}")
        if kind == "netem":
            applied = self.network.slow(
                me,
                delay_ms=int(step.param("delay_ms", "50")),
                jitter_ms=int(step.param("jitter_ms", "10")),
                loss_percent=int(step.param("loss_percent", "0")),
                reorder_percent=int(step.param("reorder_percent", "0")),
                seed=step.pick,
                # The delayer ends itself if the heal never comes (a harness crash).
                deadline_s=step.duration_s + _DELAYER_GRACE_S,
            )
            return f"slow link on {me}: {applied}", lambda: self.network.unslow(me)
        if kind == "kill":
            self.cluster.kill(target)
            return f"SIGKILLed broker {target}", lambda: self.restart(target)
        if kind == "pause":
            self.cluster.kill(target, signal.SIGSTOP)
            self.paused.add(target)
            return f"SIGSTOPped broker {target}", lambda: self.resume(target)
        if kind == "restart":
            took = self.terminate(target)
            return f"SIGTERMed broker {target} (stopped in {took})", lambda: self.restart(target)
        if kind == "rolling-restart":
            order = [target, *self.others(target, step)]
            self.rolling_restart(order, step.duration_s)
            return f"rolling restart of {order}", lambda: None
        if kind == "disk-full":
            disks = self.disks
            assert disks is not None  # _disk_target refused the step otherwise
            taken = disks.fill(target)
            return (
                f"filled the disk of broker {target} ({step.role}; {self.leads(target)}; "
                f"filler {taken // (1024 * 1024)} MiB)",
                lambda: disks.free(target),
            )
        if kind == "power-loss":
            assert self.lossy is not None
            self.cluster.kill(target)
            report = self.lossy.fs.crash()
            dropped = report.get("files_rolled_back", {})
            return (
                f"power loss on broker {target}: {len(dropped)} file(s) rolled back, "
                f"{len(report.get('entries_dropped', []))} entries dropped",
                lambda: self.restart(target),
            )
        raise ValueError(f"unknown fault kind {kind!r}")

    def _grudge(self, grudge: dict[str, list[str]], text: str) -> tuple[str, Callable[[], None]]:
        """Cut each key from its peers (both ways, rules in the key's namespace)."""
        for source, peers in grudge.items():
            self.network.cut(source, peers)

        def heal() -> None:
            for source in grudge:
                self.network.heal(source)

        return text, heal

    # --- processes ------------------------------------------------------------------------

    def restart(self, broker_id: int) -> None:
        """Start ``broker_id`` again if it is not running (retried: a port may linger).

        Each attempt waits ``_RESTART_WAIT_S`` for it to serve: a broker recovering its
        logs after a kill or a power loss (on the lossy FUSE file system, in Python) on a
        loaded machine took over a minute in three 1,800 s runs side by side, and an
        attempt cut short at 30 s killed it mid-recovery, so every attempt started the
        recovery again and the run gave up (2026-11-29)."""
        for attempt in range(_RESTART_ATTEMPTS):
            if self.cluster.is_running(broker_id):
                return
            try:
                self.cluster.start_broker(broker_id, timeout_s=_RESTART_WAIT_S)
                self.events.append(f"broker {broker_id} restarted")
                return
            except RuntimeError as error:
                log.warning("restart of broker %d failed (%d): %s", broker_id, attempt, error)
                if self.cluster.is_running(broker_id):
                    self.cluster.kill(broker_id)
                time.sleep(1.0)
        output = self.cluster.output(broker_id)[-2000:]
        raise RuntimeError(f"broker {broker_id} did not restart: {output}")

    def terminate(self, broker_id: int) -> str:
        """SIGTERM ``broker_id`` and wait for its graceful shutdown; after
        ``GRACEFUL_STOP_S`` SIGKILL it and record a finding (a liveness bug: the broker
        asks for ``shutdown.grace.ms`` 1 000). Returns how long it took, as text."""
        began = time.monotonic()
        if not self.cluster.is_running(broker_id):
            return "0 s (not running)"
        try:
            self.cluster.kill(broker_id, signal.SIGTERM)
        except subprocess.TimeoutExpired:
            pass  # LocalCluster waits 20 s; the rest of the wait is below
        while self.cluster.is_running(broker_id):
            if time.monotonic() - began > GRACEFUL_STOP_S:
                self.cluster.kill(broker_id)
                finding = (
                    f"broker {broker_id} had not stopped {GRACEFUL_STOP_S:.0f} s after SIGTERM:"
                    " SIGKILLed"
                )
                log.warning("%s", finding)
                self.findings.append(finding)
                return f"{GRACEFUL_STOP_S:.0f} s, then SIGKILLed"
            time.sleep(0.1)
        return f"{time.monotonic() - began:.1f} s"

    def resume(self, broker_id: int) -> None:
        if broker_id in self.paused:
            if self.cluster.is_running(broker_id):
                self.cluster.kill(broker_id, signal.SIGCONT)
            self.paused.discard(broker_id)

    def rolling_restart(self, order: Sequence[int], budget_s: float) -> None:
        """Gracefully restart each broker of ``order`` in turn over about ``budget_s``."""
        per_broker_s = budget_s / max(len(order), 1)
        for broker_id in order:
            began = time.monotonic()
            self.resume(broker_id)
            self.terminate(broker_id)
            self.restart(broker_id)
            time.sleep(max(0.0, per_broker_s - (time.monotonic() - began)))

    # --- healing everything -----------------------------------------------------------------

    def heal_all(self) -> None:
        """Undo every fault: cuts, netem, pauses, stopped brokers. Raises only if a broker
        cannot be started again."""
        for name in [ZOOKEEPER, *(node(b) for b in self.cluster.broker_ids)]:
            self.network.heal(name)
            self.network.unslow(name)
        if self.disks is not None:
            for broker_id in self.disks.broker_ids:
                self.disks.free(broker_id)
        for broker_id in list(self.paused):
            self.resume(broker_id)
        for broker_id in self.cluster.broker_ids:
            self.restart(broker_id)


@dataclass
class _StepFault:
    nemesis: Nemesis
    step: Step
    _heal: Callable[[], object] | None = None

    def start(self) -> str:
        target = self.nemesis.target(self.step)
        text, self._heal = self.nemesis.apply(self.step, target)
        return text

    def heal(self) -> str | None:
        heal, self._heal = self._heal, None
        said = heal() if heal is not None else None
        return said if isinstance(said, str) and said else None


def move_data_dir_onto(cluster: LocalCluster, broker_id: int, fs: LossyFs) -> None:
    """Put broker ``broker_id``'s data directory on ``fs`` (the broker must be stopped):
    its content is copied in and fsynced, the directory replaced by a symbolic link to
    the mount."""
    data = cluster.data_dir(broker_id)
    if data.exists():
        shutil.copytree(data, fs.mountpoint, dirs_exist_ok=True)
        shutil.rmtree(data)
    _fsync_tree(fs.mountpoint)
    data.symlink_to(fs.mountpoint, target_is_directory=True)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
