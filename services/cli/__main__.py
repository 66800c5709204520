"""`python -m services.cli`: the same as the `headrace` command (how `headrace up` starts its
children)."""

from services.cli.app import main

main()
