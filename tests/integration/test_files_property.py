"""dlock_files writes any text and mode exactly, then leaves the file alone
(Hypothesis; the module's other tests: tests/unit/plugins/modules/test_dlock_files.py)."""

import grp
import os
import pwd
import stat

from hypothesis import given, settings, strategies as st

from ansible_collections.dlock.fleet.plugins.modules import dlock_files as module

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=200),
       mode=st.integers(0, 0o777))
def test_any_text_and_mode_is_written_exactly_and_then_left_alone(tmp_path_factory, text, mode):
    root = tmp_path_factory.mktemp("prop")
    files = [{"path": str(root / "f"), "content": text, "mode": "%04o" % mode, "owner": USER, "group": GROUP}]
    assert module.run({"files": files}, False, False)["changed"]
    with open(str(root / "f"), encoding="utf-8", newline="") as handle:
        assert handle.read() == text
    assert stat.S_IMODE(os.stat(str(root / "f")).st_mode) == mode
    assert module.run({"files": files}, False, False) == {"changed": False, "paths": []}
