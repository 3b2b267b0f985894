#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#   bash scripts/test.sh
# Installs what it needs (scripts/setup.sh), then runs every stage below and
# fails if any stage fails (pytest's "no tests collected" included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

stage() { printf '\n=== %s\n' "$*"; }

stage "pytest: unit and integration (real redis-server and PostgreSQL on loopback)"
pytest tests/unit tests/integration

stage "pytest: module, action plugin and filter on ansible-core 2.18 and 2.21 (scripts/matrix.sh)"
bash scripts/matrix.sh

stage "ansible-test sanity (every test that applies, no ignore file)"
bash scripts/ansible-test.sh sanity

stage "ansible-test units (module, action plugin, engine; every Python found)"
bash scripts/ansible-test.sh units

stage "promtool: the shipped alert rules (check rules, test rules)"
promtool check rules roles/dlock_metrics/files/dlock.rules.yml
(cd roles/dlock_metrics/files && promtool test rules dlock.rules.test.yml)

stage "pytest: the lab fleet (systemd-nspawn nodes over SSH; site.yml on Redis and PostgreSQL)"
pytest tests/lab

stage "molecule: the runner and jobs roles on the lab"
molecule test -s default

stage "molecule: the Redis backend, chrony and metrics (a backend node + 3 job nodes)"
molecule test -s redis

stage "molecule: the PostgreSQL backend, chrony and metrics (a backend node + 3 job nodes)"
molecule test -s postgresql

stage "ansible-lint --profile production"
ansible-lint

stage "all stages passed"
