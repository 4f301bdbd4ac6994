"""The console's HTTP plumbing: the session middleware and the security headers, and
what a handler reads from a request's address.

``SessionMiddleware`` finds or makes each request's ``ConsoleSession``, sends its cookie
(``HttpOnly``, ``SameSite=Strict``, ``Secure`` over https) whenever the id is new or
changed (a login changes it), and puts the same headers on every page: no caching, no
framing, no sniffing, a same-origin referrer and a Content-Security-Policy that allows
this site's scripts and styles only. A group id may hold any character, ``/`` too, so it
is read from the raw, percent-encoded path (``group_path``, with the prefix ``prefixed``
puts in the scope); a topic name must be a legal one before any client call
(``topic_name``, 400). Redirects after a login go to a path of this site only
(``safe_next``: never an open redirect).

Thread-safe: the functions keep no state; the middleware's only state is the session
store, which is thread-safe.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from .sessions import COOKIE_NAME, SessionStore

__all__ = [
    "SessionMiddleware",
    "group_id_of",
    "group_path",
    "here",
    "no_such_topic_page",
    "prefixed",
    "run_blocking",
    "safe_next",
    "topic_name",
]


class SessionMiddleware(BaseHTTPMiddleware):
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


async def run_blocking(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking client call from an ``async`` handler, on Starlette's thread pool."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(function, *args, **kwargs)


def group_path(request: Request) -> tuple[str, str]:
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


def group_id_of(request: Request) -> str:
    return group_path(request)[0]


# Kafka's rule (storage/files.py, which the console does not import: it uses the public
# client API only): 1 to 249 of [A-Za-z0-9._-], and not "." or "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name(request: Request) -> str:
    """The topic of ``/topics/NAME...``; 400 when it is no legal topic name."""
    name: str = request.path_params["name"]
    if _TOPIC_NAME.fullmatch(name) is None or name in (".", ".."):
        raise HTTPException(
            400,
            f"{name!r} is not a topic name: topic names are 1 to 249 ASCII letters, "
            "digits, '.', '_' and '-'.",
        )
    return name


def here(request: Request) -> str:
    """The request's path as sent (still percent-encoded: a group id's ``%2F`` stays
    one) and its query."""
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("latin-1")
    return path + (f"?{request.url.query}" if request.url.query else "")


def safe_next(url: str | None) -> str:
    """Only a path of this site: never an open redirect to another host."""
    if not url or not url.startswith("/") or url.startswith("//") or "\\" in url:
        return "/"
    return url


def prefixed(handler: Callable[[Request], Any], prefix: str) -> Callable[[Request], Any]:
    """``handler`` with the route's fixed prefix in ``scope["route_prefix"]``, for
    ``group_path``. Keeps the handler sync or async, as Starlette runs each."""
    if inspect.iscoroutinefunction(handler):

        async def run_async(request: Request) -> Any:
            request.scope["route_prefix"] = prefix
            return await handler(request)

        return run_async

    def run(request: Request) -> Any:
        request.scope["route_prefix"] = prefix
        return handler(request)

    return run


def no_such_topic_page(request: Request) -> Response:
    """``/topics/A/B``: topic names hold no ``/``."""
    raise HTTPException(
        404, "No such page: topic names are ASCII letters, digits, '.', '_' and '-' (no '/')."
    )
