"""Entry point for `python -m checks`: check templates, or `diagnose` requests, or run the
`proxy`."""

from __future__ import annotations

import os
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


def exit_code(argv: list[str]) -> int:
    """`run`, and a reader who stops reading (`| head`) or presses Ctrl-C ends it quietly, as
    other tools do: Python's default would print a traceback."""
    for stream in (sys.stdout, sys.stderr):
        # A lone surrogate (a template can write one, a request can escape one) is written
        # escaped: strict UTF-8 ended the run with a traceback after every check had run.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:
        code = run(argv)
        sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C: one line, and the shell's code for SIGINT (128 + 2), not a traceback. The
        # sandbox workers are stopped on the way out (the pool is closed in a `finally`).
        sys.stderr.write("python -m checks: interrupted\n")
        return 130
    except BrokenPipeError:
        # stdout is gone: point it at nothing so the interpreter's own final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13)
    return code


sys.exit(exit_code(sys.argv[1:]))
