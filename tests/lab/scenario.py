"""A molecule scenario's rollout and verify set, on a lab session's own nodes.

The suite rolls each topology out once (issue 20): the lab session that
boots a topology converges it with a scenario's variables, and the
scenario's verify set (molecule/NAME/tests, pytest-testinfra) runs against
that converge; molecule does not boot and converge the same fleet again.
`molecule test -s NAME` still runs a scenario whole, on a lab of its own
(the developer's loop).

What molecule would give the tests, the lab gives them here:
- the inventory: a directory in the lab's state directory with a copy of
  the lab's hosts and the scenario's group_vars, as molecule.yml writes them
  (they name no host and no subnet: they hold on any lab);
- the ephemeral directory: ${MOLECULE_EPHEMERAL_DIRECTORY} in molecule.yml
  stands for a directory beside that inventory, where the scenario's
  generated passwords land. The passwords the lab's own rollouts also use
  (the backend's, etcd root's, Patroni's: rollout.password_file) are links
  there to the lab's files, under the scenario's names: a lab that rolls out
  a scenario after another rollout (the Patroni faults after the etcd ones,
  on the same members) keeps one password for each;
- MOLECULE_INVENTORY_FILE, MOLECULE_EPHEMERAL_DIRECTORY,
  MOLECULE_SCENARIO_DIRECTORY and MOLECULE_PROJECT_DIRECTORY, and the lab's
  prefix and subnet for the tests that call lab.py.
The -vvv --diff idempotence run (changed=0, no secret in its output) is
saved in the ephemeral directory as idempotence.log; the shared
molecule/common/tests/test_no_secret.py reads it there (verbose_run).
"""

import glob
import os
import re
import subprocess
import sys

import yaml

from rollout import LAST_ROLLOUT, ROOT, ansible_playbook, collections_path, password_file, read_password, rollout_key, site

EPHEMERAL_MARK = "${MOLECULE_EPHEMERAL_DIRECTORY}"
MOLECULE_SSH_ARGS = ("-o UserKnownHostsFile=/dev/null -o ControlMaster=auto -o ControlPersist=60s -o ForwardX11=no "
                     "-o LogLevel=ERROR -o IdentitiesOnly=yes -o StrictHostKeyChecking=no")
PATRONI_PASSWORDS = ("etcd", "replication", "rewind", "restapi")  # site.yml's dlock-patroni-NAME.password
IDEMPOTENCE_LOG = "idempotence.log"


def scenario_directory(name):
    return os.path.join(ROOT, "molecule", name)


def ephemeral_directory(lab, name):
    return os.path.join(lab.state_dir, "molecule-" + name)


def inventory(lab, name):
    """The scenario's inventory for this lab (written afresh: the lab's shape
    may have changed): its path, a directory."""
    ephemeral = ephemeral_directory(lab, name)
    path = os.path.join(ephemeral, "inventory")
    os.makedirs(os.path.join(path, "group_vars"), exist_ok=True)
    for group, values in group_vars(name, ephemeral).items():
        with open(os.path.join(path, "group_vars", group + ".yml"), "w") as handle:
            yaml.safe_dump(values, handle, default_flow_style=False, sort_keys=False)
    with open(os.path.join(path, "hosts.yml"), "w") as handle:
        yaml.safe_dump(hosts(lab), handle, default_flow_style=False)
    for name_in_scenario, lab_file in lab_passwords(lab).items():
        linked = os.path.join(ephemeral, name_in_scenario)
        if not os.path.lexists(linked):
            # The lookup that generates a missing password writes through the link.
            os.makedirs(os.path.dirname(lab_file), mode=0o700, exist_ok=True)
            os.symlink(lab_file, linked)
    return path


def hosts(lab):
    """The lab's nodes as molecule's inventory has its instances: the same
    connection variables (the tests read ansible_private_key_file) and
    molecule's ssh options (no known-hosts warning on a command's stderr)."""
    groups = {}
    for group in ("dlock_nodes", "dlock_backend"):
        groups[group] = {"hosts": dict(
            (name, {"ansible_host": lab.addr(name), "ansible_user": "root", "ansible_port": 22,
                    "ansible_private_key_file": lab.key, "ansible_ssh_common_args": MOLECULE_SSH_ARGS})
            for name in lab.group(group))}
    return {"all": {"children": groups}}


# The kinds of password the lab's rollouts generate (rollout.password_file's
# arguments), and the name a scenario gives each.
PASSWORD_KINDS = [("backend.password", {}), ("backend-admin.password", {"admin": True})] + [
    ("dlock-patroni-%s.password" % patroni, {"patroni": patroni}) for patroni in PATRONI_PASSWORDS]


def lab_passwords(lab):
    """{the name a scenario gives a generated password: the lab's file of it}."""
    return dict((name, password_file(lab, **kind)) for name, kind in PASSWORD_KINDS)


BASE_CONFIG = os.path.join(ROOT, ".config", "molecule", "config.yml")
PROJECT_MARK = "${MOLECULE_PROJECT_DIRECTORY}"


