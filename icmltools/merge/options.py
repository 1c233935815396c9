"""Names and defaults of the merge engine (standard library only: commands import it for their choices)."""
from __future__ import annotations

# the engine's general methods (icmltools.merge.methods registers one class per name; a test checks they agree)
METHODS = ("task_arithmetic", "magnitude", "dare", "ties", "dare_ties", "breadcrumbs")
# elements per chunk for methods that are local (element-wise rules, n:m blocks); 2^21 float32 = 8 MiB. Smaller
# chunks cost more per-chunk work (calls, views, output slots): base + 4 bf16 models of 1 GB merged to disk, 2
# threads, 2^20 -> 2^21, three rounds each (2026-12-03): task arithmetic 1.09-1.15 -> 0.96-1.09 s, NegMerge
# 1.21-1.26 -> 1.05-1.10, DARE 1.61-1.75 -> 1.60-1.71, CABS 4.19-4.25 -> 4.00-4.01, TIES unchanged; 2^18 was
# 1.5-2x slower, 2^22-2^23 no faster than 2^21 within this VM's noise. (At first 2^20, against 2^24: 1.3-2x.)
CHUNK_ELEMS = 1 << 21
# breadcrumbs: fraction of the largest magnitudes dropped (mergekit's `gamma` of magnitude_outliers)
BREADCRUMBS_GAMMA = 0.01
# default density where a method prunes and none is given (mergekit has none: it requires one)
DENSITY = 0.2
# output dtypes of the floating tensors a merge can be written in ("same": each tensor keeps its own); also
# the names mergekit configs use for `dtype` / `out_dtype`
OUT_DTYPES = ("float32", "float16", "bfloat16")
