"""What a merge kept: the K x K overlap of the pruned task vectors (list form; the streamed merge counts it in
the engine with the same definition) and the short blocks of an n:m mask.

Overlap is counted on the nonzeros of the pruned vectors (as the official ``calculate_overlap``): counts[i][j]
= #(pruned_i != 0 and pruned_j != 0) (the diagonal: each model's nonzeros), iou[i][j] = counts[i][j] /
#(pruned_i != 0 or pruned_j != 0). Streamed in O(1) buffers in K: one integer per element whose bit k says
that model k's pruned vector is nonzero there (K <= 62; above, only the diagonal is counted).
"""
from __future__ import annotations

from typing import Sequence

MAX_PAIRWISE = 62


class Overlap:
    """Accumulates the overlap matrix over tensors, one pruned vector (or its nonzero mask) at a time."""

    def __init__(self, k: int):
        self.k = k
        self.counts = [[0] * k for _ in range(k)]
        self.union = [[0] * k for _ in range(k)]
        self._bits = None

    def start(self, shape, device="cpu") -> None:
        """A new tensor of `shape`."""
        import torch

        if self.k <= MAX_PAIRWISE:
            dt = torch.int16 if self.k <= 14 else (torch.int32 if self.k <= 30 else torch.int64)
            self._bits = torch.zeros(shape, dtype=dt, device=device)

    def add(self, k: int, nonzero) -> None:
        """Model k's nonzero positions in the current tensor (a bool tensor)."""
        import torch

        self.counts[k][k] += int(torch.count_nonzero(nonzero))
        if self._bits is not None:
            self._bits.bitwise_or_(nonzero.to(self._bits.dtype) << k)

    def finish(self) -> None:
        """Close the current tensor: the pairwise counts from the bit field."""
        if self._bits is None:
            return
        import torch

        planes = [((self._bits >> i) & 1).bool() for i in range(self.k)]
        for i in range(self.k):
            for j in range(i + 1, self.k):
                both = int(torch.count_nonzero(planes[i] & planes[j]))
                either = int(torch.count_nonzero(planes[i] | planes[j]))
                self.counts[i][j] += both
                self.counts[j][i] += both
                self.union[i][j] += either
                self.union[j][i] += either
        self._bits = None

    def result(self) -> dict:
        k = self.k
        iou = [[None] * k for _ in range(k)]
        for i in range(k):
            iou[i][i] = 1.0 if self.counts[i][i] else 0.0
            for j in range(k):
                if i != j and k <= MAX_PAIRWISE:
                    iou[i][j] = self.counts[i][j] / self.union[i][j] if self.union[i][j] else 0.0
        pairs = [self.counts[i][j] for i in range(k) for j in range(i + 1, k)]
        return {"counts": self.counts, "iou": iou,
                "max_pairwise": (max(pairs) if pairs else 0) if k <= MAX_PAIRWISE else None}


def overlap_of(pruned: Sequence) -> dict:
    """The overlap matrix of K pruned vectors of one tensor (list form)."""
    ov = Overlap(len(pruned))
    ov.start(pruned[0].shape, pruned[0].device)
    for k, p in enumerate(pruned):
        ov.add(k, p != 0)
    ov.finish()
    return ov.result()


def short_blocks(mask, n: int, m: int, tail: str = "pad") -> int:
    """Full blocks of m (and a padded tail) keeping fewer than n positions (CA left them fewer free slots)."""
    flat = mask.reshape(-1)
    full = flat.numel() // m * m
    cnt = 0
    if full:
        cnt += int((flat[:full].view(-1, m).sum(1) < n).sum())
    r = flat.numel() - full
    if r and tail == "pad":
        cnt += int(flat[full:].sum() < min(n, r))
    return cnt