def _interpolated(path, ephemeral):
    """A molecule file parsed after molecule's interpolation of the two
    variables ours use ($$ is a $)."""
    with open(path) as handle:
        text = handle.read().replace("$$", "\0")
    for mark, value in ((EPHEMERAL_MARK, ephemeral), (PROJECT_MARK, ROOT)):
        text = text.replace(mark, value)
    if "$" in text:
        raise ValueError("%s: a $ other than %s, %s or $$" % (os.path.relpath(path, ROOT), EPHEMERAL_MARK, PROJECT_MARK))
    return yaml.safe_load(text.replace("\0", "$"))


def _merged(base, own):
    """OWN over BASE as molecule merges a scenario over the base config:
    mappings key by key, anything else (a list too) replaced."""
    if not (isinstance(base, dict) and isinstance(own, dict)):
        return own
    merged = dict(base)
    for key, value in own.items():
        merged[key] = _merged(base[key], value) if key in base else value
    return merged


def molecule_config(name, ephemeral="/nonexistent"):
    """The scenario's molecule.yml, read as molecule reads it: interpolated,
    parsed, and merged over the base config. The one reader of the files:
    the group_vars, playbooks and verifier below."""
    return _merged(_interpolated(BASE_CONFIG, ephemeral),
                   _interpolated(os.path.join(scenario_directory(name), "molecule.yml"), ephemeral))


def group_vars(name, ephemeral="/nonexistent"):
    """The scenario's group_vars: {group: {variable: value}}."""
    return molecule_config(name, ephemeral)["provisioner"]["inventory"]["group_vars"]


def backend_type(name):
    return group_vars(name)["all"]["dlock_backend_type"]


# The scenario's variables that decide the lab's shape (rollout.site reads them
# from its extra vars: a Patroni cluster wants three backend nodes).
SHAPE_VARIABLES = ("dlock_postgresql_ha",)


def site_vars(name, extra_vars=None):
    """The extra vars of the scenario's rollouts: EXTRA_VARS, and the
    variables that decide the lab's shape as the scenario sets them."""
    values = dict((key, value) for key, value in group_vars(name)["all"].items() if key in SHAPE_VARIABLES)
    values.update(extra_vars or {})
    return values


def playbooks(name):
    """The scenario's own playbooks: {step: path}."""
    named = molecule_config(name)["provisioner"].get("playbooks", {})
    return dict((step, os.path.normpath(os.path.join(scenario_directory(name), path))) for step, path in named.items())


def verify_paths(name):
    """What molecule's testinfra verifier gives pytest, in its order: the
    scenario's tests directory, then the shared checks its
    additional_files_or_dirs names (relative to that directory; globs
    expanded)."""
    tests = os.path.join(scenario_directory(name), "tests")
    additional = molecule_config(name).get("verifier", {}).get("additional_files_or_dirs", [])
    found = [tests]
    for pattern in additional:
        found += [os.path.normpath(path) for path in glob.glob(os.path.join(glob.escape(tests), pattern))]
    return found


def prepare(lab, name):
    """The scenario's prepare playbook, if it has one (the TLS scenarios make
    and install their certificates there), as molecule runs it: with the
    scenario's inventory and its ephemeral directory in the environment. It
    is idempotent: run again after nodes were added, it prepares those."""
    playbook = playbooks(name).get("prepare")
    if playbook:
        ansible_playbook(lab, playbook, {}, "-i", inventory(lab, name),
                         env={"MOLECULE_EPHEMERAL_DIRECTORY": ephemeral_directory(lab, name)})


def converge(lab, name, extra_vars=None, *args):
    """The scenario's prepare step, then site.yml with its inventory (EXTRA_VARS
    and ARGS on top, e.g. a further inventory)."""
    prepare(lab, name)
    return site(lab, backend_type(name), site_vars(name, extra_vars), "-i", inventory(lab, name), *args)


def converged(lab, name):
    """The scenario converged on LAB: converge() unless the lab's last
    rollout was that very one (in an earlier test module of the session)."""
    args = ("-i", inventory(lab, name))
    if LAST_ROLLOUT.get(lab.prefix) != rollout_key(backend_type(name), site_vars(name), args):
        done = converge(lab, name)
        assert "failed=0" in done.stdout
    return lab


def idempotence(lab, name, extra_vars=None):
    """site.yml again as it was converged, at -vvv --diff: the
    CompletedProcess (its output also saved for the secrets checks)."""
    done = site(lab, backend_type(name), site_vars(name, extra_vars), "-i", inventory(lab, name), "-vvv", "--diff",
                check=False)
    with open(os.path.join(ephemeral_directory(lab, name), IDEMPOTENCE_LOG), "w") as handle:
        handle.write("exit %d\n%s%s" % (done.returncode, done.stdout, done.stderr))
    return done


