"""Do the checkouts' versions fit each other's declared first-party ranges?"""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.harness.checkouts import Package


def unsatisfied(packages: tuple[Package, ...]) -> list[str]:
    """One line per first-party requirement the providing checkout's version does not satisfy.

    Every package's requirement on another ``nexuscrm-*`` distribution is evaluated against the
    version the checkout of that distribution's owner provides; a requirement no owner provides
    is reported as well. Empty when everything fits.
    """
    provided = {package.name: package for package in packages}
    problems = []
    for package in packages:
        for written in package.first_party:
            requirement = Requirement(written)
            needer = f"{package.name} {package.version} ({package.checkout.describe()}) needs {written}"
            provider = provided.get(canonicalize_name(requirement.name))
            if provider is None:
                problems.append(f"{needer}; no owner in owners.toml provides {requirement.name}")
            elif not requirement.specifier.contains(provider.version, prereleases=True):
                problems.append(
                    f"{needer}; {provider.checkout.owner.title} ({provider.checkout.describe()}) "
                    f"provides {provider.name} {provider.version}"
                )
    return problems
