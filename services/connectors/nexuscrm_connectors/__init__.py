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
- Heartbeat, Complete, Fail: ``claims.heartbeat``, ``claims.complete``, ``claims.fail`` (its
  work type's ``retry_policy.effective``) -> ``queries.claims``, ``work_items``, ``events``,
  ``retry_policy``, ``work_attempts`` (the attempt's history)
- LoadInputs: ``payloads.load_inputs`` -> ``queries.events``
- GetWork, ExplainReceipt, ListReceipts: ``inspection`` -> ``queries.work_items``,
  ``receipts``, ``events``, ``operator_reads``, ``work_attempts``
- SetRetryPolicy, GetRetryPolicy, RetryNow: ``retry_policy`` -> ``queries.retry_policy``,
  ``claims`` (RetryNow's compare-and-set)
- GetQueueState, WaitQueueDrained: ``queue_state`` -> ``queries.operator_reads``
- ListGenerations, ListMembers: ``generations`` -> ``queries.operator_reads``, ``events``
- SetRetentionPolicy, GetRetentionPolicy, Prune: ``retention`` -> ``queries.retention``,
  ``work_attempts`` (a pruned generation's attempts go with it)
- PauseClaims, ResumeClaims, ListClaimPauses: ``claim_pauses`` -> ``queries.pauses``
- ListDeadLetters, CountDeadLetters, ReplayDeadLetters, SkipDeadLetters: ``dead_letters`` (each
  replay: ``replay.replay``; each skip: ``order_policy.skip``) -> ``queries.dead_letters``
- GetCoverage: ``coverage.get_coverage`` -> ``queries.coverage``
- ListIdentities: ``identities.list_identities`` (each identity's proof: ``coverage``) ->
  ``queries.coverage``, ``operator_reads``
- SetOrderPolicy, GetOrderPolicy, SkipDeadLetter: ``order_policy`` -> ``queries.order_policy``;
  Claim's candidate read carries pauses and holds (``queries.order_policy.candidate_operable``);
  GetWork, ListGenerations and ExplainReceipt show holds and skips (``order_policy.holds``,
  ``order_policy.skips`` -> ``queries.operator_reads``)
- every RPC's authorization: ``authorization`` -> ``queries.operator_reads``
- background (``materializer.Materializer``): ``materializer.materialize`` ->
  ``Admission.admit_batch``; ``liveness.StrandedSweep`` -> ``queries.work_items``;
  ``retention.Pruner`` -> ``queries.retention``
- the old-protocol runtime: ``legacy.LegacyRuntime`` -> ``queries.legacy``
"""