# What molecule's own ansible.cfg gives testinfra: a control path, so that
# the verify set's commands share one ssh connection per host (testinfra
# reads [ssh_connection] control_path and [persistent_connection]
# control_path_dir; ansible, should a check run it, the former's
# control_path_dir). Without it every command is a new login, about 0.2 s of
# CPU between the host and the node. Keepalives, which testinfra puts before
# the inventory's ssh options: a check never waits on a connection to a node
# gone silent for more than about 20 s.
VERIFY_ANSIBLE_CFG = """[ssh_connection]
ssh_args = -o ServerAliveInterval=5 -o ServerAliveCountMax=3
control_path = %%(directory)s/%%%%C
control_path_dir = %(sockets)s
[persistent_connection]
control_path_dir = %(sockets)s
"""


def verify(lab, name):
    """The scenario's verify set against the lab, as molecule's testinfra
    verifier runs it: the CompletedProcess (output captured)."""
    path = inventory(lab, name)
    ephemeral = ephemeral_directory(lab, name)
    sockets = os.path.join(ephemeral, "cp")
    os.makedirs(sockets, mode=0o700, exist_ok=True)
    config = os.path.join(ephemeral, "ansible.cfg")
    with open(config, "w") as handle:
        handle.write(VERIFY_ANSIBLE_CFG % {"sockets": sockets})
    env = dict(os.environ,
               ANSIBLE_CONFIG=config,
               MOLECULE_EPHEMERAL_DIRECTORY=ephemeral,
               MOLECULE_INVENTORY_FILE=path,
               MOLECULE_SCENARIO_DIRECTORY=scenario_directory(name),
               MOLECULE_PROJECT_DIRECTORY=ROOT,
               DLOCK_LAB_PREFIX=lab.prefix, DLOCK_LAB_SUBNET=lab.subnet,
               ANSIBLE_COLLECTIONS_PATH=collections_path(),
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_NOCOLOR="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "--ansible-inventory", path,
            "--connection", "ansible"] + verify_paths(name)
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)


def idempotent_and_verified(lab, name, capsys, extra_vars=None):
    """After the scenario's converge (with EXTRA_VARS): its idempotence run
    changes nothing (the verify set's secrets checks read it), then its whole
    verify set passes against this lab."""
    changes_nothing_again(lab, name, extra_vars)
    passes_its_verify_set(lab, name, capsys)


# A role's own package lookup (dlock_common's install.yml) in ansible-playbook's
# output: (its task header, its hosts' results up to the next task or play).
ROLE_PACKAGE_LOOKUP = re.compile(
    r"^TASK \[dlock\.fleet\.dlock_common : (Look for (?!the packages of the checked roles)[^\]]*)\][^\n]*\n"
    r"(.*?)(?=^TASK |^PLAY |\Z)", re.M | re.S)


def changes_nothing_again(lab, name, extra_vars=None):
    """The scenario's idempotence run (its output kept for the verify set's
    secrets checks) ends well and changes nothing."""
    again = idempotence(lab, name, extra_vars)
    tail = again.stdout[-4000:]
    for value in passwords(lab):
        tail = tail.replace(value, "********")
    assert again.returncode == 0, tail
    # Each role's checks ran once, in site.yml's first play: the roles' own
    # plays skipped theirs (docs/roles.md, playbooks/site.yml).
    checks = again.stdout.count("TASK [dlock.fleet.dlock_jobs : Preflight | Validate the job entries]")
    assert checks == 1, "the jobs' checks ran %d times" % checks
    # Each host asked dpkg once, in site.yml's first play (dlock_common's
    # packages.yml): every role's own lookup found its packages installed
    # there and was skipped.
    lookups = ROLE_PACKAGE_LOOKUP.findall(again.stdout)
    assert lookups, "no role looked for its packages"
    ran = [task for task, results in lookups if re.search(r"^(ok|changed): \[", results, re.M)]
    assert ran == [], "these lookups asked dpkg again: %s" % ran
    # site.yml's role plays leave out the roles' argument checks (its first
    # play judged every variable): none in the whole run.
    assert "Validating arguments against arg spec" not in again.stdout


def passes_its_verify_set(lab, name, capsys):
    """The scenario's whole verify set passes against this lab (after its
    idempotence run, whose output its secrets checks read)."""
    verified = verify(lab, name)
    closing = verified.stdout.strip().splitlines()[-1:]
    with capsys.disabled():  # the verify set's count, in the session's output (scripts/budget.py reads it)
        print("\nmolecule/%s verify set on %s:\n%s" % (name, lab.prefix, "\n".join(closing)))
    # On failure: the first failures whole, then pytest's short summary (every failed test named).
    output = verified.stdout + verified.stderr
    first = output.find("= FAILURES =")
    summary = output.find("short test summary info")
    assert verified.returncode == 0, output[first:first + 8000] + "\n...\n" + output[summary - 40:]


def passwords(lab):
    """The generated passwords that exist (to keep them out of a failure's message)."""
    return [read_password(lab, **kind) for _name, kind in PASSWORD_KINDS if os.path.exists(password_file(lab, **kind))]
