#!/usr/bin/env bash
# The module, action plugin, filter and plugin_utils tests on the other supported
# ansible-cores (the main test stage covers .venv's):
#   .venv-2.18  the oldest supported (Debian 12's Python 3.11)
#   .venv-2.21  the newest that installs here; it needs Python 3.12+, so
#               scripts/setup.sh makes it only where one is found (pyenv)
# The unit tests of the module, the action plugin, the filters and their
# plugin_utils, and real `ansible` / `ansible-playbook` runs of each version against
# real Redis and PostgreSQL: the ad-hoc calls and the runbooks of tests/integration/module
# (its lock-section and hold tests run in the main stage, on .venv's core).
set -euo pipefail
cd "$(dirname "$0")/.."
UNIT=(tests/unit/plugins/modules tests/unit/plugins/action tests/unit/plugins/filter tests/unit/plugins/plugin_utils)
ran=0
for venv in .venv-2.18 .venv-2.21; do
  if [[ ! -x $venv/bin/python ]]; then
    if [[ $venv == .venv-2.18 ]]; then echo "matrix: $venv is missing (run scripts/setup.sh)" >&2; exit 1; fi
    echo "matrix: no $venv (no Python 3.12+ on this machine): ansible-core 2.21 not tested here"
    continue
  fi
  version=$("$venv/bin/python" -c 'import ansible; print(ansible.__version__)')
  echo "=== ansible-core $version on $("$venv/bin/python" -V)"
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${UNIT[@]}"
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration/module \
    -k "adhoc or runbooks"
  ran=$((ran + 1))
done
echo "matrix: $ran ansible-core versions besides .venv's passed"
