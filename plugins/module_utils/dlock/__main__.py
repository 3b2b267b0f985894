"""Entry point of `python3 -m dlock` (wrapped by /usr/local/bin/dlock on nodes)."""

from .cli import main

raise SystemExit(main())
