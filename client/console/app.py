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

The session middleware, the security headers and what a handler reads from an address
are in ``client.console.http``; the templates' filters and the form fields' parsers in
``client.console.formats``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidelog.client.acls import AclBinding, AclFilter
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
from .formats import (
    int_or_none,
    last,
    pairs,
    parse_datetime_ms,
    say,
    series_json,
    templates,
    under_replicated,
)
from .history import History
from .http import (
    SessionMiddleware,
    group_id_of,
    group_path,
    here,
    no_such_topic_page,
    prefixed,
    run_blocking,
    safe_next,
    topic_name,
)
from .limits import LoginLimiter
from .sessions import ConsoleSession, SessionStore
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


class _Console:
    """The handlers, sharing the config, the sessions and the templates."""

    def __init__(self, config: ConsoleConfig, store: SessionStore) -> None:
        self.config = config
        self.store = store
        self.limiter = LoginLimiter(
            max_failures=config.login_failures_max, window_ms=config.login_failure_window_ms
        )
        self.templates = templates()

    # --- helpers ----------------------------------------------------------------------

    def session(self, request: Request) -> ConsoleSession:
        session: ConsoleSession = request.state.session
        return session

    def view(self, request: Request) -> ClusterView:
        """The session's view; a redirect to the login page without one."""
        view = self.session(request).view
        if view is None:
            raise HTTPException(303, headers={"Location": "/login?next=" + quote(here(request))})
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
                "produce_now": last(produce),
                "consume_now": last(consume),
            },
            title="Overview",
        )

    def login_page(self, request: Request) -> Response:
        if not self.config.authentication:
            return RedirectResponse("/", status_code=303)
        return self.render(
            request,
            "login.html",
            {"next": safe_next(request.query_params.get("next")), "error": None},
            title="Log in",
        )

    async def login(self, request: Request) -> Response:
        form = await self.form(request)
        if not self.config.authentication:
            return RedirectResponse("/", status_code=303)
        username = str(form.get("username", "")).strip()
        password = str(form.get("password", ""))
        next_url = safe_next(str(form.get("next", "/")))
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
                error, refused = await run_blocking(self._log_in, request, username, password)
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
            partitions = int_or_none(str(form.get("partitions", "")), "Partitions", minimum=1)
            replication = int_or_none(
                str(form.get("replication_factor", "")), "Replication factor", minimum=1
            )
            config = pairs(str(form.get("config", "")))
            if not name:
                raise ValueError("Give the topic a name.")
            await run_blocking(view.create_topic, name, partitions, replication, config)
        except (ValueError, TidelogError) as exc:
            return self.redirect("/topics", request, "error", f"Not created: {say(exc)}")
        return self.redirect(
            f"/topics/{quote(name, safe='')}", request, "ok", f"Created topic {name}."
        )

    def topic(self, request: Request) -> Response:
        view = self.view(request)
        name = topic_name(request)
        description = view.topic(name)
        query = request.query_params
        partitions = [p.partition for p in description.partitions]
        browse_error = None
        page = None
        mode = query.get("mode", "auto")
        if mode not in _RENDER_MODES:
            mode = "auto"
        try:
            partition = int_or_none(query.get("partition"), "Partition") or 0
            if partition not in partitions:
                raise ValueError(f"no partition {partition}")
            offset = int_or_none(query.get("offset"), "Offset")
            at = query.get("timestamp", "").strip()
            timestamp_ms = parse_datetime_ms(at) if at else None
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
            browse_error = say(exc)

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
                "under_replicated": under_replicated(description),
                "offset_value": query.get("offset", ""),
                "timestamp_value": query.get("timestamp", ""),
            },
            title=f"Topic {name}",
        )

    async def produce(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = topic_name(request)
        back = f"/topics/{quote(name, safe='')}"
        try:
            partition = int_or_none(str(form.get("partition", "")), "Partition")
            key = str(form.get("key", ""))
            value = str(form.get("value", ""))
            headers = [(k, v.encode()) for k, v in pairs(str(form.get("headers", ""))).items()]
            landed, offset = await run_blocking(
                view.produce,
                name,
                value=value.encode(),
                key=key.encode() if key else None,
                partition=partition,
                headers=headers,
            )
        except (ValueError, TidelogError, TimeoutError) as exc:
            return self.redirect(back, request, "error", f"Not sent: {say(exc)}")
        return self.redirect(
            f"{back}?" + urlencode({"partition": landed, "offset": offset}),
            request,
            "ok",
            f"Sent: partition {landed}, offset {offset}.",
        )

    async def alter_config(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = topic_name(request)
        back = f"/topics/{quote(name, safe='')}"
        try:
            settings = pairs(str(form.get("set", "")))
            delete = [k.strip() for k in str(form.get("delete", "")).split(",") if k.strip()]
            if not settings and not delete:
                raise ValueError("nothing to change")
            await run_blocking(view.alter_topic_config, name, settings, delete)
        except (ValueError, TidelogError) as exc:
            return self.redirect(back, request, "error", f"Configs not changed: {say(exc)}")
        return self.redirect(back, request, "ok", "Configs changed.")

    def confirm_delete(self, request: Request) -> Response:
        view = self.view(request)
        name = topic_name(request)
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
        name = topic_name(request)
        if form.get("confirm_name") != name:
            return self.redirect(
                f"/topics/{quote(name, safe='')}/delete",
                request,
                "error",
                "Type the topic's name to confirm.",
            )
        try:
            await run_blocking(view.delete_topic, name)
        except TidelogError as exc:
            return self.redirect("/topics", request, "error", f"Not deleted: {say(exc)}")
        return self.redirect("/topics", request, "ok", f"Deleted topic {name}.")

    def groups(self, request: Request) -> Response:
        view = self.view(request)
        return self.render(request, "groups.html", {"groups": view.groups()}, title="Groups")

    def group(self, request: Request) -> Response:
        view = self.view(request)
        group_id = group_id_of(request)
        if view.is_share_group(group_id):
            shared, offsets = view.share_group(group_id)
            return self.render(
                request,
                "share_group.html",
                {"group": shared, "offsets": offsets},
                title=f"Share group {group_id}",
            )
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
            value = int_or_none(str(values.get("offset", "")), "Offset")
            if value is None:
                raise ValueError("give the offset")
        elif target == "timestamp":
            text = str(values.get("timestamp", "")).strip()
            if not text:
                raise ValueError("give the date and time")
            value = parse_datetime_ms(text)
        return {"target": target, "topic": topic, "value": value}

    def confirm_reset(self, request: Request) -> Response:
        view = self.view(request)
        group_id = group_id_of(request)
        back = f"/groups/{quote(group_id, safe='')}"
        try:
            reset = self._reset_request(request, request.query_params)
        except ValueError as exc:
            return self.redirect(back, request, "error", f"Not reset: {say(exc)}")
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
        group_id = group_id_of(request)
        back = f"/groups/{quote(group_id, safe='')}"
        try:
            reset = self._reset_request(request, form)
            moved = await run_blocking(
                view.reset_group, group_id, reset["topic"], reset["target"], reset["value"]
            )
        except (ValueError, TidelogError) as exc:
            return self.redirect(back, request, "error", f"Not reset: {say(exc)}")
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
            await run_blocking(view.admin.upsert_user, name, password, mechanism)
        except (ValueError, TidelogError) as exc:
            return self.redirect("/security", request, "error", f"User not saved: {say(exc)}")
        return self.redirect("/security", request, "ok", f"Saved user {name} ({mechanism}).")

    async def delete_user(self, request: Request) -> Response:
        form = await self.form(request)
        view = self.view(request)
        name = str(form.get("name", ""))
        try:
            await run_blocking(view.admin.delete_user, name)
        except TidelogError as exc:
            return self.redirect("/security", request, "error", f"Not deleted: {say(exc)}")
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
            await run_blocking(view.admin.create_acls, [binding])
        except (ValueError, TidelogError) as exc:
            return self.redirect("/security", request, "error", f"ACL not added: {say(exc)}")
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
            removed = await run_blocking(view.admin.delete_acls, acl_filter)
        except TidelogError as exc:
            return self.redirect("/security", request, "error", f"Not removed: {say(exc)}")
        return self.redirect("/security", request, "ok", f"Removed {len(removed)} ACL(s).")

    # --- JSON for the charts ------------------------------------------------------------

    def overview_chart(self, request: Request) -> Response:
        view = self.session(request).view
        if view is None:
            return JSONResponse({"error": "log in"}, status_code=401)
        return JSONResponse(
            {
                "series": [
                    series_json(view.history.produce_rate()),
                    series_json(view.history.consume_rate()),
                ]
            }
        )

    def group_chart(self, request: Request) -> Response:
        view = self.session(request).view
        if view is None:
            return JSONResponse({"error": "log in"}, status_code=401)
        group_id = group_id_of(request)
        return JSONResponse({"series": [series_json(view.history.group_lag(group_id))]})

    def group_get(self, request: Request) -> Response:
        """``GET /groups/ID`` and ``GET /groups/ID/reset`` (ID percent-encoded)."""
        action = group_path(request)[1]
        if action == "":
            return self.group(request)
        if action == "reset":
            return self.confirm_reset(request)
        raise HTTPException(404, "No such page.")

    async def group_post(self, request: Request) -> Response:
        """``POST /groups/ID/reset`` (ID percent-encoded)."""
        if group_path(request)[1] == "reset":
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
        await run_blocking(store.start)
        try:
            yield
        finally:
            await run_blocking(store.close)

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
        Route("/topics/{rest:path}", no_such_topic_page),
        Route("/groups", console.groups, methods=["GET"]),
        # A group id may contain "/": these take the rest of the path and read the id
        # from the raw, percent-encoded one (``group_path``).
        Route("/groups/{rest:path}", prefixed(console.group_get, "/groups/"), methods=["GET"]),
        Route("/groups/{rest:path}", prefixed(console.group_post, "/groups/"), methods=["POST"]),
        Route("/security", console.security, methods=["GET"]),
        Route("/security/users", console.add_user, methods=["POST"]),
        Route("/security/users/delete", console.delete_user, methods=["POST"]),
        Route("/security/acls", console.add_acl, methods=["POST"]),
        Route("/security/acls/delete", console.delete_acl, methods=["POST"]),
        Route("/api/charts/overview", console.overview_chart),
        Route(
            "/api/charts/groups/{rest:path}",
            prefixed(console.group_chart, "/api/charts/groups/"),
        ),
        Route("/healthz", console.health),
        Mount("/static", StaticFiles(directory=_PACKAGE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SessionMiddleware, store=store)],
        exception_handlers={
            TidelogError: console.broker_error,
            HTTPException: console.http_error,
        },
        lifespan=lifespan,
    )
    app.state.store = store
    return app
