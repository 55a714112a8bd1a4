"""Position-embedding tables (E_pos) across patch grids: resampling and reading a table's layout.

A learned (1, T, D) table holds ``num_prefix_tokens`` rows (the class token's) and then one row per patch
of a (rows, cols) grid in row-major order; ``learned_2d`` holds one (length, D/2) table per axis. A model
at another image size needs them on its own grid: ``resize_position_embedding`` resamples them as timm's
``resample_abs_pos_embed`` does (2-D bicubic, a = -0.5, antialiased), for ``resize_model`` / ``rebuild``
and for checkpoints loaded at another size. Hugging Face's models resample without antialiasing (PyTorch's
plain bicubic, a = -0.75): ``antialias=False`` matches a Hugging Face checkpoint run at another size.
"""

import numpy as np

from vit_keras.validation import pair


def _cubic(x, a=-0.5):
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def resample_matrix(old, new, antialias=True):
    """(new, old) weights of antialiased bicubic resampling (a = -0.5, half-pixel centers).

    This is PIL's and PyTorch's ``interpolate(mode="bicubic", antialias=True)``,
    which timm's ``resample_abs_pos_embed`` uses; at the same size it is the identity.
    antialias=False: PyTorch's plain ``interpolate(mode="bicubic", align_corners=False)`` (a = -0.75, four taps
    whatever the scale, edge samples repeated), as Hugging Face's ``interpolate_pos_encoding`` resamples.
    """
    if not antialias:
        return plain_bicubic_matrix(old, new)
    scale = old / new
    support = 2.0 * max(scale, 1.0)
    inv = 1.0 / max(scale, 1.0)
    matrix = np.zeros((new, old))
    for i in range(new):
        center = (i + 0.5) * scale
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), old)
        taps = np.arange(lo, hi)
        w = _cubic((taps - center + 0.5) * inv)
        matrix[i, lo:hi] = w / w.sum()
    return matrix


def plain_bicubic_matrix(old, new):
    """(new, old) weights of PyTorch's non-antialiased bicubic interpolation (``resample_matrix``)."""
    matrix = np.zeros((new, old))
    for i in range(new):
        source = (i + 0.5) * old / new - 0.5
        base = int(np.floor(source))
        for tap in range(base - 1, base + 3):
            matrix[i, min(max(tap, 0), old - 1)] += _cubic(tap - source, a=-0.75)
    return matrix


def resize_position_embedding(pos_embedding, new_grid, old_grid=None, num_prefix_tokens=1, antialias=True):
    """Resample the patch-grid part of a (1, T, D) position embedding to ``new_grid``.

    The first ``num_prefix_tokens`` rows (the class token's) are kept as they are;
    the N = gh * gw rows are treated as a 2-D (gh, gw, D) image and resampled with
    2-D bicubic interpolation (see ``resample_matrix``). ``old_grid`` defaults to
    a square grid. Works for square <-> rectangular grids.
    """
    pos_embedding = np.asarray(pos_embedding)
    prefix, grid = pos_embedding[:, :num_prefix_tokens], pos_embedding[:, num_prefix_tokens:]
    n = grid.shape[1]
    if old_grid is None:
        side = square_side(n)
        if side is None:
            raise ValueError(f"The position embedding has {n} patch rows, not a square grid; pass `old_grid`.")
        old_grid = (side, side)
    old_grid, new_grid = pair(old_grid, "old_grid"), pair(new_grid, "new_grid")
    if old_grid[0] * old_grid[1] != n:
        raise ValueError(f"`old_grid`={old_grid} does not match {n} patch rows in the position embedding.")
    image = grid.reshape(-1, *old_grid, grid.shape[-1]).astype("float64")
    rows, cols = (resample_matrix(old_grid[i], new_grid[i], antialias) for i in (0, 1))
    image = np.einsum("ih,jw,bhwd->bijd", rows, cols, image)
    resized = image.reshape(-1, new_grid[0] * new_grid[1], grid.shape[-1]).astype(pos_embedding.dtype)
    return np.concatenate([prefix, resized], axis=1)


def resize_axis_embedding(table, new_length):
    """One axis's (length, d) table of a ``learned_2d`` embedding resampled to ``new_length`` rows (1-D bicubic)."""
    table = np.asarray(table)
    return (resample_matrix(table.shape[0], int(new_length)) @ table).astype(table.dtype)


def square_side(n):
    """The side of an n-cell square grid, or None when n is not a positive square."""
    side = int(round(max(n, 0) ** 0.5))
    return side if side > 0 and side * side == n else None


def table_layout(rows, class_row, want_rows, model_grid, timm_table):
    """(the table's prefix rows, its grid) for a table of ``rows`` rows without a recorded grid, or None.

    ``class_row``: how many prefix rows the model's table has, where the checkpoint has a class token too
    (the class token's, and the distillation token's in DeiT; a bool counts as 0 or 1); ``want_rows``: the
    model's table rows; ``timm_table``: the table is timm's, which lacks the prefix rows under ``no_embed_class``.
    The prefix rows found are ``class_row`` or 0 (none: the caller adds zero rows).
    """
    class_row = int(class_row)
    if class_row and timm_table:  # timm: the prefix rows or none; a table at the model's own size first
        if rows == want_rows:
            return class_row, model_grid
        if rows == want_rows - class_row:
            return 0, model_grid
        for has_rows in (class_row, 0):
            side = square_side(rows - has_rows)
            if side:
                return has_rows, (side, side)
        return None
    # Google, AugReg, big_vision (its missing row added on reading), Hugging Face, our own older files: the
    # class row is there with `cls`, and Google's grids are square; else the model's own size.
    side = square_side(rows - class_row)
    if side:
        return class_row, (side, side)
    return (class_row, model_grid) if rows == want_rows else None
