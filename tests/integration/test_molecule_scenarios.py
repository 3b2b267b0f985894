"""The molecule scenarios as the lab sessions read them (tests/lab/scenario.py)
and as molecule reads them: the same group_vars. The suite rolls each
scenario out on a lab session's nodes with scenario.py's reading, and
`molecule test` with molecule's; a difference (a dollar sign molecule takes
for its own variable) would test one thing and ship another."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))

import scenario  # noqa: E402

# A scenario has a molecule.yml and a verify set (molecule/common holds the shared checks, no scenario).
SCENARIOS = sorted(name for name in os.listdir(os.path.join(ROOT, "molecule"))
                   if all(os.path.exists(os.path.join(ROOT, "molecule", name, part)) for part in ("molecule.yml", "tests")))


def test_every_scenario_with_a_verify_set_is_here():
    assert SCENARIOS == ["etcd", "postgresql", "postgresql-ha", "redis"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_lab_reads_a_scenario_as_molecule_does(name, tmp_path, monkeypatch):
    # molecule is a test dependency, imported where it is used.
    from molecule import config  # pylint: disable=import-outside-toplevel
    ephemeral = str(tmp_path / "ephemeral")
    monkeypatch.setenv("MOLECULE_EPHEMERAL_DIRECTORY", ephemeral)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.chdir(ROOT)
    molecule_view = config.Config(os.path.join("molecule", name, "molecule.yml"),
                                  args={"base_config": [os.path.join(ROOT, ".config", "molecule", "config.yml")]},
                                  command_args={"subcommand": "list"})
    expected = molecule_view._combine()["provisioner"]["inventory"]["group_vars"]  # pylint: disable=protected-access
    assert scenario.group_vars(name, ephemeral) == expected
    assert scenario.backend_type(name) in ("redis", "postgresql", "etcd")
    # The verify set: the same test modules, in the same order, and the shared ones there.
    molecule_paths = [molecule_view.verifier.directory] + molecule_view.verifier.additional_files_or_dirs
    assert scenario.verify_paths(name) == [os.path.normpath(os.path.join(ROOT, path)) for path in molecule_paths]
    shared = [os.path.basename(path) for path in scenario.verify_paths(name)[1:]]
    assert shared[:2] == ["test_every_host.py", "test_job_nodes.py"] and shared[-1] == "test_no_secret.py", shared
    assert ("test_pg_members.py" in shared) == (scenario.backend_type(name) == "postgresql"), shared
