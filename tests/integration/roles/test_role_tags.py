"""The roles' tags, as ansible-playbook --list-tasks sees them (on the
controller, no host is touched): every task of a role carries one of its
phase tags, <role>_install, <role>_configure or <role>_run (a task whose
result a later phase reads carries that phase's tag too), and its preflight
all three; `--tags <role>_<phase>` then selects that role's phase and its
checks, nothing of another role or phase, both for the roles imported on
their own and through playbooks/site.yml (whose checks run with any tag);
and, from the YAML, that a phase run alone finds every result and fact of
the role it reads.
"""

import os
import re
import subprocess

import pytest
import yaml
from ansible_cli import BIN, ROOT, ansible_env

ROLES = ["dlock_redis", "dlock_postgresql", "dlock_etcd", "dlock_chrony", "dlock_runner", "dlock_jobs", "dlock_metrics"]
PHASES = ["install", "configure", "run"]
ALWAYS = "always"

pytestmark = pytest.mark.slow  # an ansible-playbook --list-tasks for each of 21 tags

# A lab-like inventory: one backend host, two nodes, the backend provisioned by site.yml.
INVENTORY = {"all": {"vars": {"ansible_connection": "local", "dlock_backend_type": "redis"},
                     "children": {"dlock_backend": {"hosts": {"b1": {}}},
                                  "dlock_nodes": {"hosts": {"n1": {}, "n2": {}}}}}}

# Each role imported on its own, one play each; dlock_postgresql's two modes
# are files it includes (dynamically) from main.yml, so they are imported too.
PLAYS = [(role, "main.yml") for role in ROLES] + [("dlock_postgresql", "single.yml"), ("dlock_postgresql", "ha.yml")]

PLAY_LINE = re.compile(r"^  play #\d+ \([^)]*\): (.*)\tTAGS: \[(.*)\]$")
TASK_LINE = re.compile(r"^      (?:(\S+) : )?(.*)\tTAGS: \[(.*)\]$")


def list_tasks(tmp_path, playbook, *options):
    """[(play, [(role or None, task, tags)])] as ansible-playbook --list-tasks prints them."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), str(playbook),
                           "--list-tasks"] + list(options),
                          env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plays = []
    for line in proc.stdout.splitlines():
        play = PLAY_LINE.match(line)
        task = TASK_LINE.match(line)
        if play:
            plays.append((play.group(1), []))
        elif task:
            role, name, tags = task.groups()
            role = role.rsplit(".", 1)[-1] if role else None
            plays[-1][1].append((role, name, frozenset(t.strip() for t in tags.split(",") if t.strip())))
    return plays


def play_name(role, tasks):
    return "%s %s" % (role, tasks)


def playbook(tmp_path):
    """site.yml, then each role imported on its own: one listing for both."""
    path = tmp_path / "tags.yml"
    path.write_text(yaml.safe_dump([{"ansible.builtin.import_playbook": os.path.join(ROOT, "playbooks", "site.yml")}] + [
        {"name": play_name(role, tasks), "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Import", "ansible.builtin.import_role": dict(
             {"name": "dlock.fleet." + role}, **({} if tasks == "main.yml" else {"tasks_from": tasks}))}]}
        for role, tasks in PLAYS]))
    return path


def tags_of(role):
    return ["%s_%s" % (role, phase) for phase in PHASES]


def selected(tasks, tag):
    """The tasks --tags TAG runs: those with the tag, and those tagged always."""
    return [task for task in tasks if tag in task[2] or ALWAYS in task[2]]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The plays listed without --tags: site.yml's, then each role's."""
    tmp_path = tmp_path_factory.mktemp("tags")
    return list_tasks(tmp_path, playbook(tmp_path))


def split(plays):
    """(site.yml's plays, {each role's play: its tasks})."""
    roles = [play_name(role, tasks) for role, tasks in PLAYS]
    return plays[:-len(roles)], dict(plays[-len(roles):])


@pytest.fixture(scope="module")
def listings(tmp_path_factory):
    """The listing for each tag, run once."""
    cache = {}

    def listing(tag):
        if tag not in cache:
            tmp_path = tmp_path_factory.mktemp(tag)
            cache[tag] = list_tasks(tmp_path, playbook(tmp_path), "--tags", tag)
        return cache[tag]
    return listing


