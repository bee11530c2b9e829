"""How an error message names the values an argument may take."""

from __future__ import annotations

from collections.abc import Iterable


def one_of(allowed: Iterable) -> str:
    """The allowed values as a reader types them: ``auto, torch or triton``.

    Args:
        allowed: the values, in the order the message should list them (any
            iterable of str, int, enum members or torch dtypes; enum members by
            name, dtypes without their ``torch.`` prefix).

    Returns:
        str: the values joined by ``, `` with ``or`` before the last; strings
        unquoted, as they are typed in an environment variable or a flag.

    Raises:
        ValueError: ``allowed`` is empty (a check with nothing allowed is a bug).
    """
    words = [getattr(a, "name", None) or str(a).removeprefix("torch.") for a in allowed]
    if not words:
        raise ValueError("allowed must name at least one value, got none")
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
