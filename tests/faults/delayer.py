"""A userspace netem for kernels without ``sch_netem``: delay, jitter, loss, reordering (#29).

This CI's kernel (and this machine's) has no ``sch_netem`` (nor fq, sfq, prio), but it
has netfilter's NFQUEUE. So a slow link is made of two parts, both inside the node's
network namespace:

* an nftables table (``netns.NamespaceNetwork.slow``) whose output chain sends every
  packet leaving the node's veth to queue ``queue`` with the ``bypass`` flag: while no
  process is bound to the queue, packets pass untouched, so a dead delayer never
  blackholes a broker;
* this module run as a process in the namespace (``ip netns exec``): it binds the queue
  over a ``NETLINK_NETFILTER`` socket (``nfqueue`` builds the messages) with the
  ``FAIL_OPEN`` flag (a full queue or an undeliverable message accepts the packet rather
  than dropping it), and gives each packet its verdict later: ``DelayPlan`` draws, per
  packet and from a seeded generator, drop (``loss_percent``), at once
  (``reorder_percent``: netem's "reorder", those packets jump the queue) or after
  ``delay_ms`` plus normal jitter of deviation ``jitter_ms`` (clamped at zero). Verdicts
  go out by due time, not by arrival, which NFQUEUE allows (a verdict names its packet
  id): with jitter, packets leave out of order as they do through netem.

Only egress is delayed, as netem on the interface would: a round trip to the node takes
at least ``delay_ms`` (its answer waits), two such nodes talking see twice that.

The process stops by itself at ``--deadline-s``, when its parent (``--parent-pid``)
dies, and on SIGTERM (``Delayer.stop``, called by ``unslow``); at every stop it accepts
whatever it still holds, then prints one summary line (counts) and exits. Timing is
``time.monotonic`` and ``poll`` with a timeout of at most ``_TICK_S``: verdicts are late
by up to a millisecond or two on an idle machine, more on a loaded one (a lower bound is
all the tests assert).

``Delayer`` is the harness's handle on such a process: it starts it, waits until the
queue is bound (``DelayerUnavailableError`` if it cannot be: no nfnetlink_queue in the
kernel), and stops it. Not thread-safe (one owner).
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import logging
import math
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import nfqueue

__all__ = ["Counts", "DelayPlan", "Delayer", "DelayerUnavailableError", "LinkShape", "main"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
READY = "ready"
_TICK_S = 0.05
_ACK_TIMEOUT_S = 5.0
_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 5.0
_QUEUE_MAX_LENGTH = 8_192
_RECEIVE_BUFFER_BYTES = 8 << 20
_READS_PER_ROUND = 256
_SOL_NETLINK = 270
_NETLINK_NO_ENOBUFS = 5
_SO_RCVBUFFORCE = 33
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class LinkShape:
    """What a slow link does to each packet (module docstring). Validated when built."""

    delay_ms: int = 50
    jitter_ms: int = 10
    loss_percent: int = 0
    reorder_percent: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.delay_ms <= 60_000 or not 0 <= self.jitter_ms <= 60_000:
            raise ValueError(f"delay_ms and jitter_ms are 0..60000: {self}")
        if not 0 <= self.loss_percent <= 100 or not 0 <= self.reorder_percent <= 100:
            raise ValueError(f"loss_percent and reorder_percent are 0..100: {self}")

    def describe(self) -> str:
        text = f"delay {self.delay_ms}ms jitter {self.jitter_ms}ms (normal)"
        if self.loss_percent:
            text += f", loss {self.loss_percent}%"
        if self.reorder_percent:
            text += f", reorder {self.reorder_percent}%"
        return text


class DelayPlan:
    """Per-packet decisions for a ``LinkShape``, drawn from ``random.Random(seed)``: the
    same seed gives the same sequence. Pure; not thread-safe."""

    def __init__(self, shape: LinkShape, seed: int) -> None:
        self._shape = shape
        self._random = random.Random(seed)

    def decide(self) -> int | None:
        """The next packet's fate: None to drop it, else its delay in microseconds
        (0: at once)."""
        shape = self._shape
        if shape.loss_percent and self._random.random() * 100 < shape.loss_percent:
            return None
        if shape.reorder_percent and self._random.random() * 100 < shape.reorder_percent:
            return 0
        delay_ms = self._random.gauss(shape.delay_ms, shape.jitter_ms)
        return max(0, round(delay_ms * 1000))


@dataclass
class Counts:
    """What a delayer did, for its summary line."""

    accepted: int = 0
    dropped: int = 0
    overtaken: int = 0
    """Packets released after a packet that arrived later than them: reordering."""
    verdict_errors: int = 0
    released_up_to: int = field(default=-1, repr=False)

    def summary(self) -> str:
        return (
            f"accepted {self.accepted}, dropped {self.dropped}, released out of order "
            f"{self.overtaken}, verdict errors {self.verdict_errors}"
        )


class DelayerUnavailableError(RuntimeError):
    """The delayer could not bind its queue (no nfnetlink_queue here) or start at all."""


def _bind(queue: int) -> socket.socket:
    """A netlink socket bound to ``queue`` (ACKs checked); raises ``DelayerUnavailableError``."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nfqueue.NETLINK_NETFILTER)
    except OSError as error:
        raise DelayerUnavailableError(f"no NETLINK_NETFILTER socket: {error}") from error
    try:
        try:  # root may exceed rmem_max; a burst of packets must not overrun the socket
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RECEIVE_BUFFER_BYTES)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER_BYTES)
        # An overrun loses messages (fail-open accepts those packets); no ENOBUFS error.
        sock.setsockopt(_SOL_NETLINK, _NETLINK_NO_ENOBUFS, 1)
        sock.bind((0, 0))
        sock.settimeout(_ACK_TIMEOUT_S)
        requests = nfqueue.bind_messages(queue, max_length=_QUEUE_MAX_LENGTH, first_seq=1)
        for seq, request in enumerate(requests, start=1):
            sock.send(request)
            _await_ack(sock, seq)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _await_ack(sock: socket.socket, seq: int) -> None:
    deadline = time.monotonic() + _ACK_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65_536)
        except TimeoutError as error:
            raise DelayerUnavailableError(f"no answer to nfqueue config {seq}") from error
        for message in nfqueue.parse(data):
            code = nfqueue.error_code(message)
            if code is None or message.seq != seq:
                continue  # a packet already queued, or an older answer
            if code != 0:
                raise DelayerUnavailableError(
                    f"nfqueue config {seq} refused: {os.strerror(code)} (errno {code})"
                )
            return
    raise DelayerUnavailableError(f"no answer to nfqueue config {seq}")


