"""``python -m sowstream``."""

from sowstream.cli.main import main

main()
