"""Stage 1 of VP-OR: predict a high-confidence solution space for the new instance.

- `marginal` (default, ours): recency-weighted marginals of the history solutions; P(x_j = 1) for
  binaries, an interval from recent history values for general integers.
- `gnn` (optional): a small torch bipartite GNN over the variable-constraint graph trained on the series
  itself (pairs "features of instance k with the solution of k-1 -> solution of k"); the paper's GNN
  takes the base instance's optimal solution as a feature in the same way (paper, Stage 1). It predicts
  P(x=1) for binaries; integers keep the marginal intervals.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from .milp import Milp
from .ts import Prediction

log = logging.getLogger(__name__)


def history_matrix(names: list, history: list) -> np.ndarray:
    """(H, n) values of the history solutions for `names` (NaN where a solution lacks a name). Vectorised:
    solutions of one series share their key order, so the name -> column map is built once and each
    solution is one array copy (12.5k variables x 15 solutions: about 10 ms, not a Python loop per value)."""
    X = np.full((len(history), len(names)), np.nan)
    index, keys, cols = None, None, None
    for k, sol in enumerate(history):
        ks = list(sol)
        if ks != keys:
            if index is None:
                index = {n: j for j, n in enumerate(names)}
            keys = ks
            cols = np.fromiter((index.get(n, -1) for n in ks), dtype=np.int64, count=len(ks))
        vals = np.fromiter(sol.values(), dtype=float, count=len(ks))
        ok = cols >= 0
        X[k, cols[ok]] = vals[ok]
    return X


def recency_weights(h: int, decay: float) -> np.ndarray:
    return decay ** np.arange(h - 1, -1, -1, dtype=float)


def marginal_prediction(names, kind, lb, ub, history: list, decay: float = 0.8, recent: int = 3) -> Prediction:
    """Stage 1, ours (the paper uses a GNN): binaries p_j = sum_k w_k x_kj / sum_k w_k with w_k = decay^age;
    general integers get the interval [floor min, ceil max] of the last `recent` history values and, as p,
    the weight share of history values inside it."""
    kind = np.asarray(kind)
    n = len(names)
    if not history:
        return Prediction(list(names), kind, np.full(n, 0.5), np.full(n, -math.inf), np.full(n, math.inf),
                          np.asarray(lb, float), np.asarray(ub, float))
    X = history_matrix(names, history)
    w = recency_weights(len(history), decay)[:, None] * ~np.isnan(X)
    Xz = np.nan_to_num(X)
    wsum = w.sum(axis=0)
    p = np.where(wsum > 0, (w * np.clip(Xz, 0, 1)).sum(axis=0) / np.maximum(wsum, 1e-12), 0.5)
    R = X[-recent:]
    with np.errstate(all="ignore"):
        lo = np.where(np.all(np.isnan(R), axis=0), -math.inf, np.floor(np.nanmin(np.where(np.isnan(R), np.inf, R),
                                                                                  axis=0) + 1e-6))
        hi = np.where(np.all(np.isnan(R), axis=0), math.inf, np.ceil(np.nanmax(np.where(np.isnan(R), -np.inf, R),
                                                                               axis=0) - 1e-6))
    inside = (X >= lo - 1e-6) & (X <= hi + 1e-6)
    conf = np.where(wsum > 0, (w * inside).sum(axis=0) / np.maximum(wsum, 1e-12), 0.0)
    p = np.where(kind == "I", conf, p)
    return Prediction(list(names), kind, p, lo, hi, np.asarray(lb, float), np.asarray(ub, float))


# ------------------------------------------------------------------------------------------ GNN


def _features(milp: Milp, prev: np.ndarray, marg: np.ndarray):
    """Variable and constraint features of the bipartite graph (scale-free where possible)."""
    A = milp.A.tocoo()
    absobj = np.abs(milp.obj)
    oscale = absobj.max() if absobj.max() > 0 else 1.0
    deg_v = np.bincount(A.col, minlength=milp.n).astype(float)
    deg_c = np.bincount(A.row, minlength=milp.m).astype(float)
    lbf = np.clip(np.nan_to_num(milp.lb, posinf=1e3, neginf=-1e3), -1e3, 1e3)
    ubf = np.clip(np.nan_to_num(milp.ub, posinf=1e3, neginf=-1e3), -1e3, 1e3)
    sign = -1.0 if milp.sense == "maximize" else 1.0
    xv = np.stack([sign * milp.obj / oscale, np.sign(lbf) * np.log1p(np.abs(lbf)), np.sign(ubf) * np.log1p(np.abs(ubf)),
                   (milp.vtype == "B").astype(float), (milp.vtype == "I").astype(float),
                   deg_v / max(deg_v.max(), 1.0), np.nan_to_num(np.clip(prev, -1e3, 1e3)), marg], axis=1)
    fin_l, fin_r = np.isfinite(milp.lhs), np.isfinite(milp.rhs)
    rowabs = np.asarray(abs(milp.A).sum(axis=1)).ravel()
    rowabs = np.where(rowabs > 0, rowabs, 1.0)
    xc = np.stack([np.where(fin_l, np.nan_to_num(milp.lhs) / rowabs, 0.0), fin_l.astype(float),
                   np.where(fin_r, np.nan_to_num(milp.rhs) / rowabs, 0.0), fin_r.astype(float),
                   deg_c / max(deg_c.max(), 1.0)], axis=1)
    vals = A.data / rowabs[A.row]
    return xv.astype(np.float32), xc.astype(np.float32), A.row, A.col, vals.astype(np.float32)


def _build_net(torch, hidden: int = 32):
    nn = torch.nn

    class BipartiteGNN(nn.Module):
        """Two half-convolutions (variables -> constraints -> variables), as in Gasse et al. 2019."""

        def __init__(self):
            super().__init__()
            self.ev = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            self.ec = nn.Sequential(nn.Linear(5, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            self.vc = nn.Linear(hidden, hidden)
            self.cv = nn.Linear(hidden, hidden)
            self.uc = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU())
            self.uv = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU())
            self.out = nn.Sequential(nn.Linear(hidden + 8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

        def forward(self, xv, xc, ri, ci, w):
            hv, hc = self.ev(xv), self.ec(xc)
            m = torch.zeros_like(hc).index_add_(0, ri, self.vc(hv)[ci] * w[:, None])
            hc = self.uc(torch.cat([hc, m], 1))
            m = torch.zeros_like(hv).index_add_(0, ci, self.cv(hc)[ri] * w[:, None])
            hv = self.uv(torch.cat([hv, m], 1))
            return self.out(torch.cat([hv, xv], 1)).squeeze(1)

    return BipartiteGNN()


def _tensors(torch, feat, device):
    xv, xc, ri, ci, w = feat
    return (torch.from_numpy(xv).to(device), torch.from_numpy(xc).to(device),
            torch.from_numpy(np.asarray(ri, dtype=np.int64)).to(device),
            torch.from_numpy(np.asarray(ci, dtype=np.int64)).to(device), torch.from_numpy(w).to(device))


def _training_pairs(history_milps: list, history: list, decay: float) -> list:
    """(features of history instance k with the solution of k-1 and the marginals of 0..k-1, the solution
    of k, mask of its binaries) for every k with both solutions known."""
    pairs = []
    for k in range(1, len(history)):
        hm = history_milps[k] if k < len(history_milps) else None
        if hm is None or history[k] is None or history[k - 1] is None:
            continue
        names = hm.var_names
        prev = history_matrix(names, [history[k - 1]])[0]
        known = [h for h in history[:k] if h is not None]
        marg = marginal_prediction(names, hm.vtype, hm.lb, hm.ub, known, decay).p
        y = history_matrix(names, [history[k]])[0]
        mask = (hm.vtype == "B") & ~np.isnan(y)
        pairs.append((_features(hm, prev, marg), np.nan_to_num(y), mask))
    return pairs


def train_gnn(history_milps: list, history: list, device: str = "cpu", decay: float = 0.8, epochs: int = 100,
              seed: int = 0, deadline=None):
    """Stage 1 as in the paper (a GNN on the variable-constraint graph), trained on the history series
    offline, before the new instance arrives: BCE on the binaries of the pairs of `_training_pairs`.

    Streams: `derive(seed, "reopt", "gnn")`, child "init" for the weights, "order" for the epoch order.
    Returns (net or None, info)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        from icmltools.core.errors import MissingDependencyError

        raise MissingDependencyError("the gnn predictor needs torch", param="predictor") from e
    import time

    t0 = time.perf_counter()
    info = {"predictor": "gnn", "pairs": 0, "epochs": 0, "device": device}
    pairs = _training_pairs(history_milps, history, decay)
    info["pairs"] = len(pairs)
    if len(pairs) < 2:
        info["fallback"] = "fewer than 2 consecutive solved history pairs; marginal prediction used"
        return None, info
    stream = derive(seed, "reopt", "gnn")
    with stream.child("init").torch_init():
        net = _build_net(torch).to(device)
    g = stream.child("order").torch()
    # trained before the solve's clock starts, so torch.optim's one-off import cost (~2 s) is not timed
    opt = torch.optim.Adam(net.parameters(), lr=5e-3)
    data = [(_tensors(torch, f, device), torch.from_numpy(y.astype(np.float32)).to(device),
             torch.from_numpy(m).to(device)) for f, y, m in pairs]
    lossf = torch.nn.BCEWithLogitsLoss()
    loss_v = float("nan")
    for ep in range(epochs):
        if ep > 0 and deadline is not None and time.perf_counter() > deadline:
            break
        for i in torch.randperm(len(data), generator=g).tolist():
            (xv, xc, ri, ci, w), y, m = data[i]
            if not bool(m.any()):
                continue
            opt.zero_grad()
            loss = lossf(net(xv, xc, ri, ci, w)[m], y[m])
            loss.backward()
            opt.step()
            loss_v = float(loss.detach())
        info["epochs"] = ep + 1
    info["final_loss"] = loss_v
    info["train_s"] = round(time.perf_counter() - t0, 4)
    return net, info


