"""Nodes in Linux network namespaces on one bridge, and network partitions between them.

``NamespaceNetwork`` (root, ``ip``, ``nft``) builds, for a test, the topology of
``reference/fault-testing.md`` section 4:

* one network namespace per node (ZooKeeper, each broker), named ``tl<tag>-<node>``;
* a veth pair per node, its outer end on a bridge ``tl<tag>br`` in the root namespace;
* addresses in a private /24, ``10.213.<n>.0/24``: the bridge (where the test's clients
  live, in the root namespace) is ``.1``, nodes are ``.10`` upwards.

A process runs in a node with ``wrap(node, command)`` (``ip netns exec``). ``cut(node,
peers)`` drops every packet between ``node`` and ``peers`` in both directions with an
nftables table in ``node``'s namespace (a silent blackhole, as a real partition: no
reset), while the root namespace's clients still reach it; ``heal(node)`` deletes the
table. ``cut(..., inbound=False)`` or ``cut(..., outbound=False)`` makes a one-way
partition (only the other direction's packets are dropped). ``slow(node, ...)`` delays,
jitters, drops and reorders every packet ``node`` sends, clients' included: with a ``tc
netem`` queue on its interface, or where the kernel has no netem with the userspace
``delayer`` on an NFQUEUE of its egress, or where it has neither a ``tbf`` rate limit and
random loss with nftables; ``unslow(node)`` removes it. ``close`` removes the
namespaces (their veth ends go with them) and the bridge, whatever happened before; the
``with`` block calls it.

``BrokerNodes`` adapts a network to ``broker.cluster.testing.BrokerNetwork``, so a
``LocalCluster`` runs its brokers in it (node ``b<id>``).

``missing()`` names what this host lacks (root, ``ip``, ``nft``, ``tc``); the tests fail
on it in CI and skip elsewhere. Not thread-safe (one owner).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from types import TracebackType

from tests.faults.delayer import Delayer, DelayerUnavailableError, LinkShape

__all__ = ["BrokerNodes", "NamespaceNetwork", "missing"]

log = logging.getLogger(__name__)

_CUT_TABLE = "tidelog_cut"
_LOSS_TABLE = "tidelog_loss"
_DELAY_TABLE = "tidelog_delay"
_DELAY_QUEUE = 0  # one delayer per namespace, and queue numbers are per namespace
_SLOW_METHODS = ("auto", "netem", "delayer", "tbf")
_COMMAND_TIMEOUT_S = 20.0


def missing() -> str | None:
    """What stops namespace tests here, or None when they can run."""
    if os.geteuid() != 0:
        return "network namespace tests need root (CAP_NET_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"no {tool}: apt-get install {package} (`make venv` does it as root)"
    return None


def _run(command: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        list(command),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=_COMMAND_TIMEOUT_S,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


class NamespaceNetwork:
    """Namespaces ``nodes`` on one bridge (module docstring). Build, ``with``/``close``."""

    def __init__(self, nodes: Sequence[str]) -> None:
        if len(set(nodes)) != len(nodes) or len(nodes) > 200:
            raise ValueError(f"nodes must be distinct and at most 200: {nodes}")
        for node in nodes:
            if not node.isalnum() or len(node) > 4:
                raise ValueError(f"node names are up to 4 letters or digits: {node!r}")
        # Names unique to this process: interface names are at most 15 characters.
        self._tag = f"{os.getpid() % 0x10000:04x}"
        self._subnet = self._free_subnet()
        self._nodes = list(nodes)
        self._addresses = {node: f"{self._subnet}.{10 + i}" for i, node in enumerate(nodes)}
        self._bridge = f"tl{self._tag}br"
        self._created: list[str] = []  # namespaces made so far, for close
        self._veths: list[str] = []  # outer veth ends made so far, for close
        self._bridge_made = False
        self._delayers: dict[str, Delayer] = {}  # node -> its running delayer

    @property
    def client_address(self) -> str:
        """The root namespace's address on the bridge: where the test's clients are."""
        return f"{self._subnet}.1"

    def address(self, node: str) -> str:
        return self._addresses[node]

    def namespace(self, node: str) -> str:
        return f"tl{self._tag}-{node}"

    def wrap(self, node: str, command: list[str]) -> list[str]:
        """``command`` run in ``node``'s namespace (``ip netns exec`` execs it in place,
        so the process started is the command itself)."""
        return ["ip", "netns", "exec", self.namespace(node), *command]

    def start(self) -> NamespaceNetwork:
        try:
            _run(["ip", "link", "add", self._bridge, "type", "bridge"])
            self._bridge_made = True
            _run(["ip", "addr", "add", f"{self.client_address}/24", "dev", self._bridge])
            _run(["ip", "link", "set", self._bridge, "up"])
            for node in self._nodes:
                self._add_node(node)
        except BaseException:
            self.close()
            raise
        return self

    def _add_node(self, node: str) -> None:
        namespace = self.namespace(node)
        outer, inner = f"tl{self._tag}{node}h", self.interface(node)
        _run(["ip", "netns", "add", namespace])
        self._created.append(namespace)
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        self._veths.append(outer)
        _run(["ip", "link", "set", inner, "netns", namespace])
        _run(["ip", "link", "set", outer, "master", self._bridge, "up"])
        inside = ["ip", "netns", "exec", namespace]
        _run([*inside, "ip", "addr", "add", f"{self.address(node)}/24", "dev", inner])
        _run([*inside, "ip", "link", "set", inner, "up"])
        _run([*inside, "ip", "link", "set", "lo", "up"])

    def interface(self, node: str) -> str:
        """The name of ``node``'s interface inside its namespace (its veth's inner end)."""
        return f"tl{self._tag}{node}n"

    def cut(
        self, node: str, peers: Iterable[str], *, inbound: bool = True, outbound: bool = True
    ) -> None:
        """Drop traffic between ``node`` and ``peers``, leaving the clients' address and
        everyone else alone. Replaces an earlier cut of ``node``.

        Both ways by default; ``inbound=False`` keeps what ``peers`` send to ``node``
        (only ``node``'s packets to them are dropped), ``outbound=False`` the reverse: a
        one-way partition. Over TCP a one-way cut still stalls connections (their acks
        cannot come back), but new connections fail differently and UDP-like probes get
        through one way; it is the shape Jepsen calls an asymmetric grudge.
        """
        if not (inbound or outbound):
            raise ValueError("a cut drops at least one direction")
        peer_list = list(peers)
        if not peer_list:
            raise ValueError("a cut needs at least one peer")
        addresses = ", ".join(self.address(peer) for peer in peer_list)
        self.heal(node)
        chains = []
        if inbound:
            chains.append(
                f"  chain input {{ type filter hook input priority 0; policy accept;\n"
                f"    ip saddr {{ {addresses} }} drop\n  }}\n"
            )
        if outbound:
            chains.append(
                f"  chain output {{ type filter hook output priority 0; policy accept;\n"
                f"    ip daddr {{ {addresses} }} drop\n  }}\n"
            )
        rules = f"table inet {_CUT_TABLE} {{\n{''.join(chains)}}}\n"
        _run(["ip", "netns", "exec", self.namespace(node), "nft", "-f", "-"], stdin=rules)
        log.info(
            "cut %s from %s (%s)",
            node,
            addresses,
            "both ways" if inbound and outbound else "inbound" if inbound else "outbound",
        )

    def slow(
        self,
        node: str,
        *,
        delay_ms: int = 50,
        jitter_ms: int = 10,
        loss_percent: int = 0,
        reorder_percent: int = 0,
        fallback_rate_kbit: int = 1_000,
        seed: int = 0,
        deadline_s: float = 600.0,
        method: str = "auto",
    ) -> str:
        """Make ``node``'s link slow and lossy, for every packet it sends (to peers,
        ZooKeeper and clients); return what was applied, for the report.

        ``method`` ``auto`` takes the first of these the host can do (or names one):

        * ``netem``, the kernel's ``sch_netem``: ``tc qdisc ... netem delay D J
          distribution normal loss L% 25% reorder R% 50%``;
        * ``delayer``, where the kernel has no netem (the CI's Firecracker kernel has no
          netem, fq, sfq or prio) but has NFQUEUE: ``delayer.Delayer`` in the namespace
          (delay, normal jitter, loss and reordering drawn from ``seed``; it stops by
          itself after ``deadline_s``) and an NFQUEUE rule with the bypass flag on the
          node's egress (``_queue_rule``);
        * ``tbf``, the last resort: a ``tbf`` rate limit of ``fallback_rate_kbit``
          (queueing delay under load, no jitter or reordering) and, for loss, an
          nftables rule dropping ``loss_percent`` of outgoing packets at random
          (``numgen random``).

        ``unslow`` removes any of them. Raises ``ValueError`` on a bad shape or method,
        ``RuntimeError`` when a named method cannot be applied.
        """
        shape = LinkShape(
            delay_ms=delay_ms,
            jitter_ms=jitter_ms,
            loss_percent=loss_percent,
            reorder_percent=reorder_percent,
        )
        if method not in _SLOW_METHODS:
            raise ValueError(f"method must be one of {_SLOW_METHODS}: {method!r}")
        self.unslow(node)
        skipped: list[str] = []
        if method in ("auto", "netem"):
            try:
                applied = self._netem(node, shape)
            except _UnsupportedError as error:
                if method == "netem":
                    raise RuntimeError(f"no netem on {node}: {error}") from error
                skipped.append(str(error))
            else:
                log.info("slow %s: %s", node, applied)
                return applied
        if method in ("auto", "delayer"):
            try:
                applied = self._delay(node, shape, seed=seed, deadline_s=deadline_s)
            except DelayerUnavailableError as error:
                if method == "delayer":
                    raise
                skipped.append(f"no NFQUEUE delayer: {error}")
            else:
                applied += "".join(f"; {reason}" for reason in skipped)
                log.info("slow %s: %s", node, applied)
                return applied
        applied = self._tbf(node, shape, fallback_rate_kbit) + "".join(
            f"; {reason}" for reason in skipped
        )
        log.info("slow %s: %s", node, applied)
        return applied

    def delayer(self, node: str) -> Delayer | None:
        """The delayer ``slow`` started for ``node``, if it did (for tests)."""
        return self._delayers.get(node)

    def _netem(self, node: str, shape: LinkShape) -> str:
        netem = [
            "delay",
            f"{shape.delay_ms}ms",
            f"{shape.jitter_ms}ms",
            "distribution",
            "normal",
        ]
        if shape.loss_percent:
            netem += ["loss", f"{shape.loss_percent}%", "25%"]
        if shape.reorder_percent:
            netem += ["reorder", f"{shape.reorder_percent}%", "50%"]
        tc = self.wrap(node, ["tc", "qdisc", "replace", "dev", self.interface(node), "root"])
        try:
            _run([*tc, "netem", *netem])
        except RuntimeError as error:
            if "unknown" not in str(error):
                raise
            raise _UnsupportedError("no sch_netem in this kernel") from error
        return "netem " + " ".join(netem)

    def _delay(self, node: str, shape: LinkShape, *, seed: int, deadline_s: float) -> str:
        delayer = Delayer(
            lambda command: self.wrap(node, command),
            shape,
            seed=seed,
            queue=_DELAY_QUEUE,
            deadline_s=deadline_s,
        )
        delayer.start()
        self._delayers[node] = delayer
        try:
            how = self._queue_rule(node)
        except DelayerUnavailableError:
            self._delayers.pop(node, None)
            delayer.stop()
            raise
        return (
            f"delayer {shape.describe()}, seed {seed}, on the egress of "
            f"{self.interface(node)} through NFQUEUE {_DELAY_QUEUE} ({how}, bypass)"
        )

    def _queue_rule(self, node: str) -> str:
        """Send ``node``'s egress packets to the delayer's queue, with ``bypass`` (a
        queue nobody reads passes packets). nftables' own ``queue`` statement where
        the kernel has ``nft_queue``; else iptables' NFQUEUE target (this kernel has
        only that one, ``xt_NFQUEUE``, which iptables-nft reaches through
        ``nft_compat``). Returns which; raises ``DelayerUnavailableError`` if neither."""
        device = self.interface(node)
        rules = (
            f"table inet {_DELAY_TABLE} {{\n"
            "  chain output { type filter hook output priority 10; policy accept;\n"
            f'    oifname "{device}" queue num {_DELAY_QUEUE} bypass\n  }}\n'
            "}\n"
        )
        try:
            _run(self.wrap(node, ["nft", "-f", "-"]), stdin=rules)
            return "nft queue"
        except RuntimeError as nft_error:
            if shutil.which("iptables") is None:
                raise DelayerUnavailableError(
                    f"no nft queue statement ({nft_error}) and no iptables "
                    "(apt-get install iptables, `make venv` does it as root)"
                ) from nft_error
        try:
            _run(self.wrap(node, ["iptables", "-A", *self._iptables_rule(node)]))
        except RuntimeError as error:
            raise DelayerUnavailableError(f"no NFQUEUE target: {error}") from error
        return "iptables NFQUEUE"

    def _iptables_rule(self, node: str) -> list[str]:
        return [
            "OUTPUT",
            "-o",
            self.interface(node),
            "-j",
            "NFQUEUE",
            "--queue-num",
            str(_DELAY_QUEUE),
            "--queue-bypass",
        ]

    def _tbf(self, node: str, shape: LinkShape, rate_kbit: int) -> str:
        tc = self.wrap(node, ["tc", "qdisc", "replace", "dev", self.interface(node), "root"])
        latency_ms = max(shape.delay_ms, 50)
        _run(
            [
                *tc,
                "tbf",
                "rate",
                f"{rate_kbit}kbit",
                "burst",
                "16kbit",
                "latency",
                f"{latency_ms}ms",
            ]
        )
        applied = f"tbf rate {rate_kbit}kbit (no delay, jitter or reordering)"
        if shape.loss_percent:
            rules = (
                f"table inet {_LOSS_TABLE} {{\n"
                "  chain output { type filter hook output priority 0; policy accept;\n"
                f"    numgen random mod 100 < {shape.loss_percent} drop\n  }}\n"
                "}\n"
            )
            _run(self.wrap(node, ["nft", "-f", "-"]), stdin=rules)
            applied += f", nft drops {shape.loss_percent}% of outgoing packets"
        return applied

    def unslow(self, node: str) -> str | None:
        """Undo ``slow(node, ...)``; nothing if there was none. Returns the delayer's
        summary line (what it accepted, dropped and reordered) if one ran.

        The queue rules go first, so new packets leave directly; then the delayer is
        stopped, and it releases whatever it still holds before it exits."""
        _run(
            self.wrap(node, ["tc", "qdisc", "del", "dev", self.interface(node), "root"]),
            check=False,
        )
        _run(self.wrap(node, ["nft", "delete", "table", "inet", _LOSS_TABLE]), check=False)
        _run(self.wrap(node, ["nft", "delete", "table", "inet", _DELAY_TABLE]), check=False)
        delayer = self._delayers.pop(node, None)
        if delayer is None:
            return None
        if shutil.which("iptables") is not None:
            _run(self.wrap(node, ["iptables", "-D", *self._iptables_rule(node)]), check=False)
        summary = delayer.stop()
        log.info("delayer on %s stopped: %s", node, summary)
        return f"delayer: {summary}"

    def heal(self, node: str) -> None:
        """Undo ``cut(node, ...)``; nothing if there was none."""
        _run(
            [
                "ip",
                "netns",
                "exec",
                self.namespace(node),
                "nft",
                "delete",
                "table",
                "inet",
                _CUT_TABLE,
            ],
            check=False,
        )

    def close(self) -> None:
        """Remove every namespace, veth pair and the bridge. Idempotent; never raises.

        Each veth pair is deleted by its outer end first: a namespace outlives ``ip netns
        delete`` while anything (a socket left by a killed server) still refers to it,
        and its veth pair with it (seen here: pairs left behind after a run)."""
        for outer in reversed(self._veths):
            _run(["ip", "link", "delete", outer], check=False)
        self._veths.clear()
        for namespace in reversed(self._created):
            _run(["ip", "netns", "delete", namespace], check=False)
        self._created.clear()
        if self._bridge_made:
            _run(["ip", "link", "delete", self._bridge], check=False)
            self._bridge_made = False

    def _free_subnet(self) -> str:
        """``10.213.<n>`` with no route on this host yet (another run's, say)."""
        routes = _run(["ip", "-4", "route", "show"], check=False)
        first = os.getpid() % 250
        for step in range(250):
            candidate = f"10.213.{(first + step) % 250 + 1}"
            if f"{candidate}.0/24" not in routes:
                return candidate
        raise RuntimeError("no free 10.213.x.0/24 subnet")

    def __enter__(self) -> NamespaceNetwork:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _UnsupportedError(RuntimeError):
    """This kernel lacks what a ``slow`` method needs."""


class BrokerNodes:
    """``BrokerNetwork`` over a ``NamespaceNetwork``: broker ``id`` is node ``b<id>``."""

    def __init__(self, network: NamespaceNetwork) -> None:
        self._network = network

    def host(self, broker_id: int) -> str:
        return self._network.address(f"b{broker_id}")

    def wrap(self, broker_id: int, command: list[str]) -> list[str]:
        return self._network.wrap(f"b{broker_id}", command)
