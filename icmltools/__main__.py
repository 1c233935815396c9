"""`python -m icmltools` runs the `icml` command."""
from icmltools.commands.cli import main

if __name__ == "__main__":
    main()
