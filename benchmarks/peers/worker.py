"""One measurement in a process of its own: ``python -m benchmarks.peers.worker``.

::

    python -m benchmarks.peers.worker --peer NAME --address HOST:PORT --workload JSON

``--workload`` is a ``Workload`` as a JSON object. Prints the figures as one JSON object on
the last line of stdout; progress notes, if any, go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.peers import PEERS
from benchmarks.peers.common import Workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--address", required=True)
    parser.add_argument("--workload", required=True, help="a Workload as JSON")
    args = parser.parse_args()
    workload = Workload(**json.loads(args.workload))
    figures = PEERS[args.peer].run(workload, args.address)
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter finalization: a client library's daemon thread frozen at exit while
    # holding a grpc call's lock deadlocked a worker in that call's __del__ (seen once in
    # CI: the figures were written, the process never ended). The work is done and
    # flushed; nothing is left to finalize.
    os._exit(status)
