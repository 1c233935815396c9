"""Offline instance-series generators (own numpy code after the learn2branch / Ecole schemes) and
perturbation modes obj | rhs | bnd | mat | mixed (spec: the MIPcc23-style series VP-OR is evaluated on).

Each problem family is a small class in `FAMILIES` (base builder, size presets, its rhs / bnd / mat
perturbations). Each instance of a series is the base instance with the declared component perturbed
afresh (not cumulatively), so "only the declared component changes" holds between any two instances.
Random streams: `derive(seed, "reopt", "generate", problem, mode, size)`, child "base" for the base
instance and ("instance", k) for instance k, so any instance can be rebuilt alone.
"""
from __future__ import annotations

import abc
import hashlib
import math
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_write_bytes, atomic_write_json, atomic_write_text
from icmltools.core.seed import Stream, derive

from .milp import Milp, mps_bytes
from .options import MODES, PROBLEMS, SIZES, SeriesSpec  # noqa: F401  (re-exported)


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


class _Rows:
    """Rows of a MILP under construction: (row, column, value) triplets and row bounds, by name."""

    def __init__(self):
        self.rows, self.cols, self.vals, self.lhs, self.rhs, self.names = [], [], [], [], [], []

    def add(self, name: str, cols, vals, lo: float = -math.inf, hi: float = math.inf) -> None:
        r = len(self.names)
        cols = list(cols)
        self.names.append(name)
        self.rows += [r] * len(cols)
        self.cols += cols
        self.vals += list(vals)
        self.lhs.append(lo)
        self.rhs.append(hi)


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
    names = _names("y", nF) + [f"x{i}_{j}" for i in range(nC) for j in range(nF)]
    xi = lambda i, j: nF + i * nF + j  # noqa: E731
    rows = _Rows()
    for i in range(nC):  # demand
        rows.add(f"dem{i}", [xi(i, j) for j in range(nF)], [1.0] * nF, lo=d[i])
    for j in range(nF):  # capacity
        rows.add(f"cap{j}", [xi(i, j) for i in range(nC)] + [j], [1.0] * nC + [-s[j]], hi=0.0)
    rows.add("total", range(nF), s, lo=d.sum())
    for i in range(nC):  # tightening x_ij <= M_ij y_j with M_ij = min(s_j, 2 d_i) (room for rhs changes)
        for j in range(nF):
            rows.add(f"t{i}_{j}", [xi(i, j), j], [1.0, -min(s[j], 2 * d[i])], hi=0.0)
    obj = np.concatenate([f, unit.ravel()])
    vt = ["B"] * nF + ["C"] * (nC * nF)
    ub = np.concatenate([np.ones(nF), np.full(nC * nF, math.inf)])
    return _milp("facility", names, vt, np.zeros(len(names)), ub, obj, rows.names, rows.rows, rows.cols, rows.vals,
                 rows.lhs, rows.rhs, "minimize", {"problem": "facility", "n_customers": nC, "n_facilities": nF})


def _barabasi_albert(rng: np.random.Generator, n_nodes: int, m: int):
    """Edges (v < u) and degrees of a Barabasi-Albert graph: a clique on m + 1 nodes, then each new node
    links to m distinct earlier nodes drawn proportionally to their degree."""
    edges = set()
    degree = np.zeros(n_nodes)

    def link(v: int, u: int) -> None:
        edges.add((v, u))
        degree[u] += 1
        degree[v] += 1

    for u in range(m + 1):
        for v in range(u):
            link(v, u)
    for u in range(m + 1, n_nodes):
        p = degree[:u] / degree[:u].sum()
        for v in rng.choice(u, size=m, replace=False, p=p):
            link(int(v), u)
    return edges, degree


def _clique_partition(n_nodes: int, edges: set, degree: np.ndarray) -> list:
    """Greedy clique cover of the edges (learn2branch): from the highest-degree node, grow cliques of
    not-yet-covered edges, neighbours by decreasing degree."""
    adj = [set() for _ in range(n_nodes)]
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    remaining = set(edges)
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
    return cliques


