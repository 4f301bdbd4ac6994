"""Share partitions as a Hypothesis state machine over a real log manager (temporary data
directory) and the real ``__share_group_state`` store, against a plain reference model.

Several members acquire, accept, release and reject records, locks expire on a manual
clock, retention moves the log start, and the broker restarts (everything reopened from
disk). Checked at every step: no record is held by two members at once, nothing
acknowledged or archived is handed out again, delivery counts only grow and never pass
the limit (the limit archives), the start offset only moves forward, acknowledgements
succeed exactly when the model says the member holds the records; and after a restart
the state reloaded equals the state before it with every acquisition turned Available
(Archived at the delivery limit)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.broker.share.partition import (
    ACCEPT,
    ACQUIRED,
    REJECT,
    RELEASE,
    Acknowledgement,
    InFlight,
    SharePartitionConfig,
)
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import ACKNOWLEDGED, ARCHIVED, AVAILABLE
from tidelog.broker.share.state_log import ShareStateLog, ShareStateLogConfig
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidRecordStateError
from tidelog.storage.log_manager import LogManager, LogManagerConfig

GROUP, TOPIC = "workers", "jobs"
MEMBERS = ("m1", "m2", "m3")
LOCK_MS = 1_000
LIMIT = 2
CONFIG = SharePartitionConfig(
    record_lock_duration_ms=LOCK_MS,
    delivery_count_limit=LIMIT,
    max_record_locks=12,
    auto_offset_reset="earliest",
)


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


class Broker:
    """What a broker builds for share partitions, reopened from its data directory."""

    def __init__(self, path: Path, clock: ManualClock) -> None:
        self.path = path
        self.clock = clock
        self.open()

    def open(self) -> None:
        self.logs = LogManager.open(self.path, LogManagerConfig(cleaner_enabled=False), self.clock)
        store_config = ShareStateLogConfig(num_partitions=2, snapshot_update_records_per_snapshot=3)
        self.store = ShareStateLog.open(self.logs, store_config)
        self.manager = SharePartitionManager(
            self.logs, self.store, topic_id=topic_id, group_config=lambda _: CONFIG
        )

    def restart(self) -> None:
        self.logs.close()
        self.open()

    def produce(self, count: int) -> None:
        builder = BatchBuilder()
        for i in range(count):
            builder.append(self.clock.wall_ms(), None, b"job-%d" % i)
        self.logs.get_log(TOPIC, 0).append(builder.build())


class ShareModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="share-model-"))
        self.clock = ManualClock()
        self.broker = Broker(self.dir, self.clock)
        self.broker.logs.create_topic(TOPIC, 1, {})
        self.log_start = 0
        self.log_end = 0
        # The reference: offset -> delivery count, who holds it until when, what is done.
        self.counts: dict[int, int] = {}
        self.held: dict[int, tuple[str, int]] = {}
        self.done: set[int] = set()
        self.last_start = 0

    def teardown(self) -> None:
        self.broker.logs.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the reference's own rules ---------------------------------------------------

    def _expire_model(self) -> None:
        now = self.clock.monotonic_ms()
        for offset, (_, deadline) in list(self.held.items()):
            if deadline <= now:
                del self.held[offset]
                if self.counts[offset] >= LIMIT:
                    self.done.add(offset)

    def _live(self, offset: int) -> bool:
        return offset >= self.log_start

    # --- rules -----------------------------------------------------------------------

    @rule(count=st.integers(1, 5))
    def produce(self, count: int) -> None:
        self.broker.produce(count)
        self.log_end += count

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 6))
    def acquire(self, member: str, max_records: int) -> None:
        self._expire_model()
        before = self.broker.manager.describe(GROUP, TOPIC, 0)
        window = len(before.records())
        ranges = self.broker.manager.acquire(GROUP, TOPIC, 0, member, max_records)
        got = [
            (o, r.delivery_count) for r in ranges for o in range(r.first_offset, r.last_offset + 1)
        ]
        assert len(got) <= max_records
        deadline = self.clock.monotonic_ms() + LOCK_MS
        for offset, count in got:
            assert offset not in self.held, f"{offset} acquired by two members at once"
            assert offset not in self.done, f"{offset} handed out again after it was done"
            assert self._live(offset)
            assert offset < self.log_end
            assert count == self.counts.get(offset, 0) + 1
            assert count <= LIMIT
            self.counts[offset] = count
            self.held[offset] = (member, deadline)
        available = [
            o
            for o in range(max(self.log_start, 0), self.log_end)
            if o not in self.held and o not in self.done
        ]
        if available and window < CONFIG.max_record_locks:
            assert got, f"nothing handed out while {available} were available"

    @rule(
        member=st.sampled_from(MEMBERS),
        kind=st.sampled_from([ACCEPT, RELEASE, REJECT]),
        data=st.data(),
    )
    def acknowledge(self, member: str, kind: int, data: st.DataObject) -> None:
        self._expire_model()
        mine = sorted(o for o, (m, _) in self.held.items() if m == member and self._live(o))
        candidates = list(range(max(self.log_start, 0), self.log_end))
        if mine and data.draw(st.booleans()):
            candidates = mine  # mostly what the member holds: the acknowledgements that work
        if not candidates:
            return
        chosen = sorted(
            set(data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4)))
        )
        acks = [Acknowledgement(o, o, kind) for o in chosen]
        valid = all(self.held.get(o, ("", 0))[0] == member for o in chosen)
        try:
            self.broker.manager.acknowledge(GROUP, TOPIC, 0, member, acks)
        except InvalidRecordStateError:
            assert not valid, f"{member} refused for {chosen} it holds"
            return
        assert valid, f"{member} acknowledged {chosen} it does not hold"
        for offset in chosen:
            del self.held[offset]
            if kind != RELEASE or self.counts[offset] >= LIMIT:
                self.done.add(offset)

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member: str) -> None:
        self.broker.manager.release_member(GROUP, member)
        for offset, (m, _) in list(self.held.items()):
            if m == member:
                del self.held[offset]
                if self.counts[offset] >= LIMIT:
                    self.done.add(offset)

    @rule(ms=st.integers(1, 2 * LOCK_MS))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)
        self.broker.manager.expire_locks()
        self._expire_model()

    @precondition(lambda self: self.log_end > self.log_start)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        new_start = data.draw(st.integers(self.log_start + 1, self.log_end))
        self.broker.logs.get_log(TOPIC, 0).increase_log_start_offset(new_start)
        self.log_start = new_start
        self.broker.manager.expire_locks()
        for offset in [o for o in self.held if o < new_start]:
            del self.held[offset]

    @rule()
    def restart(self) -> None:
        before = self.broker.manager.describe(GROUP, TOPIC, 0)
        expected = {o: _reloaded(r) for o, r in before.records().items()}
        self.broker.restart()
        after = self.broker.manager.describe(GROUP, TOPIC, 0)
        undone = [o for o, r in expected.items() if r.state not in (ACKNOWLEDGED, ARCHIVED)]
        assert after.start_offset >= before.start_offset, "the start offset moved back"
        assert all(o >= after.start_offset for o in undone), "an undone record was skipped"
        assert after.records() == {o: r for o, r in expected.items() if o >= after.start_offset}
        # The model: every lock died with the broker.
        for offset in list(self.held):
            del self.held[offset]
            if self.counts[offset] >= LIMIT:
                self.done.add(offset)

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def start_only_moves_forward(self) -> None:
        start = self.broker.manager.describe(GROUP, TOPIC, 0).start_offset
        assert start >= self.last_start
        self.last_start = start

    @invariant()
    def held_records_match(self) -> None:
        now = self.clock.monotonic_ms()
        records = self.broker.manager.describe(GROUP, TOPIC, 0).records()
        for offset, record in records.items():
            assert record.delivery_count <= LIMIT
            if record.state == ACQUIRED and record.deadline_ms > now:
                assert self.held.get(offset, ("", 0))[0] == record.member_id
            if offset in self.done:
                assert record.state in (ACKNOWLEDGED, ARCHIVED)


def _reloaded(record: InFlight) -> InFlight:
    state = record.persisted_state
    if state == AVAILABLE and record.delivery_count >= LIMIT:
        state = ARCHIVED
    return InFlight(state, record.delivery_count)


ShareModel.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestShareModel = ShareModel.TestCase
