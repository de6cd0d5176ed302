"""``python -m corral.edges.shims COMMAND ARGS...``: a shim without its symlink."""

from corral.edges.shims import main

main()
