"""Connectors: receipts, Events and WorkItems of source projection (docs/design.md).

Code map: each RPC (``servicer``) -> ``service.Connectors`` -> the function doing its work ->
the SQL it runs (``queries.<module>``):

- Ingest: ``admission.Admission.ingest`` -> ``grouping.GroupCommit`` -> ``Admission.admit_batch``
  (``_batch_transaction``, ``_new_generations``; rows from ``deliveries``; duplicates:
  ``duplicates.verify_duplicates``) -> ``queries.packs``, ``receipts``, ``events``, ``work_items``
- Replay: ``replay.replay`` -> ``queries.packs``, ``work_items``
- Claim: ``claims.complete_all`` (its completions), then ``claims.claim`` ->
  ``claims.claim_transaction`` (rows reserved by ``reservations.Reservations``; inline inputs:
  ``payloads.whole_pages``) -> ``queries.claims``, ``work_items``, ``events``
- Heartbeat, Complete, Fail: ``claims.heartbeat``, ``claims.complete``, ``claims.fail`` ->
  ``queries.claims``, ``work_items``, ``events``
- LoadInputs: ``payloads.load_inputs`` -> ``queries.events``
- GetWork, ExplainReceipt, ListReceipts: ``inspection`` -> ``queries.work_items``,
  ``receipts``, ``events``, ``operator_reads``
- GetQueueState, WaitQueueDrained: ``queue_state`` -> ``queries.operator_reads``
- ListGenerations, ListMembers: ``generations`` -> ``queries.operator_reads``, ``events``
- SetRetentionPolicy, GetRetentionPolicy, Prune: ``retention`` -> ``queries.retention``
- PauseClaims, ResumeClaims, ListClaimPauses: ``claim_pauses`` -> ``queries.pauses``
- ListDeadLetters, CountDeadLetters, ReplayDeadLetters: ``dead_letters`` (each replay:
  ``replay.replay``) -> ``queries.dead_letters``
- GetCoverage: ``coverage.get_coverage`` -> ``queries.coverage``
- SetOrderPolicy, GetOrderPolicy, SkipDeadLetter: ``order_policy`` -> ``queries.order_policy``;
  Claim's candidate read carries pauses and holds (``queries.order_policy.candidate_operable``)
- every RPC's authorization: ``authorization`` -> ``queries.operator_reads``
- background (``materializer.Materializer``): ``materializer.materialize`` ->
  ``Admission.admit_batch``; ``liveness.StrandedSweep`` -> ``queries.work_items``;
  ``retention.Pruner`` -> ``queries.retention``
- the old-protocol runtime: ``legacy.LegacyRuntime`` -> ``queries.legacy``
"""
