"""Run the collection's playbooks against a lab, as an operator would.

As a module: ansible_playbook() and site(). As a command (the demo uses it):

    python3 tests/lab/rollout.py site --backend-type redis -e @tests/lab/demo_jobs.yml

rolls out playbooks/site.yml on the lab named by DLOCK_LAB_PREFIX, with the
backend role of that type on the backend node and the lab's clock layout.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lab import Lab  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collections_path():
    """Where ansible finds dlock.fleet: the built tarball that the lab tests
    install (DLOCK_COLLECTIONS_PATH, see conftest.py), else this checkout
    through build/ (the demo, a developer's runs)."""
    return os.environ.get("DLOCK_COLLECTIONS_PATH") or os.path.join(ROOT, "build")


def collection_file(rel):
    """REL (e.g. playbooks/site.yml) in the collection that ansible will use."""
    return os.path.join(collections_path(), "ansible_collections", "dlock", "fleet", rel)


def _env():
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections_path(),
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               # One SSH round trip per task instead of three: the lab logs in as
               # root (no requiretty), as the molecule scenarios do.
               ANSIBLE_PIPELINING="True")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def ansible_playbook(lab, playbook, extra_vars, *args, check=True, capture=True, env=None, timeout=900):
    """ansible-playbook PLAYBOOK against the lab's inventory; extra vars go in a
    temp file (never on the command line), ENV adds to its environment. A
    relative PLAYBOOK is one of the collection's. Returns the CompletedProcess."""
    if not os.path.isabs(playbook):
        playbook = collection_file(playbook)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(extra_vars, handle)
        varfile = handle.name
    try:
        done = subprocess.run(["ansible-playbook", "-i", lab.inventory, playbook,
                               "-e", "@" + varfile] + list(args),
                              env=dict(_env(), **(env or {})), capture_output=capture, text=True, timeout=timeout, check=False)
    finally:
        os.unlink(varfile)
    if check and done.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (playbook, done.returncode, (done.stdout or "")[-6000:],
                                                          (done.stderr or "")[-3000:]))
    return done


def warnings(done):
    """The [WARNING] lines of a finished ansible-playbook run."""
    return [line for line in ((done.stdout or "") + (done.stderr or "")).splitlines() if "[WARNING]" in line]


def clock_inventory(lab):
    """A second inventory holding the lab's clock layout: the backend node is
    the time root (it serves its clock, the host's, to the subnet) and the job
    nodes sync from it. Nodes have no other time source."""
    path = os.path.join(lab.state_dir, "clock-groups.json")
    backend = lab.group("dlock_backend")[0]
    layout = {
        "dlock_backend": {"vars": {"dlock_chrony_local_stratum": 10,
                                   "dlock_chrony_allow": ["%s.0/24" % lab.subnet]}},
        "dlock_nodes": {"vars": {"dlock_chrony_servers": [backend]}},
        "all": {"vars": {"dlock_chrony_pools": []}},
    }
    with open(path, "w") as handle:
        json.dump(layout, handle)
    return path


def backend_count(backend_type, current, ha=False):
    """How many backend nodes a rollout of this type wants: an etcd cluster,
    and PostgreSQL with Patroni (ha) beside one, need three (more, once a test
    has grown it, stay), the others run on one (site.yml refuses several Redis
    hosts)."""
    if backend_type == "etcd" or ha:
        return current if current >= 3 else 3
    return 1


def shape(lab, backend_type, ha=False):
    """Boot or remove backend nodes so the lab has backend_count of them (job
    nodes stay); returns the backend nodes' names."""
    current = len(lab.group("dlock_backend"))
    wanted = backend_count(backend_type, current, ha)
    if wanted != current:
        lab.up(nodes=len(lab.group("dlock_nodes")), backends=wanted)
    return lab.group("dlock_backend")


# The last site.yml each lab (by prefix) finished without error: its backend
# type, extra variables and arguments (those that change only what is printed
# left out). scenario.converged() rolls out again only when the one it wants
# differs; a failed or --check run forgets it (it may have changed part),
# unless writes_nothing() proved that it changed nothing.
LAST_ROLLOUT = {}
OUTPUT_ONLY_ARGS = ("-v", "-vv", "-vvv", "-vvvv", "--diff", "-D")


def node_config(lab):
    """The runner's settings (/etc/dlock/dlock.json) on the lab's first job node."""
    return json.loads(lab.ssh(lab.group("dlock_nodes")[0], "cat /etc/dlock/dlock.json", check=True).stdout)


