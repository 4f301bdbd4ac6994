"""The broker's security settings (``SecurityConfig``): TLS, SASL, sessions, audit.

Parsed from the same flat mapping of Kafka-named settings as ``BrokerConfig`` (which holds
one of these as ``security``); ``docs/security.md`` explains each.

===================================  ====================  =====================================
key                                  default               meaning
===================================  ====================  =====================================
``security.protocol``                PLAINTEXT             the listener's protocol: PLAINTEXT,
                                                           SSL, SASL_PLAINTEXT, SASL_SSL (also
                                                           ``listeners=SASL_SSL://HOST:PORT``)
``ssl.certfile``                     (none)                PEM certificate chain (SSL, SASL_SSL)
``ssl.keyfile``                      (none)                PEM private key of that certificate
``ssl.cafile``                       (none)                PEM CA bundle: client certificates
                                                           are verified against it; brokers
                                                           verify each other with it
``ssl.client.auth``                  none                  none, requested, required
``sasl.enabled.mechanisms``          SCRAM-SHA-256,        comma-separated; PLAIN only with
                                     SCRAM-SHA-512         SASL_SSL
``sasl.session.lifetime.ms``         86400000              a session token's life
``connections.max.reauth.ms``        0                     KIP-368: sessions end this soon (0: off)
``sasl.login.failures.max``          5                     failed logins per address per window
``sasl.login.failure.window.ms``     60000                 that window
``inter.broker.sasl.mechanism``      SCRAM-SHA-512         how brokers log in to each other
``inter.broker.sasl.username``       (none)                (SASL_* in cluster mode)
``inter.broker.sasl.password``       (none)                never written back by ``to_mapping``
``metrics.ssl.enable``               false                 serve metrics over TLS (same cert)
``audit.log.file``                   (none)                also append audit lines here
===================================  ====================  =====================================

The listener's scheme decides, as in Kafka: ``ssl.*`` settings mean nothing on a PLAINTEXT
listener and ``sasl.*`` settings nothing without a SASL scheme. They are accepted (a config
file can be shared between listeners) but never silently: ``ignored_settings`` names each
one given that the protocol does not use, and the setting that would turn it on, and the
broker logs it as a warning at start.

Pure and immutable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.storage.errors import InvalidConfigError

__all__ = [
    "CLIENT_AUTH_CHOICES",
    "PROTOCOLS",
    "SECURITY_KEYS",
    "SecurityConfig",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
CLIENT_AUTH_CHOICES = ("none", "requested", "required")
_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")

SECURITY_KEYS = frozenset(
    {
        "security.protocol",
        "ssl.certfile",
        "ssl.keyfile",
        "ssl.cafile",
        "ssl.client.auth",
        "sasl.enabled.mechanisms",
        "sasl.session.lifetime.ms",
        "connections.max.reauth.ms",
        "sasl.login.failures.max",
        "sasl.login.failure.window.ms",
        "inter.broker.sasl.mechanism",
        "inter.broker.sasl.username",
        "inter.broker.sasl.password",
        "metrics.ssl.enable",
        "audit.log.file",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityConfig:
    """The listener's security. Immutable; validated when built (``InvalidConfigError``)."""

    protocol: str = "PLAINTEXT"
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cafile: str | None = None
    ssl_client_auth: str = "none"
    sasl_enabled_mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    sasl_session_lifetime_ms: int = 86_400_000
    connections_max_reauth_ms: int = 0
    """KIP-368: an authenticated session lasts at most this long (0: as long as
    ``sasl.session.lifetime.ms`` on gRPC, the connection's life on the Kafka listener);
    clients re-authenticate on their live connection before it ends."""
    sasl_login_failures_max: int = 5
    sasl_login_failure_window_ms: int = 60_000
    inter_broker_sasl_mechanism: str = "SCRAM-SHA-512"
    inter_broker_sasl_username: str | None = None
    inter_broker_sasl_password: str | None = None
    metrics_ssl_enable: bool = False
    audit_log_file: str | None = None
    given: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The Kafka-named keys this config was built from (``from_mapping``): what the user
    set, as against the defaults, for ``ignored_settings``."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise InvalidConfigError(
                f"security.protocol: expected one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )
        if self.ssl_client_auth not in CLIENT_AUTH_CHOICES:
            raise InvalidConfigError(
                f"ssl.client.auth: expected none, requested or required, got "
                f"{self.ssl_client_auth!r}"
            )
        for mechanism in (*self.sasl_enabled_mechanisms, self.inter_broker_sasl_mechanism):
            if mechanism not in _MECHANISMS:
                raise InvalidConfigError(
                    f"sasl.enabled.mechanisms: unknown mechanism {mechanism!r} "
                    f"(known: {', '.join(_MECHANISMS)})"
                )
        if self.tls and (not self.ssl_certfile or not self.ssl_keyfile):
            raise InvalidConfigError(
                f"security.protocol {self.protocol} needs ssl.certfile and ssl.keyfile"
            )
        if self.tls and self.ssl_client_auth != "none" and not self.ssl_cafile:
            raise InvalidConfigError(
                f"ssl.client.auth={self.ssl_client_auth} needs ssl.cafile (to verify clients)"
            )
        if self.sasl and not self.sasl_enabled_mechanisms:
            raise InvalidConfigError("sasl.enabled.mechanisms: empty with a SASL protocol")
        if self.metrics_ssl_enable and not (self.ssl_certfile and self.ssl_keyfile):
            raise InvalidConfigError("metrics.ssl.enable needs ssl.certfile and ssl.keyfile")
        for name, value, minimum in (
            ("sasl.session.lifetime.ms", self.sasl_session_lifetime_ms, 1),
            ("connections.max.reauth.ms", self.connections_max_reauth_ms, 0),
            ("sasl.login.failures.max", self.sasl_login_failures_max, 1),
            ("sasl.login.failure.window.ms", self.sasl_login_failure_window_ms, 1),
        ):
            if value < minimum:
                raise InvalidConfigError(f"{name}: must be >= {minimum}, got {value}")

    @property
    def tls(self) -> bool:
        """The listener speaks TLS (SSL, SASL_SSL)."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        """Every call needs a session from the ``Authenticate`` handshake (SASL_*)."""
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ignored_settings(self) -> tuple[str, ...]:
        """One message per given setting this protocol does not use, in key order.

        Each names the setting, the protocol in force and what would turn it on. Empty
        when nothing given is ignored.
        """
        turn_on = "set security.protocol (or a listeners=SCHEME://HOST:PORT scheme) to"
        messages = []
        for key in sorted(self.given):
            if key.startswith("ssl.") and not self.tls:
                if key in ("ssl.certfile", "ssl.keyfile") and self.metrics_ssl_enable:
                    continue  # the metrics endpoint's certificate
                messages.append(
                    f"{key} is ignored: the listener is {self.protocol}, not TLS; "
                    f"{turn_on} SSL or SASL_SSL to use it"
                )
            elif (key.startswith("sasl.") or key.startswith("inter.broker.sasl.")) and (
                not self.sasl
            ):
                messages.append(
                    f"{key} is ignored: the listener is {self.protocol}, which authenticates "
                    f"no one with SASL; {turn_on} SASL_SSL or SASL_PLAINTEXT to use it"
                )
        return tuple(messages)

    @classmethod
    def from_mapping(
        cls, settings: Mapping[str, object], listener_protocol: str | None = None
    ) -> SecurityConfig:
        """Build from Kafka-named settings (other keys are ignored).

        ``listener_protocol``: the scheme of ``listeners`` if it had one; it must agree
        with ``security.protocol`` when both are given.
        """
        changes: dict[str, Any] = {"given": frozenset(SECURITY_KEYS & set(settings))}
        protocol = listener_protocol
        if "security.protocol" in settings:
            given = _text("security.protocol", settings["security.protocol"]).upper()
            if protocol is not None and protocol != given:
                raise InvalidConfigError(
                    f"security.protocol {given} disagrees with listeners' {protocol}://"
                )
            protocol = given
        if protocol is not None:
            changes["protocol"] = protocol
        for key, name in (
            ("ssl.certfile", "ssl_certfile"),
            ("ssl.keyfile", "ssl_keyfile"),
            ("ssl.cafile", "ssl_cafile"),
            ("inter.broker.sasl.username", "inter_broker_sasl_username"),
            ("inter.broker.sasl.password", "inter_broker_sasl_password"),
            ("audit.log.file", "audit_log_file"),
        ):
            if key in settings:
                changes[name] = _text(key, settings[key])
        if "ssl.client.auth" in settings:
            changes["ssl_client_auth"] = _text(
                "ssl.client.auth", settings["ssl.client.auth"]
            ).lower()
        if "sasl.enabled.mechanisms" in settings:
            text = _text("sasl.enabled.mechanisms", settings["sasl.enabled.mechanisms"])
            changes["sasl_enabled_mechanisms"] = tuple(
                m.strip().upper() for m in text.split(",") if m.strip()
            )
        if "inter.broker.sasl.mechanism" in settings:
            changes["inter_broker_sasl_mechanism"] = _text(
                "inter.broker.sasl.mechanism", settings["inter.broker.sasl.mechanism"]
            ).upper()
        for key, name in (
            ("sasl.session.lifetime.ms", "sasl_session_lifetime_ms"),
            ("connections.max.reauth.ms", "connections_max_reauth_ms"),
            ("sasl.login.failures.max", "sasl_login_failures_max"),
            ("sasl.login.failure.window.ms", "sasl_login_failure_window_ms"),
        ):
            if key in settings:
                changes[name] = _integer(key, settings[key])
        if "metrics.ssl.enable" in settings:
            value = settings["metrics.ssl.enable"]
            if isinstance(value, str):
                if value.strip().lower() not in ("true", "false"):
                    raise InvalidConfigError(
                        f"metrics.ssl.enable: expected true or false, got {value!r}"
                    )
                value = value.strip().lower() == "true"
            if not isinstance(value, bool):
                raise InvalidConfigError(
                    f"metrics.ssl.enable: expected true or false, got {value!r}"
                )
            changes["metrics_ssl_enable"] = value
        try:
            return cls(**changes)
        except InvalidConfigError as exc:
            if listener_protocol is not None and str(exc).startswith("security.protocol"):
                raise InvalidConfigError(f"listeners: {listener_protocol}:// {exc}") from None
            raise

    def to_mapping(self) -> dict[str, str]:
        """The settings as Kafka-named strings; the inter-broker password is left out."""
        out = {
            "security.protocol": self.protocol,
            "ssl.client.auth": self.ssl_client_auth,
            "sasl.enabled.mechanisms": ",".join(self.sasl_enabled_mechanisms),
            "sasl.session.lifetime.ms": str(self.sasl_session_lifetime_ms),
            "connections.max.reauth.ms": str(self.connections_max_reauth_ms),
            "sasl.login.failures.max": str(self.sasl_login_failures_max),
            "sasl.login.failure.window.ms": str(self.sasl_login_failure_window_ms),
            "inter.broker.sasl.mechanism": self.inter_broker_sasl_mechanism,
            "metrics.ssl.enable": str(self.metrics_ssl_enable).lower(),
        }
        for key, value in (
            ("ssl.certfile", self.ssl_certfile),
            ("ssl.keyfile", self.ssl_keyfile),
            ("ssl.cafile", self.ssl_cafile),
            ("inter.broker.sasl.username", self.inter_broker_sasl_username),
            ("audit.log.file", self.audit_log_file),
        ):
            if value is not None:
                out[key] = value
        return out


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def _integer(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise InvalidConfigError(f"{key}: expected an integer, got {value!r}") from None
