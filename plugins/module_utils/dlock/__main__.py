"""Entry point of `python3 -m dlock` (wrapped by /usr/local/bin/dlock on nodes)."""

from .cli import main

# Guarded: ansible-test's import sanity test imports this file.
if __name__ == "__main__":
    raise SystemExit(main())
