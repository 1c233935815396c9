"""A method's limit on SCIP: wall-clock seconds, or a deterministic budget (SCIP's deterministic time,
branch-and-bound nodes, LP iterations) that gives the same search, bit for bit, on every rerun.

A budget is the method's whole allowance: VP-OR's sub-MIPs draw on it one after the other (`Budget.used`).
The wall-clock limit stays as a cap on the deterministic kinds; a run the cap cuts short is flagged
(`wall_cap_hit`), since it is no longer reproducible. The `Clock` event handler records incumbents on both
axes (wall seconds and work) and stops a solve whose work reaches its share (SCIP has no parameter for a
deterministic-time or LP-iteration limit; nodes use `limits/totalnodes`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .milp import c_stdout_captured
from .options import SolveConfig

CATCH_CTRL_C = True
"""SCIP catches SIGINT during a solve and stops with status 'userinterrupt', which `optimize` raises as
KeyboardInterrupt. `--jobs` workers set this to False (and ignore SIGINT): their parent stops them."""

# how much work a model has done in its current solve (SCIP resets these statistics on every solve)
WORK = {
    "det-time": lambda m: float(m.getDeterministicTime()),
    "nodes": lambda m: float(m.getNTotalNodes()),
    "lp-iterations": lambda m: float(m.getNLPIterations()),
}


SOLVING_STAGES = (9, 10)  # SCIP_STAGE_SOLVING, SCIP_STAGE_SOLVED


SCIP_CTRL_C = "pressed CTRL-C"
"""The start of the line SCIP's own SIGINT handler prints on C stdout (`interruptHandler`, interrupt.c)."""


def optimize(model, verbose: bool = False, clock=None) -> str:
    """`model.optimize()`, then SCIP's status; Ctrl-C during the solve is raised as KeyboardInterrupt, so
    nothing is reported, written or cached from a solve cut short. SCIP catches it itself (`CATCH_CTRL_C`)
    and stops at its next check with status 'userinterrupt' (unless our `clock` stopped the solve at its
    budget). A Ctrl-C that reaches SCIP's handler after its last check is lost to SCIP, which ends the solve
    as if none had come, and Python never sees it; the line SCIP's handler printed is its only trace, so C
    stdout is captured during the solve and that line counts as Ctrl-C whatever the status. SCIP's own log
    (`verbose`) is passed on once the solve ends."""
    model.setParam("misc/catchctrlc", CATCH_CTRL_C)
    with c_stdout_captured(echo=verbose) as out:
        model.optimize()
    st = model.getStatus()
    if SCIP_CTRL_C in out.text or (st == "userinterrupt" and (clock is None or not clock.hit)):
        raise KeyboardInterrupt
    return "budget" if st == "userinterrupt" else st


