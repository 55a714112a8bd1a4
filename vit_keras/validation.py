"""Argument checks shared by the library, the converter and the CLI (standard library only)."""

import difflib
import numbers


def check_keywords(given, valid, where):
    """Refuse keyword arguments that ``where`` does not take, naming each one and its nearest valid name.

    ``given``: the keywords passed (a dict or names); ``valid``: the names ``where`` accepts.
    """
    valid = sorted(valid)
    unknown = [name for name in given if name not in valid]
    if not unknown:
        return
    parts = []
    for name in unknown:
        near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise TypeError(f"{where} got unknown keyword argument{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; "
                    f"valid keywords are {', '.join(valid)}.")


def check_choice(value, name, choices):
    """Refuse ``value`` for argument ``name`` unless it is one of ``choices``, listing them."""
    if value not in choices:
        raise ValueError(f"Unknown `{name}`={value!r}; valid values are {', '.join(map(repr, choices))}.")


def pair(value, name):
    """(h, w) from an int or a pair, with a clear error naming argument ``name`` otherwise."""
    if isinstance(value, numbers.Integral):
        value = (int(value), int(value))
    value = tuple(int(v) for v in value)
    if len(value) != 2 or min(value) <= 0:
        raise ValueError(f"`{name}` must be a positive int or a pair (height, width); got {value}.")
    return value
