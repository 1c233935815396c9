"""Decoupled SGDA (Zindari, Yazdkhasti, Rodomanov, Chavdarova, Stich, "Decoupled SGDA for Games with
Intermittent Strategy Communication", ICML 2025, arXiv 2501.14652). No official code is published.

Each player runs K local (stochastic) gradient steps on its own objective against the opponents'
last communicated strategies, then all players exchange strategies once (one communication round).
This package holds:

- `games`: the game families (quadratic SCSC with a coupling knob, n-player quadratic, the noisy game,
  a Dirac-GAN-style game, a user's block-matrix game from JSON);
- `maps`: the exact affine round map of every method on a quadratic game (M_K = P - (I - P) D^-1 O for
  Decoupled SGDA; GDA, alternating GDA, optimistic GDA, extragradient, Local SGDA, Ghost), used for
  deterministic runs by matrix powers and mat-vecs;
- `sim`: direct simulation (nonlinear games, stochastic runs vectorised over step sizes and seeds);
- `oracle`: the same loop for a user's game given as gradient callables (numpy or torch);
- `api`: what the command calls.

`options` (choice lists, configs, defaults, the paper) imports only the standard library.
"""
