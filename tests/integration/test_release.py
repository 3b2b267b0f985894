"""The collection as it is published and installed.

- `ansible-galaxy collection build` of this checkout passes galaxy-importer
  (the check Galaxy runs on upload), with no error or warning;
- the tarball holds what users need and no development file, and a build
  from a used checkout (a venv, build/ with its symlink back to the checkout,
  caches, an earlier tarball) has the same files as one from a clean tree;
- installed with `ansible-galaxy collection install -p DIR` into an empty
  collections path, the module and the runbooks work from there alone,
  against a real redis-server;
- the role READMEs' generated blocks are current, and the node wrapper
  rendered from the runner role starts the engine's command line;
- the passwords site.yml generates beside an inventory kept in the checkout
  (INVENTORY_DIR/credentials/) are in neither the tarball nor git.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import jinja2
import pytest
import yaml
from ansible_cli import BIN, ROOT, build_collection, galaxy_env, install_collection

from ansible_collections.dlock.fleet.plugins.plugin_utils import dlock_backend_options

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import role_readmes  # noqa: E402

ROLES = sorted(role_readmes.roles())
# What a user of the collection needs; nothing else goes in the tarball.
SHIPPED_TOP = {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "CHANGELOG.rst", "requirements.txt",
               "bindep.txt", "meta", "playbooks", "plugins", "roles", "changelogs", "examples", "docs"}
# The reference the README links to, and the design (Galaxy shows docs/*.md).
DOCS = sorted(name for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
# The modules with an action plugin each (dlock_run_now's runs the module on the node).
CONTROLLER_MODULES = ("dlock", "dlock_pause", "dlock_run_now")
# The roles' node modules, beside the controller's.
NODE_MODULES = ("dlock_etcd_access", "dlock_postgresql_access", "dlock_patroni_cluster", "dlock_job_units",
                "dlock_files")
DEV_PARTS = {"tests", "molecule", "scripts", "build", ".venv", ".ci", ".git", "__pycache__", ".pytest_cache",
             ".ansible", "tests/output"}


def members(tarball):
    with tarfile.open(tarball) as archive:
        return {m.name: m for m in archive.getmembers()}


def clean_tree(dest):
    """The files a fresh `git clone` of this checkout has, once its changes
    are committed: git's tracked files plus untracked ones it does not ignore."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True)
    for rel in filter(None, out.stdout.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src):  # deleted, not yet committed
            continue
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)
    return dest


# site.yml's password lookups write, by default, in credentials/ beside the
# inventory (test_site_credentials_are_beside_the_inventory): in a checkout,
# beside the example inventory (examples/site) or an inventory at the top.
# The lab's inventory and passwords live in its state directory
# (/run/PREFIX-lab), molecule's in its ephemeral directory: not in a checkout.
INVENTORY_DIRS = ["examples/site", "."]
# With them, the record of the backend for the controller's tools (no secret, but the fleet's address).
SITE_PASSWORDS = ["dlock-backend.password", "dlock-backend-admin.password", "dlock-backend.json"] + [
    "dlock-patroni-%s.password" % name for name in ("etcd", "replication", "rewind", "restapi")]
PLANTED = "Planted-Pw-5ecret-in-the-checkout"


def credentials_paths():
    return [os.path.normpath(os.path.join(inventory, "credentials", name))
            for inventory in INVENTORY_DIRS for name in SITE_PASSWORDS]


