"""What the jobs role's write costs a node per job: the dlock_job_units
module's Python entry (JobUnits.run: the list validated, every job's three
files rendered, compared and written) on N jobs into an empty temporary
directory, then a second call that finds every file as wanted, for N = 10,
100 and 1000. Systemd is left out (no systemctl is run), and so is Ansible's
own cost of one module call (once per node, whatever N).

Not part of the pass/fail suite. The sizes are measured in turn, each round
(interleaved), --rounds rounds, a new directory each time; medians of this
process's CPU time per job, user (the module's Python: validation,
rendering, comparing) apart from system (the kernel's file work, which
varies from run to run with the file system's journal). The ratio 1000/100
of the user time per job says whether the module's cost grows faster than
the number of jobs (1.0: linear).

  python tests/bench/bench_job_units.py [--rounds N] [--quick]
"""

import argparse
import grp
import os
import resource
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests")]

# conftest links the checkout as ansible_collections.dlock.fleet under build/, as for the tests.
import conftest  # noqa: E402,F401  pylint: disable=unused-import
from ansible_collections.dlock.fleet.plugins.modules import dlock_job_units  # noqa: E402

SIZES = (10, 100, 1000)


def jobs(count):
    """`count` jobs as an operator writes them: a command, a schedule, lock options, some settings."""
    return [{"name": "job-%04d" % index, "command": ["/usr/local/bin/report", "--part", str(index)],
             "schedule": "*-*-* 02:%02d:00" % (index % 60), "once_per": "1d", "ttl": "10m",
             "environment": {"PART": index}, "description": "report part %d" % index,
             "read_write_paths": ["/srv/reports"], "unit_settings": {"MemoryMax": "1G"}}
            for index in range(count)]


def one_call(params):
    """(user, system) CPU seconds of one call of the module's entry, without systemd; whether it changed anything."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = dlock_job_units.JobUnits(params, False, False, None, systemd_dir="/nonexistent").run()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime), result["changed"]


def measure(count, scratch):
    """((user, system) seconds of the first call, of the second) on `count` jobs in a new directory."""
    directory = tempfile.mkdtemp(dir=scratch)
    os.mkdir(os.path.join(directory, "jobs"))
    os.mkdir(os.path.join(directory, "units"))
    params = dict((name, spec.get("default")) for name, spec in dlock_job_units.ARGUMENT_SPEC.items())
    params.update(jobs=jobs(count), jobs_dir=os.path.join(directory, "jobs"), unit_dir=os.path.join(directory, "units"),
                  group=grp.getgrgid(os.getgid()).gr_name, password_path=os.path.join(directory, "backend.password"))
    first, changed = one_call(params)
    second, changed_again = one_call(params)
    if not changed or changed_again:
        raise RuntimeError("%d jobs: the first call must write, the second must not" % count)
    shutil.rmtree(directory)
    return first, second


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    scratch = tempfile.mkdtemp(prefix="dlock-bench-job-units-")
    samples = dict((count, []) for count in SIZES)
    try:
        measure(10, scratch)  # warm: imports, the page cache
        for _round in range(rounds):
            for count in SIZES:
                samples[count].append(measure(count, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    per_job = {}
    print("ms of CPU per job   %-21s %-21s" % ("write: user, system", "no change: user, system"))
    for count in SIZES:
        row = [statistics.median(sample[call][kind] for sample in samples[count]) / count
               for call in (0, 1) for kind in (0, 1)]
        per_job[count] = row
        print("%4d jobs %16.3f %9.3f %16.3f %9.3f" % tuple([count] + [value * 1000 for value in row]))
    print("ratio of the user time per job, 1000 jobs / 100 jobs: write %.2f, no change %.2f (1.0: linear)"
          % (per_job[1000][0] / per_job[100][0], per_job[1000][2] / per_job[100][2]))
    print("(%d rounds, medians)" % rounds)


if __name__ == "__main__":
    main()
