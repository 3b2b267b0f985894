"""The lock state of a node's jobs as textfile metrics (`dlock metrics`).

For every job in the jobs directory: whether its lock is held (by any node,
as the backend sees it) and by which host, the lease's age and TTL left, the
fencing token, the last finished run on any node, and the period of the job's
timer; plus this node's clock check. node_exporter serves the file, and the
shipped alert rules (roles/dlock_metrics) read it.

The names differ from the runner's per-job metrics (its dlock_lock_held means
"this node holds it"): two textfiles must never export the same series, or
node_exporter rejects the scrape.
"""

import datetime
import os
import re
import subprocess

# (name, type, help)
METRICS = (
    ("dlock_lock_state_held", "gauge", "1 while some node holds the job's lock (the backend's view)."),
    ("dlock_lock_state_holder_info", "gauge", "The host holding the job's lock, as a label."),
    ("dlock_lock_state_age_seconds", "gauge", "Age of the current lease of the job's lock (0 when free)."),
    ("dlock_lock_state_ttl_remaining_seconds", "gauge",
     "TTL left on the current lease (0 when free; absent for a session lock)."),
    ("dlock_lock_state_fencing_token", "gauge", "Last fencing token granted for the job's lock."),
    ("dlock_lock_state_last_run_timestamp_seconds", "gauge", "Unix time the last run of the job ended, on any node."),
    ("dlock_lock_state_last_exit_code", "gauge", "Exit code of the last run of the job, on any node."),
    ("dlock_job_schedule_period_seconds", "gauge", "Seconds between two runs of the job's timer."),
    ("dlock_paused", "gauge",
     "1 while a pause of the job's lock, of one of its groups or of every lock refuses its runs (dlock pause)."),
    ("dlock_pause_until_timestamp_seconds", "gauge", "Unix time the pause that refuses the job's runs ends."),
    ("dlock_pause_start_timestamp_seconds", "gauge", "Unix time the pause that refuses the job's runs was set."),
    ("dlock_pause_mirror_only", "gauge",
     "1 while only this node's mirror of a pause refuses the job's runs: the backend has lost the pause "
     "(restarted empty, or restored from an older backup)."),
    ("dlock_job_file_invalid", "gauge",
     "1 for a job file this node's runner cannot load: the job does not run here (dlock status names why)."),
    ("dlock_lock_state_refresh_success", "gauge", "1 when the last lock-state refresh could query the backend."),
    ("dlock_lock_state_refresh_timestamp_seconds", "gauge", "Unix time of the last lock-state refresh."),
    ("dlock_clock_check_safe", "gauge", "1 when this node's clock check passed (dlock check-clock)."),
    ("dlock_clock_check_offset_seconds", "gauge", "Backend clock minus this node's clock, at the last refresh."),
    ("dlock_clock_chrony_synchronised", "gauge", "1 when chrony reports this node synchronised."),
    ("dlock_backend_info", "gauge", "The backend member that answered this node's refresh, as labels."),
    ("dlock_backend_cluster_members", "gauge", "Voting members in the etcd cluster's member list."),
    ("dlock_backend_cluster_members_healthy", "gauge",
     "Members of the backend URL that answered this node and know a leader, with no alarm."),
    ("dlock_backend_cluster_leader", "gauge", "1 when the etcd members this node reaches agree on a leader."),
    ("dlock_backend_sync_replication_enabled", "gauge",
     "1 when the PostgreSQL primary's synchronous_standby_names asks for a synchronous standby."),
    ("dlock_backend_standbys_connected", "gauge", "Standbys connected to the PostgreSQL primary (pg_stat_replication)."),
    ("dlock_backend_sync_standbys", "gauge",
     "Standbys streaming as synchronous to the PostgreSQL primary (absent when the role may not see it)."),
)
_ELAPSE = re.compile(r"^\s*(?:Next elapse|Iter\. #2): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$", re.M)


def _calendar(unit_dir, job):
    """The single OnCalendar of dlock-JOB.timer, or None."""
    try:
        with open(os.path.join(unit_dir, "dlock-%s.timer" % job)) as handle:
            calendar = [line.split("=", 1)[1].strip() for line in handle if line.startswith("OnCalendar=")]
    except (IOError, OSError):
        return None
    return calendar[0] if len(calendar) == 1 else None


def _analyze(calendars):
    """[seconds or None] between the next two elapses of each calendar, from
    one systemd-analyze run for all of them; None when its answers cannot be
    told apart (it did not run, or refused an expression, which prints
    nothing)."""
    try:
        out = subprocess.run(["systemd-analyze", "calendar", "--iterations=2", "--"] + list(calendars),
                             capture_output=True, text=True, timeout=10, check=False,
                             env=dict(os.environ, TZ="UTC", LC_ALL="C")).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    blocks = [block for block in out.split("\n\n") if block.strip()]
    if len(blocks) != len(calendars):
        return None
    periods = []
    for block in blocks:
        times = [datetime.datetime.strptime(t, "%Y-%m-%d %H:%M:%S") for t in _ELAPSE.findall(block)]
        periods.append((times[1] - times[0]).total_seconds() if len(times) == 2 else None)
    return periods


