"""Controlplane: pack lifecycle, fences, protocol rows and cutover (docs/design.md).

Code map: each RPC (``servicer``) -> the function doing its work; every one runs its SQL
through ``queries`` (the dashboard's reads: ``dashboard.queries``):

- InstallPack, ActivatePack, GetProtocol, GetPack, FindPacks, ListPacks: ``lifecycle``
  (``install_pack``, ``activate_pack``, ``get_protocol``, ``get_pack``, ``find_packs``, ``list_packs``)
- ArmFence, DisarmFence, ListFences, AddFenceOverride, RemoveFenceOverride: ``fences``
- GetDrainStatus: ``drain.drain_status``
- AuditCutover, Cutover: ``cutover.run_cutover`` (its audit: ``audit.audit_responsibility``)
- every RPC's authorization: ``authorization``; the runbook commands: ``runbook``
"""
