#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#   bash scripts/test.sh
# Installs what it needs (scripts/setup.sh) and the lab's node image, then
# runs every stage below in lanes side by side, and fails if any stage fails
# (pytest's "no tests collected" included). Each stage prints its start and
# its time as it happens; at the end, the budget table (scripts/budget.py):
# each stage's seconds and checks, the site.yml rollouts and lab boots.
#
# Why lanes: the lab stages mostly wait (boots, SSH round trips, timers,
# the fault tests' runs, elections), the engine's tests wait on their real
# servers, and only rollouts and the static checks keep a core busy. On two
# cores, five lanes side by side take about as long as the longest lane.
# The static checks run niced: nothing there is timed, while the lab's
# fault tests and the engine's heartbeat tests have time bounds.
#   checks:   version matrix, ansible-test sanity and units, promtool, ansible-lint
#   engine:   pytest tests/unit tests/integration (real servers on loopback), then molecule redis
#   fleet:    the session lab dlkt (site.yml on Redis then PostgreSQL, TLS, check mode, containment)
#   ha:       the etcd lab dlke (etcd faults, Patroni faults, membership), then molecule postgresql
#   molecule: the bare-hosts lab dlkb, then molecule etcd and postgresql-ha
# Every stage of a lane runs even after one failed (one CI run shows every
# failure); each lane's output is printed whole, in order, at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash scripts/setup.sh
echo "=== setup: ${SECONDS}s"
export PATH="$PWD/.venv/bin:$PATH"

# The lab's node image (debootstrap and apt; cached in /var/cache/dlock-lab,
# so a no-op after the first run): before the lanes, which all boot labs.
start=$SECONDS
python3 tests/lab/lab.py build
echo "=== lab image: $((SECONDS - start))s"

DLOCK_SUITE_COUNT=$(mktemp /tmp/dlock-suite-count.XXXXXX)
export DLOCK_SUITE_COUNT
trap 'rm -f "$DLOCK_SUITE_COUNT"' EXIT

# run_stage NAME COMMAND...: runs one stage of the current lane ($LANE),
# announces its start and its time on fd 3 (the suite's own output) as they
# happen, and records its seconds, exit status and checks for the table.
run_stage() {
  local name=$1 start=$SECONDS rc=0 output
  shift
  output=$(mktemp /tmp/dlock-stage.XXXXXX)
  echo "=== [$LANE] started: $name" >&3
  printf '\n=== %s\n' "$name"
  DLOCK_SUITE_STAGE=$name "$@" 2>&1 | tee "$output" || rc=$?
  echo "=== $name: $((SECONDS - start))s (exit $rc)"
  echo "=== [$LANE] $name: $((SECONDS - start))s (exit $rc)" >&3
  python3 scripts/budget.py stage --name "$name" --lane "$LANE" --seconds $((SECONDS - start)) --rc "$rc" \
    --output "$output"
  rm -f "$output"
  return "$rc"
}

# In the lab stages every ansible-playbook run is counted (the callback
# appends a line to DLOCK_SUITE_COUNT; lab.py counts its boots there too).
lab_stage() {
  ANSIBLE_CALLBACK_PLUGINS="$PWD/tests/budget/callback_plugins" \
  ANSIBLE_CALLBACKS_ENABLED=dlock_suite_count \
    run_stage "$@"
}

HA_LAB_TESTS=(tests/lab/test_etcd_faults.py tests/lab/test_pg_faults.py tests/lab/test_etcd_members.py)
BARE_LAB_TESTS=(tests/lab/test_bare_hosts.py)
LAB_PYTEST=(pytest -p no:cacheprovider --durations=15)

