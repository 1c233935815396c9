"""A plain-array MILP (variables, bounds, objective, sparse rows), a deterministic MPS writer and a
PySCIPOpt-backed reader.

Variables and constraints are always matched by *name*: PySCIPOpt may reorder variables after a
write/read round trip (spec, Stage 1).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file

SUPPORTED_SUFFIXES = (".mps", ".mps.gz", ".lp", ".lp.gz")

log = logging.getLogger(__name__)


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


def _row_kind(lo: float, hi: float) -> str:
    """E (lo == hi), L (hi only), G (lo only), R (ranged: written as G lo with range hi - lo) or N (free)."""
    fin_lo, fin_hi = bool(np.isfinite(lo)), bool(np.isfinite(hi))
    if fin_lo and fin_hi:
        return "E" if lo == hi else "R"
    return "L" if fin_hi else "G" if fin_lo else "N"


def _rows_section(milp: Milp, kinds: list) -> list:
    lines = ["ROWS", " N  obj"]
    lines += [f" {'G' if k == 'R' else k}  {name}" for k, name in zip(kinds, milp.cons_names)]
    return lines


def _column_entries(milp: Milp, At, j: int) -> list:
    """(row, coefficient) of column j: the objective first, then its nonzero rows (at least one entry)."""
    entries = [("obj", milp.obj[j])] if milp.obj[j] != 0 else []
    s, e = At.indptr[j], At.indptr[j + 1]
    entries += [(milp.cons_names[i], a) for i, a in zip(At.indices[s:e], At.data[s:e]) if a != 0]
    return entries or [("obj", 0.0)]


def _columns_section(milp: Milp) -> list:
    """COLUMNS, with integer variables between INTORG/INTEND markers."""
    lines = ["COLUMNS"]
    At = milp.A.tocsc()
    integ_open = False
    for j, vname in enumerate(milp.var_names):
        is_int = milp.vtype[j] != "C"
        if is_int != integ_open:
            lines.append("    MARKER 'MARKER' " + ("'INTORG'" if is_int else "'INTEND'"))
            integ_open = is_int
        lines += [f"    {vname} {r} {_fmt(a)}" for r, a in _column_entries(milp, At, j)]
    if integ_open:
        lines.append("    MARKER 'MARKER' 'INTEND'")
    return lines


def _rhs_section(milp: Milp, kinds: list) -> list:
    """RHS (the objective offset as -offset on the objective row), then RANGES for ranged rows."""
    lines = ["RHS"]
    if milp.obj_offset != 0:
        lines.append(f"    RHS obj {_fmt(-milp.obj_offset)}")
    for k, name, lo, hi in zip(kinds, milp.cons_names, milp.lhs, milp.rhs):
        val = hi if k in ("E", "L") else lo if k in ("G", "R") else 0.0
        if val != 0:
            lines.append(f"    RHS {name} {_fmt(val)}")
    if "R" in kinds:
        lines.append("RANGES")
        lines += [f"    RNG {name} {_fmt(hi - lo)}"
                  for k, name, lo, hi in zip(kinds, milp.cons_names, milp.lhs, milp.rhs) if k == "R"]
    return lines


def _bound_lines(vname: str, vtype: str, lo: float, hi: float) -> list:
    """Explicit bounds of one variable: BV, FX, FR, or a lower (LO/MI) and an upper (UP/PL) line."""
    if vtype == "B" and lo == 0 and hi == 1:
        return [f" BV BND {vname}"]
    if lo == hi:
        return [f" FX BND {vname} {_fmt(lo)}"]
    if not np.isfinite(lo) and not np.isfinite(hi):
        return [f" FR BND {vname}"]
    return [f" MI BND {vname}" if not np.isfinite(lo) else f" LO BND {vname} {_fmt(lo)}",
            f" PL BND {vname}" if not np.isfinite(hi) else f" UP BND {vname} {_fmt(hi)}"]


def mps_text(milp: Milp) -> str:
    """Free-format MPS text (deterministic: same Milp, same bytes). Every bound is written explicitly."""
    kinds = [_row_kind(lo, hi) for lo, hi in zip(milp.lhs, milp.rhs)]
    lines = [f"NAME {milp.name}", "OBJSENSE", "    " + ("MAX" if milp.sense == "maximize" else "MIN")]
    lines += _rows_section(milp, kinds) + _columns_section(milp) + _rhs_section(milp, kinds)
    lines.append("BOUNDS")
    for j, vname in enumerate(milp.var_names):
        lines += _bound_lines(vname, milp.vtype[j], milp.lb[j], milp.ub[j])
    lines.append("ENDATA")
    return "\n".join(lines) + "\n"


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

    _relay_scip_errors()
    m = Model()
    if not verbose:
        m.hideOutput()
    return m


# SCIP prints its errors from C (`[reader_mps.c:402] ERROR: ...`) through one process-wide error printer,
# even when a model's output is hidden. PySCIPOpt's `redirectOutput` points that printer at Python's
# sys.stderr; `scip_errors` then collects those lines instead of letting them reach the terminal, and the
# caller turns them into one error message.
_RELAYED = False
_SCIP_ERROR = re.compile(r"^\[[\w.+-]+:\d+\] ERROR: ")
_RETCODE_LINE = re.compile(r"^Error <-?\d+> in function call$")


def _relay_scip_errors() -> None:
    global _RELAYED
    if _RELAYED:
        return
    from pyscipopt import Model

    relay = Model()
    relay.hideOutput()
    relay.redirectOutput()  # sets the process-wide error printer to write to Python's sys.stderr
    _RELAYED = True


class _ErrorSink:
    """A sys.stderr stand-in: SCIP error lines are kept in `lines`, everything else passes through."""

    def __init__(self, real):
        self.real, self.lines, self._pending = real, [], ""

    def write(self, s: str) -> int:
        if self._pending or _SCIP_ERROR.match(s):
            self._pending += s
            *done, self._pending = self._pending.split("\n")
            self.lines += [_SCIP_ERROR.sub("", ln).strip() for ln in done if ln.strip()]
            return len(s)
        return self.real.write(s)

    def close_pending(self) -> None:
        if self._pending.strip():
            self.lines.append(_SCIP_ERROR.sub("", self._pending).strip())
        self._pending = ""

    def __getattr__(self, name):
        return getattr(self.real, name)


@contextlib.contextmanager
def scip_errors():
    """Collect SCIP's C-level error messages printed inside the block (yields the list of messages,
    file/line prefixes removed) instead of letting them reach stderr."""
    _relay_scip_errors()
    sink = _ErrorSink(sys.stderr)
    try:
        with contextlib.redirect_stderr(sink):
            yield sink.lines
    finally:
        sink.close_pending()
        for ln in sink.lines:
            log.debug("SCIP: %s", ln)


@contextlib.contextmanager
def c_stdout_captured(echo: bool = False):
    """What C code prints on stdout (fd 1) inside the block goes to a temporary file, read back as the
    yielded object's `text` when the block ends, and passed on to stdout then when `echo`. SCIP's Ctrl-C
    handler prints 'pressed CTRL-C 1 times ...' there even when the model's output is hidden, and that line
    is the only trace of a Ctrl-C that SCIP caught after its last check (the solve then ends as if none had
    come: `budget.optimize` looks for it). C buffers are flushed on both sides, so nothing printed inside
    comes out later. A file, not a pipe: SCIP holds the GIL while it solves, so no thread could drain a
    pipe, and a verbose solve would block on a full one."""
    import ctypes
    import tempfile
    import types

    fflush = ctypes.CDLL(None).fflush  # looked up before the block: a first lookup runs Python code
    fflush(None)
    out = types.SimpleNamespace(text="")
    with tempfile.TemporaryFile() as f:
        saved = os.dup(1)
        try:
            os.dup2(f.fileno(), 1)
            yield out
        finally:
            # Ctrl-C can be raised after any call returns: stdout is put back in the innermost block, whose
            # first call does it (with the flush first, a test once lost its stdout: fd 1 left on this file)
            try:
                fflush(None)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
        f.seek(0)
        raw = f.read()
        out.text = raw.decode("utf-8", "replace")
        view = memoryview(raw) if echo else memoryview(b"")
        while view:  # a pipe or terminal may take part of it at a time
            view = view[os.write(1, view):]


def scip_reason(errors: list, exc: BaseException | None = None) -> str:
    """The most telling of SCIP's error messages (not the 'Error <-9> in function call' trail)."""
    telling = [e for e in errors if not _RETCODE_LINE.match(e)]
    if telling:
        return telling[0]
    return f"{type(exc).__name__}: {str(exc)[:160]}" if exc is not None else "unknown SCIP error"


