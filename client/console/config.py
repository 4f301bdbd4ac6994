"""``ConsoleConfig``: how the web console reaches the cluster and serves its pages.

One frozen, keyword-only dataclass (STYLE.md), validated when built. The security
settings are the client's (``security_protocol``, ``sasl_mechanism``, ``ssl_*``; the
``--command-config`` properties file of the command line gives them) without a user name
or password: with a ``SASL_*`` protocol every console user logs in with a SCRAM user of
the cluster, and the console acts with that user's credentials only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_LISTEN", "ConsoleConfig", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:7480"
_SECURITY_KEYS = frozenset(
    {"security_protocol", "sasl_mechanism", "ssl_cafile", "ssl_certfile", "ssl_keyfile"}
)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port). Raises ``ValueError``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsoleConfig:
    """The console's settings. Immutable and thread-safe.

    Attributes:
        bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
        host, port: where the console listens (127.0.0.1:7480 by default; port 0 picks
            a free one).
        refresh_ms: how often pages and charts refresh themselves in the browser.
        request_timeout_ms: the clients' deadline for one call; a page with a broker
            down waits at most about this long.
        history_window_ms: how far back the charts reach.
        sample_interval_ms: how often the console samples the cluster in the background
            for the charts (per cluster connection), 1000 to 60000.
        page_size: records per page of the record browser.
        session_idle_ms: a console session unused this long is closed (and its clients).
        login_failures_max, login_failure_window_ms: failed logins per browser address
            within the window after which that address is refused for a while (the
            console's own limit, below the broker's, which counts all console users as
            one address: ``limits.py``).
        security: client security settings without credentials (see the module).
    """

    bootstrap_servers: str
    host: str = "127.0.0.1"
    port: int = 7480
    refresh_ms: int = 5_000
    request_timeout_ms: int = 5_000
    history_window_ms: int = 600_000
    sample_interval_ms: int = 5_000
    page_size: int = 20
    session_idle_ms: int = 1_800_000
    login_failures_max: int = 3
    login_failure_window_ms: int = 60_000
    security: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ValueError("bootstrap_servers is empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        for name in (
            "refresh_ms",
            "request_timeout_ms",
            "history_window_ms",
            "page_size",
            "login_failures_max",
            "login_failure_window_ms",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 1_000 <= self.sample_interval_ms <= 60_000:
            raise ValueError("sample_interval_ms must be between 1000 and 60000")
        if self.session_idle_ms < 1_000:
            raise ValueError("session_idle_ms must be at least 1000")
        unknown = set(self.security) - _SECURITY_KEYS
        if unknown:
            raise ValueError(
                f"unknown or unwanted security settings {sorted(unknown)} "
                "(credentials come from the login page)"
            )

    @property
    def authentication(self) -> bool:
        """Whether the cluster wants a SASL login (every console user logs in)."""
        return self.security.get("security_protocol", "PLAINTEXT").startswith("SASL")

    def client_settings(
        self, username: str | None = None, password: str | None = None
    ) -> dict[str, object]:
        """The keyword settings of every client made for one console user."""
        settings: dict[str, object] = {
            **self.security,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if username is not None:
            settings["sasl_plain_username"] = username
            settings["sasl_plain_password"] = password
        return settings