def schedule_periods(unit_dir, jobs):
    """{job: seconds between the next two elapses of dlock-JOB.timer's single
    OnCalendar}, for the jobs where that can be told. One systemd-analyze run
    for all the distinct calendars, as a refresh runs every 30 s by default
    and a node may have hundreds of jobs (a run a job cost a node with 50
    jobs most of its idle CPU); should it refuse one of them, each is asked
    on its own."""
    calendars = dict((job, _calendar(unit_dir, job)) for job in jobs)
    distinct = sorted(set(calendar for calendar in calendars.values() if calendar))
    if not distinct:
        return {}
    periods = _analyze(distinct)
    if periods is None:
        periods = [(_analyze([calendar]) or [None])[0] for calendar in distinct]
    by_calendar = dict(zip(distinct, periods))
    return dict((job, by_calendar[calendar]) for job, calendar in calendars.items()
                if calendar and by_calendar[calendar] is not None)


def _backend_samples(samples, info):
    """The member that answered and the cluster's health (Backend.describe(cluster=True))."""
    member = info.get("member")
    if member:
        labels = {"backend": info["backend"], "member": member["endpoint"]}
        labels.update(("member_" + k, member[k]) for k in ("name", "role") if member.get(k))
        samples["dlock_backend_info"].append((labels, 1))
    cluster = info.get("cluster") or {}
    if "healthy" in cluster:  # etcd
        if cluster["members"] is not None:
            samples["dlock_backend_cluster_members"].append(({}, cluster["members"]))
        samples["dlock_backend_cluster_members_healthy"].append(({}, cluster["healthy"]))
        samples["dlock_backend_cluster_leader"].append(({}, 1 if cluster["leader_id"] else 0))
    if "sync_replication" in cluster:  # PostgreSQL
        samples["dlock_backend_sync_replication_enabled"].append(({}, 1 if cluster["sync_replication"] else 0))
        samples["dlock_backend_standbys_connected"].append(({}, cluster["standbys_connected"]))
        if cluster["sync_standbys"] is not None:
            samples["dlock_backend_sync_standbys"].append(({}, cluster["sync_standbys"]))


def families(rows, periods, clock, refreshed_at, backend=None, invalid_jobs=()):
    """Metric families for report.render_families.

    rows: `dlock status --json` rows (None when the backend could not be
    queried); periods: {job: seconds}; clock: clock.assess() or None;
    backend: Backend.describe(cluster=True) or None; invalid_jobs: the jobs
    whose file does not load."""
    samples = dict((name, []) for name, _kind, _help in METRICS)
    if backend:
        _backend_samples(samples, backend)
    for row in rows or []:
        labels = {"job": row["job"], "key": row["key"]}
        held = bool(row.get("held"))
        samples["dlock_lock_state_held"].append((labels, 1 if held else 0))
        if held and row.get("owner"):
            holder = row["owner"].rsplit(":", 2)[0]  # owner tokens are host:pid:random
            samples["dlock_lock_state_holder_info"].append((dict(labels, holder=holder), 1))
        samples["dlock_lock_state_age_seconds"].append((labels, (row.get("age") or 0) if held else 0))
        if not held or row.get("ttl_remaining") is not None:
            samples["dlock_lock_state_ttl_remaining_seconds"].append(
                (labels, (row.get("ttl_remaining") or 0) if held else 0))
        samples["dlock_lock_state_fencing_token"].append((labels, row.get("fence") or 0))
        pause = row.get("paused")
        samples["dlock_paused"].append((labels, 1 if pause else 0))
        samples["dlock_pause_mirror_only"].append((labels, 1 if row.get("mirror_only") else 0))
        if pause and pause.get("until") is not None:
            samples["dlock_pause_until_timestamp_seconds"].append((labels, pause["until"]))
        if pause and pause.get("at") is not None:
            samples["dlock_pause_start_timestamp_seconds"].append((labels, pause["at"]))
        last = row.get("last") or {}
        if last.get("finished_at") is not None:
            samples["dlock_lock_state_last_run_timestamp_seconds"].append((labels, last["finished_at"]))
        if last.get("exit_code") is not None:
            samples["dlock_lock_state_last_exit_code"].append((labels, last["exit_code"]))
    for job in sorted(periods):
        samples["dlock_job_schedule_period_seconds"].append(({"job": job}, periods[job]))
    for job in sorted(invalid_jobs):
        samples["dlock_job_file_invalid"].append(({"job": job}, 1))
    samples["dlock_lock_state_refresh_success"].append(({}, 0 if rows is None else 1))
    samples["dlock_lock_state_refresh_timestamp_seconds"].append(({}, round(refreshed_at, 3)))
    if clock is not None:
        samples["dlock_clock_check_safe"].append(({}, 1 if clock["safe"] else 0))
        samples["dlock_clock_check_offset_seconds"].append(({}, clock["offset_seconds"]))
        chrony = clock.get("chrony") or {}
        if "synchronised" in chrony:
            samples["dlock_clock_chrony_synchronised"].append(({}, 1 if chrony["synchronised"] else 0))
    return [(name, kind, help_text, samples[name]) for name, kind, help_text in METRICS]
