"""The ZooKeeper session as a lease: from when a broker stops vouching for its roles.

A broker's roles (leader of a partition, controller) hold only while its ZooKeeper session
does: when the session expires, its ephemeral registration goes, and the controller (this
broker or another) moves its leaderships elsewhere. A broker cut off from ZooKeeper learns
of the expiry only when it reaches ZooKeeper again, which in a network partition may be
much later; meanwhile its clients may still reach it. Kafka's ZooKeeper mode lets such a
broker go on naming itself leader until then (clients whose metadata comes from it are
sent back to it again and again). Tidelog treats the session as a lease instead: once the
broker cannot show that the session is alive, it assumes another broker may have taken
over, and says so (``SessionFence``).

When. kazoo pings every third of the negotiated session timeout ``T`` and drops the
connection (state ``SUSPENDED``) when a ping is not answered within the next third, so in
a silent cut ``SUSPENDED`` comes about ``2T/3`` after the last packet the servers got from
this broker; the servers expire the session ``T`` after that packet, i.e. about ``T/3``
after ``SUSPENDED``. ``step_down_delay_ms`` is that ``T/3``: the broker steps down when
the servers may first have expired its session, no later. Stepping down at ``SUSPENDED``
itself would cost availability on every brief blip (a ZooKeeper restart resets the
connection: ``SUSPENDED`` at once, ``CONNECTED`` on the same session a moment later),
while waiting a whole ``T`` after ``SUSPENDED`` (what Tidelog did before, issue #33) left
clients of a cut-off leader without acknowledgements for up to ``5T/3``. If kazoo comes
back on the same session before the delay, nothing happened; if it comes back after it,
the broker re-reads the cluster and vouches for its roles again (see ``ClusterNode``).

Pure apart from ``SessionFence``'s lock; no ZooKeeper call is made here.
"""

from __future__ import annotations

import threading

__all__ = ["SessionFence", "step_down_delay_ms"]


def step_down_delay_ms(session_timeout_ms: int) -> int:
    """How long after kazoo's ``SUSPENDED`` a broker stops vouching for its roles.

    ``session_timeout_ms`` is the configured ``zookeeper.session.timeout.ms`` (the
    servers may negotiate it within their bounds; tests configure both alike). Returns
    ``session_timeout_ms // 3`` (module docstring), at least 1 ms. Raises ``ValueError``
    for a timeout below 1 ms.
    """
    if session_timeout_ms < 1:
        raise ValueError(f"session timeout must be at least 1 ms, not {session_timeout_ms}")
    return max(session_timeout_ms // 3, 1)


class SessionFence:
    """Whether this broker is cut off from ZooKeeper (and so vouches for no role).

    Set by the node's session thread, read by the placement (Metadata, produce, fetch)
    and the controller (admin calls). Thread-safe: the changes are made under one lock;
    the reads take none (one reference read is atomic), since every partition of every
    fetch reads it (issue #34: thousands a second, contended).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None

    @property
    def cut_off(self) -> bool:
        """True while the broker must not claim any role."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the broker is cut off (for error messages), or None."""
        return self._reason

    def cut(self, reason: str) -> bool:
        """Stop vouching; returns whether this changed anything."""
        with self._lock:
            changed = self._reason is None
            if changed:
                self._reason = reason
            return changed

    def restore(self) -> bool:
        """Vouch again (the session is back and the view re-read); whether it changed."""
        with self._lock:
            changed = self._reason is not None
            self._reason = None
            return changed
