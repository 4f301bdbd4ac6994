"""The API versions the Kafka listener advertises (ApiVersions), one table.

Advertise exactly what is implemented (a client never sends what is not advertised, and
a request for anything else closes the connection), with ranges wide enough for every
client in scope (``reference/kafka-protocol.md`` section 2.3):

- the minima satisfy librdkafka <= 2.11.0's single-version feature checks (Debian's
  kcat links 2.0.2: Produce 3 and Fetch 4 for RecordBatch v2, JoinGroup 0...) and
  aiokafka's old, non-flexible request classes;
- Produce advertises 0-2 although only 3+ is implemented: librdkafka <= 2.11.0 turns
  compression off unless Produce v0 is in range (KAFKA-18659). No client sends v0-2 (they
  need RecordBatch v2); one that did would see its connection closed;
- the maxima stay below what is not built yet: Produce 12 (10: KIP-951 leader hints;
  11-12: KIP-890's transactions v2; 13 names topics by id), Fetch 16 (13+ names topics
  by id, 16 carries KIP-951 leader hints; 17 is KIP-853's KRaft directory ids),
  Metadata 12 (13 only adds a top-level error code, KIP-1102's request to rebootstrap:
  not built), InitProducerId 5 (6 is KIP-939's two-phase commit, unshipped in Kafka).
  WriteTxnMarkers (27, issue #28) is served from v1 (Kafka 4 removed v0): a transaction
  coordinator's call to a partition leader (docs/transactions.md).

Features (ApiVersions v3+, KIP-584): ``transaction.version`` is finalized at 2, so a
Kafka 4.x Java client runs transactions v2 (KIP-890 part 2: its ``TransactionManager``
reads exactly this finalized level, from any broker's ApiVersions answer whose features
epoch is newer than the one it saw, and switches at the start of a transaction). No
client is forced onto it: v2 is chosen per request by the versions a client sends
(Produce v12, TxnOffsetCommit v5, EndTxn v5), and the clients that never read the
feature (librdkafka and confluent-kafka, kafka-python, aiokafka) stay on v1 against the
same coordinator. The features never change while a broker runs, so their epoch is a
constant; a broker that ever lowers a level must raise the epoch with it (clients ignore
an epoch they have seen).
"""

from __future__ import annotations

__all__ = [
    "ADVERTISED",
    "API_VERSIONS",
    "FINALIZED_FEATURES",
    "FINALIZED_FEATURES_EPOCH",
    "SUPPORTED_FEATURES",
    "supported",
]

API_VERSIONS = 18

# api key -> (min, max) advertised.
ADVERTISED: dict[int, tuple[int, int]] = {
    0: (0, 12),  # Produce (0-2 advertised, not served: see above; 10: KIP-951; 11-12: KIP-890)
    1: (4, 16),  # Fetch (13+: topic ids, 16: KIP-951)
    2: (1, 7),  # ListOffsets
    3: (0, 12),  # Metadata
    8: (2, 9),  # OffsetCommit (9: KIP-848 member epochs)
    9: (1, 9),  # OffsetFetch (8+ is the batched form)
    10: (0, 4),  # FindCoordinator (4+: batched coordinator_keys, KIP-699)
    11: (0, 7),  # JoinGroup (0 for librdkafka <= 2.11.0, KAFKA-19444)
    12: (0, 4),  # Heartbeat
    13: (0, 4),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups
    16: (0, 5),  # ListGroups (5: group types, share groups listed)
    17: (0, 1),  # SaslHandshake (0: raw tokens follow; librdkafka <= 2.11.0 checks 0)
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords (KIP-107)
    22: (0, 5),  # InitProducerId (5: KIP-890's TRANSACTION_ABORTABLE)
    24: (0, 5),  # AddPartitionsToTxn (0-3 the clients' form, 4-5 the brokers', KIP-890)
    25: (0, 3),  # AddOffsetsToTxn
    26: (0, 5),  # EndTxn (5: transactions v2, the bumped identity answered)
    27: (1, 1),  # WriteTxnMarkers (between brokers; v0 removed by Kafka 4, no schema here)
    28: (0, 5),  # TxnOffsetCommit (3: KIP-447's member and generation; 5: v2's implicit add)
    23: (2, 4),  # OffsetForLeaderEpoch (KIP-320 position validation; librdkafka sends v2)
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    35: (1, 4),  # DescribeLogDirs (one directory per broker)
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders (KIP-460: preferred and unclean)
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 1),  # AlterPartitionReassignments (KIP-455; v1: allow_replication_factor_change)
    46: (0, 0),  # ListPartitionReassignments (KIP-455)
    47: (0, 0),  # OffsetDelete (KIP-496)
    50: (0, 0),  # DescribeUserScramCredentials (KIP-554)
    51: (0, 0),  # AlterUserScramCredentials (KIP-554)
    60: (0, 1),  # DescribeCluster
    61: (0, 0),  # DescribeProducers (KIP-664)
    65: (0, 0),  # DescribeTransactions (KIP-664)
    66: (0, 1),  # ListTransactions (KIP-664; v1: KIP-994's duration filter)
    68: (0, 1),  # ConsumerGroupHeartbeat (KIP-848; librdkafka's group.protocol=consumer)
    69: (0, 0),  # ConsumerGroupDescribe (KIP-848)
    76: (1, 1),  # ShareGroupHeartbeat (KIP-932; Kafka 4.1 serves v1 only, as below)
    77: (1, 1),  # ShareGroupDescribe
    78: (1, 1),  # ShareFetch (v2 is Kafka 4.2's KIP-1222 lock renewal)
    79: (1, 1),  # ShareAcknowledge
    90: (0, 1),  # DescribeShareGroupOffsets (Kafka 4.1: v0-1; v1 adds the lag)
    91: (0, 0),  # AlterShareGroupOffsets
    92: (0, 0),  # DeleteShareGroupOffsets
}

# Feature name -> (min, max) level this broker supports, and the finalized levels.
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {"transaction.version": (0, 2)}
FINALIZED_FEATURES: dict[str, int] = {"transaction.version": 2}
FINALIZED_FEATURES_EPOCH = 1


def supported(api_key: int, api_version: int) -> bool:
    """Whether ``api_version`` of ``api_key`` is inside the advertised range."""
    found = ADVERTISED.get(api_key)
    return found is not None and found[0] <= api_version <= found[1]
