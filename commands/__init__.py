"""The Click layer of `icml` (installed as `icmltools.commands`). Thin wrappers over `icmltools`."""
