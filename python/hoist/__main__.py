"""`python -m hoist`: the `hoist` command."""

from ._cli import main

main()
