"""A search worker process, started by `sweep --search --workers K` (search.run_workers): it keeps to its share of
the machine, ends with the process that started it, and takes trials from the study (trial.work).

    python -m hftoolkit.sweeps.worker SEARCH_JSON INDEX
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from hftoolkit.base import console
    from hftoolkit.base.errors import UserError
    from hftoolkit.base.lifecycle import Stopped, die_with_parent, stop_on_signals
    from hftoolkit.sweeps.search import CPUS_VARIABLE
    from hftoolkit.sweeps.trial import Search, work

    stop_on_signals()
    die_with_parent()
    cpus = os.environ.get(CPUS_VARIABLE)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    search, index = Search(**json.loads(argv[0])), int(argv[1])
    try:
        work(search, index, console.phase)
    except Stopped as stop:
        if not stop.said:
            print(f"stopped by {stop.name}", file=sys.stderr)
        return stop.exit_code
    except UserError as err:
        print(f"Error: {err.format_message()}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # (no slow interpreter teardown of torch and transformers: cli/app.py does the same)
