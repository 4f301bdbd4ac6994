"""The console's web application: routes, forms, CSRF, login, and the JSON of the charts.

Every page is server-rendered HTML (Jinja2, autoescaped) that works with JavaScript off:
tables, links and forms. ``static/console.js`` adds live updates (it re-fetches the page
every ``refresh_ms`` and swaps the ``data-live`` regions) and the uPlot charts, fed by
``/api/charts/...``. Handlers are plain ``def`` functions: Starlette runs them on its
thread pool, where the blocking client calls belong.

Forms: every POST carries the session's CSRF token (``csrf_token``) or is refused with
403. Destructive actions (delete a topic, reset a group's offsets) go through a
confirmation page; the topic's deletion also wants its name typed again. After a POST
the browser is redirected (303) and the outcome shown as a flash message.

Routes::

    GET  /                              overview (brokers, totals, rates chart)
    GET  /login  POST /login  POST /logout
    GET  /topics   POST /topics         list (sort, filter) and create
    GET  /topics/{name}                 partitions, configs, record browser
    POST /topics/{name}/produce         a test record
    POST /topics/{name}/config          set or delete configs
    GET  /topics/{name}/delete  POST    confirmation, then delete
    GET  /groups   GET /groups/{id}     groups; one group with lag per partition
    GET  /groups/{id}/reset  POST       confirmation, then reset (empty groups only)
                                        ({id} percent-encoded: it may contain "/")
    GET  /security                      users and ACLs
    POST /security/users  /security/users/delete  /security/acls  /security/acls/delete
    GET  /api/charts/overview  /api/charts/groups/{id}
    GET  /healthz
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidelog.client.acls import AclBinding, AclFilter
from tidelog.client.types import TopicDescription
from tidelog.storage.errors import (
    BrokerUnavailableError,
    GroupIdNotFoundError,
    InvalidTopicError,
    NotAuthorizedError,
    SaslAuthenticationError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

from .config import ConsoleConfig
from .history import History, Series
from .limits import LoginLimiter
from .sessions import COOKIE_NAME, ConsoleSession, SessionStore
from .view import ClusterView, describe_error, total_lag

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parent
_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "name": lambda r: r.name,
    "partitions": lambda r: r.partitions,
    "rf": lambda r: r.replication_factor,
    "size": lambda r: r.size_bytes,
    "messages": lambda r: r.messages,
    "retention": lambda r: int(r.retention_ms) if r.retention_ms.lstrip("-").isdigit() else 0,
    "rate": lambda r: r.rate or 0.0,
    "under_replicated": lambda r: r.under_replicated,
}
_RESET_TARGETS = ("earliest", "latest", "timestamp", "offset")
_RENDER_MODES = ("auto", "utf-8", "json", "hex")


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_PACKAGE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = _human_bytes
    env.filters["ms"] = _format_ms
    env.filters["rate"] = lambda v: "\u2013" if v is None else f"{v:,.1f}/s"
    env.filters["duration"] = _duration
    env.filters["urlpart"] = lambda v: quote(str(v), safe="")
    return env


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"  # pragma: no cover - the loop returns at GiB


def _format_ms(value: int | None) -> str:
    if value is None or value < 0:
        return "\u2013"
    moment = datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{value % 1000:03d}Z"


def _duration(text: str) -> str:
    if not text.lstrip("-").isdigit():
        return text or "\u2013"
    ms = int(text)
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _parse_datetime_ms(text: str) -> int:
    """An ISO date-time (a browser's ``datetime-local``: no zone means UTC) or ms."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _int_or_none(text: str | None, what: str, *, minimum: int = 0) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be a whole number") from None
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}")
    return value