def check_numbers(model, path) -> None:
    """Refuse NaN anywhere and infinities where they mean nothing (objective and matrix coefficients, a
    lower bound or lhs of +inf, an upper bound or rhs of -inf): SCIP reads `nan` and solves as if the row
    or bound were absent. Infinite bounds and sides (no bound) are fine."""
    inf = model.infinity()
    for v in model.getVars():
        o, lb, ub = v.getObj(), v.getLbOriginal(), v.getUbOriginal()
        if not (abs(o) < inf):
            raise BadInputError(f"{path}: variable {v.name!r} has objective coefficient {o:g}")
        if math.isnan(lb) or math.isnan(ub) or lb >= inf or ub <= -inf:
            raise BadInputError(f"{path}: variable {v.name!r} has bounds [{lb:g}, {ub:g}]")
    for c in model.getConss():
        if c.getConshdlrName() != "linear":
            continue
        lhs, rhs = model.getLhs(c), model.getRhs(c)
        if math.isnan(lhs) or math.isnan(rhs) or lhs >= inf or rhs <= -inf:
            raise BadInputError(f"{path}: constraint {c.name!r} has sides [{lhs:g}, {rhs:g}]")
        vals = model.getValsLinear(c)
        a = np.fromiter(vals.values(), dtype=float, count=len(vals))
        if not np.all(np.abs(a) < inf):
            bad = next(k for k, x in vals.items() if not abs(x) < inf)
            raise BadInputError(f"{path}: constraint {c.name!r} has coefficient {vals[bad]:g} for variable {bad!r}")


