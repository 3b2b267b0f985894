"""Every host of the PostgreSQL HA scenario: services and chrony (pytest-testinfra)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

# The shared tests, imported to be collected here.
from fleet_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    test_chrony_container_mode_never_adjusts_the_clock,
    test_chrony_tracking_reports_a_state,
    test_services_run,
)

testinfra_hosts = ["ansible://all"]