def make_used(tree):
    """What a development checkout gathers: the venv, build/ with the link back
    to the checkout (a loop), byte code, pytest and ansible-test leftovers, an
    earlier tarball, ansible's local state, the passwords a site.yml run from
    an inventory in the checkout generated."""
    os.makedirs(os.path.join(tree, ".venv", "bin"))
    with open(os.path.join(tree, ".venv", "pyvenv.cfg"), "w") as handle:
        handle.write("home = /usr/bin\n")
    os.makedirs(os.path.join(tree, "build", "ansible_collections", "dlock"))
    os.symlink("../../..", os.path.join(tree, "build", "ansible_collections", "dlock", "fleet"))
    for where in ("plugins/module_utils/dlock", "tests/unit"):
        os.makedirs(os.path.join(tree, where, "__pycache__"), exist_ok=True)
        with open(os.path.join(tree, where, "__pycache__", "x.cpython-311.pyc"), "wb") as handle:
            handle.write(b"\0")
    for where in (".pytest_cache/v", ".hypothesis/examples", "tests/output/.tmp", ".ansible/tmp"):
        os.makedirs(os.path.join(tree, where))
    with open(os.path.join(tree, "dlock-fleet-0.0.9.tar.gz"), "wb") as handle:
        handle.write(b"old")
    for rel in credentials_paths():
        os.makedirs(os.path.join(tree, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(tree, rel), "w") as handle:
            handle.write(PLANTED + "\n")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Tarballs of this checkout as it is, of a clean tree, and of a used one."""
    base = tmp_path_factory.mktemp("release")
    clean = clean_tree(str(base / "clean"))
    used = clean_tree(str(base / "used"))
    make_used(used)
    return {
        "checkout": build_collection(ROOT, base / "out-checkout"),
        "clean": build_collection(clean, base / "out-clean"),
        "used": build_collection(used, base / "out-used"),
        "dir": base,
    }


def test_galaxy_importer_passes(release, tmp_path):
    config = tmp_path / "galaxy-importer.cfg"
    # What Galaxy runs on upload, but ansible-test (it needs a container engine):
    # metadata and content checks, ansible-doc of every plugin, ansible-lint.
    config.write_text("[galaxy-importer]\nrun_ansible_test = false\nrun_ansible_doc = true\n"
                      "run_ansible_lint = true\ncheck_changelog = true\nansible_local_tmp = %s\n"
                      "tmp_root_dir = %s\n" % (tmp_path / "ansible-tmp", tmp_path))
    out = subprocess.run([sys.executable, "-m", "galaxy_importer.main", release["checkout"]], cwd=str(tmp_path),
                         env=galaxy_env(GALAXY_IMPORTER_CONFIG=str(config), HOME=str(tmp_path)),
                         capture_output=True, text=True, timeout=300, check=False)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "Importer processing completed successfully" in log, log
    problems = [line for line in log.splitlines() if "ERROR" in line or "WARNING" in line]
    assert not problems, log
    with open(str(tmp_path / "importer_result.json")) as handle:
        result = json.load(handle)
    contents = {(c["content_type"], c["name"]) for c in result["contents"]}
    assert {("role", role) for role in ROLES} <= contents
    assert ("filter", "dlock_jobs") in contents
    assert {("module", name) for name in CONTROLLER_MODULES + NODE_MODULES} <= contents
    docs = {(c["content_type"], c["content_name"]): c for c in result["docs_blob"]["contents"]}
    for name in CONTROLLER_MODULES + NODE_MODULES:
        assert docs[("module", name)]["doc_strings"]["doc"]["short_description"], name
    for role in ROLES:
        assert "Variables" in docs[("role", role)]["readme_html"], role
    assert sorted(f["name"] for f in result["docs_blob"]["documentation_files"]) == DOCS
    assert result["metadata"]["license"] == ["GPL-3.0-or-later"]
    assert "example.invalid" not in json.dumps(result["metadata"])


def test_tarball_holds_what_users_need_and_no_development_file(release):
    files = members(release["checkout"])
    tops = {name.split("/")[0] for name in files}
    assert tops <= SHIPPED_TOP, tops - SHIPPED_TOP
    for name, member in files.items():
        parts = name.split("/")
        assert not DEV_PARTS.intersection(parts), name
        assert not name.endswith((".pyc", ".tar.gz", ".retry")), name
        assert member.isfile() or member.isdir(), "%s is a link or special file" % name
    needed = {"README.md", "LICENSE", "meta/runtime.yml", "meta/execution-environment.yml", "requirements.txt",
              "bindep.txt", "plugins/module_utils/dlock/cli.py",
              "playbooks/site.yml", "playbooks/status.yml", "playbooks/break_lock.yml", "playbooks/pause.yml",
              "playbooks/resume.yml", "playbooks/run_now.yml", "playbooks/history.yml",
              "playbooks/backfill.yml"}
    needed |= {"plugins/modules/%s.py" % name for name in CONTROLLER_MODULES + NODE_MODULES}
    needed |= {"plugins/action/%s.py" % name for name in CONTROLLER_MODULES}
    needed |= {"roles/%s/README.md" % role for role in ROLES}
    needed |= {"roles/%s/meta/argument_specs.yml" % role for role in ROLES}
    needed |= {"docs/%s" % name for name in DOCS} | {"docs/design.md", "docs/runner.md", "docs/testing.md"}
    assert needed <= set(files), needed - set(files)
    assert "plugins/module_utils/dlock/__main__.py" not in files
    # The developers' files: the contributors' guide and the changelog's fragments (its sources).
    assert "CONTRIBUTING.md" not in files and not [name for name in files if name.startswith("changelogs/fragments")]
    assert "CHANGELOG.rst" in files and "changelogs/changelog.yaml" in files
    with open("/usr/share/common-licenses/GPL-3", "rb") as handle:
        gpl = handle.read()
    with tarfile.open(release["checkout"]) as archive:
        assert archive.extractfile("LICENSE").read() == gpl


def test_used_checkout_builds_the_same_tarball_as_a_clean_one(release):
    clean = sorted(members(release["clean"]))
    assert sorted(members(release["used"])) == clean
    # This very checkout, with whatever it gathered (.venv, build/, caches).
    assert sorted(members(release["checkout"])) == clean
    assert len(clean) > 100


def test_site_credentials_are_beside_the_inventory():
    """Every default of site.yml's password lookups, and its record of the
    backend, is in credentials/ beside the backend host's inventory (one
    variable says where): what the paths below stand for. The dlock action
    plugin looks for the record at the same place."""
    with open(os.path.join(ROOT, "playbooks", "site.yml")) as handle:
        site = handle.read()
    assert site.count("['inventory_dir']") == 1
    assert re.findall(r"__dlock_site_credentials: \"\{\{ (.*) \}\}\"", site) == [
        "hostvars[groups['dlock_backend'][0]]['inventory_dir'] ~ '/credentials'"]
    defaults = re.findall(r"default\(__dlock_site_credentials(?: ~ '([^']*)')?\)", site)
    assert sorted(defaults) == ["", "/dlock-backend-admin.password", "/dlock-backend.password"], defaults
    assert site.count("lookup('ansible.builtin.password'") + site.count("query('ansible.builtin.password'") == 3
    assert "'/dlock-patroni-'" in site and "'.password'" in site
    assert site.count('dest: "{{ __dlock_site_credentials }}/dlock-backend.json"') == 1
    assert (dlock_backend_options.RECORD_DIR, dlock_backend_options.RECORD_NAME) == ("credentials", "dlock-backend.json")


def test_generated_passwords_stay_out_of_the_tarball_and_git(release):
    """A checkout in which site.yml ran from an inventory inside it builds a
    tarball with none of the passwords, and git ignores them."""
    with tarfile.open(release["used"]) as archive:
        names = archive.getnames()
        assert not [name for name in names if "credentials" in name.split("/")], names
        for member in archive.getmembers():
            if member.isfile():
                assert PLANTED.encode() not in archive.extractfile(member).read(), member.name
    out = subprocess.run(["git", "-C", ROOT, "check-ignore", "--no-index", "--verbose"] + credentials_paths(),
                         capture_output=True, text=True, timeout=60, check=False)
    ignored = [line.split("\t")[1] for line in out.stdout.splitlines()]
    assert sorted(ignored) == sorted(credentials_paths()), out.stdout + out.stderr


def test_galaxy_metadata_points_nowhere_dead():
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    for field in ("repository", "documentation", "homepage", "issues"):
        assert "example.invalid" not in str(galaxy.get(field, "")), field
    texts = [os.path.join(ROOT, "plugins", "modules", "dlock.py"),
             os.path.join(ROOT, "plugins", "doc_fragments", "backend.py")]
    for path in texts:
        with open(path) as handle:
            text = handle.read()
        assert "example.invalid" not in text and "DESIGN" not in text, path


def test_module_docs_name_every_backend_and_its_driver():
    """ansible-doc of the module renders, names etcd beside Redis and
    PostgreSQL, every scheme the engine takes, each driver of
    requirements.txt as a requirement (phrases: ansible-doc joins them with
    commas, so a sentence's full stop read as 'backends., psycopg'), and
    says that Redis and etcd need none."""
    from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import SCHEMES

    out = subprocess.run([os.path.join(BIN, "ansible-doc"), "dlock.fleet.dlock", "--json"], capture_output=True,
                         text=True, env=galaxy_env(ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build")), timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["dlock.fleet.dlock"]["doc"]
    assert "etcd" in doc["short_description"] and "etcd" in doc["description"][0]
    url = " ".join(doc["options"]["backend_url"]["description"])
    assert [scheme for scheme in SCHEMES if "V(%s://" % scheme not in url] == []
    with open(os.path.join(ROOT, "requirements.txt")) as handle:
        drivers = [line.strip().split(">=") for line in handle if line.strip() and not line.startswith("#")]
    assert len(doc["requirements"]) == len(drivers) == 1  # psycopg: Redis and etcd are spoken to without a driver
    for (name, version), requirement in zip(drivers, doc["requirements"]):
        assert requirement.startswith("%s >= %s (Python package) for " % (name, version)), requirement
        assert not requirement.endswith("."), requirement
    assert any("V(redis://), V(rediss://), V(etcd://) and V(etcd+https://) need none" in note for note in doc["notes"])


def test_docs_list_failed_units_the_way_systemctl_takes_a_pattern():
    """`systemctl --failed 'dlock-*'` stops at 'Unknown command verb dlock-*'
    (Debian 12's systemd 252): --failed takes no pattern; `systemctl
    list-units --failed 'dlock-*'` does. No shipped text says the former."""
    wrong = re.compile(r"systemctl(?:\s+-\S+)*\s+--failed(?:\s+-\S+)*\s+[^\s`-]")
    paths = [os.path.join(ROOT, "README.md")]
    for top in ("roles", "playbooks", "examples", "plugins", "meta"):
        for folder, _dirs, files in os.walk(os.path.join(ROOT, top)):
            paths += [os.path.join(folder, name) for name in files
                      if name.endswith((".md", ".yml", ".yaml", ".j2", ".py", ".sh"))]
    found = []
    for path in paths:
        with open(path) as handle:
            text = " ".join(handle.read().split())  # a command may wrap over lines
        found += [(path, match.group(0)) for match in wrong.finditer(text)]
    assert found == []
    with open(os.path.join(ROOT, "README.md")) as handle:
        assert "systemctl list-units --failed 'dlock-*'" in " ".join(handle.read().split())


def test_role_readmes_are_current():
    assert role_readmes.main(["--check"]) == 0
    for role in ROLES:
        with open(os.path.join(ROOT, "roles", role, "README.md")) as handle:
            text = handle.read()
        for heading in ("## Supported platforms", "## Variables", "## Example"):
            assert heading in text, (role, heading)
        assert "{{" not in text.split("<!-- BEGIN VARIABLES", 1)[1].split("<!-- END VARIABLES", 1)[0], role
        assert "dlock.fleet.%s" % role in text.split("## Example", 1)[1], role


def node_wrapper(directory):
    """The dlock_runner role's wrapper, rendered over a copy of the engine in
    `directory` (as the role installs it), for this interpreter."""
    engine = directory / "lib"
    shutil.copytree(os.path.join(ROOT, "plugins", "module_utils", "dlock"), str(engine / "dlock"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(ROOT, "roles", "dlock_runner", "templates", "dlock.sh.j2")) as handle:
        template = jinja2.Template(handle.read())
    wrapper = directory / "dlock"
    wrapper.write_text(template.render(ansible_managed="test", dlock_runner_python=sys.executable,
                                       dlock_runner_install_dir=str(engine)))
    wrapper.chmod(0o755)
    return str(wrapper)


def test_node_wrapper_starts_the_runner(tmp_path):
    wrapper = node_wrapper(tmp_path)
    out = subprocess.run([wrapper, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.startswith("dlock "), out.stdout + out.stderr
    bad = subprocess.run([wrapper, "run", "--job", "x", "--ttl", "nonsense", "--backend",
                          "file://%s" % tmp_path, "--", "true"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 78, bad.stdout + bad.stderr


# Pure-Python standard modules that `dlock run` imports as it starts.
STDLIB_THE_RUNNER_IMPORTS = ("json", "re", "enum", "signal", "threading")


def test_node_wrapper_imports_nothing_from_where_it_is_started(tmp_path):
    """A json.py in the directory `dlock` is started from (an operator's
    shell in /tmp, a cron job's home), or on a PYTHONPATH of the caller's,
    is never run by the runner: with `python -c`, the current directory came
    first on sys.path. The job still gets the caller's environment."""
    wrapper = node_wrapper(tmp_path)
    planted = tmp_path / "planted"
    for where in ("cwd", "pythonpath"):
        (tmp_path / where).mkdir()
        for name in STDLIB_THE_RUNNER_IMPORTS:
            (tmp_path / where / (name + ".py")).write_text(
                "open(%r, 'a').write(%r)\nraise SystemExit(99)\n" % (str(planted), "%s/%s.py " % (where, name)))
    seen = tmp_path / "job-saw"
    run = subprocess.run([wrapper, "run", "--job", "x", "--backend", "file://%s" % (tmp_path / "locks"), "--",
                          "sh", "-c", 'printf %s "$PYTHONPATH" > "$0"', str(seen)],
                         cwd=str(tmp_path / "cwd"), env=dict(os.environ, PYTHONPATH=str(tmp_path / "pythonpath")),
                         capture_output=True, text=True, timeout=60, check=False)
    assert not planted.exists(), "the runner imported %s" % planted.read_text()
    assert run.returncode == 0, run.stdout + run.stderr
    assert seen.read_text() == str(tmp_path / "pythonpath")


@pytest.fixture(scope="module")
def installed(release):
    """The tarball installed into an empty collections path."""
    return install_collection(release["checkout"], release["dir"] / "collections")


def installed_env(installed, tmp_path):
    """Only the installed copy can be found: no build/ link, no checkout."""
    return galaxy_env(ANSIBLE_COLLECTIONS_PATH=installed, ANSIBLE_LOCALHOST_WARNING="false",
                      ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
                      ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")


def test_installed_collection_runs_the_module_and_runbooks(installed, redis_server, unique_key, tmp_path):
    env = installed_env(installed, tmp_path)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
        "vars": {"dlock_backend": {"url": redis_server.url}}}}))
    where = subprocess.run([os.path.join(BIN, "ansible-doc"), "-t", "module", "dlock.fleet.dlock", "--json"],
                           capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60, check=False)
    assert where.returncode == 0, where.stderr
    doc = json.loads(where.stdout)["dlock.fleet.dlock"]["doc"]
    assert doc["filename"].startswith(installed), doc["filename"]

    def adhoc(args):
        out = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", str(inventory), "-m",
                              "dlock.fleet.dlock", "-a", args], capture_output=True, text=True, env=env,
                             cwd=str(tmp_path), timeout=60, check=False)
        assert " => " in out.stdout, out.stdout + out.stderr
        return out.returncode, json.loads(out.stdout.split(" => ", 1)[1])

    rc, result = adhoc("key=%s ttl=5m" % unique_key)
    assert rc == 0 and result["acquired"] is True and result["changed"] is True, result
    fence = result["fence"]
    rc, result = adhoc("key=%s state=query" % unique_key)
    assert rc == 0 and result["holder"]["held"] is True and result["holder"]["fence"] == fence, result

    def runbook(name, *extra):
        return subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "dlock.fleet." + name]
                              + list(extra), capture_output=True, text=True, env=env, cwd=str(tmp_path),
                              timeout=120, check=False)

    status = runbook("status", "-e", "dlock_keys=%s" % unique_key)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "%s is held by" % unique_key in status.stdout and "fence %d" % fence in status.stdout, status.stdout
    broken = runbook("break_lock", "-e", "dlock_key=%s" % unique_key, "-e", json.dumps({"dlock_reason": "release test"}))
    assert broken.returncode == 0, broken.stdout + broken.stderr
    assert not redis_server.client().exists("dlock:{%s}:lease" % unique_key)
    rc, result = adhoc("key=%s state=query" % unique_key)
    assert rc == 0 and result["holder"]["held"] is False, result


