"""Run the collection's playbooks against a lab, as an operator would."""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ansible_playbook(lab, playbook, extra_vars, *args, check=True):
    """ansible-playbook PLAYBOOK against the lab's inventory; extra vars go in a
    temp file (never on the command line). Returns the CompletedProcess."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(extra_vars, handle)
        varfile = handle.name
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build"),
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        done = subprocess.run(["ansible-playbook", "-i", lab.inventory, os.path.join(ROOT, playbook),
                               "-e", "@" + varfile] + list(args),
                              env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        os.unlink(varfile)
    if check and done.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (playbook, done.returncode, done.stdout[-6000:],
                                                          done.stderr[-3000:]))
    return done


def redis_backend(lab, password):
    """Start the lab's Redis on the backend node; returns the dlock_backend value."""
    lab.up(nodes=len(lab.group("dlock_nodes")), backend=True)
    ansible_playbook(lab, "tests/lab/backend_redis.yml", {"lab_redis_password": password})
    return {"url": "redis://%s:6379/0" % lab.addr(lab.group("dlock_backend")[0]), "password": password}