def indset_base(rng: np.random.Generator, n_nodes: int, affinity: int) -> Milp:
    """Maximum (weighted) independent set on a Barabasi-Albert graph, with the greedy clique-partition
    formulation of learn2branch: sum_{v in C} x_v <= 1 for each clique C covering the edges."""
    edges, degree = _barabasi_albert(rng, n_nodes, affinity)
    cliques = _clique_partition(n_nodes, edges, degree)
    rows = _Rows()
    for name, c in zip(_names("k", len(cliques)), cliques):
        rows.add(name, c, np.ones(len(c)), hi=1.0)
    w = rng.integers(1, 11, size=n_nodes).astype(float)
    return _milp("indset", _names("v", n_nodes), ["B"] * n_nodes, np.zeros(n_nodes), np.ones(n_nodes), w,
                 rows.names, rows.rows, rows.cols, rows.vals, rows.lhs, rows.rhs, "maximize", {"problem": "indset"})


# ------------------------------------------------------------------------------------------ perturbations


def _perturb_obj(m: Milp, base: Milp, rng, strength: float) -> None:
    """Objective coefficients times U(1 - strength, 1 + strength), rounded, zeros kept (every family)."""
    sel = base.obj != 0
    new = base.obj * rng.uniform(1 - strength, 1 + strength, size=base.n)
    integral = np.all(base.obj == np.round(base.obj))
    m.obj = np.where(sel, np.maximum(np.round(new) if integral else np.round(new, 3), 1e-3 if not integral else 1),
                     0.0)


class Family(abc.ABC):
    """A problem family: its size presets, its base instance, and how its rhs, bounds and matrix are
    perturbed. The perturbations change `m`, a copy of `base`, in place."""

    name = ""
    presets: dict = {}
    builder = None  # the base-instance function, called with a numpy Generator and a preset's keywords

    def base(self, rng: np.random.Generator, **preset) -> Milp:
        return type(self).builder(rng, **preset)

    @abc.abstractmethod
    def rhs(self, m: Milp, base: Milp, rng, strength: float) -> None:
        """Perturb the right-hand sides of `m` (mode `rhs`)."""

    @abc.abstractmethod
    def bnd(self, m: Milp, base: Milp, rng, strength: float) -> None:
        """Perturb the variable bounds of `m` (mode `bnd`)."""

    def mat(self, m: Milp, base: Milp, rng, strength: float) -> None:
        """Each nonzero is drawn with probability max(strength, 0.05); `coefficients` gives the new values."""
        A = base.A.copy().tocsr()
        sel = rng.uniform(size=A.nnz) < max(strength, 0.05)
        A.data = self.coefficients(A, sel, base, rng, strength)
        m.A = A

    @abc.abstractmethod
    def coefficients(self, A, sel: np.ndarray, base: Milp, rng, strength: float) -> np.ndarray:
        """The new values of A's nonzeros (`sel` marks the ones to change)."""


def _bnd_fraction(strength: float) -> float:
    return max(strength / 4, 0.02)


class SetCover(Family):
    name = "setcover"
    # tiny solves << 1 s (tests); small is what the benchmark uses; medium is harder
    presets = {"tiny": dict(nrows=60, ncols=120, density=0.08), "small": dict(nrows=500, ncols=1000, density=0.05),
               "medium": dict(nrows=1000, ncols=2000, density=0.05)}

    def base(self, rng, **preset):
        # multi-cover demands in every mode: unit demands are solved to near-optimality within 5 s at the
        # small size, leaving nothing to compare
        return setcover_base(rng, multi=True, **preset)

    def rhs(self, m, base, rng, strength):
        """Multi-cover demands b_i move by +-1 within 1..min(3, deg_i - 1)."""
        deg = np.diff(base.A.indptr)
        sel = rng.uniform(size=base.m) < max(strength, 0.05)
        step = rng.choice([-1.0, 1.0], size=base.m)
        m.lhs = np.where(sel, np.clip(base.lhs + step, 1, np.minimum(3, deg - 1)), base.lhs)

    def bnd(self, m, base, rng, strength):
        """Some columns unavailable (ub = 0) if every row stays coverable; a few forced (lb = 1)."""
        frac = _bnd_fraction(strength)
        At = base.A.tocsc()
        avail = np.asarray(base.A.sum(axis=1)).ravel()
        for j in rng.permutation(base.n)[: int(frac * base.n)]:
            rws = At.indices[At.indptr[j]:At.indptr[j + 1]]
            if np.all(avail[rws] - 1 >= base.lhs[rws] + 1):
                m.ub[j] = 0.0
                avail[rws] -= 1
        free = np.where(m.ub > 0)[0]
        m.lb[rng.choice(free, size=max(1, int(frac / 4 * base.n)), replace=False)] = 1.0

    def coefficients(self, A, sel, base, rng, strength):
        """Partial coverage coefficients in [0.5, 1]; a row keeps its coefficient sum >= lhs + 0.5."""
        new = np.where(sel, np.round(rng.uniform(0.5, 1.0, size=A.nnz), 2), A.data)
        for i in range(A.shape[0]):
            s, e = A.indptr[i], A.indptr[i + 1]
            if new[s:e].sum() < base.lhs[i] + 0.5:
                new[s:e] = A.data[s:e]
        return new


