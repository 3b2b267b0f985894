#!/usr/bin/env bash
# Installs everything the demo and the tests need on a fresh Debian 12 machine
# (run as root): Debian packages, then the Python tools in .venv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(
  redis-server redis-tools postgresql          # real backends for the engine/module tests
  pgbouncer                                    # waiting through a pooler in transaction mode
  etcd-server etcd-client
  prometheus                                   # promtool: check metrics and rules
  debootstrap systemd-container iproute2 iptables  # the lab: nspawn nodes in network namespaces
  openssh-client faketime chrony rsync git
  python3-venv
  python3-redis python3-psycopg                # the nodes' drivers, for tests/bench/bench_startup.py on /usr/bin/python3
  time                                         # GNU time: a run's peak RSS, for tests/bench/bench_run_cost.py
)

missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  # policy-rc.d: the packages' own services must not start on this host.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import ansible, redis, psycopg, etcd3gw, pytest, molecule' 2>/dev/null \
   || [[ requirements-dev.txt -nt .venv/.installed ]]; then
  echo "setup: creating .venv with the Python tools"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -U pip
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
  touch .venv/.installed
fi
# The oldest supported ansible-core, for the tests that run on every
# supported version (tests/integration/test_secrets.py, scripts/matrix.sh).
if [[ ! -x .venv-2.18/bin/ansible-playbook ]] || [[ requirements-2.18.txt -nt .venv-2.18/.installed ]]; then
  echo "setup: creating .venv-2.18 (ansible-core 2.18)"
  python3 -m venv .venv-2.18
  .venv-2.18/bin/pip install -q --disable-pip-version-check -r requirements-2.18.txt
  touch .venv-2.18/.installed
fi
# The newest ansible-core that installs here needs Python 3.12+: Debian 12
# has 3.11, so .venv-2.21 is made only where a newer Python is found.
newer_python=""
for candidate in /root/.pyenv/versions/3.13.*/bin/python3.13 /root/.pyenv/versions/3.12.*/bin/python3.12 \
                 "$(command -v python3.13 || true)" "$(command -v python3.12 || true)"; do
  if [[ -n $candidate && -x $candidate ]]; then newer_python=$candidate; break; fi
done
if [[ -n $newer_python ]] && { [[ ! -x .venv-2.21/bin/ansible-playbook ]] || [[ requirements-2.21.txt -nt .venv-2.21/.installed ]]; }; then
  echo "setup: creating .venv-2.21 (ansible-core 2.21 on $newer_python)"
  "$newer_python" -m venv .venv-2.21
  .venv-2.21/bin/pip install -q --disable-pip-version-check -r requirements-2.21.txt
  touch .venv-2.21/.installed
fi
# ansible-playbook and molecule find the collection through build/ (a link
# named ansible_collections/dlock/fleet pointing at this checkout).
mkdir -p build/ansible_collections/dlock
[[ -e build/ansible_collections/dlock/fleet ]] || ln -s ../../.. build/ansible_collections/dlock/fleet
echo "setup: ready"
