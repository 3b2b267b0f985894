"""Run the collection's playbooks against a lab, as an operator would.

As a module: ansible_playbook() and site(). As a command (the demo uses it):

    python3 tests/lab/rollout.py site --backend-type redis -e @tests/lab/demo_jobs.yml

rolls out playbooks/site.yml on the lab named by DLOCK_LAB_PREFIX, with the
backend role of that type on the backend node and the lab's clock layout.
"""

import argparse
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


def ansible_playbook(lab, playbook, extra_vars, *args, check=True, capture=True):
    """ansible-playbook PLAYBOOK against the lab's inventory; extra vars go in a
    temp file (never on the command line). A relative PLAYBOOK is one of the
    collection's. Returns the CompletedProcess."""
    if not os.path.isabs(playbook):
        playbook = collection_file(playbook)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(extra_vars, handle)
        varfile = handle.name
    try:
        done = subprocess.run(["ansible-playbook", "-i", lab.inventory, playbook,
                               "-e", "@" + varfile] + list(args),
                              env=_env(), capture_output=capture, text=True, timeout=900, check=False)
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


def site(lab, backend_type, extra_vars, *args, check=True, capture=True):
    """site.yml with dlock_backend_type: the backend role on the backend nodes
    (booted if missing: three for etcd, else one), chrony, the runner, the jobs
    and the metrics. The backend password is generated once into the lab's
    state directory."""
    if not lab.group("dlock_backend"):
        lab.up(nodes=len(lab.group("dlock_nodes")), backends=3 if backend_type == "etcd" else 1)
    site_vars = {"dlock_backend_type": backend_type,
                 "dlock_backend_password_file": password_file(lab)}
    site_vars.update(extra_vars)
    return ansible_playbook(lab, "playbooks/site.yml", site_vars, "-i", clock_inventory(lab), *args,
                            check=check, capture=capture)


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
    where a whole site.yml takes minutes."""
    playbook = os.path.join(lab.state_dir, "jobs.yml")
    with open(playbook, "w") as handle:
        handle.write(JOBS_PLAY)
    return ansible_playbook(lab, playbook, {"dlock_jobs_list": jobs_list}, *args, check=check)


def password_file(lab):
    """Where site.yml keeps the generated backend password (0600, on the controller)."""
    return os.path.join(lab.state_dir, "credentials", "dlock-backend.password")


def read_password(lab):
    """The generated password (the lookup writes 'PASSWORD[ salt=...]')."""
    with open(password_file(lab)) as handle:
        return handle.read().split(" salt=")[0].strip()


def main():
    parser = argparse.ArgumentParser(description="Roll out playbooks/site.yml on the lab.")
    sub = parser.add_subparsers(dest="command", required=True)
    site_p = sub.add_parser("site", help="site.yml with a provisioned backend")
    site_p.add_argument("--backend-type", choices=["redis", "postgresql", "etcd"], default="redis")
    site_p.add_argument("-e", "--extra-vars", action="append", default=[],
                        help="@FILE of extra variables (YAML or JSON), as ansible-playbook -e")
    args = parser.parse_args()
    passthrough = []
    for value in args.extra_vars:
        passthrough += ["-e", value]
    done = site(Lab(), args.backend_type, {}, *passthrough, check=False, capture=False)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