class Facility(Family):
    name = "facility"
    presets = {"tiny": dict(n_customers=15, n_facilities=8), "small": dict(n_customers=100, n_facilities=100),
               "medium": dict(n_customers=200, n_facilities=100)}
    builder = facility_base

    def rhs(self, m, base, rng, strength):
        """Demands d_i times U(1 - strength, 1 + strength); the total-demand row follows."""
        dem = np.array([n.startswith("dem") for n in base.cons_names])
        d = np.round(base.lhs[dem] * rng.uniform(1 - strength, 1 + strength, size=base.meta["n_customers"]), 2)
        m.lhs = base.lhs.copy()
        m.lhs[dem] = d
        m.lhs[base.cons_names.index("total")] = float(d.sum())

    def bnd(self, m, base, rng, strength):
        """Some facilities forced open (always feasible); at least 2, so that a tiny series (8 facilities)
        has 28 possible instances rather than 8 (with 1, instances of one series often coincided)."""
        nF = base.meta["n_facilities"]
        m.lb[rng.choice(nF, size=min(nF, max(2, int(_bnd_fraction(strength) * 2 * nF))), replace=False)] = 1.0

    def coefficients(self, A, sel, base, rng, strength):
        """Capacity-row usage coefficients of shipments times U(1 - strength, 1 + strength)."""
        cap = np.zeros(A.nnz, dtype=bool)
        for i, n in enumerate(base.cons_names):
            if n.startswith("cap"):
                s, e = A.indptr[i], A.indptr[i + 1]
                cap[s:e] = A.data[s:e] > 0
        return np.where(sel & cap, np.round(rng.uniform(1 - strength, 1 + strength, size=A.nnz), 3), A.data)


class _Packing(Family):
    """Packing families (at most one unit per row): bounds and matrix perturbed the same way."""

    def bnd(self, m, base, rng, strength):
        """Some items / bids / nodes unavailable (ub = 0; always feasible)."""
        integ = np.where(base.vtype != "C")[0]
        m.ub[rng.choice(integ, size=max(1, int(_bnd_fraction(strength) * len(integ))), replace=False)] = 0.0

    def coefficients(self, A, sel, base, rng, strength):
        """Resource use of a bid / node in a row in [0.5, 1.5] (x = 0 stays feasible)."""
        return np.where(sel, np.round(rng.uniform(0.5, 1.5, size=A.nnz), 2), A.data)


class CombAuction(_Packing):
    name = "cauction"
    presets = {"tiny": dict(n_items=20, n_bids=60), "small": dict(n_items=100, n_bids=500),
               "medium": dict(n_items=200, n_bids=1000)}
    builder = cauction_base

    def rhs(self, m, base, rng, strength):
        """Multi-unit supply: some items get 1 or 2 more units."""
        sel = rng.uniform(size=base.m) < max(strength, 0.05)
        m.rhs = np.where(sel, base.rhs + rng.integers(1, 3, size=base.m), base.rhs)


class IndSet(_Packing):
    name = "indset"
    presets = {"tiny": dict(n_nodes=60, affinity=4), "small": dict(n_nodes=500, affinity=4),
               "medium": dict(n_nodes=1000, affinity=4)}
    builder = indset_base

    def rhs(self, m, base, rng, strength):
        """Some clique constraints (of more than 2 nodes) allow 2."""
        sel = rng.uniform(size=base.m) < max(strength / 2, 0.02)
        m.rhs = np.where(sel & (np.diff(base.A.indptr) > 2), 2.0, base.rhs)


FAMILIES = {f.name: f for f in (SetCover(), CombAuction(), Facility(), IndSet())}