def serve(
    shape: LinkShape,
    *,
    seed: int,
    queue: int,
    deadline_s: float,
    ready: Callable[[], None],
    stopping: Callable[[], bool],
) -> Counts:
    """Bind ``queue`` and delay its packets until ``deadline_s`` (seconds from now) or
    ``stopping()``; accept everything still held; return the counts. ``ready`` is
    called once the queue is bound."""
    sock = _bind(queue)
    plan = DelayPlan(shape, seed)
    counts = Counts()
    held: list[tuple[float, int]] = []  # (due, packet id); ids grow with arrival
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    end = time.monotonic() + deadline_s

    def verdict(packet: int, accept: bool) -> None:
        message = nfqueue.verdict_message(
            queue, packet, nfqueue.NF_ACCEPT if accept else nfqueue.NF_DROP
        )
        try:
            sock.send(message)
        except OSError as error:  # the packet left the queue (flushed): nothing to do
            log.debug("verdict for %d: %s", packet, error)
            counts.verdict_errors += 1
            return
        if not accept:
            counts.dropped += 1
            return
        counts.accepted += 1
        if packet < counts.released_up_to:
            counts.overtaken += 1
        counts.released_up_to = max(counts.released_up_to, packet)

    ready()
    try:
        while not stopping():
            now = time.monotonic()
            if now >= end:
                break
            while held and held[0][0] <= now:
                verdict(heapq.heappop(held)[1], True)
            wait_s = min(_TICK_S, end - now, held[0][0] - now if held else _TICK_S)
            if not poller.poll(max(0, math.ceil(wait_s * 1000))):
                continue
            for _ in range(_READS_PER_ROUND):
                try:
                    data = sock.recv(65_536)
                except BlockingIOError:
                    break
                arrived = time.monotonic()
                for message in nfqueue.parse(data):
                    code = nfqueue.error_code(message)
                    if code:
                        counts.verdict_errors += 1
                    packet = nfqueue.packet_id(message)
                    if packet is None:
                        continue
                    decision = plan.decide()
                    if decision is None or decision == 0:
                        verdict(packet, decision == 0)
                    else:
                        heapq.heappush(held, (arrived + decision / 1_000_000, packet))
    finally:
        for _, packet in sorted(held):
            verdict(packet, True)
        sock.close()
    return counts


