"""`python -m qcls.cli …`: the `qcls` command."""
import sys

from qcls.cli.commands import main

sys.exit(main())
