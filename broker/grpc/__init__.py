"""The gRPC listener: the ``grpc.aio`` server (``broker.grpc.listener``), the servicer's
request/response conversion (``broker.grpc.service`` and its areas ``admin_service``,
``data_service``, ``group_service``, ``security_service``; ``broker.grpc.parse``), the
rendering of neutral outcomes as gRPC statuses (``broker.grpc.errors``) and the
inter-broker call credentials (``broker.grpc.auth_client``). It holds no domain logic:
every call goes through ``broker.core.pipeline`` into ``broker.core``. See ``docs/architecture.md``.
"""

__all__: list[str] = []
