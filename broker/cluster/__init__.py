"""Cluster mode: brokers that share metadata and leader elections through Apache ZooKeeper.

Without ``zookeeper.connect`` a broker is a single node and nothing here runs (the
embedded default). With it, the modules follow Kafka's ZooKeeper-era control plane
(``../shared/reference/replication.md``, sections 2 and 5):

* ``assignment``: where a new topic's partition replicas go (Kafka's round robin with a
  shifting start). Pure.
* ``znodes``: the znode paths and their JSON, encoded and decoded. Pure.
* ``store``: the one module that talks to ZooKeeper (kazoo): broker registration,
  controller election fenced by ``/controller_epoch``, topics and partition state written
  by compare-and-set on the znode version.
* ``producer_ids``: producer ids for the whole cluster, from blocks claimed in
  ``/latest_producer_id_block`` and one znode per producer key (``init_keyed``).
* ``testing``: a throwaway ZooKeeper server for tests, ours and users'.

The package itself exports nothing; import from the modules.
"""

__all__: list[str] = []
