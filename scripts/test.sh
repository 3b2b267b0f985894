#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#   bash scripts/test.sh
# Installs what it needs (scripts/setup.sh), then runs every stage below and
# fails if any stage fails (pytest's "no tests collected" included). Each
# stage prints its time.
#
# Two cores: the static checks (version matrix, ansible-test sanity and units,
# promtool, ansible-lint) and the lab's image build run in the background
# beside the first pytest stage, whose real servers and subprocesses wait more
# than they compute. The lab stages run alone afterwards: their timers and
# slot windows want a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash scripts/setup.sh
echo "=== setup: ${SECONDS}s"
export PATH="$PWD/.venv/bin:$PATH"

STAGE="" STAGE_START=0
stage() {
  [[ -n $STAGE ]] && printf '=== %s: %ds\n' "$STAGE" $((SECONDS - STAGE_START))
  STAGE="$*" STAGE_START=$SECONDS
  [[ -n $STAGE ]] && printf '\n=== %s\n' "$STAGE"
  return 0
}

static_checks() {
  stage "pytest: module, action plugin and filter on ansible-core 2.18 and 2.21 (scripts/matrix.sh)"
  bash scripts/matrix.sh
  stage "ansible-test sanity (every test that applies, no ignore file)"
  bash scripts/ansible-test.sh sanity
  stage "ansible-test units (module, action plugin, engine; every Python found)"
  bash scripts/ansible-test.sh units
  stage "promtool: the shipped alert rules (check rules, test rules)"
  promtool check rules roles/dlock_metrics/files/dlock.rules.yml
  (cd roles/dlock_metrics/files && promtool test rules dlock.rules.test.yml)
  stage "ansible-lint --profile production"
  ansible-lint
  stage ""
}

STATIC_LOG=$(mktemp /tmp/dlock-static-checks.XXXXXX)
( set -euo pipefail; static_checks ) > "$STATIC_LOG" 2>&1 &
STATIC_PID=$!

# The lab's node image (debootstrap and apt: mostly the network and the disk)
# is built beside the first stage too, unless cached. If this build fails, the
# lab stage builds it again and fails there, with the error in its output.
IMAGE_LOG=$(mktemp /tmp/dlock-lab-image.XXXXXX)
( start=$SECONDS; python3 tests/lab/lab.py build && echo "=== lab image: $((SECONDS - start))s" ) > "$IMAGE_LOG" 2>&1 &
IMAGE_PID=$!

stage "pytest: unit and integration (real redis-server and PostgreSQL on loopback)"
pytest_rc=0
pytest tests/unit tests/integration || pytest_rc=$?
stage ""

static_rc=0
wait "$STATIC_PID" || static_rc=$?
printf '\n=== static checks (ran in the background) ===\n'
cat "$STATIC_LOG"
rm -f "$STATIC_LOG"
wait "$IMAGE_PID" || echo "=== the lab image build beside the first stage failed; the lab stage builds it again"
tail -n 3 "$IMAGE_LOG"
rm -f "$IMAGE_LOG"
if ((pytest_rc != 0 || static_rc != 0)); then
  echo "=== FAILED: pytest unit/integration rc=$pytest_rc, static checks rc=$static_rc"
  exit 1
fi

stage "pytest: the lab fleet (systemd-nspawn nodes over SSH; site.yml on Redis and PostgreSQL)"
pytest --durations=12 tests/lab

# Two scenarios at a time, each on its own lab (prefix and subnet): their
# converges wait on SSH round trips and on the nodes much of the time, so a
# pair takes less than the two in a row (each prints its own time). Each
# scenario's output is printed whole, in order, once both have ended.
molecule_pair() {
  local name logs=() pids=() rc=0 i
  for name in "$@"; do
    logs+=("$(mktemp "/tmp/dlock-molecule-$name.XXXXXX")")
    ( start=$SECONDS status=0
      molecule test -s "$name" || status=$?
      echo "=== molecule $name: $((SECONDS - start))s (exit $status)"; exit $status ) > "${logs[-1]}" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    cat "${logs[$i]}"
    rm -f "${logs[$i]}"
  done
  return $rc
}

stage "molecule, side by side: redis (a backend node + 3 job nodes: Redis, chrony, the runner, the jobs, metrics) and postgresql (the same on PostgreSQL)"
molecule_pair redis postgresql

stage "molecule: the etcd backend, chrony and metrics (3 etcd members + 3 job nodes)"
molecule test -s etcd

stage "molecule: PostgreSQL with Patroni (3 backend nodes: etcd and Patroni side by side, + 3 job nodes; a switchover)"
molecule test -s postgresql-ha

stage ""
echo "=== all stages passed in ${SECONDS}s"
