"""Drafter invariance across servers: the same seeded requests give the same tokens with any drafter.

Six servers on the tiny Llama target, started side by side, all with
``--enable-deterministic-inference`` and CUDA graphs (``_e2e.FAMILIES``):

* ``no_spec``: no speculative decoding (the reference);
* ``coupled_chain``: chain EAGLE (steps 3, top-k 1, 4 draft tokens), coupled verify and
  its default coupled drafts (q raced on the TARGET stream);
* ``coupled_tree``: tree EAGLE (steps 3, top-k 4, 8 draft tokens), coupled verify, children
  = q's Gumbel-top-k on the TARGET stream;
* ``coupled_chain_random_draft``: the coupled chain with an unrelated random EAGLE draft;
* ``coupled_race_chain``: the chain with ``--speculative-use-rejection-sampling``
  and ``SGLANG_DETSPEC_VERIFY=coupled`` (drafts race q on the TARGET stream);
* ``coupled_chain_adaptive``: the coupled chain with SGLang's ``--speculative-adaptive``
  (its default table: the draft step count follows the batch size and the accept rate);
* ``chain_eagle``: rejection-sampling chain EAGLE (a figure: its tokens depend on the draft).

Each gets the same 8 seeded sampled requests (64 new tokens; 6 plain rows in
one batch, a top-k and a top-p row in another; ``_invariance.py``).

Checks (``<DETSPEC_E2E_OUT>/invariance_*.json``; all outputs in
``invariance_outputs.json``):

1. Each coupled server: the same tokens as ``no_spec`` for all 8 requests, the
   plugin active in coupled mode (its start-up line). Logprob equality is
   recorded per request.
2. The rejection chain: how many of the 8 differ from ``no_spec`` (a figure;
   fails only when it could not be measured).
3. Accept lengths of every speculative server on these requests; the default
   coupled chain and the coupled-race chain with the copying draft must accept most drafts (mean
   accept length >= 2 of 4): its drafts race the draft distribution with the
   target's own uniforms, so a draft that copies the target is almost always
   accepted; a lower figure means the drafts race at other positions or on
   another stream than the verify.
4. The adaptive chain switched its draft steps at least once while it served
   these requests (its log's ``Switch adaptive runtime state`` lines): the
   positive control that check 1 compared tokens drafted with more than one
   step count.

About 3-4 minutes on an H200: six starts in parallel (100-150 s), then seconds of traffic.
"""

import sys

import pytest

import _e2e
import _invariance
from _register import register_cuda_ci

register_cuda_ci(est_time=240, suite="detspec-e2e-cuda")

REFERENCE = "no_spec"
COUPLED = ("coupled_chain", "coupled_tree", "coupled_chain_random_draft", "coupled_race_chain", "coupled_chain_adaptive")
ADAPTIVE = "coupled_chain_adaptive"
REJECTION = "chain_eagle"
GROUP = (REFERENCE, *COUPLED, REJECTION)
MIN_RACE_ACCEPT_LENGTH = 2.0  # of 4 (3 drafts + 1); the copying pair measured 3.86 in rejection mode
TEST_ORDER = (
    "test_same_tokens_as_without_speculative_decoding",
    "test_rejection_chain_figure",
    "test_accept_lengths",
    "test_adaptive_chain_switched_its_steps",
)


@pytest.fixture(scope="module")
def group(servers, models):
    vocab = _e2e.vocab_size(models.target)
    configs = [_e2e.server_config(name, models) for name in GROUP]
    return servers.remember("invariance", lambda: _invariance.run_group(servers, configs, vocab, "invariance_outputs"))


def name_of(family_name: str) -> str:
    return f"{family_name}_det_cuda_graph"


@pytest.mark.parametrize("family_name", COUPLED)
def test_same_tokens_as_without_speculative_decoding(group, family_name):
    _invariance.check_same_tokens(group, name_of(REFERENCE), name_of(family_name),
                                  f"invariance_{family_name}_vs_{REFERENCE}")


def test_rejection_chain_figure(group):
    """Recorded, not required: rejection sampling's tokens depend on the draft."""
    outcome = _invariance.compare(group, name_of(REFERENCE), name_of(REJECTION))
    # Only a failed measurement fails here; differing tokens are the figure.
    problems = [p for p in outcome["problems"] if "gave other tokens" not in p]
    path = _e2e.write_result(f"invariance_{REJECTION}_vs_{REFERENCE}_figure",
                             {"passed": not problems, "figure_only": True, **outcome, "problems": problems})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


def test_accept_lengths(group):
    figures = {family_name: group[name_of(family_name)]["accept_length"] for family_name in (*COUPLED, REJECTION)}
    problems = [f"{family_name}: no accept length (no verify counts, or the server failed)"
                for family_name, value in figures.items() if value is None]
    for raced in ("coupled_chain", "coupled_race_chain"):  # the default chain and the one with the user's flag
        race = figures[raced]
        if race is not None and race < MIN_RACE_ACCEPT_LENGTH:
            problems.append(
                f"{raced}: mean accept length {race:.3f} < {MIN_RACE_ACCEPT_LENGTH} with the copying draft "
                "(its drafts should race q with the verify's own TARGET uniforms at the drafted positions)"
            )
    path = _e2e.write_result("invariance_accept_lengths", {
        "passed": not problems, "problems": problems, "accept_length_of_max": 4,
        "requests": _invariance.NUM_REQUESTS, "new_tokens_per_request": _invariance.NEW_TOKENS,
        "accept_lengths": figures, "min_race_accept_length": MIN_RACE_ACCEPT_LENGTH,
    })
    assert not problems, "; ".join(problems) + f" ({path})"


def test_adaptive_chain_switched_its_steps(group):
    """Check 1 proves drafter invariance across step counts only if the counts did change while it served."""
    entry = group[name_of(ADAPTIVE)]
    switches = entry["adaptive_switches"]
    problems = [] if switches else [
        f"{ADAPTIVE}: no 'Switch adaptive runtime state' line in its log "
        f"({'the server failed: ' + entry['error'] if entry['error'] else 'its steps never changed'}), "
        "so its tokens were drafted with one step count only"]
    path = _e2e.write_result("invariance_adaptive_switches", {
        "passed": not problems, "problems": problems, "adaptive_switches": switches,
        "accept_length": entry["accept_length"],
    })
    assert not problems, "; ".join(problems) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
