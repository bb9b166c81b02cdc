"""Entry point for `python -m checks`: check templates, or `diagnose` requests, or run the
`proxy`."""

from __future__ import annotations

import sys


def run(argv: list[str]) -> int:
    if argv[:1] == ["diagnose"]:
        from checks.cli_diagnose import main as diagnose_main

        return diagnose_main(argv[1:], sys.stdout)
    if argv[:1] == ["proxy"]:
        from checks.proxy import main as proxy_main

        return proxy_main(argv[1:])
    from checks.cli import main

    return main(argv)


sys.exit(run(sys.argv[1:]))