class Delayer:
    """A delayer process for one namespace (module docstring). Not thread-safe.

    ``wrap`` turns a command into one run in the namespace (``NamespaceNetwork.wrap``
    for a node). ``start`` returns once the queue is bound, ``stop`` ends the process
    and returns its summary line; both bounded in time.
    """

    def __init__(
        self,
        wrap: Callable[[list[str]], list[str]],
        shape: LinkShape,
        *,
        seed: int,
        queue: int = 0,
        deadline_s: float = 600.0,
    ) -> None:
        self._wrap = wrap
        self.shape = shape
        self.seed = seed
        self.queue = queue
        self.deadline_s = deadline_s
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the process; raise ``DelayerUnavailableError`` (with its output) if it does
        not bind its queue within ``_START_TIMEOUT_S``."""
        command = [
            sys.executable,
            "-m",
            "tests.faults.delayer",
            f"--queue={self.queue}",
            f"--delay-ms={self.shape.delay_ms}",
            f"--jitter-ms={self.shape.jitter_ms}",
            f"--loss-percent={self.shape.loss_percent}",
            f"--reorder-percent={self.shape.reorder_percent}",
            f"--seed={self.seed}",
            f"--deadline-s={self.deadline_s}",
            f"--parent-pid={os.getpid()}",
        ]
        process = subprocess.Popen(
            self._wrap(command),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._process = process
        assert process.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([process.stdout], [], [], 0.1)
            if readable:
                line = process.stdout.readline()
                if line.strip() == READY:
                    return
                if line == "":  # exited before binding
                    break
        output = self.stop()
        raise DelayerUnavailableError(f"the delayer did not bind queue {self.queue}: {output}")

    @property
    def pid(self) -> int | None:
        """The process id (``ip netns exec`` execs in place: the delayer itself)."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> str:
        """SIGTERM the process (it accepts what it holds and prints its counts), SIGKILL
        it after ``_STOP_TIMEOUT_S``; return its output. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return ""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate(timeout=_STOP_TIMEOUT_S)
        return output.strip()


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError) as error:  # the deadline still ends it
        log.warning("cannot set the parent-death signal: %s", error)
    if os.getppid() != parent_pid:  # the parent died before prctl
        sys.exit(0)


def _say(line: str) -> None:
    """One line to the harness (``Delayer`` reads the process's output), flushed."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.delayer",
        description="Delay, jitter, drop and reorder the packets of an NFQUEUE (issue #29).",
    )
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delay-ms", type=int, default=50)
    parser.add_argument("--jitter-ms", type=int, default=10)
    parser.add_argument("--loss-percent", type=int, default=0)
    parser.add_argument("--reorder-percent", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=600.0)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    shape = LinkShape(
        delay_ms=args.delay_ms,
        jitter_ms=args.jitter_ms,
        loss_percent=args.loss_percent,
        reorder_percent=args.reorder_percent,
    )
    if args.parent_pid is not None:
        _die_with_parent(args.parent_pid)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True  # the loop sees it within one tick

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        counts = serve(
            shape,
            seed=args.seed,
            queue=args.queue,
            deadline_s=args.deadline_s,
            ready=lambda: _say(READY),
            stopping=lambda: stop,
        )
    except DelayerUnavailableError as error:
        _say(f"unavailable: {error}")
        return 3
    _say(counts.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
