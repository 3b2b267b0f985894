"""The test suite's named stages, as nox sessions.

    nox -l                 # every session, with what it runs
    nox -s lint            # one session
    nox -t pr              # a developer's quick loop: lint, matrix, quick (never what CI runs)
    bash scripts/test.sh   # set-up on a fresh machine, then every session tagged full (what CI runs)

Every session runs in the project's .venv (scripts/setup.sh makes it; nox
makes no virtualenv of its own: python=False), so run nox from there:
`.venv/bin/nox ...`. scripts/test.sh runs the `full` sessions in lanes side
by side (its LANES) and refuses to start if a lane misses one or names one
that is not tagged full.

Where a new test goes, and how to run one test: tests/README.md.
"""

import glob

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = []  # `nox` alone lists nothing to run: name a session (-s) or a tag (-t)

PYTEST = ("pytest", "--durations=40")  # where the time goes: the 40 slowest steps of each stage
LAB_PYTEST = PYTEST + ("-p", "no:cacheprovider")
ETCD_LAB_TESTS = ("tests/lab/test_etcd_faults.py", "tests/lab/test_etcd_members.py")
PATRONI_LAB_TESTS = ("tests/lab/test_pg_faults.py",)
BARE_LAB_TESTS = ("tests/lab/test_bare_hosts.py",)


# The molecule scenarios (molecule/NAME; molecule/default is molecule's stub).
SCENARIOS = ("redis", "postgresql", "etcd", "postgresql-ha")


@nox.session(python=False, tags=["pr", "full"])
def lint(session):
    """ansible-lint (production profile), molecule's syntax check of every scenario, promtool on the shipped
    alert rules, and the docsite antsibull-docs renders (scripts/docsite.sh: Sphinx, warnings as errors)."""
    session.run("ansible-lint", external=True)
    session.run("molecule", "syntax", *[arg for name in SCENARIOS for arg in ("-s", name)], external=True)
    session.run("promtool", "check", "rules", "roles/dlock_metrics/files/dlock.rules.yml", external=True)
    with session.chdir("roles/dlock_metrics/files"):
        session.run("promtool", "test", "rules", "dlock.rules.test.yml", external=True)
    session.run("bash", "scripts/docsite.sh", external=True)


@nox.session(python=False, tags=["full"])
def sanity(session):
    """ansible-test sanity: every test that applies, no ignore file."""
    session.run("bash", "scripts/ansible-test.sh", "sanity", *session.posargs, external=True)


@nox.session(python=False, tags=["full"])
def units(session):
    """ansible-test units: the module, the action plugin and the engine on every Python 3.9-3.13 found."""
    session.run("bash", "scripts/ansible-test.sh", "units", *session.posargs, external=True)


@nox.session(python=False, tags=["pr", "full"])
def matrix(session):
    """The module, action plugin and filter on ansible-core 2.18 and 2.21 (scripts/matrix.sh)."""
    session.run("bash", "scripts/matrix.sh", external=True)


@nox.session(python=False, tags=["pr"])
def quick(session):
    """The integration session without the tests marked slow: the quick loop's share of it."""
    args = session.posargs or ["tests/unit", "tests/integration", "--ignore=tests/integration/test_release.py"]
    session.run(*PYTEST, "-m", "not slow", *args, external=True)


@nox.session(python=False, tags=["full"])
def integration(session):
    """pytest tests/unit tests/integration: the engine against real redis-server, PostgreSQL and etcd on loopback,
    the roles through real ansible-playbook on local hosts (tests/integration/roles), Hypothesis properties (the
    published collection is the release session's; the roles' node modules, the role-modules session's;
    the modules through real ansible runs, the modules session's)."""
    args = session.posargs or ["tests/unit", "tests/integration", "--ignore=tests/integration/test_release.py",
                               "--ignore=tests/integration/module", "--ignore=tests/integration/operations",
                               "--ignore=tests/integration/role_modules"]
    session.run(*PYTEST, *args, external=True)


@nox.session(name="role-modules", python=False, tags=["full"])
def role_modules(session):
    """pytest tests/integration/role_modules: the roles' node modules (dlock_postgresql_access, dlock_etcd_access,
    dlock_patroni_cluster, dlock_job_units) through real `ansible` against real PostgreSQL and etcd on loopback, and
    the engine under the grants they make. A session of its own, in the fleet lane (scripts/test.sh), the shortest:
    99 s on an idle machine, 259-278 s on CI's, taken out of the engine's lane, which was the longest (2082 s in
    CI18, 1754-1833 s since)."""
    session.run(*PYTEST, "tests/integration/role_modules", *session.posargs, external=True)