# The backend settings (backend type and extra variables) of each lab's last
# site.yml that finished without error, kept even when a later run failed:
# fence_epoch() compares the next rollout's with them.
LAST_BACKEND = {}


def installed_epoch(lab):
    """The highest fence_epoch in the job nodes' dlock.json; None when no
    node has one (a fresh lab)."""
    epochs = []
    for node in lab.group("dlock_nodes"):
        done = lab.ssh(node, "cat /etc/dlock/dlock.json")
        if done.returncode == 0:
            epochs.append(json.loads(done.stdout).get("fence_epoch", 0))
    return max(epochs) if epochs else None


def fence_epoch(lab, backend_type, extra_vars):
    """dlock_fence_epoch for this rollout, as an operator sets it (docs/runner.md,
    Switching backends): the nodes' own, one higher when the backend may have
    changed since the last rollout (another type, other variables: the lab's
    tests switch backends on the same job nodes, which the runner's preflight
    refuses without it). One higher when the backend did not change is
    harmless; the same epoch after a real switch would be refused, visibly."""
    installed = installed_epoch(lab)
    if installed is None:
        return 0
    same = LAST_BACKEND.get(lab.prefix) == rollout_key(backend_type, extra_vars, ())
    return installed if same else installed + 1


def rollout_key(backend_type, extra_vars, args):
    """What LAST_ROLLOUT keeps of a site.yml run: equal keys, equal rollouts."""
    return (backend_type, json.dumps(extra_vars, sort_keys=True), tuple(a for a in args if a not in OUTPUT_ONLY_ARGS))


def site(lab, backend_type, extra_vars, *args, check=True, capture=True, timeout=900):
    """site.yml with dlock_backend_type: the backend role on the backend nodes
    (as many as backend_count wants, booted or removed first), chrony, the
    runner, the jobs and the metrics. The backend password is generated once
    into the lab's state directory."""
    shape(lab, backend_type, bool(extra_vars.get("dlock_postgresql_ha")))
    site_vars = {"dlock_backend_type": backend_type,
                 "dlock_backend_password_file": password_file(lab),
                 "dlock_fence_epoch": fence_epoch(lab, backend_type, extra_vars)}
    site_vars.update(extra_vars)
    LAST_ROLLOUT.pop(lab.prefix, None)
    done = ansible_playbook(lab, "playbooks/site.yml", site_vars, "-i", clock_inventory(lab), *args,
                            check=check, capture=capture, timeout=timeout)
    if done.returncode == 0 and "--check" not in args and "-C" not in args:
        LAST_ROLLOUT[lab.prefix] = rollout_key(backend_type, extra_vars, args)
        LAST_BACKEND[lab.prefix] = rollout_key(backend_type, extra_vars, ())
    return done


def snapshot_all(lab):
    """Everything site.yml may write, on every host (nodes and backend)."""
    paths = ("/etc/dlock /etc/systemd/system /etc/redis /etc/postgresql /etc/chrony /etc/default "
             "/usr/local/bin /usr/local/lib")
    return dict((host, lab.ssh(host, "find %s -type f -exec md5sum {} + 2>/dev/null | sort" % paths).stdout
                 + lab.ssh(host, "systemctl is-enabled redis-server postgresql chrony prometheus-node-exporter "
                                 "2>&1; getent passwd dlock-metrics").stdout)
                for host in lab.group("dlock_nodes") + lab.group("dlock_backend"))


@contextlib.contextmanager
def writes_nothing(lab):
    """Around a run that must write nothing on any host (a preflight that
    refuses, --check): asserts that everything site.yml may write is equal
    before and after it. Proven so, the lab's last rollout still stands:
    site() forgot it before the run (a run may change part), and it is put
    back, so the next test that wants it rolls out nothing."""
    last = LAST_ROLLOUT.get(lab.prefix)
    before = snapshot_all(lab)
    yield
    assert snapshot_all(lab) == before, "a run that must write nothing changed a host"
    if last is not None:
        LAST_ROLLOUT[lab.prefix] = last


JOBS_PLAY = """\
- name: Install the dlock jobs
  hosts: dlock_nodes
  become: true
  gather_facts: false
  roles:
    - role: dlock.fleet.dlock_jobs
"""


def jobs(lab, jobs_list, *args, check=True):
    """Only the dlock_jobs role on the job nodes, as an operator adds or
    removes a job on a fleet that site.yml already rolled out: seconds,
    where a whole site.yml takes minutes. The role is told the runners'
    backend URL (as the nodes have it, no password in it): its scheme decides
    the timing rule the jobs' options must pass."""
    playbook = os.path.join(lab.state_dir, "jobs.yml")
    with open(playbook, "w") as handle:
        handle.write(JOBS_PLAY)
    config = node_config(lab)
    return ansible_playbook(lab, playbook, {"dlock_jobs_list": jobs_list, "dlock_jobs_backend_url": config["backend"]},
                            *args, check=check)


