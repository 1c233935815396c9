"""A plain-array MILP (variables, bounds, objective, sparse rows), a deterministic MPS writer and a
PySCIPOpt-backed reader.

Variables and constraints are always matched by *name*: PySCIPOpt may reorder variables after a
write/read round trip (spec, Stage 1).
"""
from __future__ import annotations

import gzip
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file

SUPPORTED_SUFFIXES = (".mps", ".mps.gz", ".lp", ".lp.gz")


@dataclass
class Milp:
    """min/max c'x s.t. lhs <= A x <= rhs, lb <= x <= ub, x_j integer for vtype in {B, I}."""

    name: str
    var_names: list
    vtype: np.ndarray          # array of 'B' | 'I' | 'C'
    lb: np.ndarray
    ub: np.ndarray
    obj: np.ndarray
    cons_names: list
    A: sp.csr_matrix
    lhs: np.ndarray
    rhs: np.ndarray
    sense: str = "minimize"
    obj_offset: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.var_names)

    @property
    def m(self) -> int:
        return len(self.cons_names)

    def copy(self) -> "Milp":
        return Milp(self.name, list(self.var_names), self.vtype.copy(), self.lb.copy(), self.ub.copy(),
                    self.obj.copy(), list(self.cons_names), self.A.copy(), self.lhs.copy(), self.rhs.copy(),
                    self.sense, self.obj_offset, dict(self.meta))

    def objective(self, x: np.ndarray) -> float:
        return float(self.obj @ x + self.obj_offset)

    def violation(self, x: np.ndarray, tol: float = 1e-6) -> float:
        """Largest bound, row or integrality violation of `x` (0 when feasible)."""
        ax = self.A @ x
        v = [0.0, float(np.max(self.lb - x, initial=0)), float(np.max(x - self.ub, initial=0)),
             float(np.max(self.lhs - ax, initial=0)), float(np.max(ax - self.rhs, initial=0))]
        integ = self.vtype != "C"
        if integ.any():
            v.append(float(np.max(np.abs(x[integ] - np.round(x[integ])), initial=0)))
        return max(v)


def check_instance_path(path: str | os.PathLike) -> Path:
    p = check_input_file(path, allow_empty=True)
    if not any(p.name.lower().endswith(s) for s in SUPPORTED_SUFFIXES):
        raise BadInputError(f"{p}: unsupported file type; use .mps, .mps.gz or .lp")
    return p


# ------------------------------------------------------------------------------------------ writing