lane_checks() {
  local rc=0
  run_stage "pytest: module, action plugin and filter on ansible-core 2.18 and 2.21 (scripts/matrix.sh)" \
    nice -n 15 bash scripts/matrix.sh || rc=1
  run_stage "ansible-test sanity (every test that applies, no ignore file)" \
    nice -n 15 bash scripts/ansible-test.sh sanity || rc=1
  run_stage "ansible-test units (module, action plugin, engine; every Python found)" \
    nice -n 15 bash scripts/ansible-test.sh units || rc=1
  run_stage "promtool: the shipped alert rules (check rules, test rules)" \
    bash -c 'promtool check rules roles/dlock_metrics/files/dlock.rules.yml &&
             cd roles/dlock_metrics/files && promtool test rules dlock.rules.test.yml' || rc=1
  run_stage "ansible-lint --profile production" nice -n 15 ansible-lint || rc=1
  return $rc
}

lane_engine() {
  local rc=0
  run_stage "pytest: unit and integration (real redis-server, PostgreSQL and etcd on loopback)" \
    pytest --durations=15 tests/unit tests/integration || rc=1
  lab_stage "molecule: redis (a backend node + 3 job nodes: Redis, chrony, the runner, the jobs, metrics)" \
    molecule test -s redis || rc=1
  return $rc
}

lane_fleet() {
  local ignore=() test
  for test in "${HA_LAB_TESTS[@]}" "${BARE_LAB_TESTS[@]}"; do ignore+=("--ignore=$test"); done
  lab_stage "pytest: the lab fleet (systemd-nspawn nodes over SSH; site.yml on Redis and PostgreSQL; TLS; check mode)" \
    "${LAB_PYTEST[@]}" tests/lab "${ignore[@]}"
}

lane_ha() {
  local rc=0
  lab_stage "pytest: the etcd lab (etcd: leader killed, partitioned, follower crashed; Patroni: primary crashed, partitioned, 3 leader changes, no sync standby; etcd members replaced and added)" \
    "${LAB_PYTEST[@]}" "${HA_LAB_TESTS[@]}" || rc=1
  lab_stage "molecule: postgresql (a backend node + 3 job nodes: one PostgreSQL server, chrony, the runner, metrics)" \
    molecule test -s postgresql || rc=1
  return $rc
}

lane_molecule() {
  local rc=0
  lab_stage "pytest: check mode on bare hosts (a lab of its own without the roles' packages)" \
    "${LAB_PYTEST[@]}" "${BARE_LAB_TESTS[@]}" || rc=1
  lab_stage "molecule: etcd (3 etcd members + 3 job nodes: the etcd backend over TLS, chrony and metrics)" \
    molecule test -s etcd || rc=1
  lab_stage "molecule: postgresql-ha (3 backend nodes: etcd and Patroni side by side, + 3 job nodes)" \
    molecule test -s postgresql-ha || rc=1
  return $rc
}

LANES=(checks engine fleet ha molecule)
lane_logs=() lane_pids=() failed_lanes=()
exec 3>&1
python3 scripts/budget.py cpu
for lane in "${LANES[@]}"; do
  lane_logs+=("$(mktemp "/tmp/dlock-lane-$lane.XXXXXX")")
  ( set -uo pipefail; start=$SECONDS status=0 LANE=$lane
    "lane_$lane" || status=$?
    echo "=== lane $lane: $((SECONDS - start))s (exit $status)"; exit $status ) > "${lane_logs[-1]}" 2>&1 &
  lane_pids+=($!)
done
for i in "${!lane_pids[@]}"; do
  wait "${lane_pids[$i]}" || failed_lanes+=("${LANES[$i]}")
done
python3 scripts/budget.py cpu
for i in "${!lane_pids[@]}"; do
  printf '\n=== output of lane %s ===\n' "${LANES[$i]}"
  cat "${lane_logs[$i]}"
done
rm -f "${lane_logs[@]}"
printf '\n=== budget: every stage, its time and its checks; the rollouts and lab boots (scripts/budget.py) ===\n'
python3 scripts/budget.py table
if ((${#failed_lanes[@]})); then
  echo "=== FAILED: lane(s) ${failed_lanes[*]} (see their output above)"
  exit 1
fi
echo "=== all stages passed in ${SECONDS}s"
