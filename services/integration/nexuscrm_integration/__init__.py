"""Core Integration Service: activation gate and worker host (docs/design.md).

Code map: each RPC (``servicer``) -> the function doing its work; this service runs no SQL
of its own (it reads Connectors and Controlplane over gRPC):

- GetActivation: ``host.HostStatus.activation``, set by ``main`` from ``activation.wait_for_activation``
  (``activation.check_activation`` over ``RemoteSchemaVerifier`` and ``RemoteProtocolReader``)
- ListWorkers: ``host.HostStatus.workers``, the workers of ``host.WorkerHost``
"""
