"""The offline PKI every security test shares (one CA per session)."""

from __future__ import annotations

import pytest

from tests.support.pki import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The CA, certificates and policy of ``tests.support.pki``."""
    return make_pki(tmp_path_factory.mktemp("pki"))
