"""The ``tidelog`` protobuf package namespace (see ``proto/tidelog/v1``)."""
