"""``python -m lbmr_tools.sim``: the lbmr-sim command."""

from .cli import main

main()
