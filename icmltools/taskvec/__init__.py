"""Task-vector checkpoint I/O shared by every merging method (lazy readers, streaming atomic writers)."""
from .io import (  # noqa: F401
    CheckpointReader,
    CheckpointWriter,
    MemoryReader,
    TensorSpec,
    check_compatible,
    default_output_name,
    is_float_dtype,
    open_checkpoint,
    read_record,
    resolve_output_format,
    sidecar_path,
    write_state_dict,
)
