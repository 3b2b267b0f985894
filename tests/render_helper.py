"""Renders role templates with Ansible's own templating, for property tests.

A separate process (Ansible's collection loader must own the
ansible_collections package, which pytest has already imported as a plain
namespace package): it reads one JSON request per line on stdin,
{"template": PATH, "variables": {...}, "role_variables": {...}}, and
answers one JSON line, {"text": RENDERED} or {"error": MESSAGE}. The
variables are data, never templates themselves (like inventory values that
Ansible does not trust); the role's own variables (its vars/main.yml) are
templates, as Ansible treats them, resolved when the template uses them.

    python tests/render_helper.py COLLECTIONS_PATH
"""

import json
import sys


def trusted(value):
    """The role's variables, with every string trusted as a template."""
    from ansible.template import trust_as_template

    if isinstance(value, dict):
        return dict((key, trusted(item)) for key, item in value.items())
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return trust_as_template(value) if isinstance(value, str) else value


def main():
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template

    init_plugin_loader([sys.argv[1]])
    loader = DataLoader()
    for line in sys.stdin:
        request = json.loads(line)
        with open(request["template"]) as handle:
            source = handle.read()
        variables = dict(trusted(request.get("role_variables", {})), **request["variables"])
        try:
            text = Templar(loader=loader, variables=variables).template(trust_as_template(source))
            answer = {"text": str(text)}
        except Exception as exc:  # pylint: disable=broad-exception-caught
            answer = {"error": "%s: %s" % (type(exc).__name__, exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