OPERATOR_KEY = "operator-check"  # a lock no job of the lab uses


def operator_commands(lab, *inventories):
    """What an operator runs on the controller (this host) right after
    site.yml, with what they gave site.yml and nothing written by hand (no
    dlock_backend: site.yml's record of its backend is all there is): a
    module task that takes OPERATOR_KEY for 5 minutes, the status runbook,
    break_lock in check mode, then examples/adhoc.sh, which looks, would
    break, and breaks it. ansible_playbook's first inventory (the lab's:
    the hosts' file, beside which site.yml keeps its credentials and the
    record) comes first, INVENTORIES after it, as in the rollout; adhoc.sh
    takes one inventory, the lab's. Returns {step: output}; each step must
    succeed."""
    key = OPERATOR_KEY
    given = [lab.inventory] + list(inventories)
    steps = [
        ("module", ["ansible", "localhost", "-m", "dlock.fleet.dlock", "-a", "key=%s ttl=5m" % key]),
        ("status", ["ansible-playbook", "dlock.fleet.status", "-e", "dlock_keys=" + key]),
        ("break_lock --check", ["ansible-playbook", "dlock.fleet.break_lock", "--check",
                                "-e", "dlock_key=" + key, "-e", "dlock_reason=operator check"]),
    ]
    outputs = {}
    for step, argv in steps:
        for inventory in reversed(given):
            argv[1:1] = ["-i", inventory]
        outputs[step] = _operator_run(step, argv)
    outputs["adhoc.sh"] = _operator_run("adhoc.sh", ["sh", os.path.join(ROOT, "examples", "adhoc.sh"), lab.inventory,
                                                     key])
    return outputs


def check_operator_commands(outputs, password):
    """operator_commands did what each says, and no output shows PASSWORD."""
    key = OPERATOR_KEY
    assert '"acquired": true' in outputs["module"], outputs["module"][-3000:]
    assert "%s is held by ansible@" % key in outputs["status"], outputs["status"][-3000:]
    assert "would break the lock: %s is held by ansible@" % key in outputs["break_lock --check"], \
        outputs["break_lock --check"][-3000:]
    # adhoc.sh: held (from the module task), would break (--check), broke; then the runbook finds it free.
    adhoc = outputs["adhoc.sh"]
    assert "%s is held by ansible@" % key in adhoc and adhoc.count("broke the lock of %s" % key) == 1, adhoc[-4000:]
    for step, output in outputs.items():
        assert password not in output, "%s showed the backend password" % step


def _operator_run(step, argv):
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError("%s failed (%d): %s\n%s" % (step, done.returncode, " ".join(argv), output[-6000:]))
    return output


def password_file(lab, admin=False, patroni=None):
    """Where site.yml keeps the generated backend password (0600, on the
    controller); admin: etcd's root password; patroni: one of Patroni's
    (etcd, replication, rewind, restapi). site.yml's default places for them:
    beside the lab's inventory, in its state directory."""
    if patroni:
        name = "dlock-patroni-%s.password" % patroni
    else:
        name = "dlock-backend-admin.password" if admin else "dlock-backend.password"
    return os.path.join(lab.state_dir, "credentials", name)


def read_password(lab, admin=False, patroni=None):
    """The generated password (the lookup writes 'PASSWORD[ salt=...]')."""
    with open(password_file(lab, admin, patroni)) as handle:
        return handle.read().split(" salt=")[0].strip()


def main():
    parser = argparse.ArgumentParser(description="Roll out playbooks/site.yml on the lab.")
    sub = parser.add_subparsers(dest="command", required=True)
    site_p = sub.add_parser("site", help="site.yml with a provisioned backend")
    site_p.add_argument("--backend-type", choices=["redis", "postgresql", "etcd"], default="redis")
    site_p.add_argument("--ha", action="store_true", help="postgresql: a Patroni cluster on three backend nodes")
    site_p.add_argument("-e", "--extra-vars", action="append", default=[],
                        help="@FILE of extra variables (YAML or JSON), as ansible-playbook -e")
    args = parser.parse_args()
    passthrough = []
    for value in args.extra_vars:
        passthrough += ["-e", value]
    extra = {"dlock_postgresql_ha": True} if args.ha else {}
    done = site(Lab(), args.backend_type, extra, *passthrough, check=False, capture=False)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
