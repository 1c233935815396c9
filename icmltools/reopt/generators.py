"""Offline instance-series generators (own numpy code after the learn2branch / Ecole schemes) and
perturbation modes obj | rhs | bnd | mat | mixed.

Each instance of a series is the base instance with one declared component perturbed afresh (not
cumulatively), so "only the declared component changes" holds between any two instances.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_write_bytes, atomic_write_json, atomic_write_text

from .milp import Milp, mps_bytes

PROBLEMS = ("setcover", "cauction", "facility", "indset")
MODES = ("obj", "rhs", "bnd", "mat", "mixed")
SIZES = ("tiny", "small", "medium")

# size presets: tiny solves << 1 s (tests); small is what the benchmark uses; medium is harder.
PRESETS = {
    "setcover": {"tiny": dict(nrows=60, ncols=120, density=0.08),
                 "small": dict(nrows=500, ncols=1000, density=0.05),
                 "medium": dict(nrows=1000, ncols=2000, density=0.05)},
    "cauction": {"tiny": dict(n_items=20, n_bids=60),
                 "small": dict(n_items=100, n_bids=500),
                 "medium": dict(n_items=200, n_bids=1000)},
    "facility": {"tiny": dict(n_customers=15, n_facilities=8),
                 "small": dict(n_customers=100, n_facilities=100),
                 "medium": dict(n_customers=200, n_facilities=100)},
    "indset": {"tiny": dict(n_nodes=60, affinity=4),
               "small": dict(n_nodes=500, affinity=4),
               "medium": dict(n_nodes=1000, affinity=4)},
}


def _names(prefix: str, k: int) -> list:
    w = len(str(max(k - 1, 0)))
    return [f"{prefix}{i:0{w}d}" for i in range(k)]


def _milp(name, var_names, vtype, lb, ub, obj, cons_names, rows, cols, vals, lhs, rhs, sense, meta) -> Milp:
    A = sp.csr_matrix((np.asarray(vals, float), (np.asarray(rows, int), np.asarray(cols, int))),
                      shape=(len(cons_names), len(var_names)))
    A.sum_duplicates()
    A.sort_indices()
    return Milp(name=name, var_names=var_names, vtype=np.asarray(vtype), lb=np.asarray(lb, float),
                ub=np.asarray(ub, float), obj=np.asarray(obj, float), cons_names=cons_names, A=A,
                lhs=np.asarray(lhs, float), rhs=np.asarray(rhs, float), sense=sense, meta=meta)


# ------------------------------------------------------------------------------------------ bases


def setcover_base(rng: np.random.Generator, nrows: int, ncols: int, density: float, multi: bool) -> Milp:
    """Balas & Ho set cover: min c'x, A x >= b, x binary; every column covers >= 1 row, every row has
    >= 3 columns. `multi` draws demands b in {1, 2} (multi-cover; ours) so that rhs perturbations have room
    and the small preset is not solved to near-optimality within a few seconds."""
    nnz = max(int(nrows * ncols * density), ncols)
    cols = np.concatenate([rng.permutation(ncols), rng.integers(0, ncols, size=nnz - ncols)])
    rows = np.concatenate([np.arange(ncols) % nrows, rng.integers(0, nrows, size=nnz - ncols)])
    rows = rng.permutation(nrows)[rows]
    M = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(nrows, ncols))
    M.data[:] = 1.0
    deg = np.diff(M.indptr)
    extra_r, extra_c = [], []
    for i in np.where(deg < 3)[0]:
        have = set(M.indices[M.indptr[i]:M.indptr[i + 1]])
        for c in rng.permutation(ncols):
            if len(have) >= 3:
                break
            if c not in have:
                have.add(c)
                extra_r.append(i)
                extra_c.append(c)
    M = M + sp.csr_matrix((np.ones(len(extra_r)), (extra_r, extra_c)), shape=(nrows, ncols))
    M.data[:] = 1.0
    M = M.tocoo()
    cost = rng.integers(1, 101, size=ncols).astype(float)
    b = rng.integers(1, 3, size=nrows).astype(float) if multi else np.ones(nrows)
    return _milp("setcover", _names("x", ncols), ["B"] * ncols, np.zeros(ncols), np.ones(ncols), cost,
                 _names("c", nrows), M.row, M.col, M.data, b, np.full(nrows, math.inf), "minimize",
                 {"problem": "setcover"})


def cauction_base(rng: np.random.Generator, n_items: int, n_bids: int) -> Milp:
    """Combinatorial auction (after Leyton-Brown's arbitrary-relationships scheme, simplified): items
    have common values and pairwise compatibilities; each bid grows a bundle by compatibility and bids
    its value with noise. max p'x, each item sold at most once, x binary."""
    values = rng.uniform(1, 100, size=n_items)
    compat = rng.uniform(0, 1, size=(n_items, n_items))
    compat = (compat + compat.T) / 2
    np.fill_diagonal(compat, 0)
    rows, cols, prices = [], [], []
    for b in range(n_bids):
        first = int(rng.integers(n_items))
        bundle = [first]
        while rng.uniform() < 0.65 and len(bundle) < n_items:
            w = compat[bundle].sum(axis=0)
            w[bundle] = 0
            if w.sum() <= 0:
                break
            bundle.append(int(rng.choice(n_items, p=w / w.sum())))
        price = values[bundle].sum() * (1 + rng.uniform(-0.2, 0.5)) + 5 * len(bundle) ** 1.2
        rows.extend(bundle)
        cols.extend([b] * len(bundle))
        prices.append(round(price, 2))
    return _milp("cauction", _names("b", n_bids), ["B"] * n_bids, np.zeros(n_bids), np.ones(n_bids), prices,
                 _names("item", n_items), rows, cols, np.ones(len(rows)), np.full(n_items, -math.inf),
                 np.ones(n_items), "maximize", {"problem": "cauction"})


def facility_base(rng: np.random.Generator, n_customers: int, n_facilities: int, ratio: float = 5.0) -> Milp:
    """Capacitated facility location (Cornuejols, Sridharan & Thizy): y_j open (binary), x_ij amount
    shipped (continuous). min f'y + c'x; sum_j x_ij >= d_i; sum_i x_ij <= s_j y_j; x_ij <= d_i y_j
    (tightening); sum_j s_j y_j >= sum_i d_i."""
    cx, cy = rng.uniform(size=n_customers), rng.uniform(size=n_customers)
    fx, fy = rng.uniform(size=n_facilities), rng.uniform(size=n_facilities)
    d = rng.integers(5, 36, size=n_customers).astype(float)
    s = rng.integers(10, 161, size=n_facilities).astype(float)
    f = (rng.integers(100, 111, size=n_facilities) * np.sqrt(s) + rng.integers(0, 91, size=n_facilities)).round()
    s = np.round(s * ratio * d.sum() / s.sum())
    unit = np.round(np.sqrt((cx[:, None] - fx[None]) ** 2 + (cy[:, None] - fy[None]) ** 2) * 10, 3)
    nC, nF = n_customers, n_facilities
    y_names = _names("y", nF)
    x_names = [f"x{i}_{j}" for i in range(nC) for j in range(nF)]
    names = y_names + x_names
    nv = len(names)
    xi = lambda i, j: nF + i * nF + j  # noqa: E731
    rows, cols, vals, lhs, rhs, cn = [], [], [], [], [], []
    for i in range(nC):  # demand
        r = len(cn)
        cn.append(f"dem{i}")
        for j in range(nF):
            rows.append(r); cols.append(xi(i, j)); vals.append(1.0)
        lhs.append(d[i]); rhs.append(math.inf)
    for j in range(nF):  # capacity
        r = len(cn)
        cn.append(f"cap{j}")
        for i in range(nC):
            rows.append(r); cols.append(xi(i, j)); vals.append(1.0)
        rows.append(r); cols.append(j); vals.append(-s[j])
        lhs.append(-math.inf); rhs.append(0.0)
    r = len(cn)
    cn.append("total")
    for j in range(nF):
        rows.append(r); cols.append(j); vals.append(s[j])
    lhs.append(d.sum()); rhs.append(math.inf)
    for i in range(nC):  # tightening x_ij <= M_ij y_j with M_ij = min(s_j, 2 d_i) (room for rhs changes)
        for j in range(nF):
            r = len(cn)
            cn.append(f"t{i}_{j}")
            rows += [r, r]; cols += [xi(i, j), j]; vals += [1.0, -min(s[j], 2 * d[i])]
            lhs.append(-math.inf); rhs.append(0.0)
    obj = np.concatenate([f, unit.ravel()])
    vt = ["B"] * nF + ["C"] * (nC * nF)
    ub = np.concatenate([np.ones(nF), np.full(nC * nF, math.inf)])
    return _milp("facility", names, vt, np.zeros(nv), ub, obj, cn, rows, cols, vals, lhs, rhs, "minimize",
                 {"problem": "facility", "n_customers": nC, "n_facilities": nF})


def indset_base(rng: np.random.Generator, n_nodes: int, affinity: int) -> Milp:
    """Maximum (weighted) independent set on a Barabasi-Albert graph, with the greedy clique-partition
    formulation of learn2branch: sum_{v in C} x_v <= 1 for each clique C covering the edges."""
    m = affinity
    edges = set()
    degree = np.zeros(n_nodes)
    for u in range(m + 1):
        for v in range(u):
            edges.add((v, u)); degree[u] += 1; degree[v] += 1
    for u in range(m + 1, n_nodes):
        p = degree[:u] / degree[:u].sum()
        nbrs = rng.choice(u, size=m, replace=False, p=p)
        for v in nbrs:
            edges.add((int(v), u)); degree[u] += 1; degree[v] += 1
    adj = [set() for _ in range(n_nodes)]
    for a, b in edges:
        adj[a].add(b); adj[b].add(a)
    remaining = {tuple(e) for e in edges}
    cliques = []
    for v in np.argsort(-degree, kind="stable"):
        v = int(v)
        while True:
            nb = [w for w in adj[v] if (min(v, w), max(v, w)) in remaining]
            if not nb:
                break
            clique = [v]
            for w in sorted(nb, key=lambda w: -degree[w]):
                if all(w in adj[c] for c in clique):
                    clique.append(w)
            for a in clique:
                for b in clique:
                    remaining.discard((min(a, b), max(a, b)))
            cliques.append(sorted(clique))
    rows, cols = [], []
    for r, c in enumerate(cliques):
        rows += [r] * len(c); cols += c
    w = rng.integers(1, 11, size=n_nodes).astype(float)
    return _milp("indset", _names("v", n_nodes), ["B"] * n_nodes, np.zeros(n_nodes), np.ones(n_nodes), w,
                 _names("k", len(cliques)), rows, cols, np.ones(len(rows)), np.full(len(cliques), -math.inf),
                 np.ones(len(cliques)), "maximize", {"problem": "indset"})


def make_base(problem: str, size: str, rng: np.random.Generator, mode: str) -> Milp:
    if problem not in PRESETS:
        raise BadInputError(f"unknown problem {problem!r}; choose from {', '.join(PROBLEMS)}")
    if size not in SIZES:
        raise BadInputError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    kw = PRESETS[problem][size]
    if problem == "setcover":  # multi-cover demands in every mode: unit demands are solved to near-optimality
        return setcover_base(rng, multi=True, **kw)  # within 5 s at the small size, leaving nothing to compare
    if problem == "cauction":
        return cauction_base(rng, **kw)
    if problem == "facility":
        return facility_base(rng, **kw)
    return indset_base(rng, **kw)


# ------------------------------------------------------------------------------------------ perturbations


def _perturb_obj(base: Milp, rng, strength: float) -> Milp:
    m = base.copy()
    sel = base.obj != 0
    new = base.obj * rng.uniform(1 - strength, 1 + strength, size=base.n)
    integral = np.all(base.obj == np.round(base.obj))
    m.obj = np.where(sel, np.maximum(np.round(new) if integral else np.round(new, 3), 1e-3 if not integral else 1),
                     0.0)
    return m


def _perturb_rhs(base: Milp, rng, strength: float) -> Milp:
    m = base.copy()
    p = base.meta["problem"]
    if p == "setcover":  # multi-cover demands b_i in 1..min(3, deg_i - 1)
        deg = np.diff(base.A.indptr)
        sel = rng.uniform(size=base.m) < max(strength, 0.05)
        step = rng.choice([-1.0, 1.0], size=base.m)
        m.lhs = np.where(sel, np.clip(base.lhs + step, 1, np.minimum(3, deg - 1)), base.lhs)
    elif p == "cauction":  # multi-unit supply of items
        sel = rng.uniform(size=base.m) < max(strength, 0.05)
        m.rhs = np.where(sel, base.rhs + rng.integers(1, 3, size=base.m), base.rhs)
    elif p == "facility":  # demands d_i change; the total-demand row follows
        nC = base.meta["n_customers"]
        dem = np.array([n.startswith("dem") for n in base.cons_names])
        d = base.lhs[dem] * rng.uniform(1 - strength, 1 + strength, size=nC)
        m.lhs = base.lhs.copy()
        m.lhs[dem] = np.round(d, 2)
        tot = base.cons_names.index("total")
        m.lhs[tot] = float(np.round(d, 2).sum())
    else:  # indset: a clique constraint may allow 2
        sel = rng.uniform(size=base.m) < max(strength / 2, 0.02)
        m.rhs = np.where(sel & (np.diff(base.A.indptr) > 2), 2.0, base.rhs)
    return m


def _perturb_bnd(base: Milp, rng, strength: float) -> Milp:
    m = base.copy()
    p = base.meta["problem"]
    integ = np.where(base.vtype != "C")[0]
    frac = max(strength / 4, 0.02)
    if p == "setcover":  # some columns unavailable (ub=0) if every row stays coverable; a few forced (lb=1)
        At = base.A.tocsc()
        avail = np.asarray(base.A.sum(axis=1)).ravel()
        for j in rng.permutation(base.n)[: int(frac * base.n)]:
            rws = At.indices[At.indptr[j]:At.indptr[j + 1]]
            if np.all(avail[rws] - 1 >= base.lhs[rws] + 1):
                m.ub[j] = 0.0
                avail[rws] -= 1
        free = np.where(m.ub > 0)[0]
        m.lb[rng.choice(free, size=max(1, int(frac / 4 * base.n)), replace=False)] = 1.0
    elif p == "facility":  # some facilities forced open (always feasible)
        nF = base.meta["n_facilities"]
        m.lb[rng.choice(nF, size=max(1, int(frac * 2 * nF)), replace=False)] = 1.0
    else:  # packing problems: some items/bids/nodes unavailable (always feasible)
        m.ub[rng.choice(integ, size=max(1, int(frac * len(integ))), replace=False)] = 0.0
    return m


def _perturb_mat(base: Milp, rng, strength: float) -> Milp:
    m = base.copy()
    A = base.A.copy().tocsr()
    p = base.meta["problem"]
    sel = rng.uniform(size=A.nnz) < max(strength, 0.05)
    if p == "setcover":  # partial coverage coefficients in [0.5, 1]; rows keep sum >= lhs + 0.5
        new = np.where(sel, np.round(rng.uniform(0.5, 1.0, size=A.nnz), 2), A.data)
        for i in range(A.shape[0]):
            s, e = A.indptr[i], A.indptr[i + 1]
            if new[s:e].sum() < base.lhs[i] + 0.5:
                new[s:e] = A.data[s:e]
        A.data = new
    elif p == "facility":  # capacity-row usage coefficients of shipments
        cap = np.zeros(A.nnz, dtype=bool)
        for i, n in enumerate(base.cons_names):
            if n.startswith("cap"):
                s, e = A.indptr[i], A.indptr[i + 1]
                cap[s:e] = A.data[s:e] > 0
        A.data = np.where(sel & cap, np.round(rng.uniform(1 - strength, 1 + strength, size=A.nnz), 3), A.data)
    else:  # packing: resource use of a bid/node in a row in [1, 1.5] (still <= 1 per row => feasible at 0)
        A.data = np.where(sel, np.round(rng.uniform(0.5, 1.5, size=A.nnz), 2), A.data)
    m.A = A
    return m


def perturb(base: Milp, mode: str, rng: np.random.Generator, strength: float = 0.2) -> Milp:
    """One instance of the series: `base` with component(s) `mode` perturbed afresh."""
    if mode == "obj":
        return _perturb_obj(base, rng, strength)
    if mode == "rhs":
        return _perturb_rhs(base, rng, strength)
    if mode == "bnd":
        return _perturb_bnd(base, rng, strength)
    if mode == "mat":
        return _perturb_mat(base, rng, strength)
    if mode == "mixed":
        m = _perturb_obj(base, rng, strength / 2)
        m = _perturb_rhs(m, rng, strength / 2)
        return _perturb_bnd(m, rng, strength / 2)
    raise BadInputError(f"unknown perturbation mode {mode!r}; choose from {', '.join(MODES)}")


# ------------------------------------------------------------------------------------------ series files


@dataclass
class SeriesSpec:
    problem: str = "setcover"
    mode: str = "rhs"
    size: str = "tiny"
    n_instances: int = 6
    seed: int = 0
    strength: float = 0.2
    timeout: float = 10.0
    gzip: bool = True


def generate_series(spec: SeriesSpec, out_dir: str | os.PathLike) -> dict:
    """Write `n_instances` instances, a MIPcc23-style `.test` file and `manifest.json` (sha256 per file)
    into `out_dir`. Deterministic: the same spec gives byte-identical files."""
    if spec.n_instances < 2:
        raise BadInputError("--instances must be >= 2 (a history and a new instance)")
    if spec.mode not in MODES:
        raise BadInputError(f"unknown perturbation mode {spec.mode!r}; choose from {', '.join(MODES)}")
    if not (0 < spec.strength < 1):
        raise BadInputError("--strength must be in (0, 1)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root = np.random.SeedSequence([spec.seed, PROBLEMS.index(spec.problem) if spec.problem in PROBLEMS else 99,
                                   MODES.index(spec.mode), SIZES.index(spec.size) if spec.size in SIZES else 99])
    base_ss, *inst_ss = root.spawn(spec.n_instances + 1)
    base = make_base(spec.problem, spec.size, np.random.default_rng(base_ss), spec.mode)
    stem = f"{spec.problem}_{spec.mode}_{spec.size}_s{spec.seed}"
    ext = ".mps.gz" if spec.gzip else ".mps"
    files = []
    import hashlib

    for k, ss in enumerate(inst_ss):
        inst = perturb(base, spec.mode, np.random.default_rng(ss), spec.strength)
        inst.name = f"{stem}_{k:03d}"
        data = mps_bytes(inst, spec.gzip)
        path = out / f"{inst.name}{ext}"
        atomic_write_bytes(path, data)
        files.append({"path": path.name, "sha256": hashlib.sha256(data).hexdigest(), "n_vars": inst.n,
                      "n_cons": inst.m})
    varying = {"obj": "objective", "rhs": "rhs", "bnd": "bounds", "mat": "matrix",
               "mixed": "objective rhs bounds"}[spec.mode]
    test_text = f"[TIMEOUT] {spec.timeout:g}\n[VARYING] {varying}\n" + "".join(f"{f['path']}\n" for f in files)
    test_path = out / f"{stem}.test"
    atomic_write_text(test_path, test_text)
    manifest = {"generator": "icml reopt generate", "spec": spec.__dict__, "test_file": test_path.name,
                "instances": files}
    atomic_write_json(out / "manifest.json", manifest)
    return {"test_file": str(test_path), "manifest": str(out / "manifest.json"), "instances": [
        str(out / f["path"]) for f in files], "sha256": [f["sha256"] for f in files], "n_vars": files[0]["n_vars"],
        "n_cons": files[0]["n_cons"]}
