"""``python -m corral.shims COMMAND ARGS...``: a shim without its symlink."""

from . import main

main()