def predict_gnn(net, new: Milp, history: list, device: str = "cpu", decay: float = 0.8) -> Prediction:
    """P(x=1) for the new instance's binaries from the trained net; marginal intervals for integers."""
    import torch

    known = [h for h in history if h is not None]
    base = marginal_prediction(new.var_names, new.vtype, new.lb, new.ub, known, decay)
    if net is None or not known:
        return base
    prev = history_matrix(new.var_names, [known[-1]])[0]
    with torch.no_grad():
        p = torch.sigmoid(net(*_tensors(torch, _features(new, prev, base.p), device))).cpu().numpy().astype(float)
    return Prediction(base.names, base.kind, np.where(base.kind == "B", p, base.p), base.lo, base.hi, base.lb,
                      base.ub)


def gnn_prediction(new: Milp, history_milps: list, history: list, device: str = "cpu", decay: float = 0.8,
                   epochs: int = 100, seed: int = 0, deadline=None) -> tuple[Prediction, dict]:
    """Train on the history, then predict for `new` (both steps in one call)."""
    net, info = train_gnn(history_milps, history, device, decay, epochs, seed, deadline)
    return predict_gnn(net, new, history, device, decay), info


def check_names(new_names: list, other_names: list, what: str, new_label: str) -> None:
    """Variables are matched by name (spec): the two instances must have the same set of names."""
    a, b = set(new_names), set(other_names)
    if a != b:
        only_new = sorted(a - b)[:3]
        only_old = sorted(b - a)[:3]
        raise BadInputError(f"{what} and {new_label} have different variable names "
                            f"({len(a - b)} only in the new instance, e.g. {only_new}; {len(b - a)} only in the "
                            f"history, e.g. {only_old})", hint="variables are matched by name")
