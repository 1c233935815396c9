"""Names and defaults of the merge engine (standard library only: commands import it for their choices)."""
from __future__ import annotations

# the engine's general methods (icmltools.merge.methods registers one class per name; a test checks they agree)
METHODS = ("task_arithmetic", "magnitude", "dare", "ties", "dare_ties", "breadcrumbs", "breadcrumbs_ties")
# elements per chunk for methods that are local (element-wise rules, n:m blocks); 2^22 float32 = 16 MiB. Smaller
# chunks cost more per-chunk work (calls into the loops, views, output slots): base + 4 bf16 models of 1 GB merged
# to disk, 2 threads, 2^20 -> 2^21, rounds 2 and 3 of three, alternated (2026-12-03): task arithmetic 1.09-1.15 ->
# 0.96-1.09 s, NegMerge 1.21-1.26 -> 1.05-1.10, DARE 1.61-1.75 -> 1.60-1.63, CABS 4.19-4.25 -> 4.00-4.01, TIES
# 3.56-3.57 -> 3.54-3.56 (the first round, which ran 2^20 first on a cold start, left out: task arithmetic 2.22
# against 1.22 s); 2^18 (another run, to /dev/shm): DARE 3.1-3.6 s against 1.90-1.93 at 2^21, task arithmetic
# 1.54-1.57 against 1.28-1.34; 2^22 and 2^23 no faster than 2^21 within this VM's noise. (At first 2^20, against
# 2^24: 1.3-2x.) Again after the one-pass loops wrote their output themselves (d2ced19), 2^21 against 2^22, in
# one process, 2 threads, to disk, alternated (2026-12-03): task arithmetic 0.76-0.89 -> 0.66-0.76 s, NegMerge
# and MagMax about 10 % faster, DARE, DARE-TIES, magnitude, TIES and breadcrumbs the same within 5 %, but CABS
# 4.03-4.24 -> 4.54-4.57 and CA-magnitude 4.65-4.75 (and one 7.63) -> 5.39-6.73. The element-wise gain was the
# writer's slots (engine.OUT_SLOT_BYTES, then 48 MB at 2^22 against 32 at 2^21), not the chunk: task arithmetic on
# HF folders 0.72-0.77 s at 2^21 with 64 MB of slots, 0.74-0.80 at 2^22 with 48, 0.91-0.94 at 2^21 with 32.
# 2^22 since session 41 (2026-12-06, the Intel host, the benchmark's fresh processes, 2 threads, two runs of each of
# 2^21, 2^22, 2^23 per format): every chunked method 0.03-0.1 s faster at 2^22 than at 2^21 on both formats (CABS
# 1.30-1.31 -> 1.24-1.25 s single files, 1.32 -> 1.26-1.27 HF; DARE-TIES 1.17-1.21 -> 1.10-1.12 and 1.19-1.20 ->
# 1.14-1.15; task arithmetic 0.81-0.91 -> 0.71-0.76 single files), peak RSS within 0.01 GB; 2^23 no faster than
# 2^22, with 0.02-0.04 GB more. Each chunk's loop is one call whose pieces the threads share (a pool's thread is
# woken per call; the faster one then waits for the other's last piece): inside those calls, in a CABS merge at
# 2^21 in one process, the main thread slept 0.14 s and the pool's 0.19 s (perf's sched:sched_switch events).
CHUNK_ELEMS = 1 << 22
# breadcrumbs: fraction of the largest magnitudes dropped (mergekit's `gamma` of magnitude_outliers)
BREADCRUMBS_GAMMA = 0.01
# default density where a method prunes and none is given (mergekit has none: it requires one)
DENSITY = 0.2
# output dtypes of the floating tensors a merge can be written in ("same": each tensor keeps its own); also
# the names mergekit configs use for `dtype` / `out_dtype`
OUT_DTYPES = ("float32", "float16", "bfloat16")