def _pairs(text: str) -> dict[str, str]:
    """``key=value`` lines (blank lines ignored). Raises ``ValueError``."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {line.strip()!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _series_json(series: Series) -> dict[str, Any]:
    return {
        "name": series.name,
        "points": [[p.time_ms / 1000, p.value] for p in series.points],
    }


class _SessionMiddleware(BaseHTTPMiddleware):
    """Finds (or makes) the request's ``ConsoleSession``; sets the cookie when new."""

    def __init__(self, app: Any, store: SessionStore) -> None:
        super().__init__(app)
        self.store = store

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path.startswith("/static/") or request.url.path == "/healthz":
            return await call_next(request)
        session, created = self.store.get_or_create(request.cookies.get(COOKIE_NAME))
        request.state.session = session
        sid = session.session_id
        response = await call_next(request)
        # A login changes the id (``SessionStore.log_in``): send the new one.
        if created or session.session_id != sid or request.cookies.get(COOKIE_NAME) != sid:
            response.set_cookie(
                COOKIE_NAME,
                session.session_id,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'",
        )
        return response


class _Console:
    """The handlers, sharing the config, the sessions and the templates."""

    def __init__(self, config: ConsoleConfig, store: SessionStore) -> None:
        self.config = config
        self.store = store
        self.limiter = LoginLimiter(
            max_failures=config.login_failures_max, window_ms=config.login_failure_window_ms
        )
        self.templates = _templates()

    # --- helpers ----------------------------------------------------------------------

    def session(self, request: Request) -> ConsoleSession:
        session: ConsoleSession = request.state.session
        return session

    def view(self, request: Request) -> ClusterView:
        """The session's view; a redirect to the login page without one."""
        view = self.session(request).view
        if view is None:
            raise HTTPException(303, headers={"Location": "/login?next=" + quote(_here(request))})
        return view

    def render(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        *,
        status_code: int = 200,
        title: str = "",
    ) -> HTMLResponse:
        session = self.session(request)
        # A live refresh (console.js re-fetching the page for its data-live regions) shows
        # no flash and leaves them for the next page load: the old page's timer can fire
        # between a form's redirect and the page it leads to, and took the message away
        # (seen in the browser test: a produce answered "Sent" that never showed).
        live = request.headers.get("x-console-live") == "1"
        page = self.templates.get_template(template).render(
            {
                "request_path": request.url.path,
                "csrf_token": session.csrf_token,
                "principal": session.principal,
                "authentication": self.config.authentication,
                "refresh_ms": self.config.refresh_ms,
                "flashes": [] if live else session.take_flashes(),
                "title": title,
                "bootstrap": self.config.bootstrap_servers,
                **context,
            }
        )
        return HTMLResponse(page, status_code=status_code)

    async def form(self, request: Request) -> FormData:
        """The POSTed form, its CSRF token checked (403 when missing or wrong)."""
        form = await request.form()
        if not self.session(request).csrf_ok(form.get("csrf_token")):
            log.warning("refused a form without a valid CSRF token: %s", request.url.path)
            raise HTTPException(403, "missing or invalid CSRF token: reload the page")
        return form

    def redirect(self, url: str, request: Request, kind: str = "", message: str = "") -> Response:
        if message:
            self.session(request).flash(kind, message)
        return RedirectResponse(url, status_code=303)

    # --- pages ------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        view = self.view(request)
        overview = view.overview()
        produce = view.history.produce_rate()
        consume = view.history.consume_rate()
        return self.render(
            request,
            "overview.html",
            {
                "overview": overview,
                "produce_now": _last(produce),
                "consume_now": _last(consume),
            },
            title="Overview",
        )

    def login_page(self, request: Request) -> Response:
        if not self.config.authentication:
            return RedirectResponse("/", status_code=303)
        return self.render(
            request,
            "login.html",
            {"next": _safe_next(request.query_params.get("next")), "error": None},
            title="Log in",
        )

    async def login(self, request: Request) -> Response:
        form = await self.form(request)
        if not self.config.authentication:
            return RedirectResponse("/", status_code=303)
        username = str(form.get("username", "")).strip()
        password = str(form.get("password", ""))
        next_url = _safe_next(str(form.get("next", "/")))
        status, headers = 401, {}
        error = None
        if not username or not password:
            error = "Give a user name and a password."
        else:
            # The console's own limit per browser address, checked before the broker is
            # asked: the broker counts every console user as one address (``limits.py``).
            address = request.client.host if request.client else "unknown"
            attempt = self.limiter.begin(address)
            if isinstance(attempt, int):
                seconds = -(-attempt // 1000)
                log.warning("refused a login: too many failed logins from %s", address)
                error = f"Too many failed logins from your address. Try again in {seconds} s."
                status, headers = 429, {"Retry-After": str(seconds)}
            else:
                error, refused = await _run(self._log_in, request, username, password)
                self.limiter.end(attempt, refused=refused)
        if error is not None:
            # The password is neither echoed nor logged; the user name is not logged.
            response = self.render(
                request,
                "login.html",
                {"next": next_url, "error": error},
                status_code=status,
                title="Log in",
            )
            response.headers.update(headers)
            return response
        return RedirectResponse(next_url, status_code=303)

    def _log_in(self, request: Request, username: str, password: str) -> tuple[str | None, bool]:
        """Log ``request``'s session in: (an error to show or None, whether the cluster
        refused the user name and password)."""
        view = ClusterView(
            self.config.bootstrap_servers,
            self.config.client_settings(username, password),
            principal=username,
            history=History(window_ms=self.config.history_window_ms),
        )
        try:
            view.admin.list_topics()
        except SaslAuthenticationError:
            view.close()
            return "The cluster refused this user name and password.", True
        except NotAuthorizedError:
            pass  # logged in; the pages say what this user may not see
        except TidelogError as exc:
            view.close()
            return f"The cluster could not be reached: {describe_error(exc)}", False
        self.store.log_in(self.session(request), view, username)
        return None, False

    async def logout(self, request: Request) -> Response:
        await self.form(request)
        self.store.log_out(self.session(request))
        return RedirectResponse("/login" if self.config.authentication else "/", 303)

    def topics(self, request: Request) -> Response:
        view = self.view(request)
        query = request.query_params
        text = query.get("q", "").strip()
        sort = query.get("sort", "name")
        if sort not in _SORT_KEYS:
            sort = "name"
        order = "desc" if query.get("order") == "desc" else "asc"
        show_internal = query.get("internal") == "1"
        rows = [
            r
            for r in view.topic_rows()
            if (show_internal or not r.internal) and text.lower() in r.name.lower()
        ]
        rows.sort(key=_SORT_KEYS[sort], reverse=order == "desc")

        def sort_link(key: str) -> str:
            flip = "desc" if sort == key and order == "asc" else "asc"
            params = {"sort": key, "order": flip, "q": text}
            if show_internal:
                params["internal"] = "1"
            return "/topics?" + urlencode(params)

        return self.render(
            request,
            "topics.html",
            {
                "rows": rows,
                "q": text,
                "sort": sort,
                "order": order,
                "show_internal": show_internal,
                "sort_link": sort_link,
            },
            title="Topics",
        )

    async def create_topic(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = str(form.get("name", "")).strip()
        try:
            partitions = _int_or_none(str(form.get("partitions", "")), "Partitions", minimum=1)
            replication = _int_or_none(
                str(form.get("replication_factor", "")), "Replication factor", minimum=1
            )
            config = _pairs(str(form.get("config", "")))
            if not name:
                raise ValueError("Give the topic a name.")
            await _run(view.create_topic, name, partitions, replication, config)
        except (ValueError, TidelogError) as exc:
            return self.redirect("/topics", request, "error", f"Not created: {_say(exc)}")
        return self.redirect(
            f"/topics/{quote(name, safe='')}", request, "ok", f"Created topic {name}."
        )

    def topic(self, request: Request) -> Response:
        view = self.view(request)
        name = _topic_name(request)
        description = view.topic(name)
        query = request.query_params
        partitions = [p.partition for p in description.partitions]
        browse_error = None
        page = None
        mode = query.get("mode", "auto")
        if mode not in _RENDER_MODES:
            mode = "auto"
        try:
            partition = _int_or_none(query.get("partition"), "Partition") or 0
            if partition not in partitions:
                raise ValueError(f"no partition {partition}")
            offset = _int_or_none(query.get("offset"), "Offset")
            at = query.get("timestamp", "").strip()
            timestamp_ms = _parse_datetime_ms(at) if at else None
            page = view.browse(
                name,
                partition,
                offset=offset,
                timestamp_ms=timestamp_ms,
                limit=self.config.page_size,
                mode=mode,
            )
        except (ValueError, TidelogError) as exc:
            partition = 0
            browse_error = _say(exc)

        def page_link(offset: int) -> str:
            return f"/topics/{quote(name, safe='')}?" + urlencode(
                {"partition": partition, "offset": offset, "mode": mode}
            )

        return self.render(
            request,
            "topic.html",
            {
                "topic": description,
                "partition": partition,
                "page": page,
                "mode": mode,
                "modes": _RENDER_MODES,
                "browse_error": browse_error,
                "page_link": page_link,
                "under_replicated": _under_replicated(description),
                "offset_value": query.get("offset", ""),
                "timestamp_value": query.get("timestamp", ""),
            },
            title=f"Topic {name}",
        )

    async def produce(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = _topic_name(request)
        back = f"/topics/{quote(name, safe='')}"
        try:
            partition = _int_or_none(str(form.get("partition", "")), "Partition")
            key = str(form.get("key", ""))
            value = str(form.get("value", ""))
            headers = [(k, v.encode()) for k, v in _pairs(str(form.get("headers", ""))).items()]
            landed, offset = await _run(
                view.produce,
                name,
                value=value.encode(),
                key=key.encode() if key else None,
                partition=partition,
                headers=headers,
            )
        except (ValueError, TidelogError, TimeoutError) as exc:
            return self.redirect(back, request, "error", f"Not sent: {_say(exc)}")
        return self.redirect(
            f"{back}?" + urlencode({"partition": landed, "offset": offset}),
            request,
            "ok",
            f"Sent: partition {landed}, offset {offset}.",
        )

    async def alter_config(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = _topic_name(request)
        back = f"/topics/{quote(name, safe='')}"
        try:
            settings = _pairs(str(form.get("set", "")))
            delete = [k.strip() for k in str(form.get("delete", "")).split(",") if k.strip()]
            if not settings and not delete:
                raise ValueError("nothing to change")
            await _run(view.alter_topic_config, name, settings, delete)
        except (ValueError, TidelogError) as exc:
            return self.redirect(back, request, "error", f"Configs not changed: {_say(exc)}")
        return self.redirect(back, request, "ok", "Configs changed.")

    def confirm_delete(self, request: Request) -> Response:
        view = self.view(request)
        name = _topic_name(request)
        description = view.topic(name)
        return self.render(
            request,
            "confirm_delete.html",
            {
                "topic": description,
                "messages": sum(
                    max(0, p.log_end_offset - p.log_start_offset) for p in description.partitions
                ),
            },
            title=f"Delete {name}?",
        )

    async def delete_topic(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = _topic_name(request)
        if form.get("confirm_name") != name:
            return self.redirect(
                f"/topics/{quote(name, safe='')}/delete",
                request,
                "error",
                "Type the topic's name to confirm.",
            )
        try:
            await _run(view.delete_topic, name)
        except TidelogError as exc:
            return self.redirect("/topics", request, "error", f"Not deleted: {_say(exc)}")
        return self.redirect("/topics", request, "ok", f"Deleted topic {name}.")

    def groups(self, request: Request) -> Response:
        view = self.view(request)
        return self.render(request, "groups.html", {"groups": view.groups()}, title="Groups")

    def group(self, request: Request) -> Response:
        view = self.view(request)
        group_id = _group_id(request)
        description = view.group(group_id)
        topics = sorted({p.tp.topic for p in description.partitions})
        return self.render(
            request,
            "group.html",
            {
                "group": description,
                "total_lag": total_lag(description),
                "topics": topics,
                "empty": not description.members,
            },
            title=f"Group {group_id}",
        )

    def _reset_request(self, request: Request, values: Mapping[str, Any]) -> dict[str, Any]:
        target = str(values.get("target", ""))
        if target not in _RESET_TARGETS:
            raise ValueError("choose earliest, latest, a timestamp or an offset")
        topic = str(values.get("topic", "")).strip() or None
        value: int | None = None
        if target == "offset":
            value = _int_or_none(str(values.get("offset", "")), "Offset")
            if value is None:
                raise ValueError("give the offset")
        elif target == "timestamp":
            text = str(values.get("timestamp", "")).strip()
            if not text:
                raise ValueError("give the date and time")
            value = _parse_datetime_ms(text)
        return {"target": target, "topic": topic, "value": value}

    def confirm_reset(self, request: Request) -> Response:
        view = self.view(request)
        group_id = _group_id(request)
        back = f"/groups/{quote(group_id, safe='')}"
        try:
            reset = self._reset_request(request, request.query_params)
        except ValueError as exc:
            return self.redirect(back, request, "error", f"Not reset: {_say(exc)}")
        description = view.group(group_id)
        if description.members:
            return self.redirect(
                back,
                request,
                "error",
                "Not reset: the group has members. Stop its consumers first.",
            )
        return self.render(
            request,
            "confirm_reset.html",
            {"group": description, **reset},
            title=f"Reset {group_id}?",
        )

    async def reset(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        group_id = _group_id(request)
        back = f"/groups/{quote(group_id, safe='')}"
        try:
            reset = self._reset_request(request, form)
            moved = await _run(
                view.reset_group, group_id, reset["topic"], reset["target"], reset["value"]
            )
        except (ValueError, TidelogError) as exc:
            return self.redirect(back, request, "error", f"Not reset: {_say(exc)}")
        return self.redirect(
            back, request, "ok", f"Reset {len(moved)} partition(s) of group {group_id}."
        )

    def security(self, request: Request) -> Response:
        view = self.view(request)
        return self.render(request, "security.html", {"state": view.security()}, title="Security")

    async def add_user(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = str(form.get("name", "")).strip()
        password = str(form.get("password", ""))
        mechanism = str(form.get("mechanism", "SCRAM-SHA-256"))
        try:
            if not name or not password:
                raise ValueError("give a name and a password")
            await _run(view.admin.upsert_user, name, password, mechanism)
        except (ValueError, TidelogError) as exc:
            return self.redirect("/security", request, "error", f"User not saved: {_say(exc)}")
        return self.redirect("/security", request, "ok", f"Saved user {name} ({mechanism}).")

    async def delete_user(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = str(form.get("name", ""))
        try:
            await _run(view.admin.delete_user, name)
        except TidelogError as exc:
            return self.redirect("/security", request, "error", f"Not deleted: {_say(exc)}")
        return self.redirect("/security", request, "ok", f"Deleted user {name}.")

    async def add_acl(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        try:
            binding = AclBinding(
                principal=str(form.get("principal", "")).strip(),
                operation=str(form.get("operation", "")),
                resource_type=str(form.get("resource_type", "TOPIC")),
                resource_name=str(form.get("resource_name", "")).strip(),
                pattern_type=str(form.get("pattern_type", "LITERAL")),
                permission=str(form.get("permission", "ALLOW")),
                host=str(form.get("host", "*")).strip() or "*",
            )
            await _run(view.admin.create_acls, [binding])
        except (ValueError, TidelogError) as exc:
            return self.redirect("/security", request, "error", f"ACL not added: {_say(exc)}")
        return self.redirect("/security", request, "ok", "ACL added.")

    async def delete_acl(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        acl_filter = AclFilter(
            principal=str(form.get("principal", "")),
            operation=str(form.get("operation", "")),
            resource_type=str(form.get("resource_type", "")),
            resource_name=str(form.get("resource_name", "")),
            pattern_type=str(form.get("pattern_type", "")),
            permission=str(form.get("permission", "")),
            host=str(form.get("host", "")),
        )
        try:
            removed = await _run(view.admin.delete_acls, acl_filter)
        except TidelogError as exc:
            return self.redirect("/security", request, "error", f"Not removed: {_say(exc)}")
        return self.redirect("/security", request, "ok", f"Removed {len(removed)} ACL(s).")

    # --- JSON for the charts ------------------------------------------------------------

    def overview_chart(self, request: Request) -> Response:
        view = self.session(request).view
        if view is None:
            return JSONResponse({"error": "log in"}, status_code=401)
        return JSONResponse(
            {
                "series": [
                    _series_json(view.history.produce_rate()),
                    _series_json(view.history.consume_rate()),
                ]
            }
        )

    def group_chart(self, request: Request) -> Response:
        view = self.session(request).view
        if view is None:
            return JSONResponse({"error": "log in"}, status_code=401)
        group_id = _group_id(request)
        return JSONResponse({"series": [_series_json(view.history.group_lag(group_id))]})

    def group_get(self, request: Request) -> Response:
        """``GET /groups/ID`` and ``GET /groups/ID/reset`` (ID percent-encoded)."""
        action = _group_path(request)[1]
        if action == "":
            return self.group(request)
        if action == "reset":
            return self.confirm_reset(request)
        raise HTTPException(404, "No such page.")

    async def group_post(self, request: Request) -> Response:
        """``POST /groups/ID/reset`` (ID percent-encoded)."""
        if _group_path(request)[1] == "reset":
            return await self.reset(request)
        raise HTTPException(404, "No such page.")

    def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    # --- errors -----------------------------------------------------------------------

    def broker_error(self, request: Request, exc: Exception) -> Response:
        status = 502
        if isinstance(exc, UnknownTopicOrPartitionError | GroupIdNotFoundError):
            status = 404
        elif isinstance(exc, InvalidTopicError):
            status = 400
        elif isinstance(exc, NotAuthorizedError | SaslAuthenticationError):
            status = 403
        elif isinstance(exc, BrokerUnavailableError):
            status = 503
        if not hasattr(request.state, "session"):
            return Response(describe_error(exc), status_code=status)
        return self.render(
            request,
            "error.html",
            {"message": describe_error(exc), "status": status},
            status_code=status,
            title="Error",
        )

    def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code in (301, 302, 303, 307) and exc.headers:
            return RedirectResponse(exc.headers["Location"], status_code=exc.status_code)
        if not hasattr(request.state, "session"):
            return Response(exc.detail, status_code=exc.status_code)
        return self.render(
            request,
            "error.html",
            {"message": exc.detail, "status": exc.status_code},
            status_code=exc.status_code,
            title="Error",
        )


async def _run(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking client call from an ``async`` handler, on Starlette's thread pool."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(function, *args, **kwargs)


def _group_path(request: Request) -> tuple[str, str]:
    """(group id, what follows it) of ``/groups/ID[/reset]`` or
    ``/api/charts/groups/ID``. A group id may hold any character, ``/`` too: links
    percent-encode it whole (``%2F``), so it is read from the raw, still encoded path,
    where its ``/`` cannot be told from a separator. 404 when there is none; 400 when
    its encoding is not UTF-8."""
    path: str = request.scope["route_prefix"]
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    encoded, _, action = raw[len(path) :].decode("latin-1").partition("/")
    if not encoded:
        raise HTTPException(404, "No group id in this address.")
    try:
        return unquote(encoded, errors="strict"), action
    except UnicodeDecodeError:
        raise HTTPException(400, "This group id is not valid UTF-8.") from None


def _group_id(request: Request) -> str:
    return _group_path(request)[0]


# Kafka's rule (storage/files.py, which the console does not import: it uses the public
# client API only): 1 to 249 of [A-Za-z0-9._-], and not "." or "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _topic_name(request: Request) -> str:
    """The topic of ``/topics/NAME...``; 400 when it is no legal topic name."""
    name: str = request.path_params["name"]
    if _TOPIC_NAME.fullmatch(name) is None or name in (".", ".."):
        raise HTTPException(
            400,
            f"{name!r} is not a topic name: topic names are 1 to 249 ASCII letters, "
            "digits, '.', '_' and '-'.",
        )
    return name


def _last(series: Series) -> float | None:
    for point in reversed(series.points):
        if point.value is not None:
            return point.value
    return None


def _under_replicated(description: TopicDescription) -> int:
    return sum(1 for p in description.partitions if len(p.isr) < len(p.replicas))


def _say(exc: BaseException) -> str:
    return describe_error(exc) if isinstance(exc, TidelogError) else str(exc)


def _here(request: Request) -> str:
    """The request's path as sent (still percent-encoded: a group id's ``%2F`` stays
    one) and its query."""
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("latin-1")
    return path + (f"?{request.url.query}" if request.url.query else "")


def _safe_next(url: str | None) -> str:
    """Only a path of this site: never an open redirect to another host."""
    if not url or not url.startswith("/") or url.startswith("//") or "\\" in url:
        return "/"
    return url


def _prefixed(handler: Callable[[Request], Any], prefix: str) -> Callable[[Request], Any]:
    """``handler`` with the route's fixed prefix in ``scope["route_prefix"]``, for
    ``_group_path``. Keeps the handler sync or async, as Starlette runs each."""
    if inspect.iscoroutinefunction(handler):

        async def run_async(request: Request) -> Any:
            request.scope["route_prefix"] = prefix
            return await handler(request)

        return run_async

    def run(request: Request) -> Any:
        request.scope["route_prefix"] = prefix
        return handler(request)

    return run


def _no_such_topic_page(request: Request) -> Response:
    """``/topics/A/B``: topic names hold no ``/``."""
    raise HTTPException(
        404, "No such page: topic names are ASCII letters, digits, '.', '_' and '-' (no '/')."
    )


def create_app(config: ConsoleConfig) -> Starlette:
    """The console as an ASGI application (uvicorn serves it: ``client.console.serve``).

    The clients are made on the first request (with authentication: at each login) and
    closed when the application shuts down.
    """
    shared: Callable[[], ClusterView] | None = None
    if not config.authentication:

        def shared() -> ClusterView:
            return ClusterView(
                config.bootstrap_servers,
                config.client_settings(),
                history=History(window_ms=config.history_window_ms),
            )

    store = SessionStore(
        shared, idle_ms=config.session_idle_ms, sample_interval_ms=config.sample_interval_ms
    )
    console = _Console(config, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Background sampling for the charts lives as long as the application: the
        # shared view's sampler starts now (its first look is made on the sampler's own
        # thread), a session's at its login; all stop here.
        await _run(store.start)
        try:
            yield
        finally:
            await _run(store.close)

    routes = [
        Route("/", console.overview, name="overview"),
        Route("/login", console.login_page, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route("/topics", console.topics, methods=["GET"]),
        Route("/topics", console.create_topic, methods=["POST"]),
        Route("/topics/{name}/produce", console.produce, methods=["POST"]),
        Route("/topics/{name}/config", console.alter_config, methods=["POST"]),
        Route("/topics/{name}/delete", console.confirm_delete, methods=["GET"]),
        Route("/topics/{name}/delete", console.delete_topic, methods=["POST"]),
        Route("/topics/{name}", console.topic, methods=["GET"]),
        Route("/topics/{rest:path}", _no_such_topic_page),
        Route("/groups", console.groups, methods=["GET"]),
        # A group id may contain "/": these take the rest of the path and read the id
        # from the raw, percent-encoded one (``_group_path``).
        Route("/groups/{rest:path}", _prefixed(console.group_get, "/groups/"), methods=["GET"]),
        Route("/groups/{rest:path}", _prefixed(console.group_post, "/groups/"), methods=["POST"]),
        Route("/security", console.security, methods=["GET"]),
        Route("/security/users", console.add_user, methods=["POST"]),
        Route("/security/users/delete", console.delete_user, methods=["POST"]),
        Route("/security/acls", console.add_acl, methods=["POST"]),
        Route("/security/acls/delete", console.delete_acl, methods=["POST"]),
        Route("/api/charts/overview", console.overview_chart),
        Route(
            "/api/charts/groups/{rest:path}",
            _prefixed(console.group_chart, "/api/charts/groups/"),
        ),
        Route("/healthz", console.health),
        Mount("/static", StaticFiles(directory=_PACKAGE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_SessionMiddleware, store=store)],
        exception_handlers={
            TidelogError: console.broker_error,
            HTTPException: console.http_error,
        },
        lifespan=lifespan,
    )
    app.state.store = store
    return app
