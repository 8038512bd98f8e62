"""Who may call each ConnectorsService RPC: the namespace of the pack or WorkId it names.

Claim and ListReceipts may omit the pack (every pack); only a caller of every namespace may.
A Claim's completions are checked as Complete's WorkId: one not the caller's (or unknown)
refuses the whole call (NOT_FOUND), before anything changes (decision 131).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_runtime.authorization import (
    Principal,
    Rule,
    allow_any_principal,
    require_all_namespaces,
    require_visible,
)

SERVICE = "/nexuscrm.connectors.v1.ConnectorsService/"


def require_pack(engine: Engine, principal: Principal, field: str, pack_install_id: str) -> None:
    """Refuse (NOT_FOUND) unless the pack the request's ``field`` names is in the caller's namespaces.

    A pack's namespace is fixed at install, so the rule may read it before the RPC's own transaction.
    """
    with engine.connect() as connection:
        namespace = operator_reads_sql.pack_namespace(connection, pack_install_id)
    require_visible(principal, namespace, field, pack_install_id)


def require_work(engine: Engine, principal: Principal, work_id: str) -> None:
    """Refuse (NOT_FOUND) unless the WorkItem ``work_id`` names is in the caller's namespaces."""
    with engine.connect() as connection:
        namespace = operator_reads_sql.work_namespace(connection, work_id)
    require_visible(principal, namespace, "work_id", work_id)


def require_works(engine: Engine, principal: Principal, field: str, work_ids: list[str]) -> None:
    """``require_work`` for every WorkId of a request's ``field``, in one statement (a Claim's completions)."""
    if not work_ids:
        return
    with engine.connect() as connection:
        namespaces = operator_reads_sql.work_namespaces(connection, work_ids)
    for work_id in work_ids:
        require_visible(principal, namespaces.get(work_id), field, work_id)


def rules(engine: Engine) -> dict[str, Rule]:
    """The rule of every ConnectorsService method, resolving namespaces through ``engine``."""

    def by_pack(principal: Principal, request: Any) -> None:
        require_pack(engine, principal, "pack_install_id", request.pack_install_id)

    def by_work(principal: Principal, request: Any) -> None:
        require_work(engine, principal, request.work_id)

    def claim(principal: Principal, request: Any) -> None:
        if not request.pack_install_ids:
            require_all_namespaces(principal, request)
        for pack_install_id in request.pack_install_ids:
            require_pack(engine, principal, "pack_install_ids", pack_install_id)
        require_works(engine, principal, "completions.work_id", [c.work_id for c in request.completions])

    def list_receipts(principal: Principal, request: Any) -> None:
        if request.pack_install_id:
            by_pack(principal, request)
        else:
            require_all_namespaces(principal, request)

    def by_scope(principal: Principal, request: Any) -> None:  # the operating RPCs (issue 37)
        require_pack(engine, principal, "scope.pack_install_id", request.scope.pack_install_id)

    def by_filter(principal: Principal, request: Any) -> None:
        require_pack(engine, principal, "filter.pack_install_id", request.filter.pack_install_id)

    by_method: dict[str, Rule] = {
        "Ingest": by_pack,
        "ExplainReceipt": by_pack,
        "ListReceipts": list_receipts,
        "Claim": claim,
        "Replay": by_work,
        "LoadInputs": by_work,
        "LoadReplayedInputs": by_work,
        "Heartbeat": by_work,
        "Complete": by_work,
        "Fail": by_work,
        "GetWork": by_work,
        "GetQueueState": by_pack,
        "WaitQueueDrained": by_pack,
        "ListGenerations": by_pack,
        "ListMembers": by_work,
        "SetRetentionPolicy": by_pack,
        "GetRetentionPolicy": by_pack,
        "Prune": by_pack,
        "GetBuildInfo": allow_any_principal,
        "PauseClaims": by_scope,
        "ResumeClaims": by_scope,
        "ListClaimPauses": by_pack,
        "ListDeadLetters": by_filter,
        "CountDeadLetters": by_filter,
        "ReplayDeadLetters": by_filter,
        "SetOrderPolicy": by_pack,
        "GetOrderPolicy": by_pack,
        "SkipDeadLetter": by_work,
        "SkipDeadLetters": by_filter,
        "GetCoverage": by_pack,
        "SetRetryPolicy": by_pack,
        "GetRetryPolicy": by_pack,
        "RetryNow": by_work,
        "ListIdentities": by_pack,
        "BuildFlowVersion": by_pack,
        "ListFlowVersions": by_pack,
        "SwitchFlowVersion": by_pack,
        "RollbackFlowVersion": by_pack,
        "RetireFlowVersion": by_pack,
        "RecordFlowVersionVerification": by_pack,
    }
    return {SERVICE + name: rule for name, rule in by_method.items()}
