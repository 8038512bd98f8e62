#!/usr/bin/env bash
# One owner's test suite in a virtualenv holding only Core and that owner (decision 146).
#
#   bash tests/support/owner_venv.sh OWNER [pytest arguments]     (make test-owner OWNER=...)
#
# Builds a virtualenv in a fresh temporary directory outside the checkout, installs, under
# requirements/constraints.txt, requirements/dev.txt's test tools, the third-party requirements
# of the packages, and editable (without dependencies, so nothing first-party comes from an
# index) Core's packages and OWNER's from owners.toml; generates the protos; prints `pip list`
# and refuses to run when another owner's distribution is in it; then runs pytest on OWNER's
# test directories with NEXUSCRM_REPO_ROOT set to this checkout. NEXUSCRM_KEEP_VENV=1 keeps the
# virtualenv. Exits with pytest's code (2 for a usage error before it).
set -euo pipefail

owner=${1:?usage: owner_venv.sh OWNER [pytest arguments] (OWNER: a name of owners.toml)}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}
core=schema-catalog

# owners.toml read once: OWNER's and Core's package directories, third-party requirements, the
# other owners' distribution names and OWNER's test directories, one kind per line.
plan=$("$python" - "$root" "$owner" "$core" <<'EOF'
import re, sys, tomllib, pathlib
root, owner, core = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
owners = tomllib.loads((root / "owners.toml").read_text())["owners"]
if owner not in owners:
    sys.exit(f"unknown owner {owner!r}: owners.toml names {', '.join(owners)}")
def directory(p): return "protos/python" if p == "protos" else p
def project(d): return tomllib.loads((root / d / "pyproject.toml").read_text())["project"]
def name(requirement): return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()
mine = [directory(p) for o in dict.fromkeys([core, owner]) for p in owners[o]["packages"]]
third = sorted({r for d in mine for r in project(d).get("dependencies", []) if not name(r).startswith("nexuscrm-")})
others = sorted({name(project(directory(p))["name"]) for o in owners if o not in (core, owner) for p in owners[o]["packages"]})
print("packages", *mine)
print("requires", *third)
print("others", *others)
print("tests", *owners[owner]["tests"])
EOF
) || exit 2
field() { sed -n "s/^$1 //p" <<<"$plan"; }
read -r -a packages <<<"$(field packages)"
read -r -a requires <<<"$(field requires)"
read -r -a others <<<"$(field others)"
read -r -a tests <<<"$(field tests)"

workspace=$(mktemp -d "${TMPDIR:-/tmp}/nexuscrm-owner-XXXXXX")
case "$workspace/" in "$root"/*) echo "the temporary directory $workspace is inside the checkout: set TMPDIR elsewhere" >&2; exit 2 ;; esac
if [ "${NEXUSCRM_KEEP_VENV:-}" = 1 ]; then trap 'echo "kept the virtualenv $workspace/venv"' EXIT; else trap 'rm -rf "$workspace"' EXIT; fi
venv=$workspace/venv
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet -c "$root/requirements/constraints.txt")
"${pip[@]}" -r "$root/requirements/dev.txt" "${requires[@]}"
"$venv/bin/python" "$root/protos/generate.py" >/dev/null
editables=()
for package in "${packages[@]}"; do editables+=(-e "$root/$package"); done
"${pip[@]}" --no-deps "${editables[@]}"

echo "== owner $owner: first-party distributions in $venv"
"$venv/bin/python" -m pip list --format=freeze 2>/dev/null | grep -i '^nexuscrm-'
installed=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | sed 's/==.*//' | tr '[:upper:]_.' '[:lower:]--')
for other in "${others[@]}"; do
    if grep -qx "$other" <<<"$installed"; then echo "another owner's $other is installed: not an owner-only run" >&2; exit 2; fi
done

cd "$root"
NEXUSCRM_REPO_ROOT=$root "$venv/bin/python" -m pytest -p no:cacheprovider "${tests[@]}" "$@"