@nox.session(python=False, tags=["full"])
def operations(session):
    """pytest tests/integration/operations: what an operator does by hand, through the runner, on every backend on
    loopback - pause and resume (a job's, a group's, the fleet's, drained, mirrored on the node), run-now, rerun of a
    failed slot. A session of its own, in the etcd lab's lane (scripts/test.sh): in the engine's, the longest, it
    was 1884 s of a 1924 s run (CI, stop 38)."""
    session.run(*PYTEST, "tests/integration/operations", *session.posargs, external=True)


@nox.session(python=False, tags=["full"])
def modules(session):
    """pytest tests/integration/module: the controller's modules (dlock, dlock_pause, dlock_run_now) and their action plugins
    through real ansible and ansible-playbook runs, against real redis-server and PostgreSQL on loopback. A session
    of its own so that it runs in a lane with time to spare (scripts/test.sh), not in the engine's, the longest."""
    session.run(*PYTEST, "tests/integration/module", *session.posargs, external=True)


@nox.session(python=False, tags=["full"])
def release(session):
    """The collection as published: the built tarball through galaxy-importer, installed into an empty path,
    the changelog (antsibull-changelog lint)."""
    session.run(*PYTEST, "tests/integration/test_release.py", *session.posargs, external=True)


@nox.session(name="lab-single", python=False, tags=["full"])
def lab_single(session):
    """The session lab dlkt (3 job nodes, a backend node): site.yml with molecule/redis's variables, then
    molecule/postgresql's, each once, its idempotence at -vvv --diff and its verify set; every slot once; bad input
    refused in preflight; TLS; containment under a unit."""
    ignore = ["--ignore=" + path for path in ETCD_LAB_TESTS + PATRONI_LAB_TESTS + BARE_LAB_TESTS]
    session.run(*LAB_PYTEST, "tests/lab", *ignore, *session.posargs, external=True)


@nox.session(name="lab-etcd", python=False, tags=["full"])
def lab_etcd(session):
    """The etcd lab dlke (3 backend nodes, 3 job nodes): molecule/etcd rolled out once (client and peer TLS), its
    idempotence at -vvv --diff and its verify set; the etcd faults; then the membership procedures (destructive:
    last)."""
    session.run(*LAB_PYTEST, *ETCD_LAB_TESTS, *session.posargs, external=True)


@nox.session(name="lab-patroni", python=False, tags=["full"])
def lab_patroni(session):
    """The Patroni lab dlkh (3 backend nodes, 3 job nodes): molecule/postgresql-ha rolled out once, its idempotence
    at -vvv --diff and its verify set; then the Patroni faults."""
    session.run(*LAB_PYTEST, *PATRONI_LAB_TESTS, *session.posargs, external=True)


@nox.session(name="lab-bare", python=False, tags=["full"])
def lab_bare(session):
    """Check mode of the whole rollout on a lab of its own (dlkb): on fresh hosts at -vvv --diff (no secret in it),
    then on the same hosts without the roles' packages (a readable diff, bounded)."""
    session.run(*LAB_PYTEST, *BARE_LAB_TESTS, *session.posargs, external=True)


# The full suite converges each topology once (issue 20): lab-single rolls out
# molecule/redis and molecule/postgresql, lab-etcd molecule/etcd and
# lab-patroni molecule/postgresql-ha, each followed by its scenario's
# idempotence and verify set (tests/lab/scenario.py). `nox -s "molecule(etcd)"`
# runs one scenario whole, as molecule does: the developer's loop.
@nox.session(python=False)
@nox.parametrize("scenario", [nox.param(name, id=name) for name in SCENARIOS])
def molecule(session, scenario):
    """molecule test -s SCENARIO: create, converge, idempotence, verify (pytest-testinfra), destroy."""
    session.run("molecule", "test", "-s", scenario, external=True)


@nox.session(python=False)
def bench(session):
    """The benchmarks under tests/bench (each prints its ratios, measured side by side in one run)."""
    scripts = session.posargs or sorted(glob.glob("tests/bench/bench_*.py"))
    for script in scripts:
        session.run("python3", script, external=True)
