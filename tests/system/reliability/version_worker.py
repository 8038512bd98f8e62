"""A worker process of one Flow version, for the restart test (``python -m tests.system.reliability.version_worker``).

Arguments: the Connectors address, the pack, the Flow version to claim (``flow_versions``)
and a file it appends one line per member it ran to (``WorkId build_run ordinal``), flushed
before it completes the generation. It claims with the generated stub, because the SDK's
Claim does not pass ``flow_versions`` yet. It retries across a Connectors restart and runs
until it is killed: a SIGKILL mid-generation leaves a claim its lease gives back, and the
next worker runs that generation again (its members are then recorded twice, under the same
WorkId).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import TextIO

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_wire import convert

LEASE_SECONDS = 2
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.FAILED_PRECONDITION)


def run_once(channel: grpc.Channel, pack: str, version: str, sink: TextIO) -> None:
    """Claim one generation of ``version``, record its members, complete it."""
    request = pb.ClaimRequest(
        worker_id=f"build-{version}",
        pack_install_ids=[pack],
        max_items=1,
        lease_seconds=LEASE_SECONDS,
        wait_ms=200,
        flow_versions=[version],
    )
    client = ConnectorsClient(channel, timeout=dt.timedelta(seconds=10))
    for message in pb_grpc.ConnectorsServiceStub(channel).Claim(request, timeout=10).claims:
        claim = convert.claim_from_proto(message)
        lines = [
            f"{claim.work.work_id} {int(claim.work.build_run)} {member.enqueue_ordinal}\n"
            for page in client.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
            for member in page.inputs
        ]
        sink.write("".join(lines))
        sink.flush()
        client.complete(claim.work.work_id, lease_token=claim.lease_token)


def main(address: str, pack: str, version: str, runs_path: str) -> None:
    """Run generations of ``version`` until killed."""
    with open(runs_path, "a", encoding="utf-8") as sink, grpc.insecure_channel(address) as channel:
        while True:
            try:
                run_once(channel, pack, version, sink)
            except grpc.RpcError as error:
                if error.code() not in RETRIED:  # a restart, or a lease the restart let run out
                    raise
                time.sleep(0.1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
