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

SCENARIOS = sorted(name for name in os.listdir(os.path.join(ROOT, "molecule"))
                   if os.path.exists(os.path.join(ROOT, "molecule", name, "tests")))


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
