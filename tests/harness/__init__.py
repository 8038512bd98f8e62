"""The cross-checkout harness of the one runner (tests/integration/connector-projection-ranges.sh).

Each owner of owners.toml can be taken from a checkout of its own, named by its ``checkout``
variable (NEXUSCRM_REPO_ROOT for Core, the schema-catalog owner); every variable defaults to the
runner's own checkout. ``python -m tests.harness check`` reads the checkouts' versions and
first-party ranges and exits 9 when one does not fit another; ``python -m tests.harness test
[pytest arguments]`` runs the tests: with every owner from the runner's checkout, pytest as
always; otherwise in an external temporary virtualenv holding each owner's packages, editable,
from that owner's checkout, each owner's tests run from its own checkout; ``python -m
tests.harness owner OWNER`` runs one owner's suite in a virtualenv of Core and that owner only
(``make test-owner``; docs/decisions/146-test-layout-by-owner.md).
"""