def make_base(problem: str, size: str, rng: np.random.Generator) -> Milp:
    """The base instance of `problem` at size preset `size`."""
    if problem not in FAMILIES:
        raise BadInputError(f"unknown {problem!r}; choose from {', '.join(PROBLEMS)}", param="problem")
    family = FAMILIES[problem]
    if size not in family.presets:
        raise BadInputError(f"unknown {size!r}; choose from {', '.join(SIZES)}", param="size")
    return family.base(rng, **family.presets[size])


def _steps(family: Family, mode: str, strength: float) -> list:
    plans = {"obj": [(_perturb_obj, strength)], "rhs": [(family.rhs, strength)], "bnd": [(family.bnd, strength)],
             "mat": [(family.mat, strength)],
             "mixed": [(_perturb_obj, strength / 2), (family.rhs, strength / 2), (family.bnd, strength / 2)]}
    if mode not in plans:
        raise BadInputError(f"unknown {mode!r}; choose from {', '.join(MODES)}", param="mode")
    return plans[mode]


def perturb(base: Milp, mode: str, rng: np.random.Generator, strength: float = 0.2) -> Milp:
    """One instance of the series: `base` with component(s) `mode` perturbed afresh (`mixed`: objective,
    then rhs, then bounds, each at half the strength)."""
    m = base
    for step, s in _steps(FAMILIES[base.meta["problem"]], mode, strength):
        nxt = m.copy()
        step(nxt, m, rng, s)
        m = nxt
    return m


# ------------------------------------------------------------------------------------------ series files


def series_stream(spec: SeriesSpec) -> Stream:
    """The root random stream of a generated series."""
    return derive(spec.seed, "reopt", "generate", spec.problem, spec.mode, spec.size)


def series_base(spec: SeriesSpec) -> Milp:
    """The base instance of the series (stream child "base")."""
    return make_base(spec.problem, spec.size, series_stream(spec).child("base").numpy())


def series_instance(spec: SeriesSpec, k: int, base: Milp | None = None) -> Milp:
    """Instance k of the series, named `<stem>_<k:03d>` (stream child ("instance", k)): the same whether
    it is built alone or inside `generate_series`."""
    base = series_base(spec) if base is None else base
    inst = perturb(base, spec.mode, series_stream(spec).child("instance", k).numpy(), spec.strength)
    inst.name = f"{series_stem(spec)}_{k:03d}"
    return inst


def series_stem(spec: SeriesSpec) -> str:
    return f"{spec.problem}_{spec.mode}_{spec.size}_s{spec.seed}"


VARYING = {"obj": "objective", "rhs": "rhs", "bnd": "bounds", "mat": "matrix", "mixed": "objective rhs bounds"}


def _write_instance(inst: Milp, out: Path, gz: bool) -> dict:
    data = mps_bytes(inst, gz)
    path = out / f"{inst.name}{'.mps.gz' if gz else '.mps'}"
    atomic_write_bytes(path, data)
    return {"path": path.name, "sha256": hashlib.sha256(data).hexdigest(), "n_vars": inst.n, "n_cons": inst.m}


def generate_series(spec: SeriesSpec, out_dir: str | os.PathLike) -> dict:
    """Write `n_instances` instances, a MIPcc23-style `.test` file (`[TIMEOUT]`, `[VARYING]`, the paths) and
    `manifest.json` (sha256 per file) into `out_dir`. Deterministic: the same spec gives byte-identical files."""
    spec.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = series_base(spec)
    files = [_write_instance(series_instance(spec, k, base), out, spec.gzip) for k in range(spec.n_instances)]
    test_path = out / f"{series_stem(spec)}.test"
    atomic_write_text(test_path, f"[TIMEOUT] {spec.timeout:g}\n[VARYING] {VARYING[spec.mode]}\n"
                      + "".join(f"{f['path']}\n" for f in files))
    manifest = {"generator": "icml reopt generate", "spec": asdict(spec), "test_file": test_path.name,
                "instances": files}
    atomic_write_json(out / "manifest.json", manifest)
    return {"test_file": str(test_path), "manifest": str(out / "manifest.json"),
            "instances": [str(out / f["path"]) for f in files], "sha256": [f["sha256"] for f in files],
            "n_vars": files[0]["n_vars"], "n_cons": files[0]["n_cons"]}
