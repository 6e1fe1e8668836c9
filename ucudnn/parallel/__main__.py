"""`python -m ucudnn.parallel ARGS` is `ucudnn bench ARGS`."""
import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
