#!/usr/bin/env bash
# ansible-test needs the collection at a real .../ansible_collections/NS/NAME
# path (it resolves symlinks), so this copies the checkout there and runs the
# tests from the copy. No containers here: sanity and units run from
# virtual environments that ansible-test builds itself (--venv --requirements,
# packages from PyPI). The pyenv interpreters, when present, let the
# version-specific tests (compile, import, units) cover Python 3.9-3.13.
#
#   scripts/ansible-test.sh sanity [ANSIBLE-TEST OPTIONS]   # all sanity tests
#   scripts/ansible-test.sh units  [ANSIBLE-TEST OPTIONS]   # tests/unit
#
# Extra options go to ansible-test (e.g. --test pylint, --python 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=$ROOT/build/ansible-test/ansible_collections/dlock/fleet

command=${1:?usage: scripts/ansible-test.sh sanity|units [ansible-test options]}
shift

mkdir -p "$DEST"
rsync -a --delete \
  --exclude /.venv --exclude '/.venv-*' --exclude /build --exclude /.git --exclude /tests/output \
  --exclude .pytest_cache --exclude .hypothesis --exclude __pycache__ --exclude '*.pyc' \
  "$ROOT/" "$DEST/"
# A repository of its own: inside the checkout's, every copied file would be
# ignored (build/ is in .gitignore) and ansible-test would find no targets.
# Untracked files count as content, so nothing needs to be committed there.
[[ -d $DEST/.git ]] || git -C "$DEST" init -q

for version in 3.9 3.10 3.12 3.13; do
  for bin in /root/.pyenv/versions/"$version".*/bin; do
    [[ -x $bin/python$version ]] && PATH=$PATH:$bin
  done
done
export PATH="$ROOT/.venv/bin:$PATH"

# ansible-test bootstraps pip into its venvs with get-pip-24.2.py from
# ci-files.testing.ansible.com, which is not reachable here (only PyPI is).
# Its error message says to save the script in its cache; we save a stand-in
# that does the same job with the interpreter's own ensurepip, then installs
# the requested packages (pip==24.2 among them) from PyPI.
GET_PIP=$HOME/.ansible/test/cache/get_pip_24_2.py
if [[ ! -e $GET_PIP ]]; then
  mkdir -p "$(dirname "$GET_PIP")"
  cat > "$GET_PIP" <<'PY'
"""Stand-in for get-pip-24.2.py written by dlock.fleet's scripts/ansible-test.sh."""
import subprocess
import sys

# In a child: ensurepip.bootstrap() in-process points PIP_CONFIG_FILE at
# /dev/null, which would hide the machine's pip.conf (index, CA bundle).
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
# --no-setuptools / --no-wheel are get-pip options: without them pip installs none.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
PY
fi

cd "$DEST"
case $command in
  sanity) exec ansible-test sanity --venv --requirements --color no "$@" ;;
  units) exec ansible-test units --venv --requirements --color no "$@" ;;
  *) echo "unknown command: $command (sanity or units)" >&2; exit 2 ;;
esac
