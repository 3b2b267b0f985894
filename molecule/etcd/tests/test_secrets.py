"""No backend password anywhere it should not be (last: covers the other tests too)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

# The shared tests, imported to be collected here.
from fleet_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    test_no_password_on_the_hosts,
    test_verbose_run_changes_nothing_and_prints_no_password,
    verbose_run,
)

testinfra_hosts = ["ansible://all"]
