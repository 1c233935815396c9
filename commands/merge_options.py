"""Shared click options of the merging commands' file mode (negmerge, cabs-merge, ...): one decorator.

Imports click, the standard library and the merge engine's stdlib-only option lists (no torch), so a command's
``--help`` stays fast. The library parameter names are fixed here: ``base``, the models' parameter (named by the
command, e.g. ``candidates`` or ``models``), ``weights``, ``densities``, ``include``, ``exclude``,
``out_format``, ``out_dtype``, ``chunk_elems``; the engine (``icmltools.merge.engine.make_plan`` /
``merge_to_checkpoint``) takes the same names, so errors it raises name the right flag.
"""
from __future__ import annotations

import click

from icmltools.merge import options as engine_options
from icmltools.taskvec.formats import OUTPUT_FORMATS

from . import common

FORMATS = ("same",) + OUTPUT_FORMATS
DTYPES = ("same", *engine_options.OUT_DTYPES)
BASE_HELP = "Base checkpoint theta_0: .safetensors, a weights-only torch file (.pt/.pth/.bin), or a Hugging Face folder."


def per_model_floats(positive: bool = False) -> common.CommaList:
    """`0.6,0.4,0.4`: one finite number, or one per model in order (repeats kept: dropping them would shift the
    per-model values)."""
    return common.CommaList(kind=float, positive=positive, unique=False)


def file_options(*, models: str = "models", models_flags: tuple = ("-m", "--model"),
                 models_help: str = "A fine-tuned checkpoint (repeat; the order given is the merge order).",
                 base_help: str = BASE_HELP, weights: bool = False, densities: bool = False, filters: bool = False,
                 out_dtype: bool = False, chunk: bool = False, fmt: bool = True):
    """A decorator adding the file-mode options: ``--base``, the repeatable models option (`models_flags`,
    stored in parameter `models`), and, when asked, ``--weight`` / ``--density`` (one value for all models or
    a comma list, one per model), ``--include`` / ``--exclude`` (tensor-name globs, repeatable; excluded
    tensors are copied from the base), ``--format`` (output format; same = the base's), ``--dtype`` (output
    dtype of the floating tensors; same = the base's) and ``--chunk-elems`` (elements per chunk of the local
    methods)."""
    opts = [click.option("--base", type=click.Path(exists=False), default=None, help=base_help),
            click.option(*models_flags, models, multiple=True, type=click.Path(exists=False), help=models_help)]
    if weights:
        opts.append(click.option("--weight", "weights", type=per_model_floats(), default=None,
                                 metavar="W|W1,W2,..", help="Per-model weight (one for all, or one per model)."))
    if densities:
        opts.append(click.option("--density", "densities", type=per_model_floats(positive=True),
                                 default=None, metavar="D|D1,D2,..",
                                 help=f"Per-model density in (0, 1] (default {engine_options.DENSITY})."))
    if filters:
        opts.append(click.option("--include", multiple=True, metavar="GLOB",
                                 help="Merge only the tensors whose name matches (fnmatch glob; repeat)."))
        opts.append(click.option("--exclude", multiple=True, metavar="GLOB",
                                 help="Tensors whose name matches are copied from the base (fnmatch glob; repeat)."))
    if fmt:
        opts.append(click.option("--format", "out_format", type=click.Choice(FORMATS), default="same",
                                 help="Output checkpoint format; 'same' keeps the base's."))
    if out_dtype:
        opts.append(click.option("--dtype", "out_dtype", type=click.Choice(DTYPES), default="same",
                                 help="Output dtype of the floating-point tensors; 'same' keeps each tensor's."))
    if chunk:
        opts.append(click.option("--chunk-elems", type=click.IntRange(min=1), default=engine_options.CHUNK_ELEMS,
                                 help="Elements per chunk for the local methods (exact: chunked = unchunked)."))

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco
