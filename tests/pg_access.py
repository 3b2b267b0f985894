"""The dlock_postgresql_access module run as the dlock_postgresql role runs
it, by real `ansible`: shared by the role's tests
(tests/integration/roles/test_pg_least_privilege.py) and the engine's that
need a database provisioned the way a fleet's is (test_backend_status.py)."""

from ansible_cli import run_module

PASSWORD = "pg-least-privilege-0123"


def arguments(server, name, spec, password=PASSWORD):
    return {"database": name, "role": name, "password": password, "connection_limit": 16,
            "login_host": "127.0.0.1", "port": server.port, "login_user": "postgres",
            "schema": spec["schema"], "upgrades": spec["upgrades"], "grants": spec["grants"]}


def provision(server, name, spec, password=PASSWORD, check=False):
    """The module's {"changed", "actions"}; -vvv shows its arguments, the password masked."""
    rc, result, output = run_module("dlock_postgresql_access", arguments(server, name, spec, password),
                                    "-vvv", *(["--check"] if check else []))
    assert password not in output, output
    assert rc == 0, output
    assert result["invocation"]["module_args"]["password"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    return dict((key, result[key]) for key in ("changed", "actions"))