_CHECKED: set = set()  # files whose numbers passed check_numbers in this process: (path, size, mtime)


def _stamp(p: Path) -> tuple:
    st = p.stat()
    return str(p.resolve()), st.st_size, st.st_mtime_ns


def read_model(path: str | os.PathLike, verbose: bool = False, check: bool = True):
    """A fresh PySCIPOpt model read from `path` (errors name the file; SCIP's own messages become the
    error's reason). `check`: refuse non-finite numbers (`check_numbers`; once per file and process)."""
    p = check_instance_path(path)
    m = new_model(verbose)
    with scip_errors() as errors:
        try:
            m.readProblem(str(p))
        except Exception as e:  # SCIP raises a bare Exception / OSError on parse errors
            raise BadInputError(f"{p}: SCIP could not read this file ({scip_reason(errors, e)})") from None
    if m.getNVars() == 0:
        raise BadInputError(f"{p}: the model has no variables")
    if check and _stamp(p) not in _CHECKED:
        check_numbers(m, p)
        _CHECKED.add(_stamp(p))
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
    for c in model.getConss():
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


def var_names(path: str | os.PathLike) -> list:
    """The variable names of the instance in `path`, in SCIP's order."""
    model = read_model(path)  # keep the model alive while its variables are read
    names = [v.name for v in model.getVars()]
    del model
    return names


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
