#!/usr/bin/env bash
# The demo, on a fresh Debian 12 machine as root:
#   bash scripts/demo.sh
# Installs what it needs, boots the lab (3 job nodes and a backend node, each a
# systemd-nspawn container with real systemd, reached over SSH), rolls out
# playbooks/site.yml (a Redis provisioned by the dlock_redis role on the
# backend node, chrony, the runner, metrics) with a job that fires every 5
# seconds on all three nodes, waits a minute, and prints which
# node ran each slot (the others skipped), read from the nodes' own journals.
# The lab stays up afterwards: `python3 tests/lab/lab.py down` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$PWD/build" ANSIBLE_HOST_KEY_CHECKING=False
lab() { python3 tests/lab/lab.py "$@"; }

lab up --nodes 3 --backend
# site.yml with dlock_backend_type=redis: the dlock_redis role on the backend
# node (ACL user, AOF, noeviction), chrony (the backend node serves the lab's
# time), the runner, the job and the metrics on the three nodes. The backend
# password is generated on first use into the lab's state directory (0600).
python3 tests/lab/rollout.py site --backend-type redis -e @tests/lab/demo_jobs.yml
started=$(date -u '+%Y-%m-%d %H:%M:%S')
echo "demo: the timers are running; waiting 60s for slots to pass..."
sleep 62
python3 tests/lab/demo_report.py --job demo-tick --since "$started UTC"
echo
echo "demo: explore with: python3 tests/lab/lab.py ssh n1 -- dlock status"
echo "demo: remove the lab with: python3 tests/lab/lab.py down"
