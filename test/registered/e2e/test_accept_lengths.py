"""Accept lengths of every draft path on the same seeded requests, at temperature 1 and 0.7.

Eight servers side by side, all with ``--enable-deterministic-inference`` and
CUDA graphs (``_e2e.FAMILIES``): on the tiny Llama target ``no_spec`` (the
reference), ``chain_eagle`` (rejection chain, steps 3), ``coupled_chain``
(coupled chain without the rejection flag), ``coupled_tree`` (top-k 4, 8
draft tokens, steps 3), ``coupled_tree_16`` (top-k 4, 16 draft tokens,
steps 5); on the tiny multi-layer model ``mtp_no_spec``,
``multi_layer_eagle`` (rejection) and ``mtp_coupled``.

Each speculative server gets the 8 requests of ``_invariance.py`` with every
temperature set to 1, then to 0.7. Written as
``<DETSPEC_E2E_OUT>/accept_lengths_T1.0.json`` and ``accept_lengths_T0.7.json``
(the layout ``docs/e2e/README.md`` gives: one row per configuration with its
accept length and how many requests differ from the server without
speculative decoding).

Checks: every server answered; every coupled server gave the reference's
tokens (0 differ). The goals (coupled chain >= 0.95 x the rejection chain,
coupled tree above the rejection chain, multi-layer coupled >= 0.95 x
multi-layer rejection) are recorded with the figures, not asserted.

About 4-5 minutes on one H200: eight starts in parallel, then seconds of traffic.
"""

import sys

import pytest

import _e2e
import _invariance
from _register import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e-cuda")

# name -> (verify, draft, steps, topk, draft tokens, rejection flag)
ROWS = {
    "chain_eagle": ("rejection", "chain", 3, 1, 4, True),
    "coupled_chain": ("coupled", "chain", 3, 1, 4, False),
    "coupled_tree": ("coupled", "tree", 3, 4, 8, False),
    "coupled_tree_16": ("coupled", "tree", 5, 4, 16, False),
    "multi_layer_eagle": ("rejection", "multi_layer", 2, 1, 3, True),
    "mtp_coupled": ("coupled", "multi_layer", 2, 1, 3, False),
}
REFERENCE = {"target": "no_spec", "mtp": "mtp_no_spec"}
TEMPERATURES = (1.0, 0.7)
TEST_ORDER = ("test_accept_lengths",)


def chosen_models() -> tuple[str, ...]:
    """``DETSPEC_E2E_ACCEPT_MODELS`` (comma-separated ``target``, ``mtp``; default both): which groups run."""
    names = tuple(m.strip() for m in _e2e.env_str("DETSPEC_E2E_ACCEPT_MODELS", "target,mtp").split(",") if m.strip())
    unknown = [m for m in names if m not in REFERENCE]
    if unknown or not names:
        raise ValueError(f"DETSPEC_E2E_ACCEPT_MODELS must name some of {', '.join(REFERENCE)}, got {names}")
    return names


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_accept_lengths(servers, models, temperature):
    chosen = chosen_models()
    rows_run = {name: row for name, row in ROWS.items() if _e2e.family(name).model in chosen}
    configs = [_e2e.server_config(name, models) for name in (*(REFERENCE[m] for m in chosen), *rows_run)]
    # One group (ensure_group stops servers outside the group it is given), so the prompts stay
    # inside every chosen model's vocabulary; the second temperature reuses the servers.
    vocab = min(_e2e.vocab_size(getattr(models, m)) for m in chosen)
    group = _invariance.run_group(servers, configs, vocab, f"accept_outputs_T{temperature}", temperature)
    rows, problems = _invariance.accept_rows(group, rows_run, lambda name: REFERENCE[_e2e.family(name).model])
    by = {r["config"]: r["accept_length"] for r in rows}

    def ratio(a, b):
        return None if by.get(a) is None or not by.get(b) else by[a] / by[b]

    goals = {
        "coupled_chain / chain_eagle >= 0.95": ratio("coupled_chain", "chain_eagle"),
        "coupled_tree / chain_eagle > 1": ratio("coupled_tree", "chain_eagle"),
        "mtp_coupled / multi_layer_eagle >= 0.95": ratio("mtp_coupled", "multi_layer_eagle"),
    }
    path = _e2e.write_result(f"accept_lengths_T{temperature}", {
        "passed": not problems, "problems": problems, "temperature": temperature,
        "requests": _invariance.NUM_REQUESTS, "new_tokens_per_request": _invariance.NEW_TOKENS,
        "rows": rows, "goals": goals,
    })
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
