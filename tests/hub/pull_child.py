"""One pull in a child process, so tests can kill -9 it or Ctrl-C it mid-download.

python -m tests.hub.pull_child REF      (env: HF_ENDPOINT, HF_HOME, LOCALRUN_HOME)
"""

from __future__ import annotations

import faulthandler
import signal
import sys


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that waits in vain asks where it hangs
    # Ctrl-C as a terminal delivers it: a run started in the background of a shell without job
    # control (`(scripts/dev test &)`) inherits SIGINT ignored, and Python then keeps it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from localrun.modelstore.pull import pull
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    record = pull(ModelStore(load_settings()), sys.argv[1])
    sys.stdout.write(record.files[0].sha256 + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
