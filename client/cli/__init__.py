"""The ``tidelog`` command line.

::

    tidelog topics create NAME [--partitions N] [--config KEY=VALUE]...
    tidelog topics list [--internal]
    tidelog topics describe NAME
    tidelog topics alter NAME [--partitions N] [--set KEY=VALUE]... [--delete KEY]...
    tidelog topics delete NAME
    tidelog topics producers NAME [--partition P]...
    tidelog topics delete-records NAME (--before OFFSET | --all) [--partition P]...
    tidelog produce TOPIC [--key-separator SEP] [--partition P] [--acks 0|1|all] ...
    tidelog consume TOPIC [--from-beginning] [--partition P [--offset N]]
                          [--max-messages N] [--format FMT] [--timeout-ms MS] [--group G]
    tidelog groups list | describe GROUP | delete GROUP | delete-offsets GROUP --topic T
    tidelog groups reset-offsets GROUP (--topic T [--partition P]... | --all-topics)
                   (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO)
    tidelog quotas set [CLIENT_ID] KEY=VALUE... [--user USER]   (producer_byte_rate,
                   consumer_byte_rate, request_percentage; <default> for either name)
    tidelog quotas list [CLIENT_ID] [--user USER]
    tidelog quotas delete [CLIENT_ID] [KEY]... [--user USER]  (no KEY: every quota)
    tidelog users add NAME [--password-file F] [--mechanism M]... [--iterations N]
                           [--data-dir D]  (D: write into a data directory, broker stopped)
    tidelog users list
    tidelog users delete NAME [--mechanism M]
    tidelog serve ...              (the broker daemon: see `tidelog serve --help`)
    tidelog cluster up [--brokers N] [--data-dir D] [--base-port B]
                                   (ZooKeeper and N brokers on 127.0.0.1, in the foreground)
    tidelog console [--listen 127.0.0.1:7480] [--refresh-ms MS] [--sample-ms MS]
                                   (the web console: docs/console.md)

Every command takes ``--bootstrap HOST:PORT`` (default ``$TIDELOG_BOOTSTRAP`` or
``127.0.0.1:7410``) and ``--command-config FILE``: a Kafka tools properties file with the
security settings (``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` or
``sasl.username``/``sasl.password``, ``ssl.cafile``/``ssl.certfile``/``ssl.keyfile``;
``client.security.settings_from_properties``). Tables are aligned for a terminal; records
go to stdout, summaries and errors to stderr. An error is one line
(``tidelog: error: ... [CODE]``), never a traceback.

Exit status: 0 success (``consume`` stopped with Ctrl-C included); 1 the broker refused
the request, could not be reached, or a record was not delivered; 2 bad usage; 130
interrupted (other commands).

Layout: ``program`` builds the root parser from each command group's
``register(commands, common)`` and dispatches (``serve`` is handed to the broker's command
line there, imported lazily, so the client never imports the broker package unless
``tidelog serve`` runs); ``common`` holds what the groups share (options, connection
settings, terminal output, exit statuses); one module per command group: ``cluster``
(``cluster``, ``leaders``), ``topics``, ``produce``, ``consume``, ``groups``, ``acls``,
``quotas``, ``users``, ``console``. This package is the only part of the client that
writes to the terminal and reads the environment. ``python -m client.cli`` runs ``main``.
"""

from __future__ import annotations

from tidelog.client.cli.program import main

__all__ = ["main"]
