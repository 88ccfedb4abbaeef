"""Fleet throughput benchmark: ``python benchmarks/fleet.py [--workers 2] ...``.

The same measurement as ``rlfleet bench`` (see rlfleet/bench/ for what is
measured and the goals). Needs rlfleet importable: ``pip install -e .`` or
``PYTHONPATH=.`` from the repository root.
"""

import sys

from rlfleet.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
