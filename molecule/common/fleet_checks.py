"""What the scenarios' checks share (molecule/redis, molecule/postgresql,
molecule/etcd, molecule/postgresql-ha): where the generated passwords are,
the hosts' groups and addresses as the scenario's inventory has them, a
command fed a secret over ssh's stdin, a poll.

The checks every scenario runs are test modules beside this file
(molecule/common/tests), given to the testinfra verifier by path (the base
config's additional_files_or_dirs); a scenario's own checks are in
molecule/NAME/tests. The backend password is the one site.yml generated on
the controller (in the scenario's ephemeral directory): the checks read it
there, and check that it is in use and that it appears nowhere it should
not: unit files, configuration, process lists, journals, logs, and the
output of a -vvv run of the playbook.
"""

import os
import subprocess
import time

EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")
SCENARIO_DIR = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", "")
JOB = "sample"  # once_per 5m, every 5 minutes
PASSWORD_FILE = "/etc/dlock/backend.password"
# Patroni's configuration holds its own passwords (0600 postgres): the one
# other file under /etc where a generated password belongs.
PATRONI_CONFIG = "/etc/patroni/config.yml"
GENERATED = ("backend.password", "redis-admin.password", "backend-admin.password", "dlock-patroni-etcd.password",
             "dlock-patroni-replication.password", "dlock-patroni-rewind.password", "dlock-patroni-restapi.password")
METRICS_DIR = "/var/lib/prometheus/node-exporter"
# systemd-analyze security: exposure 0 (best) to 10; levels PERFECT, SAFE, OK,
# MEDIUM, EXPOSED, UNSAFE. Job units must stay OK or better; the refresh unit
# (dlock_metrics) at or under this score.
REFRESH_MAX_EXPOSURE = 2.0


def secret(name):
    """A password the lookup plugin generated for the run (file: password [salt=...])."""
    with open(os.path.join(EPHEMERAL, name)) as handle:
        return handle.read().split(" salt=")[0].strip()


def secrets():
    found = [secret(name) for name in GENERATED if os.path.exists(os.path.join(EPHEMERAL, name))]
    assert found and all(len(s) >= 16 for s in found), "no generated backend password to look for"
    return found


def groups(host):
    return host.ansible.get_variables()["group_names"]


def address(host):
    return host.ansible.get_variables()["ansible_host"]


def is_node(host):
    return "dlock_nodes" in groups(host)


def first_node(host):
    return host.ansible.get_variables()["groups"]["dlock_nodes"][0]


def backend_name(host):
    return host.ansible.get_variables()["groups"]["dlock_backend"][0]


def group_addresses(host, group):
    """The addresses of a group's hosts, in inventory order (the scenarios name
    no address: a lab session runs them on its own nodes, tests/lab/scenario.py)."""
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return [address(host.get_host("ansible://" + name, ansible_inventory=inventory))
            for name in host.ansible.get_variables()["groups"][group]]


def ssh_with_stdin(host, command, stdin):
    """Run a shell command on the host over plain ssh, feeding stdin: how a
    secret reaches a host command without being on any command line."""
    hostvars = host.ansible.get_variables()
    argv = ["ssh", "-i", hostvars["ansible_private_key_file"], "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
            "%s@%s" % (hostvars.get("ansible_user", "root"), hostvars["ansible_host"]), command]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)


def wait_for(predicate, attempts=60):
    """Poll a condition every half second, at most attempts times."""
    for _attempt in range(attempts):
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()
