"""Names and defaults of the merge engine (standard library only: commands import it for their choices)."""
from __future__ import annotations

# the engine's general methods (icmltools.merge.methods registers one class per name; a test checks they agree)
METHODS = ("task_arithmetic", "magnitude", "dare", "ties", "dare_ties", "breadcrumbs")
# elements per chunk for methods that are local (element-wise rules, n:m blocks); 2^20 float32 = 4 MiB: a few
# chunk buffers stay in a core's L2 cache, which made the fused loops 1.3-2x faster than 2^24 (benchmarks/merge_engine.py)
CHUNK_ELEMS = 1 << 20
# breadcrumbs: fraction of the largest magnitudes dropped (mergekit's `gamma` of magnitude_outliers)
BREADCRUMBS_GAMMA = 0.01
# default density where a method prunes and none is given (mergekit has none: it requires one)
DENSITY = 0.2
# output dtypes of the floating tensors a merge can be written in ("same": each tensor keeps its own); also
# the names mergekit configs use for `dtype` / `out_dtype`
OUT_DTYPES = ("float32", "float16", "bfloat16")
