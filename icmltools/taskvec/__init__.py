"""Task-vector checkpoint I/O shared by every merging method: lazy per-tensor readers
(:mod:`~icmltools.taskvec.readers`), streaming atomic writers (:mod:`~icmltools.taskvec.writers`) and what
they share (:mod:`~icmltools.taskvec.formats`). Importing it loads no torch; tensors are read on demand."""
from .formats import (
    OUTPUT_FORMATS,
    TensorSpec,
    all_finite,
    count_non_finite,
    default_output_name,
    is_float_dtype,
    read_record,
    resolve_output_format,
    sidecar_path,
)
from .readers import (
    CheckpointReader,
    MemoryReader,
    SafetensorsReader,
    ShardedReader,
    TorchReader,
    check_compatible,
    iter_tensors,
    open_checkpoint,
)
from .writers import CheckpointWriter, WriteBehind, write_state_dict

__all__ = [
    "OUTPUT_FORMATS", "TensorSpec", "all_finite", "count_non_finite", "default_output_name", "is_float_dtype", "read_record", "resolve_output_format",
    "sidecar_path", "CheckpointReader", "MemoryReader", "SafetensorsReader", "ShardedReader", "TorchReader",
    "check_compatible", "iter_tensors", "open_checkpoint", "CheckpointWriter", "WriteBehind", "write_state_dict",
]
