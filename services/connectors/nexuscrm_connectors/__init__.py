"""Connectors: receipts, Events and WorkItems of source projection (docs/design.md).

Wings: ``queue`` holds the hot path (admission, duplicates, replay, claims, payload reads and
the background passes), ``operating`` the operator's features and reads, ``legacy`` the
old-protocol runtime; ``queries`` holds the SQL, one module per table or concern; at the top,
the gRPC ``servicer``, the domain ``facade`` it calls and ``wire`` (operator values to and from
messages), with what every wing shares (settings, errors, metrics, authorization).

Code map: each RPC (``servicer``) -> ``facade.Connectors`` -> the function doing its work ->
the SQL it runs (``queries.<module>``):

- Ingest: ``queue.admission.Admission.ingest`` -> ``queue.grouping.GroupCommit`` -> ``Admission.admit_batch``
  (``_batch_transaction``, ``_new_generations``; rows from ``queue.deliveries``; duplicates:
  ``queue.duplicates.verify_duplicates``) -> ``queries.packs``, ``receipts``, ``events``, ``work_items``
- Replay: ``queue.replay.replay`` -> ``queries.packs``, ``work_items``
- Claim: ``queue.claims.complete_all`` (its completions), then ``queue.claims.claim`` ->
  ``queue.claims.claim_transaction`` (rows reserved by ``reservations.Reservations``; inline inputs:
  ``queue.payloads.whole_pages``) -> ``queries.claims``, ``work_items``, ``events``
- Heartbeat, Complete, Fail: ``queue.claims.heartbeat``, ``queue.claims.complete``, ``queue.claims.fail`` (its
  work type's ``queue.retries.effective``) -> ``queries.claims``, ``work_items``, ``events``,
  ``operating.retry_policy``, ``work_attempts`` (the attempt's history)
- LoadInputs: ``queue.payloads.load_inputs`` -> ``queries.events``
- GetWork, ExplainReceipt, ListReceipts: ``operating.operator_reads`` -> ``queries.work_items``,
  ``receipts``, ``events``, ``operator_reads``, ``work_attempts``
- SetRetryPolicy, GetRetryPolicy, RetryNow: ``operating.retry_policy`` -> ``queries.retry_policy``,
  ``queue.claims`` (RetryNow's compare-and-set)
- GetQueueState, WaitQueueDrained: ``operating.queue_state`` -> ``queries.operator_reads``
- ListGenerations, ListMembers: ``operating.generations`` -> ``queries.operator_reads``, ``events``
- SetRetentionPolicy, GetRetentionPolicy, Prune: ``operating.retention`` -> ``queries.retention``,
  ``work_attempts`` (a pruned generation's attempts go with it)
- PauseClaims, ResumeClaims, ListClaimPauses: ``operating.claim_pauses`` -> ``queries.claim_pauses``
- ListDeadLetters, CountDeadLetters, ReplayDeadLetters, SkipDeadLetters: ``operating.dead_letters`` (each
  replay: ``queue.replay.replay``; each skip: ``operating.order_policy.skip``) -> ``queries.dead_letters``
- GetCoverage: ``operating.coverage.get_coverage`` -> ``queries.coverage``
- ListIdentities: ``operating.identities.list_identities`` (each identity's proof: ``operating.coverage``) ->
  ``queries.coverage``, ``operator_reads``
- SetOrderPolicy, GetOrderPolicy, SkipDeadLetter: ``operating.order_policy`` -> ``queries.order_policy``;
  Claim's candidate read carries pauses and holds (``queries.order_policy.candidate_operable``);
  GetWork, ListGenerations and ExplainReceipt show holds and skips (``operating.order_policy.holds``,
  ``operating.order_policy.skips`` -> ``queries.operator_reads``)
- BuildFlowVersion, ListFlowVersions, SwitchFlowVersion, RollbackFlowVersion, RetireFlowVersion,
  RecordFlowVersionVerification: ``operating.flow_versions`` (the servicer calls it with the facade's
  context) -> ``queries.flow_versions``, ``work_items``; admission's fan-out to the tracks:
  ``queue.tracks``
- every RPC's authorization: ``authorization`` -> ``queries.operator_reads``
- background (``queue.materializer.Materializer``): ``queue.materializer.materialize`` ->
  ``Admission.admit_batch``; ``queue.liveness.StrandedSweep`` -> ``queries.work_items``;
  ``operating.retention.Pruner`` -> ``queries.retention``
- the old-protocol runtime: ``legacy.runtime.LegacyRuntime`` -> ``legacy.queries``
"""
