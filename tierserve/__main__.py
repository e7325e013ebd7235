"""`python -m tierserve` is the `tierserve` command."""
from tierserve.cli import main

main()
