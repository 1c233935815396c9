"""Vector quantisation with k-means initialisation and an EMA codebook (Sec. 4.1; van den Oord et al. 2017).

As in the official code (lucidrains' VectorQuantize defaults): the first training batch initialises the
codebook by k-means; codes then follow an exponential moving average of their assigned encodings
(decay 0.8, Laplace-smoothed counts); the encoder gets the commitment loss beta * ||z - sg(e)||^2
(beta = 1.0) and the straight-through gradient z + sg(e - z).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def kmeans(x: torch.Tensor, k: int, iters: int = 10, generator: torch.Generator | None = None):
    """Plain k-means (Euclidean) from k distinct random samples; returns (centres (k,D), counts (k,))."""
    n = x.shape[0]
    perm = torch.randperm(n, generator=generator, device="cpu")[:k].to(x.device)
    if n < k:  # repeat samples when the first batch is smaller than the codebook
        perm = torch.cat([perm, torch.randint(0, n, (k - n,), generator=generator).to(x.device)])
    c = x[perm].clone()
    for _ in range(iters):
        assign = torch.cdist(x, c).argmin(1)
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        nonempty = counts > 0
        c[nonempty] = sums[nonempty] / counts[nonempty, None].to(x.dtype)
    assign = torch.cdist(x, c).argmin(1)
    return c, torch.bincount(assign, minlength=k).to(x.dtype)


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes: int = 16, dim: int = 64, decay: float = 0.8, commitment: float = 1.0,
                 kmeans_init: bool = True, kmeans_iters: int = 10, eps: float = 1e-5):
        super().__init__()
        self.n_codes, self.dim, self.decay, self.commitment, self.eps = n_codes, dim, decay, commitment, eps
        self.kmeans_iters = kmeans_iters
        init = torch.zeros(n_codes, dim) if kmeans_init else torch.randn(n_codes, dim)
        self.register_buffer("codebook", init)
        self.register_buffer("cluster_size", torch.zeros(n_codes))
        self.register_buffer("embed_avg", init.clone())
        self.register_buffer("initted", torch.tensor(0.0 if kmeans_init else 1.0))
        self.generator: torch.Generator | None = None

    @torch.no_grad()
    def init_codebook(self, z: torch.Tensor) -> None:
        c, counts = kmeans(z.detach().reshape(-1, self.dim).float(), self.n_codes, self.kmeans_iters, self.generator)
        self.codebook.copy_(c)
        self.embed_avg.copy_(c * counts[:, None])
        self.cluster_size.copy_(counts)
        self.initted.fill_(1.0)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Index of the nearest code (Euclidean) for each row of z (..., D)."""
        flat = z.reshape(-1, self.dim)
        d = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.t() + self.codebook.pow(2).sum(1)[None])
        return d.argmin(1).reshape(z.shape[:-1])

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.codebook)

    @torch.no_grad()
    def ema_update(self, z: torch.Tensor, idx: torch.Tensor) -> None:
        flat = z.detach().reshape(-1, self.dim).float()
        onehot = F.one_hot(idx.reshape(-1), self.n_codes).type(flat.dtype)
        self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
        self.embed_avg.mul_(self.decay).add_(onehot.t() @ flat, alpha=1 - self.decay)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + self.n_codes * self.eps) * n
        self.codebook.copy_(self.embed_avg / smoothed[:, None])

    def forward(self, z: torch.Tensor, freeze: bool = False):
        """Returns (straight-through quantised z, code indices, commitment loss)."""
        if self.training and not freeze and not bool(self.initted):
            self.init_codebook(z)
        idx = self.nearest(z.detach())
        q = self.lookup(idx)
        if self.training and not freeze:
            self.ema_update(z, idx)
        loss = self.commitment * F.mse_loss(z, q.detach()) if (self.training and not freeze) else z.new_zeros(())
        q_st = z + (q - z).detach()
        return q_st, idx, loss
