"""``detspec audit``: does a seeded request give the same tokens in every batch, and with any drafter?

Arguments, help and dispatch; the in-process run is in :mod:`._audit_local`,
the server run in :mod:`._audit_server`, the report in :mod:`._audit_report`.

In-process (the default), two sections on the reference engine:

1. changing batch: the probe request of
   :func:`sglang_detspec.auditing.batch.build_plan` in batches of changing
   size, order and split, once with the keyed sampler and (unless
   ``--no-control``) once with the global-RNG control: unique probe outputs
   and mean accept length of each;
2. invariance (:func:`sglang_detspec.auditing.invariance.run_invariance`): the same
   seeded requests with speculative decoding off, chains of several lengths, a
   tree and a random draft, in the ``--mode`` verify mode, with the other
   mode's unique-output count beside it.

With ``--url`` the changing-batch trials run on a running SGLang server
through its ``/generate`` endpoint
(:class:`~sglang_detspec.auditing.http_backend.HttpBackend`), followed by the
request-seed checks of :mod:`sglang_detspec.auditing.server_seeds`. The
server is asked first, and that path imports neither torch nor transformers.

Exit code 0 when every section passes, 1 when one fails, 2 for bad arguments
or settings, an unreachable server or a server error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

from ..auditing import DEFAULT_TIMEOUT_S
from ..auditing.batch import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TRIALS,
    MAX_PROMPT_LEN,
    MIN_TRIALS_TO_JUDGE,
)
from ..config import VERIFY_MODES
from ..ops.streams import U64
from ..ops.seed_encoding import SEED_ENCODINGS, SEED_RANGE
from ._audit_common import DEFAULT_CONCURRENCY, DEFAULT_NUM_DRAFT_TOKENS, STDOUT, fail
from .messages import PREFIX

# Bounds the cost of a run: the schedule decodes about trials * max_batch / 2 requests.
MAX_BATCH = 1024
# max_position_embeddings of the reference models (reference.models.build_model_pair;
# a unit test holds the two equal), here so the bound is known before torch loads.
REFERENCE_MAX_POSITIONS = 4096
MAX_IN_PROCESS_TOKENS = REFERENCE_MAX_POSITIONS - MAX_PROMPT_LEN  # max_new_tokens + K
# Flags only a server run uses. They (and --num-draft-tokens, --control)
# default to None, meaning "not given", so run() can reject the ones that do
# not fit the mode instead of silently ignoring them.
_SERVER_ONLY = {
    "vocab_size": "--vocab-size", "concurrency": "--concurrency", "timeout": "--timeout",
    "seed_encoding": "--seed-encoding", "seed_checks": "--seed-checks", "bitwise_logprobs": "--bitwise-logprobs",
}


def _int_in(low: int, high: int | None = None, *, bound: str | None = None, why: str = ""):
    """An argparse type for ints in [low, high] (no upper bound when high is None).

    ``bound`` replaces the range in the error message; ``why`` is appended to it.
    """

    def parse(text: str) -> int:
        # Plain ASCII decimal only: int() would also take '1_000', ' 5' and non-ASCII digits.
        try:
            if not re.fullmatch(r"-?[0-9]+", text):
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            words = bound or (f">= {low}" if high is None else f"in [{low}, {high}]")
            raise argparse.ArgumentTypeError(f"must be {words}, got {value}" + (f": {why}" if why else ""))
        return value

    return parse


def _seed(text: str) -> int:
    return _int_in(0, U64 - 1, bound=f"in {SEED_RANGE}")(text)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _url(text: str) -> str:
    try:
        parts = urlsplit(text)
        port = parts.port  # raises for a port that is not a number in [0, 65535]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL of the server, got {text!r}: {exc}") from None
    if port == 0:
        raise argparse.ArgumentTypeError(f"expected a port in [1, 65535], got {text!r}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL of the server, got {text!r}")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"expected the server's base URL without a query or fragment, got {text!r}")
    return text.rstrip("/")


def _json_path(text: str) -> Path | str:
    if text == STDOUT:
        return STDOUT
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
    return path



# The epilog as data, wrapped by _format_epilog to HELP_WIDTH (argparse's raw formatter,
# needed to keep the columns, would print it as written).
HELP_WIDTH = 79
_TERM_WIDTH = 22
_EPILOG_SECTIONS = (
    ("changing-batch table (one row per run):", (
        ("run", "seeded: the in-process engine with the keyed streams; control: the same engine "
         "drawing from torch's global RNG (it shows the trials can catch a batch-dependent "
         "sampler); server: the server at --url"),
        ("unique probe outputs", "distinct token sequences the probe request gave over the trials: "
         "1 means its output did not depend on the batch it ran in"),
        ("probe logprobs", "(--url) whether the probe's output logprobs were bitwise equal in every trial"),
        ("mean accept len", "tokens committed per verify round over every request of every trial: "
         "accepted draft tokens + the target's own token, so between 1 and K+1 for K draft tokens "
         "per round (the server's --speculative-num-draft-tokens is K+1)"),
        ("varying requests", "requests (probe and fillers) whose output changed between trials, out "
         "of all distinct requests that ran: 0 for a batch-invariant run"),
        ("time", "seconds spent decoding"),
    )),
    ("invariance table (in-process; one row per configuration: speculative decoding off, chains "
     "of several lengths, a tree, a random draft):", (
        ("unique", "per probe request, distinct outputs among this configuration's and the "
         "speculative-decoding-off one (the most over the probes): 1 means the drafter changed no "
         "token; coupled verify gives 1"),
        ("accept len", "mean accept length as above, out of K+1 for the configuration's K"),
        ("accept", "share of tested draft tokens accepted"),
        ("bound, 1-TV", "(1-TV)/(1+TV), 1-TV: the lower bound coupled verification guarantees per "
         "draft token (Daliri, Musco, Suresh 2024) and the acceptance of rejection sampling, from the "
         "total variation TV between draft and target distributions, averaged over the tested draft "
         "tokens (expected rates: a small sample of measured acceptance can fall on either side; "
         "both are per single draft token, and a tree, which offers several children per position, "
         "can accept more)"),
        ("tested", "draft tokens tested, over every probe"),
        ("<other> unique", "the same count with the other verify mode, for comparison (rejection "
         "verify's tokens depend on the drafter, so it is expected above 1, and rejection mode, "
         "`--mode rejection` or `SGLANG_DETSPEC_VERIFY=rejection`, fails the invariance section by "
         "design, exit 1)"),
    )),
    ("request-seed checks (--url): unseeded requests of one prompt differ; n parallel samples with "
     "a seed differ, replay, sample 0 is the seed's n = 1 output, sample 1 is not seed + 1's; every "
     "seed the server reports (meta_info.sampling_seed) replays its output bit for bit.", ()),
    ("exit status: 0 every section passed, 1 one failed, 2 bad arguments or settings, an "
     "unreachable server or a server error, 130 interrupted (Ctrl-C).", ()),
)


def _format_epilog(sections=_EPILOG_SECTIONS, width: int = HELP_WIDTH) -> str:
    """The epilog as paragraphs and term/description columns, no line longer than ``width``."""
    indent = " " * (2 + _TERM_WIDTH)

    def wrap(text: str, **indents) -> list[str]:
        # A `quoted command` stays on one line, so it can be copied as written.
        glued = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
        lines = textwrap.wrap(glued, width, break_on_hyphens=False, **indents)
        return [line.replace("\0", " ") for line in lines]

    blocks = []
    for heading, terms in sections:
        lines = wrap(heading)
        for term, text in terms:
            first = f"  {term:<{_TERM_WIDTH - 2}}  "
            if len(first) > len(indent):  # a term too long for its column gets a line of its own
                lines.append(f"  {term}")
                first = indent
            lines += wrap(text, initial_indent=first, subsequent_indent=indent)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


_EPILOG = _format_epilog()


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``audit`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "audit",
        help="check that a seeded request gives the same tokens in every batch and with any drafter",
        # The raw formatter keeps the epilog's columns; it would print this paragraph as one line.
        description=textwrap.fill(
            "Decode one probe request in batches of changing size, order and split with the "
            "in-process reference speculative decoding engine, and count its unique outputs: "
            "1 for the seeded sampler, many for the global-RNG control; then check that the same "
            "seeded requests give the same tokens with speculative decoding off, chains, a tree and "
            "a random draft (the invariance section). With --url, run the changing-batch trials "
            "on a running SGLang server through its /generate endpoint instead, then its request-seed checks.",
            width=HELP_WIDTH,
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--mode", choices=VERIFY_MODES, default=None,
        help="verify mode of the in-process engine: coupled (drafter-invariant) or rejection "
        "(default: SGLANG_DETSPEC_VERIFY when it names one of them, else coupled)",
    )
    parser.add_argument(
        "--trials", default=DEFAULT_TRIALS, metavar="N",
        type=_int_in(MIN_TRIALS_TO_JUDGE, why="one trial cannot show that the output does not depend on the batch"),
        help=f"number of trials, at least {MIN_TRIALS_TO_JUDGE} (default {DEFAULT_TRIALS})",
    )
    parser.add_argument(
        "--max-new-tokens", type=_int_in(1), default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
        help=f"tokens generated for the probe request (default {DEFAULT_MAX_NEW_TOKENS}); in-process "
        f"N + K must be at most {MAX_IN_PROCESS_TOKENS} (the reference models' {REFERENCE_MAX_POSITIONS} "
        f"positions less the longest prompt, {MAX_PROMPT_LEN} tokens), so N <= "
        f"{MAX_IN_PROCESS_TOKENS - DEFAULT_NUM_DRAFT_TOKENS} with the default K; with --url the server's "
        "context length applies",
    )
    parser.add_argument(
        "--num-draft-tokens", "-k", type=_int_in(1), default=None, metavar="K",
        help=f"draft tokens per speculative round of the in-process engine, the chain's depth (default "
        f"{DEFAULT_NUM_DRAFT_TOKENS}); SGLang's --speculative-num-draft-tokens also counts the verified last "
        "token, so K here is a server's value less one",
    )
    parser.add_argument(
        "--max-batch-size", type=_int_in(2, MAX_BATCH), default=DEFAULT_MAX_BATCH, metavar="B",
        help=f"largest batch in the schedule, 2 to {MAX_BATCH} (default {DEFAULT_MAX_BATCH})",
    )
    parser.add_argument(
        "--seed", type=_seed, default=0,
        help="probe sampling_seed, schedule seed and control RNG seed, in [0, 2**64) (default 0)",
    )
    parser.add_argument("--json", type=_json_path, metavar="PATH",
                        help="write the full result as JSON to PATH ('-': standard output, the report then "
                             "goes to standard error)")
    parser.add_argument(
        "--control", action=argparse.BooleanOptionalAction, default=None,
        help="also run the global-RNG control engine (default: on; in-process only)",
    )
    parser.add_argument(
        "--require-control-variation", action="store_true",
        help="fail the audit when the control's probe gave 1 unique output (its trials then showed no batch "
             "dependence, so the seeded pass proves nothing); make demo sets it",
    )
    parser.add_argument(
        "--invariance", action=argparse.BooleanOptionalAction, default=None,
        help="after the changing-batch section, run the invariance section (default: on; in-process only)",
    )
    server = parser.add_argument_group("auditing a running SGLang server")
    server.add_argument(
        "--url", type=_url, metavar="URL",
        help="base URL of an SGLang server (e.g. http://127.0.0.1:30000) to audit instead of the in-process engine",
    )
    server.add_argument(
        "--vocab-size", type=_int_in(1), default=None, metavar="V",
        help="the served model's vocabulary size; prompt token ids are drawn from [0, V). "
        "Required with --url: SGLang's /server_info and /model_info do not report it",
    )
    server.add_argument(
        "--concurrency", type=_int_in(1), default=None, metavar="N",
        help=f"send each sub-batch as N concurrent /generate POSTs instead of one (default {DEFAULT_CONCURRENCY})",
    )
    server.add_argument(
        "--seed-encoding", choices=SEED_ENCODINGS, default=None,
        help="how sampling_seed values >= 2**63 are sent: uint64 as is (default; a server with "
        "sglang-detspec active admits [0, 2**64)) or int64 with the same bits (stock SGLang admits "
        "only [-2**63, 2**63))",
    )
    server.add_argument(
        "--timeout", type=_positive_seconds, default=None, metavar="S",
        help=f"seconds to wait for each HTTP request (default {DEFAULT_TIMEOUT_S:g})",
    )
    server.add_argument(
        "--seed-checks", action=argparse.BooleanOptionalAction, default=None,
        help="after the trials, run the request-seed checks (default: on; they need a server with "
        "sglang-detspec active, so turn them off to audit stock SGLang)",
    )
    server.add_argument(
        "--bitwise-logprobs", action="store_true", default=None,
        help="fail unless the probe's output logprobs are bitwise equal in every trial (what every deterministic "
        "server the E2E suites audit gave, whatever its logits claim; by default the tokens decide and moving "
        "logprobs are a note)",
    )
    parser.set_defaults(handler=run, usage=parser.format_usage)
    return parser


def _usage_error(args: argparse.Namespace) -> str | None:
    """Why this combination of flags cannot run, or None; decided before anything is imported or built."""
    if args.require_control_variation and (args.url is not None or args.control is False):
        return "--require-control-variation needs the in-process control run (no --url, no --no-control)"
    if args.url is None:
        given = [flag for name, flag in _SERVER_ONLY.items() if getattr(args, name) is not None]
        if given:
            return f"{', '.join(given)} can only be used with --url"
        k = DEFAULT_NUM_DRAFT_TOKENS if args.num_draft_tokens is None else args.num_draft_tokens
        if args.max_new_tokens + k > MAX_IN_PROCESS_TOKENS:
            return (
                f"--max-new-tokens + --num-draft-tokens must be at most {MAX_IN_PROCESS_TOKENS} with the "
                f"in-process engine (with the longest prompt, {MAX_PROMPT_LEN} tokens, they must fit the "
                f"reference models' {REFERENCE_MAX_POSITIONS} positions), got {args.max_new_tokens} + {k}"
            )
        return None
    if args.control:
        return (
            "--control is not available with --url: a server's control run is a second server launched "
            "without --enable-deterministic-inference; audit it with its own --url"
        )
    if args.num_draft_tokens is not None:
        return (
            "--num-draft-tokens sets the in-process engine; "
            "with --url the server's --speculative-num-draft-tokens applies"
        )
    if args.mode is not None:
        return "--mode sets the in-process engine; with --url the server's SGLANG_DETSPEC_VERIFY applies"
    if args.invariance:
        return "--invariance is not available with --url: the invariance section runs the in-process engine only"
    if args.vocab_size is None:
        return (
            "--url needs --vocab-size: SGLang's /server_info and /model_info do not report the model's "
            "vocabulary size, and prompt token ids must lie in it (use vocab_size from the model's config.json)"
        )
    return None


def _notes(args: argparse.Namespace) -> list[str]:
    """Flags and settings that are accepted but change nothing in this run, said before it starts."""
    from ..config import DISABLE_ENV, env_settings

    notes = []
    if args.url is not None:
        notes += [f"{flag} changes nothing with --url (the {what} runs the in-process engine only)"
                  for flag, what, value in (("--no-control", "control", args.control),
                                            ("--no-invariance", "invariance section", args.invariance))
                  if value is False]
    elif env_settings()["disabled"]:
        notes.append(f"{DISABLE_ENV}=1 applies to SGLang servers with the plugin; the in-process engine always "
                     "runs the keyed streams")
    return notes


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed ``args``; returns the exit code (0 pass, 1 fail, 2 error)."""
    problem = _usage_error(args)
    if problem is not None:
        return fail(problem, code="usage", usage=getattr(args, "usage", None), json_out=args.json == STDOUT)
    for note in _notes(args):
        print(f"{PREFIX} note: {note}", file=sys.stderr)
    if args.url is not None:
        from ._audit_server import run_server

        return run_server(args)
    from ._audit_local import kernel_problem, run_in_process

    problem = kernel_problem()
    if problem is not None:
        return fail(problem, code="usage", json_out=args.json == STDOUT)
    return run_in_process(args)
