"""Cross-cutting pieces shared by every method: errors, devices, seeding, JSON, files, checkpoints."""
from .errors import (
                     BadInputError,
                     DeviceUnavailableError,
                     IcmlError,
                     InfeasibleError,
                     MissingDependencyError,
                     RuntimeFailure,
)
from .jsonio import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text, dumps, to_jsonable

__all__ = [
    "IcmlError", "BadInputError", "DeviceUnavailableError", "InfeasibleError", "MissingDependencyError",
    "RuntimeFailure", "atomic_path", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "dumps",
    "to_jsonable",
]
