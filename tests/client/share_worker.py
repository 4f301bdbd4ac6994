"""A share consumer in its own process, for the share-group tests.

``python -m tests.client.share_worker BOOTSTRAP GROUP TOPIC`` subscribes in explicit
acknowledgement mode and never acknowledges: every record it is handed stays locked to it.
It reports on stdout, one JSON object per line, flushed at once: ``{"e": "assigned"}``
once it has an assignment, ``{"e": "recs", "r": [[partition, offset], ...]}`` for every
non-empty poll. It polls until killed.
"""

from __future__ import annotations

import argparse
import json
import sys

from tidelog.client import ShareConsumer


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("group")
    parser.add_argument("topic")
    args = parser.parse_args()
    consumer = ShareConsumer(
        args.bootstrap, args.group, acknowledgement_mode="explicit", max_poll_records=50
    )
    consumer.subscribe([args.topic])
    assigned = False
    while True:
        records = consumer.poll(timeout_ms=200)
        if not assigned and consumer.assignment():
            assigned = True
            _say(e="assigned")
        if records:
            _say(e="recs", r=[[r.partition, r.offset] for r in records])


if __name__ == "__main__":
    main()