def _fmt(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def mps_text(milp: Milp) -> str:
    """Free-format MPS text (deterministic: same Milp, same bytes). Every bound is written explicitly."""
    out = io.StringIO()
    w = out.write
    w(f"NAME {milp.name}\n")
    w("OBJSENSE\n    " + ("MAX" if milp.sense == "maximize" else "MIN") + "\n")
    w("ROWS\n N  obj\n")
    kinds = []
    for i, name in enumerate(milp.cons_names):
        lo, hi = milp.lhs[i], milp.rhs[i]
        if np.isfinite(lo) and np.isfinite(hi) and lo == hi:
            k = "E"
        elif np.isfinite(hi) and not np.isfinite(lo):
            k = "L"
        elif np.isfinite(lo) and not np.isfinite(hi):
            k = "G"
        elif np.isfinite(lo) and np.isfinite(hi):
            k = "R"  # ranged: written as G lo with range hi - lo
        else:
            k = "N"
        kinds.append(k)
        w(f" {'G' if k == 'R' else ('N' if k == 'N' else k)}  {name}\n")
    w("COLUMNS\n")
    At = milp.A.tocsc()
    integ_open = False
    for j, vname in enumerate(milp.var_names):
        is_int = milp.vtype[j] != "C"
        if is_int and not integ_open:
            w("    MARKER 'MARKER' 'INTORG'\n")
            integ_open = True
        elif not is_int and integ_open:
            w("    MARKER 'MARKER' 'INTEND'\n")
            integ_open = False
        entries = []
        if milp.obj[j] != 0:
            entries.append(("obj", milp.obj[j]))
        s, e = At.indptr[j], At.indptr[j + 1]
        for i, a in zip(At.indices[s:e], At.data[s:e]):
            if a != 0:
                entries.append((milp.cons_names[i], a))
        if not entries:
            entries.append(("obj", 0.0))
        for r, a in entries:
            w(f"    {vname} {r} {_fmt(a)}\n")
    if integ_open:
        w("    MARKER 'MARKER' 'INTEND'\n")
    w("RHS\n")
    if milp.obj_offset != 0:
        w(f"    RHS obj {_fmt(-milp.obj_offset)}\n")
    for i, name in enumerate(milp.cons_names):
        k = kinds[i]
        val = milp.rhs[i] if k in ("E", "L") else milp.lhs[i] if k in ("G", "R") else 0.0
        if val != 0:
            w(f"    RHS {name} {_fmt(val)}\n")
    if "R" in kinds:
        w("RANGES\n")
        for i, name in enumerate(milp.cons_names):
            if kinds[i] == "R":
                w(f"    RNG {name} {_fmt(milp.rhs[i] - milp.lhs[i])}\n")
    w("BOUNDS\n")
    for j, vname in enumerate(milp.var_names):
        lo, hi = milp.lb[j], milp.ub[j]
        if milp.vtype[j] == "B" and lo == 0 and hi == 1:
            w(f" BV BND {vname}\n")
            continue
        if lo == hi:
            w(f" FX BND {vname} {_fmt(lo)}\n")
            continue
        if not np.isfinite(lo) and not np.isfinite(hi):
            w(f" FR BND {vname}\n")
            continue
        w(f" MI BND {vname}\n" if not np.isfinite(lo) else f" LO BND {vname} {_fmt(lo)}\n")
        w(f" PL BND {vname}\n" if not np.isfinite(hi) else f" UP BND {vname} {_fmt(hi)}\n")
    w("ENDATA\n")
    return out.getvalue()


def mps_bytes(milp: Milp, gz: bool) -> bytes:
    data = mps_text(milp).encode("ascii")
    if not gz:
        return data
    buf = io.BytesIO()
    # mtime=0 and no file name: the same instance gives the same bytes (same sha256) on every run
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as f:
        f.write(data)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ reading


def new_model(verbose: bool = False):
    from pyscipopt import Model

    m = Model()
    if not verbose:
        m.hideOutput()
    return m


def read_model(path: str | os.PathLike, verbose: bool = False):
    """A fresh PySCIPOpt model read from `path` (errors name the file)."""
    p = check_instance_path(path)
    m = new_model(verbose)
    try:
        m.readProblem(str(p))
    except Exception as e:  # SCIP raises a bare Exception / OSError on parse errors
        raise BadInputError(f"{p}: SCIP could not read this file ({type(e).__name__}: {str(e)[:120]})") from None
    if m.getNVars() == 0:
        raise BadInputError(f"{p}: the model has no variables")
    return m


def milp_from_model(model, name: str = "model") -> Milp:
    """Extract arrays from a PySCIPOpt model in problem stage (linear constraints only)."""
    vars_ = model.getVars()
    names = [v.name for v in vars_]
    index = {n: j for j, n in enumerate(names)}
    vt = np.array([{"BINARY": "B", "INTEGER": "I", "IMPLINT": "C", "CONTINUOUS": "C"}.get(v.vtype(), "C")
                   for v in vars_])
    inf = model.infinity()

    def _b(x):
        return -math.inf if x <= -inf else (math.inf if x >= inf else float(x))

    lb = np.array([_b(v.getLbOriginal()) for v in vars_], dtype=float)
    ub = np.array([_b(v.getUbOriginal()) for v in vars_], dtype=float)
    obj = np.array([v.getObj() for v in vars_], dtype=float)
    rows, cols, vals, lhs, rhs, cnames = [], [], [], [], [], []
    for i, c in enumerate(model.getConss()):
        if c.getConshdlrName() != "linear":
            raise BadInputError(f"{name}: constraint {c.name!r} is of type {c.getConshdlrName()!r}; "
                                "only linear constraints are supported for feature extraction")
        coefs = model.getValsLinear(c)
        r = len(cnames)
        for vn, a in coefs.items():
            rows.append(r)
            cols.append(index[vn])
            vals.append(a)
        lhs.append(_b(model.getLhs(c)))
        rhs.append(_b(model.getRhs(c)))
        cnames.append(c.name)
    A = sp.csr_matrix((np.array(vals, dtype=float), (np.array(rows, dtype=int), np.array(cols, dtype=int))),
                      shape=(len(cnames), len(names)))
    A.sum_duplicates()
    return Milp(name=name, var_names=names, vtype=vt, lb=lb, ub=ub, obj=obj, cons_names=cnames, A=A,
                lhs=np.array(lhs, dtype=float), rhs=np.array(rhs, dtype=float),
                sense=model.getObjectiveSense(), obj_offset=float(model.getObjoffset()))


def read_milp(path: str | os.PathLike) -> Milp:
    return milp_from_model(read_model(path), name=str(path))


def sorted_by_name(milp: Milp) -> Milp:
    """The same MILP with variables and constraints sorted by name (for comparisons across files)."""
    vo = np.argsort(np.array(milp.var_names, dtype=object).astype(str), kind="stable")
    co = np.argsort(np.array(milp.cons_names, dtype=object).astype(str), kind="stable")
    A = milp.A[co][:, vo].tocsr()
    A.sort_indices()
    return Milp(milp.name, [milp.var_names[j] for j in vo], milp.vtype[vo], milp.lb[vo], milp.ub[vo],
                milp.obj[vo], [milp.cons_names[i] for i in co], A, milp.lhs[co], milp.rhs[co], milp.sense,
                milp.obj_offset, dict(milp.meta))


def changed_components(a: Milp, b: Milp, tol: float = 1e-9) -> set:
    """Which of {obj, rhs, bnd, mat, vars, cons, sense} differ between two MILPs (matched by name)."""
    out = set()
    if sorted(a.var_names) != sorted(b.var_names):
        return {"vars"}
    if sorted(a.cons_names) != sorted(b.cons_names):
        return {"cons"}
    a, b = sorted_by_name(a), sorted_by_name(b)

    def diff(x, y):
        x, y = np.asarray(x, float), np.asarray(y, float)
        same_inf = (np.isinf(x) & np.isinf(y) & (np.sign(x) == np.sign(y)))
        with np.errstate(invalid="ignore"):
            d = np.nan_to_num(np.abs(x - y), nan=np.inf)
        return bool(np.any(~same_inf & ~(d <= tol)))

    if a.sense != b.sense:
        out.add("sense")
    if diff(a.obj, b.obj) or abs(a.obj_offset - b.obj_offset) > tol:
        out.add("obj")
    if diff(a.lhs, b.lhs) or diff(a.rhs, b.rhs):
        out.add("rhs")
    if diff(a.lb, b.lb) or diff(a.ub, b.ub) or list(a.vtype) != list(b.vtype):
        out.add("bnd")
    if (a.A != b.A).nnz > 0 and abs(a.A - b.A).max() > tol:
        out.add("mat")
    return out
