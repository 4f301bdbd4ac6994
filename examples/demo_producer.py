"""Demo events for the Spark examples: page views keyed by user, and a user table.

Run (a broker on 127.0.0.1:7410, e.g. ``tidelog serve`` or ``docker-compose up broker``)::

    python examples/demo_producer.py                      # 20 events/s until Ctrl-C
    python examples/demo_producer.py --rate 200 --count 5000

Writes to two topics, creating them if needed:

- ``page-views`` (3 partitions): key ``user-N``, value JSON ``{"user": "user-N", "page":
  "/p/3", "ms": <event time>}``; the record timestamp is the event time, a few seconds
  behind the wall clock (and now and then much later: late data for the watermark);
- ``users`` (1 partition, ``cleanup.policy=compact``): key ``user-N``, value JSON
  ``{"user": "user-N", "country": "..", "plan": ".."}``; each user's profile is written
  once at start and rewritten now and then, so compaction keeps the latest.
"""

from __future__ import annotations

import json
import random
import time

from _common import ensure_topics, parser

from tidelog import Producer

COUNTRIES = ["NL", "DE", "FR", "BR", "JP", "US"]
PLANS = ["free", "pro", "team"]


def main(argv: list[str] | None = None) -> None:
    p = parser("Produce demo page views and user profiles.")
    p.add_argument("--rate", type=float, default=20.0, help="events per second")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    ensure_topics(args.bootstrap, ["page-views"], partitions=3)
    ensure_topics(args.bootstrap, ["users"], partitions=1, **{"cleanup.policy": "compact"})
    rng = random.Random(args.seed)

    def profile(user: str) -> bytes:
        doc = {"user": user, "country": rng.choice(COUNTRIES), "plan": rng.choice(PLANS)}
        return json.dumps(doc).encode()

    with Producer(args.bootstrap, linger_ms=20) as producer:
        users = [f"user-{n}" for n in range(args.users)]
        for user in users:
            producer.send("users", key=user.encode(), value=profile(user))
        sent = 0
        started = time.monotonic()
        while args.count is None or sent < args.count:
            user = rng.choice(users)
            now_ms = int(time.time() * 1000)
            event_ms = now_ms - rng.randint(0, 5_000)
            if rng.random() < 0.01:
                event_ms -= 60_000  # late
            value = {"user": user, "page": f"/p/{rng.randint(1, 9)}", "ms": event_ms}
            producer.send(
                "page-views",
                key=user.encode(),
                value=json.dumps(value).encode(),
                timestamp_ms=event_ms,
            )
            if rng.random() < 0.02:
                producer.send("users", key=user.encode(), value=profile(user))
            sent += 1
            delay = started + sent / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush()
    print(f"sent {sent} page views")


if __name__ == "__main__":
    main()
