#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#   bash scripts/test.sh
# Installs what it needs (scripts/setup.sh) and the lab's node image, then
# runs every nox session tagged full (noxfile.py: `nox -l` lists them) in
# lanes side by side, and fails if any session fails (pytest's "no tests
# collected" included). Each session prints its start and its time as it
# happens; at the end, the budget table (scripts/budget.py): each session's
# seconds and checks, the site.yml rollouts and the lab boots.
#
# Why lanes: the lab sessions mostly wait (boots, SSH round trips, timers,
# the fault tests' runs, elections), the engine's tests wait on their real
# servers, and only rollouts and the static checks keep a core busy. On two
# cores, five lanes side by side take about as long as the longest lane.
# Each lane's output is printed whole, in order, at the end.
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

# The lanes: the nox sessions (noxfile.py) tagged full, each in one lane, in
# order. A session missing here, or one that is not tagged full, stops the
# suite before it starts (below).
LANES=(checks engine fleet etcd patroni)
declare -A LANE_SESSIONS=(
  [checks]="matrix sanity units lint lab-bare release"
  [engine]="integration"
  [fleet]="lab-single role-modules"
  [etcd]="lab-etcd operations"
  [patroni]="lab-patroni modules"
)
# CPU priority by what a lane's timing bounds need (nice is inherited by
# everything a session starts, the lab nodes it boots included): the fault
# tests' gap bounds (etcd, patroni), the engine's heartbeat and self-fencing
# tests (engine) and the fleet's slot ledger (fleet, the longest lane) at 0;
# the static checks and the bare lab's check-mode rollouts have no tight
# time bound, so they yield, but only somewhat: at nice 15 (CI, stop 28) the
# four lab lanes starved the matrix's ad-hoc `ansible` calls past their
# 60 s timeout, the matrix took 1413 s instead of 114 s, and the checks lane
# became the longest. Measured: with every lane at the same priority on a
# loaded machine, one etcd fault's longest gap was 14.38 s against its
# 13.90 s bound. The bare lab has no lane of its own: a sixth lane on two
# cores (CI7) made every lane slower, and two engine tests missed their
# time bounds.
declare -A LANE_NICE=([checks]=5)

full=$(nox -l -t full --json 2>/dev/null | python3 -c 'import json, sys; print(" ".join(sorted(s["session"] for s in json.load(sys.stdin))))')
planned=$(for lane in "${LANES[@]}"; do
  read -ra sessions <<< "${LANE_SESSIONS[$lane]}"
  printf '%s\n' "${sessions[@]}"
done | LC_ALL=C sort | tr '\n' ' ')
if [[ "$full" != "${planned% }" ]]; then
  echo "=== FAILED: the lanes run [${planned% }] but noxfile.py tags [$full] full" >&2
  exit 1
fi

# run_session SESSION: one stage of the current lane ($LANE): nox -s
# SESSION, its start and its time announced on fd 3 (the suite's own
# output) as they happen, its seconds, exit status and checks recorded for
# the table. In the lab sessions every ansible-playbook run is counted (the
# callback appends a line to DLOCK_SUITE_COUNT; lab.py counts its boots).
# The stage's processes on the host run in a cgroup of their own, whose
# cpu.stat gives the stage's CPU time for the table (its lab nodes move to
# cgroups of their own, and lab.py counts theirs as it removes them). None
# where the host has no cgroup2.
CGROUP2=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)

run_session() {
  local session=$1 start=$SECONDS rc=0 output env=() group="" cpu=()
  output=$(mktemp /tmp/dlock-stage.XXXXXX)
  # A new group each run ($$): one an earlier run could not remove (a
  # process it left behind) would count that run's CPU again.
  if [[ -n $CGROUP2 ]] && mkdir "$CGROUP2/dlock-stage-$session-$$" 2>/dev/null; then
    group=$CGROUP2/dlock-stage-$session-$$
  fi
  case $session in
    lab-* | molecule*) env=(ANSIBLE_CALLBACK_PLUGINS="$PWD/tests/budget/callback_plugins"
                            ANSIBLE_CALLBACKS_ENABLED=dlock_suite_count) ;;
  esac
  echo "=== [$LANE] started: $session" >&3
  printf '\n=== %s\n' "$session"
  ( if [[ -n $group ]]; then echo "$BASHPID" > "$group/cgroup.procs"; fi
    exec env "${env[@]}" DLOCK_SUITE_STAGE="$session" nice -n "${LANE_NICE[$LANE]:-0}" nox -s "$session" ) 2>&1 \
    | tee "$output" || rc=$?
  if [[ -n $group ]]; then
    read -ra cpu <<< "$(awk '$1 == "usage_usec" {printf "--cpu-seconds %.1f", $2 / 1e6}' "$group/cpu.stat" 2>/dev/null)"
    rmdir "$group" 2>/dev/null || true  # a process the stage left behind keeps it
  fi
  echo "=== $session: $((SECONDS - start))s (exit $rc)"
  echo "=== [$LANE] $session: $((SECONDS - start))s (exit $rc)" >&3
  python3 scripts/budget.py stage --name "$session" --lane "$LANE" --seconds $((SECONDS - start)) --rc "$rc" \
    --output "$output" "${cpu[@]}"
  rm -f "$output"
  return "$rc"
}

# Every session of a lane runs even after one failed: one CI run shows every failure.
run_lane() {
  local session sessions rc=0
  read -ra sessions <<< "${LANE_SESSIONS[$LANE]}"
  for session in "${sessions[@]}"; do
    run_session "$session" || rc=1
  done
  return $rc
}

lane_logs=() lane_pids=() failed_lanes=()
exec 3>&1
python3 scripts/budget.py cpu
for lane in "${LANES[@]}"; do
  lane_logs+=("$(mktemp "/tmp/dlock-lane-$lane.XXXXXX")")
  ( set -uo pipefail; start=$SECONDS status=0 LANE=$lane
    run_lane || status=$?
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
