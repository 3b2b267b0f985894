"""dlock: lease locks for scheduled jobs across a fleet.

Pure Python (stdlib plus the backend's driver, imported lazily), relative
imports only and no ansible import: the same package is the engine of the
Ansible module and, copied onto a node, the `dlock` runner (the node wrapper calls dlock.cli.main()).
"""

__version__ = "0.3.0"