@dataclass
class Budget:
    """One method's allowance: `amount` of `kind` (seconds for wall), under a wall-clock cap `wall`."""

    kind: str
    amount: float
    wall: float
    used: float = 0.0
    t0: float = 0.0
    wall_cap_hit: bool = False

    @classmethod
    def of(cls, cfg: SolveConfig, amount: float | None = None) -> Budget:
        """The budget of a method run with `cfg` (`amount` overrides cfg.budget / cfg.time_limit)."""
        kind = cfg.limit_kind
        amount = float(amount if amount is not None else cfg.time_limit if kind == "wall" else cfg.budget)
        return cls(kind, amount, amount if kind == "wall" else float(cfg.time_limit), t0=time.perf_counter())

    @property
    def deterministic(self) -> bool:
        return self.kind != "wall"

    def wall_left(self) -> float:
        return self.wall - (time.perf_counter() - self.t0)

    def left(self) -> float:
        """What is left, in the budget's unit (0 once the wall cap has passed)."""
        if not self.deterministic:
            return max(0.0, self.wall_left())
        return max(0.0, self.amount - self.used) if self.wall_left() > 0 else 0.0

    def exhausted(self) -> bool:
        """Nothing worth another solve is left: 50 ms of wall time, one node, or 1 % of a deterministic-time
        or LP-iteration budget."""
        floor = {"wall": 0.05, "det-time": 0.01 * self.amount, "lp-iterations": 0.01 * self.amount}.get(self.kind, 1.0)
        return self.left() < floor

    def fraction(self, fraction: float) -> float:
        return self.amount * fraction

    def solve(self, model, clock, share: float | None = None, verbose: bool = False) -> str:
        """Solve `model` on at most `share` of what is left (default: all of it); charge what it used."""
        share = self.left() if share is None else min(share, self.left())
        wall_left = max(0.01, self.wall_left())
        model.setParam("limits/time", min(share, wall_left) if not self.deterministic else wall_left)
        if self.kind == "nodes":
            model.setParam("limits/totalnodes", max(1, int(share)))
        clock.begin(self.kind, share if self.kind in ("det-time", "lp-iterations") else math.inf, self.used)
        t = time.perf_counter()
        st = optimize(model, verbose, clock)
        spent = time.perf_counter() - t
        self.used += spent if not self.deterministic else WORK[self.kind](model)
        if self.deterministic and st == "timelimit":
            self.wall_cap_hit = True
        return st

    def to_dict(self) -> dict:
        d = {"limit_kind": self.kind, "budget": self.amount, "used": round(self.used, 4)}
        if self.deterministic:
            d["wall_cap"] = self.wall
            d["wall_cap_hit"] = self.wall_cap_hit
        return d


def make_clock():
    """An event handler that records incumbents as (wall seconds since `t0`, work so far, objective) and
    interrupts a solve whose work reaches `limit` (deterministic time or LP iterations)."""
    from pyscipopt import SCIP_EVENTTYPE, Eventhdlr

    watch = {"det-time": ("NODESOLVED", "LPSOLVED", "PRESOLVEROUND"), "lp-iterations": ("NODESOLVED", "LPSOLVED")}

    class Clock(Eventhdlr):
        def __init__(self):
            super().__init__()
            self.t0 = time.perf_counter()
            self.records: list = []
            self.kind, self.limit, self.offset, self.hit = "wall", math.inf, 0.0, False

        def begin(self, kind: str, limit: float, offset: float) -> None:
            """Before a solve: its work limit (inf: none) and the work done before it (by earlier solves)."""
            self.kind, self.limit, self.offset, self.hit = kind, limit, offset, False
            self._cap_lp(limit)

        def _cap_lp(self, left: float) -> None:
            """With an LP-iteration budget, no single LP may run past what is left (SCIP checks events only
            between LPs; a root LP alone can take thousands of iterations)."""
            if self.kind == "lp-iterations":
                cap = -1 if math.isinf(left) else max(1, int(left))
                self.model.setParam("lp/iterlim", cap)
                self.model.setParam("lp/rootiterlim", cap)

        def work(self) -> float:
            """Work so far; SCIP counts nodes and LP iterations only once solving has begun (0 before)."""
            if self.kind not in WORK or (self.kind != "det-time" and self.model.getStage() not in SOLVING_STAGES):
                return self.offset
            return self.offset + WORK[self.kind](self.model)

        # No `eventexit` (nor any callback SCIP runs outside a solve, e.g. when a transform is freed): a
        # Ctrl-C there, with Python's handler in place, would be raised inside a callback from C, printed
        # and swallowed, and the command would run on. The events caught here go with the transform SCIP
        # frees (its event filter; PySCIPOpt 6 also drops them itself).
        def eventinit(self):
            for e in ["BESTSOLFOUND", *watch.get(self.kind, ())]:
                self.model.catchEvent(getattr(SCIP_EVENTTYPE, e), self)

        def eventexec(self, event):
            if event.getType() == SCIP_EVENTTYPE.BESTSOLFOUND:
                sol = self.model.getBestSol()
                self.records.append((time.perf_counter() - self.t0, self.work(), self.model.getSolObjVal(sol)))
            done = self.work() - self.offset
            if not self.hit and done >= self.limit:
                self.hit = True
                self.model.interruptSolve()
            elif self.kind == "lp-iterations" and not math.isinf(self.limit):
                self._cap_lp(self.limit - done)

    return Clock()
