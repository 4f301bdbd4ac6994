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
partition (only the other direction's packets are dropped). ``slow(node, ...)`` puts a
``tc netem`` queue (delay, jitter, loss, reordering) on ``node``'s interface, for all its
traffic, clients' included, or where the kernel has no netem a ``tbf`` rate limit and
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

__all__ = ["BrokerNodes", "NamespaceNetwork", "missing"]

log = logging.getLogger(__name__)

_CUT_TABLE = "tidelog_cut"
_LOSS_TABLE = "tidelog_loss"
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
    ) -> str:
        """Make ``node``'s link slow and lossy, for every packet it sends (to peers,
        ZooKeeper and clients); return what was applied.

        With the kernel's ``sch_netem``: ``tc qdisc ... netem delay D J distribution
        normal loss L% 25% reorder R% 50%``. Kernels without it (the CI's Firecracker
        kernel has no netem, fq, sfq or prio, but has tbf and htb): a ``tbf`` rate limit
        of ``fallback_rate_kbit`` (queueing delay under load, no jitter or reordering)
        and, for loss, an nftables rule dropping ``loss_percent`` of outgoing packets at
        random (``numgen random``). ``unslow`` removes either.
        """
        self.unslow(node)
        device = self.interface(node)
        netem = ["delay", f"{delay_ms}ms", f"{jitter_ms}ms", "distribution", "normal"]
        if loss_percent:
            netem += ["loss", f"{loss_percent}%", "25%"]
        if reorder_percent:
            netem += ["reorder", f"{reorder_percent}%", "50%"]
        tc = self.wrap(node, ["tc", "qdisc", "replace", "dev", device, "root"])
        try:
            _run([*tc, "netem", *netem])
            applied = "netem " + " ".join(netem)
        except RuntimeError as error:
            if "unknown" not in str(error):
                raise
            _run(
                [
                    *tc,
                    "tbf",
                    "rate",
                    f"{fallback_rate_kbit}kbit",
                    "burst",
                    "16kbit",
                    "latency",
                    f"{max(delay_ms, 50)}ms",
                ]
            )
            applied = f"tbf rate {fallback_rate_kbit}kbit (no sch_netem in this kernel)"
            if loss_percent:
                rules = (
                    f"table inet {_LOSS_TABLE} {{\n"
                    "  chain output { type filter hook output priority 0; policy accept;\n"
                    f"    numgen random mod 100 < {loss_percent} drop\n  }}\n"
                    "}\n"
                )
                _run(self.wrap(node, ["nft", "-f", "-"]), stdin=rules)
                applied += f", nft drops {loss_percent}% of outgoing packets"
        log.info("slow %s: %s", node, applied)
        return applied

    def unslow(self, node: str) -> None:
        """Undo ``slow(node, ...)``; nothing if there was none."""
        _run(
            self.wrap(node, ["tc", "qdisc", "del", "dev", self.interface(node), "root"]),
            check=False,
        )
        _run(self.wrap(node, ["nft", "delete", "table", "inet", _LOSS_TABLE]), check=False)

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


class BrokerNodes:
    """``BrokerNetwork`` over a ``NamespaceNetwork``: broker ``id`` is node ``b<id>``."""

    def __init__(self, network: NamespaceNetwork) -> None:
        self._network = network

    def host(self, broker_id: int) -> str:
        return self._network.address(f"b{broker_id}")

    def wrap(self, broker_id: int, command: list[str]) -> list[str]:
        return self._network.wrap(f"b{broker_id}", command)
