"""The ``tidelog.v1`` wire contract: ``proto/tidelog/v1/broker.proto`` and its generated code.

The generated modules are committed and never edited by hand; ``make proto`` regenerates
them and ``tests/test_proto_generated.py`` fails when they differ from what the ``.proto``
produces.
"""
