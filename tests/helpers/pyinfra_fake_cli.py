"""The real `pyinfra` command line, for tests: @fake hosts, and every file the run uploads written to the JSON
file named by MODELFLEET_TEST_UPLOADS (pyinfra's fake connector otherwise drops them)."""

import atexit
import json
import os

from pyinfra.connectors.fake import FakeConnector
from pyinfra_cli.main import main  # first: pyinfra's CLI patches the process with gevent on import

uploads: dict[str, str] = {}


def put_file(self, filename_or_io, remote_filename, remote_temp_filename=None, **kwargs):
    data = filename_or_io.read()
    # A secret goes to its temp name first, then is renamed (operations.files): kept under its final name.
    folder, _, name = remote_filename.rpartition("/")
    if name.startswith(".") and name.endswith(".modelfleet-tmp"):
        remote_filename = f"{folder}/{name[1:-len('.modelfleet-tmp')]}"
    uploads[remote_filename] = data.decode() if isinstance(data, bytes) else data
    return True


FakeConnector.put_file = put_file
atexit.register(lambda: open(os.environ["MODELFLEET_TEST_UPLOADS"], "w").write(json.dumps(uploads)))

if __name__ == "__main__":
    main()
