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
# than they compute. The lab stages follow, in two lanes side by side (see
# LANES below).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash scripts/setup.sh
echo "=== setup: ${SECONDS}s"
export PATH="$PWD/.venv/bin:$PATH"

STAGE="" STAGE_START=0
# In a lane (LANE set) each stage's start and time also go to fd 3, the
# suite's own output, as they happen: the lane's whole output comes later.
LANE=""
stage() {
  local line
  if [[ -n $STAGE ]]; then
    line=$(printf '=== %s: %ds' "$STAGE" $((SECONDS - STAGE_START)))
    echo "$line"
    [[ -z $LANE ]] || echo "=== [$LANE] ${line#=== }" >&3
  fi
  STAGE="$*" STAGE_START=$SECONDS
  if [[ -n $STAGE ]]; then
    printf '\n=== %s\n' "$STAGE"
    [[ -z $LANE ]] || echo "=== [$LANE] started: $STAGE" >&3
  fi
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

# The lab stages run in two lanes side by side, each a sequence of stages on
# labs of its own (prefix and subnet): a rollout saturates both cores, but
# much of every stage waits (boots, SSH round trips, timers, the fault
# tests' runs), so two lanes take far less than one after the other. Each
# stage still prints its time; each lane's output is printed whole, in
# order, once both lanes have ended, and every stage of a lane runs even
# after one failed (one CI run shows every failure).
#   fleet: the session lab (dlkt) and the bare-hosts lab (dlkb), then
#          molecule postgresql-ha and redis;
#   ha:    the etcd lab (dlke: etcd faults, Patroni faults, membership),
#          then molecule etcd and postgresql.
# (Measured alone on a quiet machine, the two take about as long: 16 + 15.5
# + 9 minutes against 20 + 12.5 + 10.)
HA_LAB_TESTS=(tests/lab/test_etcd_faults.py tests/lab/test_pg_faults.py tests/lab/test_etcd_members.py)

lane_fleet() {
  local ignore=() test rc=0
  for test in "${HA_LAB_TESTS[@]}"; do ignore+=("--ignore=$test"); done
  stage "pytest: the lab fleet (systemd-nspawn nodes over SSH; site.yml on Redis and PostgreSQL; TLS; check mode)"
  pytest -p no:cacheprovider --durations=12 tests/lab "${ignore[@]}" || rc=1
  stage "molecule: postgresql-ha (3 backend nodes: etcd and Patroni side by side, + 3 job nodes; a switchover)"
  molecule test -s postgresql-ha || rc=1
  stage "molecule: redis (a backend node + 3 job nodes: Redis, chrony, the runner, the jobs, metrics)"
  molecule test -s redis || rc=1
  stage ""
  return $rc
}

lane_ha() {
  local rc=0
  stage "pytest: the etcd lab (etcd: leader killed, partitioned, follower crashed; Patroni: primary crashed, partitioned, 3 leader changes, no sync standby; etcd members replaced and added)"
  pytest -p no:cacheprovider --durations=12 "${HA_LAB_TESTS[@]}" || rc=1
  stage "molecule: etcd (3 etcd members + 3 job nodes: the etcd backend over TLS, chrony and metrics)"
  molecule test -s etcd || rc=1
  stage "molecule: postgresql (a backend node + 3 job nodes: one PostgreSQL server, chrony, the runner, metrics)"
  molecule test -s postgresql || rc=1
  stage ""
  return $rc
}

LANES=(fleet ha)
lane_logs=() lane_pids=() lanes_rc=0
exec 3>&1
for lane in "${LANES[@]}"; do
  lane_logs+=("$(mktemp "/tmp/dlock-lane-$lane.XXXXXX")")
  ( set -uo pipefail; start=$SECONDS status=0 LANE=$lane
    "lane_$lane" || status=$?
    echo "=== lane $lane: $((SECONDS - start))s (exit $status)"; exit $status ) > "${lane_logs[-1]}" 2>&1 &
  lane_pids+=($!)
done
for i in "${!lane_pids[@]}"; do
  wait "${lane_pids[$i]}" || lanes_rc=1
done
for i in "${!lane_pids[@]}"; do
  printf '\n=== output of lane %s ===\n' "${LANES[$i]}"
  cat "${lane_logs[$i]}"
done
printf '\n=== stage times ===\n'
grep -h '^=== .*: [0-9]*s' "${lane_logs[@]}" || true
rm -f "${lane_logs[@]}"
if ((lanes_rc != 0)); then
  echo "=== FAILED: a lab lane failed (see its output above)"
  exit 1
fi
echo "=== all stages passed in ${SECONDS}s"
