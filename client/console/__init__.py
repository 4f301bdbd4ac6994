"""The Tidelog web console: topics, partitions, records, groups and lag in a browser.

::

    tidelog console --bootstrap 127.0.0.1:7410 --listen 127.0.0.1:7480

    from tidelog.client.console import ConsoleConfig, create_app, serve
    serve(ConsoleConfig(bootstrap_servers="127.0.0.1:7410"))      # blocks until Ctrl-C

It talks to the cluster only through the public client API (``AdminClient``,
``Producer``, ``Consumer``), so it works against any Tidelog cluster, and it lives in
``client`` because of that (``tests/test_architecture.py``: no broker import).

Why Starlette + Jinja2 on uvicorn: Starlette is a small, typed, well-kept ASGI toolkit
(the base of FastAPI) whose test client drives the real application in-process, and it
runs plain ``def`` handlers on a thread pool, which suits the blocking, thread-safe
client calls; Jinja2 renders server-side HTML with autoescaping, so every page works
with JavaScript off; uvicorn is the reference ASGI server. aiohttp would have worked too,
but would bring its own HTTP client and server stack and wants ``async`` handlers
throughout, with every client call pushed to an executor by hand. The three come as the
``console`` extra (``pip install 'tidelog[console]'``; ``make venv`` installs it), so the
client library itself stays free of web dependencies.

Static assets (CSS, the uPlot charting library from the npm registry) are vendored under
``static/``: no network needed. ``docs/console.md`` tells the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidelog.client.console.config import DEFAULT_LISTEN, ConsoleConfig, parse_listen

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["DEFAULT_LISTEN", "ConsoleConfig", "create_app", "parse_listen", "serve"]


def create_app(config: ConsoleConfig) -> Starlette:
    """The console as an ASGI application (see ``client.console.app.create_app``);
    imported lazily so ``ConsoleConfig`` needs no web framework."""
    from tidelog.client.console.app import create_app as create

    return create(config)


def serve(config: ConsoleConfig) -> None:
    """Serve the console on ``config.host:config.port`` until interrupted (SIGINT or
    SIGTERM), then close every client. Access logs are off: URLs carry no secrets, but
    a console's users need not be logged either."""
    import uvicorn

    from tidelog.client.console.app import create_app as create

    uvicorn.run(
        create(config),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",  # no websockets: nothing to import or warn about
    )
