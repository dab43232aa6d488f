"""``python -m twmock [options]``: run the mock upstream alone (same options as
``twserve mock-upstream``); the command is `twmock.serve.cli.main`."""

import sys

from twmock.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
