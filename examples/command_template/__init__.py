"""A complete, tested example of the house pattern for a new command (see CONTRIBUTING.md)."""
