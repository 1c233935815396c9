"""icmltools: implementations of ICML 2025 methods behind the `icml` command.

The library layer is pure Python / numpy / torch: no click, no rich. The command layer lives in
`icmltools.commands` (the `commands/` folder of the repository).
"""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