def test_execution_environment_gets_the_drivers(installed):
    """`ansible-builder introspect` (what an EE build runs on its collections)
    finds the backend drivers and libpq."""
    out = subprocess.run([os.path.join(BIN, "ansible-builder"), "introspect", "--sanitize", installed],
                         capture_output=True, text=True, env=galaxy_env(), timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    data = yaml.safe_load(out.stdout.split("---", 1)[1])
    python = [line.split("#")[0].strip() for line in data["python"]]
    system = [line.split("#")[0].strip() for line in data["system"]]
    assert python == ["psycopg>=3.1"], out.stdout
    assert system == ["libpq [platform:rpm]", "libpq5 [platform:dpkg]"], out.stdout
    assert all("from collection dlock.fleet" in line for line in data["python"] + data["system"])


def test_readme_order_and_the_developers_commands():
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    sections = [line[3:] for line in readme.splitlines() if line.startswith("## ")]
    assert sections[:8] == ["Contents", "What it guarantees, and what it does not", "Install",
                            "Requirements and support matrix", "Five-minute first use",
                            "Migrating from cron and from flock", "Operations", "Reference"], sections
    top = readme.split("## Contents", 1)[0]
    assert "bash scripts/demo.sh" in top and "bash scripts/test.sh" in top
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert os.access(os.path.join(ROOT, script), os.X_OK), script
    assert "ansible-galaxy collection install dlock.fleet" in readme and "requirements.yml" in readme
    # Every entry of the table of contents points at a heading.
    anchors = set()
    for line in readme.splitlines():
        if line.startswith("#") and " " in line:
            title = line.split(" ", 1)[1].strip().lower()
            anchors.add("".join(c for c in title if c.isalnum() or c in "-_ ").replace(" ", "-"))
    links = re.findall(r"\]\(#([^)]+)\)", readme)
    assert links and all(link in anchors for link in links), [link for link in links if link not in anchors]
    with open(os.path.join(ROOT, "CONTRIBUTING.md")) as handle:
        contributing = handle.read()
    assert "## The lab" in contributing and "## Tests and benchmarks" in contributing


def test_job_entry_keys_are_documented_as_suboptions():
    """`ansible-doc -t role dlock.fleet.dlock_jobs` shows every key a job entry
    may have (the filter's list), and a full entry passes the role's spec."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import UNIT_KEYS
    from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import OPTION_NAMES

    out = subprocess.run([os.path.join(BIN, "ansible-doc"), "-t", "role", "dlock.fleet.dlock_jobs", "--json"],
                         capture_output=True, text=True, env=galaxy_env(ANSIBLE_COLLECTIONS_PATH=os.path.join(
                             ROOT, "build")), timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    options = json.loads(out.stdout)["dlock.fleet.dlock_jobs"]["entry_points"]["main"]["options"]
    entry = options["dlock_jobs_list"]["options"]
    assert sorted(entry) == sorted(set(UNIT_KEYS) | set(OPTION_NAMES))
    assert all(spec.get("description") and spec.get("type") for spec in entry.values())
    job = {"name": "nightly-report", "command": ["/usr/local/bin/nightly-report", "--send"],
           "schedule": "*-*-* 02:00:00", "randomized_delay": "30s", "accuracy": "1s", "persistent": True,
           "user": "reports", "group": "reports", "environment": {"REPORT_BUCKET": "reports"},
           "working_directory": "/srv", "description": "the report", "hardening": True,
           "read_write_paths": ["/srv/out"], "unit_settings": {"Nice": "5"}, "key": "report", "groups": ["reports"],
           "state": "present",
           "shell": False, "ttl": "5m", "renew_every": 60, "op_timeout": "2s", "kill_grace": "10s",
           "on_contention": "wait", "wait_timeout": "5m", "min_hold": 0, "once_per": "1d", "max_runtime": "1h",
           "max_clock_skew": "2s", "fail_open": False, "exit_codes": {"locked": 0}, "history": 100,
           "catch_up": {"policy": "latest", "window": "1d"},
           "blackout": [{"calendar": "Sat,Sun 22:00", "duration": "8h"}]}
    assert sorted(job) == sorted(entry)
    with open(os.path.join(ROOT, "roles", "dlock_jobs", "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    result = ArgumentSpecValidator(spec).validate({"dlock_jobs_list": [job, {"name": "old", "state": "absent"}]},
                                                  validate_role_argument_spec=True)
    assert result.error_messages == []
    result = ArgumentSpecValidator(spec).validate({"dlock_jobs_list": [{"name": "x", "schedul": "hourly"}]},
                                                  validate_role_argument_spec=True)
    assert result.error_messages and "schedul" in result.error_messages[0]


def semantic(version):
    """(major, minor, patch) of a release version."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    assert match, "%r is not a semantic version (MAJOR.MINOR.PATCH)" % version
    return tuple(int(part) for part in match.groups())


def test_galaxy_yml_version_and_the_changelog_agree():
    """galaxy.yml's version is either released (its changelog written, no
    fragment left: a change after it needs the next version in galaxy.yml)
    or the next one, above every release, that the fragments describe. 0.1.0
    once shipped 16 fragments' worth of changes under its released number."""
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        version = yaml.safe_load(handle)["version"]
    with open(os.path.join(ROOT, "changelogs", "changelog.yaml")) as handle:
        releases = yaml.safe_load(handle)["releases"]
    fragments = sorted(name for name in os.listdir(os.path.join(ROOT, "changelogs", "fragments"))
                       if not name.startswith("."))
    out = subprocess.run([os.path.join(BIN, "antsibull-changelog"), "lint"], cwd=ROOT, capture_output=True,
                         text=True, env=galaxy_env(), timeout=120, check=False)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr
    # The engine says the same version (dlock --version, the runner's log).
    with open(os.path.join(ROOT, "plugins", "module_utils", "dlock", "__init__.py")) as handle:
        assert re.search(r'^__version__ = "%s"$' % re.escape(version), handle.read(), re.M), "engine __version__"
    # The README's install examples name it.
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    major, minor, _patch = semantic(version)
    assert "dlock-fleet-%s.tar.gz" % version in readme and '">=%d.%d.0,<%d.%d.0"' % (
        major, minor, major, minor + 1) in readme, "the README's install examples name another version"
    if version in releases:
        assert releases[version]["changes"]["release_summary"]
        assert not fragments, ("galaxy.yml's %s is released, and changelogs/fragments/ holds changes after it: "
                               "set the next version in galaxy.yml (%s)" % (version, ", ".join(fragments)))
        with open(os.path.join(ROOT, "CHANGELOG.rst")) as handle:
            assert "v%s" % version in handle.read()
    else:
        latest = max(releases, key=semantic)
        assert semantic(version) > semantic(latest), "galaxy.yml's %s is not above the last release %s" % (
            version, latest)
