"""Embedded default data (no downloads): scikit-learn's bundled digits with label-free views, and a
synthetic fine-grained generator with two or three extractor views."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from . import options


@dataclass
class Dataset:
    """Train views (one per extractor, same rows), labels 0..C-1, a test split and target-model inputs."""

    name: str
    views: list
    view_names: list
    labels: np.ndarray
    n_classes: int
    test_labels: np.ndarray | None = None
    test_views: list | None = None
    raw: np.ndarray | None = None  # target-model input (train), e.g. pixels
    raw_test: np.ndarray | None = None
    class_names: list | None = None
    info: dict = field(default_factory=dict)


def digits(views: int = 3, test_fraction: float = 0.25, seed: int = options.DIGITS_SEED) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes), stratified train/test split.

    Extractor views, all fitted on the training images without labels: standardised pixels, whitened PCA
    (20 components) and random Fourier features (RBF, 512 components, median-heuristic bandwidth). The
    target model sees the standardised pixels (or the 1x8x8 images for the CNN). The split and the random
    features come from `derive(seed, "subset", "digits", ...)`; the command always uses the fixed
    `options.DIGITS_SEED`, so the embedded data is one dataset whatever seed the run has.
    """
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    if views not in range(1, options.MAX_VIEWS + 1):
        raise BadInputError(f"{views}: digits has 1 to {options.MAX_VIEWS} views", param="n_views")
    root = derive(seed, "subset", "digits")
    d = load_digits()
    X, y = d.data.astype(np.float64), d.target.astype(np.int64)
    idx_tr, idx_te = train_test_split(np.arange(len(y)), test_size=test_fraction, stratify=y,
                                      random_state=root.child("split").int(32))
    sc = StandardScaler().fit(X[idx_tr])
    Ztr, Zte = sc.transform(X[idx_tr]), sc.transform(X[idx_te])
    pca = PCA(n_components=20, whiten=True, random_state=root.child("pca").int(32)).fit(Ztr)
    sub = Ztr[root.child("bandwidth").numpy().choice(len(Ztr), 500, replace=False)]
    sq = ((sub[:, None, :] - sub[None, :, :]) ** 2).sum(-1)
    gamma = 1.0 / float(np.median(sq[np.triu_indices(len(sub), 1)]))
    rff = RBFSampler(gamma=gamma, n_components=512, random_state=root.child("rff").int(32)).fit(Ztr)
    all_views = [("pixels", Ztr, Zte), ("pca-white", pca.transform(Ztr), pca.transform(Zte)),
                 ("rff", rff.transform(Ztr), rff.transform(Zte))]
    chosen = all_views[:views]
    imgs = (X / 16.0).reshape(-1, 1, 8, 8)
    return Dataset(name="digits", views=[v[1] for v in chosen], view_names=[v[0] for v in chosen],
                   labels=y[idx_tr], n_classes=10, test_labels=y[idx_te], test_views=[v[2] for v in chosen],
                   raw=Ztr, raw_test=Zte, class_names=list(range(10)),
                   info={"n_train": len(idx_tr), "n_test": len(idx_te), "raw_images": (imgs[idx_tr], imgs[idx_te])})


def synthetic(views: int = 3, n_super: int = 5, n_sub: int = 4, per_class: int = 150, per_class_test: int = 50,
              latent_dim: int = 32, view_dim: int = 64, atypical: float = 0.1, sub_scale: float = 0.5,
              seed: int = 0) -> Dataset:
    """A fine-grained toy problem: `n_super` super-classes, each split into `n_sub` close sub-classes (the
    labels). Latent x = super centre + sub offset + noise; a fraction `atypical` of samples has 3x the
    noise (hard, often ambiguous samples). Each extractor view is a different random linear map of the
    latent plus its own noise level; the target model sees the latent ("raw input"). Every draw comes from
    `derive(seed, "subset", "synthetic")`."""
    if views not in range(1, options.MAX_VIEWS + 1):
        raise BadInputError(f"{views}: the synthetic generator makes 1 to {options.MAX_VIEWS} views", param="n_views")
    rng = derive(seed, "subset", "synthetic").numpy()
    C = n_super * n_sub
    supers = rng.normal(0, 1, (n_super, latent_dim)) * 2.5
    subs = supers.repeat(n_sub, axis=0) + rng.normal(0, 1, (C, latent_dim)) * sub_scale

    def sample(m):
        y = np.repeat(np.arange(C), m)
        scale = np.where(rng.random(len(y)) < atypical, 3.0, 1.0)
        x = subs[y] + rng.normal(0, 1, (len(y), latent_dim)) * scale[:, None]
        return x, y

    xtr, ytr = sample(per_class)
    xte, yte = sample(per_class_test)
    noise = [0.4, 0.8, 1.2][:views]
    maps = [rng.normal(0, 1, (latent_dim, view_dim)) / np.sqrt(latent_dim) for _ in range(views)]
    vtr = [xtr @ W + rng.normal(0, s, (len(xtr), view_dim)) for W, s in zip(maps, noise)]
    vte = [xte @ W + rng.normal(0, s, (len(xte), view_dim)) for W, s in zip(maps, noise)]
    perm = rng.permutation(len(ytr))
    return Dataset(name="synthetic", views=[v[perm] for v in vtr], view_names=[f"view{k}" for k in range(views)],
                   labels=ytr[perm], n_classes=C, test_labels=yte, test_views=vte, raw=xtr[perm], raw_test=xte,
                   class_names=list(range(C)),
                   info={"n_train": len(ytr), "n_test": len(yte), "n_super": n_super, "n_sub": n_sub,
                         "view_noise": noise, "atypical": atypical})


def inject_noise(labels: np.ndarray, n_classes: int, rate: float, rng: np.random.Generator):
    """Symmetric label noise: exactly round(rate * N) samples get a uniformly drawn *different* class.

    `rng` is the caller's derived stream (`derive(seed, "subset", "noise")` in selection mode,
    `derive(seed, "subset", "repeat", k, "noise")` in evaluation repeat k)."""
    if not 0.0 <= rate < 1.0:
        raise BadInputError(f"{rate}: must lie in [0, 1)", param="noise")
    labels = np.asarray(labels, dtype=np.int64).copy()
    n = len(labels)
    flip = rng.choice(n, int(round(rate * n)), replace=False)
    shift = rng.integers(1, n_classes, size=len(flip))
    labels[flip] = (labels[flip] + shift) % n_classes
    noisy = np.zeros(n, dtype=bool)
    noisy[flip] = True
    return labels, noisy