def test_every_task_of_a_role_carries_a_phase_tag_of_that_role(full):
    _site, roles = split(full)
    wrong = []
    assert list(roles) == [play_name(role, tasks) for role, tasks in PLAYS]
    for role, tasks in PLAYS:
        play = play_name(role, tasks)
        assert roles[play], play
        for owner, name, tags in roles[play]:
            if ALWAYS in tags:  # the role's argument check, Ansible's own
                assert name.startswith(ARGUMENT_CHECK), (play, name, tags)
                continue
            if not tags or not tags <= set(tags_of(role)):
                wrong.append("%s: %s (%s) has tags %s" % (play, name, owner, sorted(tags)))
            # The checks run with each phase, whatever the role's file that holds them.
            if name.startswith("Preflight") and tags != set(tags_of(role)):
                wrong.append("%s: preflight task %s has tags %s" % (play, name, sorted(tags)))
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("phase", PHASES)
def test_a_phase_tag_selects_that_phase_and_the_checks_of_its_role(full, listings, role, phase):
    tag = "%s_%s" % (role, phase)
    _site, every = split(full)
    _site, listed = split(listings(tag))
    for play_role, tasks in PLAYS:
        play = play_name(play_role, tasks)
        want = selected(every[play], tag) if play_role == role else [t for t in every[play] if ALWAYS in t[2]]
        assert listed[play] == want, play
        if play_role == role:
            checks = [t for t in every[play] if t[1].startswith("Preflight")]
            assert set(checks) <= set(listed[play]), play
            # Nothing of another phase unless it carries this one too (a result the phase reads).
            assert all(tag in t[2] or ALWAYS in t[2] for t in listed[play]), play


ARGUMENT_CHECK = "Validating arguments against arg spec"  # the role's argument check, Ansible's own task
PACKAGE_LOOKUP = "Look for the packages of the checked roles (Debian)"  # site.yml's first play, dlock_common's


# site.yml: the plays that apply each role (by include_role, which --list-tasks
# does not open, or by roles:, which it does), and the include task's name.
SITE_APPLY = {
    "dlock_redis": ("Provision the lock backend", "Apply the backend role"),
    "dlock_postgresql": ("Provision the lock backend", "Apply the backend role"),
    "dlock_etcd": ("Provision the lock backend", "Apply the backend role"),
    "dlock_chrony": ("Keep the clocks in sync", "Apply dlock_chrony (its gate stops unsynchronised hosts before the jobs)"),
    "dlock_runner": ("Install the dlock runner", None),
    "dlock_jobs": ("Install the dlock jobs", None),
    "dlock_metrics": ("Export the metrics", "Apply dlock_metrics"),
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("phase", PHASES)
def test_site_with_a_phase_tag_runs_every_check_and_only_that_phase(full, listings, role, phase):
    tag = "%s_%s" % (role, phase)
    site_full, roles = split(full)
    listed, _roles = split(listings(tag))
    assert [play for play, _tasks in listed] == [play for play, _tasks in site_full]
    (checks, all_checks), *others = zip(listed, site_full)
    # Every check of every role, as in a run without tags: a phase changes nothing before all hosts passed them.
    # The one lookup of the roles' packages after them goes with the install phases, which alone read it.
    lookup = [t for t in all_checks[1] if t[1] == PACKAGE_LOOKUP]
    assert len(lookup) == 1 and ALWAYS not in lookup[0][2]
    assert checks[1] == selected(all_checks[1], tag)
    assert all(ALWAYS in t[2] for t in checks[1] if t[1] != PACKAGE_LOOKUP)
    assert (lookup[0] in checks[1]) == (phase == "install" and role != "dlock_jobs"), (role, phase)
    apply_play, include = SITE_APPLY[role]
    for (play, tasks), (_play, every) in others:
        assert tasks == selected(every, tag), play
        if play != apply_play:
            assert all(ALWAYS in t[2] for t in tasks), (play, tasks)
        elif include:
            assert include in [t[1] for t in tasks], (play, tasks)
        else:  # the role's own tasks, listed: that phase and the checks, less the argument check
            # (site.yml's first play judged every variable: rolespec_validate false)
            assert tasks == [t for t in selected(roles[play_name(role, "main.yml")], tag)
                             if not t[1].startswith(ARGUMENT_CHECK)], play
            assert not any(t[1].startswith(ARGUMENT_CHECK) for t in tasks), play


# -- What a phase reads ---------------------------------------------------------
# A phase run alone must find what it reads: a result registered or a fact set
# by a task of the role carries the tags of every task that reads it, and of
# every task that notifies a handler that reads it. A read through
# `| default(...)` stands on its own. Read from the YAML (the roles' own
# task files, dlock_common's they import, the files they include).

ROLES_DIR = os.path.join(ROOT, "roles")
NAME = re.compile(r"\b__dlock_\w+")


def load(role, *path):
    with open(os.path.join(ROLES_DIR, role, *path)) as handle:
        return yaml.safe_load(handle) or []


def flat(role, tasks, inherited=frozenset()):
    """Each task with its tags as --tags sees them (imports and blocks pass
    theirs on; a dynamic include only through apply)."""
    for task in tasks:
        own = task.get("tags", [])
        tags = inherited | frozenset([own] if isinstance(own, str) else own)
        if "block" in task:
            yield from flat(role, task["block"] + task.get("rescue", []) + task.get("always", []), tags)
        elif "ansible.builtin.import_tasks" in task:
            yield from flat(role, load(role, "tasks", task["ansible.builtin.import_tasks"]), tags)
        elif "ansible.builtin.import_role" in task:
            spec = task["ansible.builtin.import_role"]
            other = spec["name"].rsplit(".", 1)[-1]
            # The import's vars are read by the imported tasks: they go with them.
            for inner, inner_tags in flat(other, load(other, "tasks", spec.get("tasks_from", "main.yml")), tags):
                yield dict(inner, vars=dict(task.get("vars", {}), **inner.get("vars", {}))), inner_tags
        elif "ansible.builtin.include_tasks" in task:
            spec = task["ansible.builtin.include_tasks"]
            spec = spec if isinstance(spec, dict) else {"file": spec}
            applied = frozenset(spec.get("apply", {}).get("tags", []))
            files = re.findall(r"'(\w+\.yml)'", spec["file"]) or [spec["file"]]  # a choice of files: each
            for name in files:
                yield from flat(role, load(role, "tasks", name), applied)
            yield task, tags
        else:
            yield task, tags


def reads(value, names):
    """The names of `names` that `value` reads, not counting reads with a default."""
    text = yaml.safe_dump(value)
    found = set()
    for match in NAME.finditer(text):
        rest = text[match.end():]
        if match.group(0) in names and not re.match(r"(\[[^\]]*\]|\.\w+)*\s*\|\s*default\b", rest):
            found.add(match.group(0))
    return found


def expand(names, role_vars, produced):
    """Names read through the role's vars (vars/main.yml), down to what tasks produce."""
    seen, todo = set(), set(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in role_vars:
            todo |= reads(role_vars[name], set(role_vars) | set(produced))
    return seen & set(produced)


@pytest.mark.parametrize("role", ROLES)
def test_a_phase_finds_what_it_reads(role):
    tasks = list(flat(role, load(role, "tasks", "main.yml")))
    role_vars = load(role, "vars", "main.yml") if os.path.exists(os.path.join(ROLES_DIR, role, "vars", "main.yml")) else {}
    produced = {}
    for task, tags in tasks:
        names = [task["register"]] if "register" in task else []
        names += [key for key in task.get("ansible.builtin.set_fact", {}) if key.startswith("__")]
        for name in names:
            produced.setdefault(name, set()).update(tags)
    handlers = load(role, "handlers", "main.yml") if os.path.exists(os.path.join(ROLES_DIR, role, "handlers", "main.yml")) else []
    topics = {}
    for handler in handlers:
        topics.setdefault(handler.get("listen", handler["name"]), []).append(handler)
    wrong = []
    for task, tags in tasks:
        phases = set(tags) - {ALWAYS}
        readers = [(task.get("name"), {k: v for k, v in task.items() if k not in ("register", "name", "tags")})]
        notify = task.get("notify", [])
        for topic in [notify] if isinstance(notify, str) else notify:
            readers += [("handler " + h["name"], h) for h in topics[topic]]
        for reader, body in readers:
            for name in expand(reads(body, set(produced) | set(role_vars)), role_vars, produced):
                if not phases <= produced[name]:
                    wrong.append("%s (tags %s, via %s) reads %s, set with tags %s"
                                 % (task.get("name"), sorted(phases), reader, name, sorted(produced[name])))
    assert wrong == [], "\n".join(wrong)
