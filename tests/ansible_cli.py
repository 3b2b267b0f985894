"""Runs real `ansible` and `ansible-playbook` for the module's integration tests.

The collection is found through build/ansible_collections (tests/conftest.py
links the checkout there); every Ansible object writes its own inventory,
whose hosts are local connections using this Python, and whose dlock_backend
points at the backend under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PLAYBOOKS = os.path.join(HERE, "integration", "module", "playbooks")
BIN = os.path.dirname(sys.executable)


def ansible_env(extra=None):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build"),
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="false",
               ANSIBLE_RETRY_FILES_ENABLED="false", PYTHONDONTWRITEBYTECODE="1")
    env.pop("ANSIBLE_CONFIG", None)
    env.update(extra or {})
    return env


class Ansible(object):
    """Runs ansible / ansible-playbook with an inventory of local hosts."""

    def __init__(self, tmp_path, backend):
        self.dir = tmp_path
        self.inventory = str(tmp_path / "inventory.yml")
        hostvars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        group = {"hosts": {"h1": dict(hostvars), "h2": dict(hostvars)}, "vars": {"dlock_backend": backend}}
        local = {"localhost": dict(hostvars)}
        # Each host's own mirror of the pauses (dlock.fleet.dlock_pause writes
        # it), never the /var/lib/dlock/pauses of the machine the suite runs on.
        self.pauses = tmp_path / "pauses"
        pauses_dir = str(self.pauses / "{{ inventory_hostname }}")
        with open(self.inventory, "w") as handle:
            yaml.safe_dump({"all": {"hosts": local, "vars": {"dlock_backend": backend,
                                                             "dlock_runner_pauses_dir": pauses_dir},
                                    "children": {"lockers": group}}}, handle)

    def playbook_argv(self, playbook, extra_vars=None, *options):
        path = playbook if os.path.isabs(playbook) else os.path.join(PLAYBOOKS, playbook)
        return [os.path.join(BIN, "ansible-playbook"), "-i", self.inventory, path,
                "-e", json.dumps(extra_vars or {})] + list(options)

    def playbook(self, playbook, extra_vars=None, *options, timeout=120):
        return subprocess.run(self.playbook_argv(playbook, extra_vars, *options), env=ansible_env(),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def start_playbook(self, playbook, extra_vars=None, *options):
        # Own session: the test can clean up the workers of a SIGKILLed run.
        return subprocess.Popen(self.playbook_argv(playbook, extra_vars, *options), env=ansible_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    def module(self, module, args, *options, extra_vars=None):
        """`ansible localhost -m dlock.fleet.MODULE -a ARGS` with this
        inventory, ARGS and EXTRA_VARS given as JSON: (rc, result dict, output)."""
        out = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", self.inventory,
                              "-m", "dlock.fleet." + module, "-a", json.dumps(args),
                              "-e", json.dumps(extra_vars or {})] + list(options),
                             env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
        return out.returncode, adhoc_result(out.stdout), out.stdout + out.stderr

    def play_on_lockers(self, tasks, *options):
        """Run TASKS on the inventory's two job nodes, h1 and h2 (in
        parallel); ({host: the last task's result}, output). The play must
        succeed."""
        results = self.dir / "results"
        results.mkdir(exist_ok=True)
        for stale in results.iterdir():
            stale.unlink()
        playbook = self.dir / "lockers.yml"
        last = dict(tasks[-1], register="last", ignore_errors=True)
        keep = {"ansible.builtin.copy": {"content": "{{ last | to_json }}", "dest": str(results / "{{ inventory_hostname }}")},
                "check_mode": False, "diff": False}
        playbook.write_text(yaml.safe_dump([{"hosts": "lockers", "gather_facts": False,
                                             "tasks": tasks[:-1] + [last, keep]}]))
        run = self.playbook(str(playbook), None, *options)
        assert run.returncode == 0, run.stdout + run.stderr
        return dict((host, json.loads((results / host).read_text())) for host in ("h1", "h2")), run.stdout

    def adhoc(self, args, *options):
        """`ansible localhost -m dlock.fleet.dlock -a ARGS`: (rc, result dict, output).
        The timeout only catches a hang: a live call starved of CPU beside
        the lab lanes once took over 60 s."""
        out = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", self.inventory,
                              "-m", "dlock.fleet.dlock", "-a", args] + list(options),
                             env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
        return out.returncode, adhoc_result(out.stdout), out.stdout + out.stderr


def adhoc_result(stdout):
    """The result of an ad-hoc run on one host: "localhost | SUCCESS => {...}";
    a failure is preceded by an error report."""
    return json.loads(stdout.split(" => ", 1)[1] if " => " in stdout else "{}")


def run_module(module, args, *options):
    """`ansible localhost -m dlock.fleet.MODULE -a ARGS` on a local connection
    with this Python, ARGS given as JSON: (rc, result dict, output)."""
    out = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                          "-e", "ansible_python_interpreter=" + sys.executable,
                          "-m", "dlock.fleet." + module, "-a", json.dumps(args)] + list(options),
                         env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    return out.returncode, adhoc_result(out.stdout), out.stdout + out.stderr


def galaxy_env(**extra):
    """ansible-galaxy without the checkout's build/ link or a developer's config."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONDONTWRITEBYTECODE="1",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("ANSIBLE_CONFIG", None)
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    env.update(extra)
    return env


def build_collection(source, output):
    """`ansible-galaxy collection build` of SOURCE: the tarball's path."""
    os.makedirs(output, exist_ok=True)
    out = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(output),
                          str(source)], capture_output=True, text=True, env=galaxy_env(), timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    tarballs = [name for name in os.listdir(str(output)) if name.endswith(".tar.gz")]
    assert len(tarballs) == 1, tarballs
    return os.path.join(str(output), tarballs[0])


def install_collection(tarball, path):
    """`ansible-galaxy collection install -p PATH TARBALL`, as a user would:
    returns PATH, which then holds ansible_collections/dlock/fleet."""
    # ansible-galaxy skips a collection it finds in any configured path ("Nothing
    # to do"), so a copy in ~/.ansible/collections would hide a broken tarball.
    out = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "-p", str(path), tarball],
                         capture_output=True, text=True, env=galaxy_env(ANSIBLE_COLLECTIONS_PATH=str(path)),
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        version = yaml.safe_load(handle)["version"]
    assert "dlock.fleet:%s was installed successfully" % version in out.stdout, out.stdout + out.stderr
    assert os.path.isfile(os.path.join(str(path), "ansible_collections", "dlock", "fleet", "plugins", "modules",
                                       "dlock.py"))
    return str(path)


def assert_ok(proc):
    out = getattr(proc, "stdout", "") or ""
    assert proc.returncode == 0, out + (getattr(proc, "stderr", "") or "")
