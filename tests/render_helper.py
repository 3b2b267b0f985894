"""Renders role templates with Ansible's own templating, for property tests.

A separate process (Ansible's collection loader must own the
ansible_collections package, which pytest has already imported as a plain
namespace package): it reads one JSON request per line on stdin,
{"template": PATH, "variables": {...}}, and answers one JSON line,
{"text": RENDERED} or {"error": MESSAGE}. The variables are data, never
templates themselves (like inventory values that Ansible does not trust).

    python tests/render_helper.py COLLECTIONS_PATH
"""

import json
import sys


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
        try:
            text = Templar(loader=loader, variables=request["variables"]).template(trust_as_template(source))
            answer = {"text": str(text)}
        except Exception as exc:  # pylint: disable=broad-exception-caught
            answer = {"error": "%s: %s" % (type(exc).__name__, exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
