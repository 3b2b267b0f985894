#!/usr/bin/env bash
# The demo, on a fresh Debian 12 machine as root:
#   bash scripts/demo.sh
# Installs what it needs, boots the lab (3 job nodes and a backend node, each a
# systemd-nspawn container with real systemd, reached over SSH), starts the
# lab's Redis on the backend node, rolls out playbooks/site.yml with a job that
# fires every 5 seconds on all three nodes, waits a minute, and prints which
# node ran each slot (the others skipped), read from the nodes' own journals.
# The lab stays up afterwards: `python3 tests/lab/lab.py down` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$PWD/build" ANSIBLE_HOST_KEY_CHECKING=False
lab() { python3 tests/lab/lab.py "$@"; }

lab up --nodes 3 --backend
inventory=$(lab inventory)
state_dir=$(dirname "$inventory")

# The backend password lives in a 0600 vars file, never on a command line.
vars="$state_dir/demo-vars.yml"
if [[ ! -s "$vars" ]]; then
  umask 077
  password=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
  backend=$(lab status --json | python3 -c 'import json,sys; print([n["addr"] for n in json.load(sys.stdin) if n["group"] == "dlock_backend"][0])')
  printf 'lab_redis_password: "%s"\ndlock_backend:\n  url: "redis://%s:6379/0"\n  password: "%s"\n' \
    "$password" "$backend" "$password" > "$vars"
fi

ansible-playbook -i "$inventory" tests/lab/backend_redis.yml -e "@$vars"
ansible-playbook -i "$inventory" playbooks/site.yml -e "@$vars" -e @tests/lab/demo_jobs.yml
started=$(date -u '+%Y-%m-%d %H:%M:%S')
echo "demo: the timers are running; waiting 60s for slots to pass..."
sleep 62
python3 tests/lab/demo_report.py --job demo-tick --since "$started UTC"
echo
echo "demo: explore with: python3 tests/lab/lab.py ssh n1 -- dlock status"
echo "demo: remove the lab with: python3 tests/lab/lab.py down"
