"""The wire conversions both ends of the contract share: below the client SDK and the services.

Hand-written, shipped in nexuscrm-protos beside the generated ``nexuscrm`` package (which is
rebuilt from the .proto files and holds nothing else), so that the client and the services
depend on the contract's distribution for them, not on each other (decision 184):

- ``nexuscrm_wire.convert``: Connectors protobuf messages to and from workqueue values (a domain
  error's kind travels as its google.rpc code).
- ``nexuscrm_wire.timestamps``: UTC datetimes to and from protobuf Timestamps; naive UTC as the
  services store it, aware UTC as the SDK hands it out.
- ``nexuscrm_wire.lookups``: what a lookup of a WorkId or a receipt key answers when it finds
  neither, in the words Connectors, the dashboard and the command line share.

It imports the generated messages, ``workqueue``, grpc and protobuf, never a service, the SDK
or the runtime (the import-linter layers in pyproject.toml).
"""
