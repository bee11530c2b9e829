"""Classify the GPU kernels of SGLang decode / verify steps into cost classes, from names and order only.

Decode and verify steps run as CUDA-graph replays, so a profiler trace of them
has no Python or aten frames to say which linear layer a GEMM kernel belongs
to. This module decides it from the kernel sequence of one GPU stream:

1. **Kind by name** (:func:`kernel_kind`): a GEMM (cuBLAS ``nvjet*`` /
   ``sm90_xmma*`` / ``gemv*``, CUTLASS, DeepGEMM's
   ``deep_gemm::sm90_bf16_gemm_impl``, SGLang's batch-invariant Triton
   ``matmul_kernel_persistent``, this package's Triton ``_gemm_fused_kernel``
   and ``_gemm_split_kernel``), a GEMM's own split-K reduction (cuBLAS
   ``splitKreduce``, this package's ``_gemm_combine_kernel``: part of the
   GEMM before it, never a GEMM of its own), attention (FA3 ``flash::``
   kernels, Triton ``_fwd_*kernel*``, FlashInfer), attention's helpers (FA3's
   ``prepare_varlen_num_blocks`` scheduler metadata and its split-KV combine,
   the cascade's ``merge_state`` / ``merge_attn_states``: class attention, but
   never an attention site alone, since SGLang computes FA3's scheduler
   metadata once per plain decode step before the graph replay), a norm
   (fused RMSNorm kernels, this package's and SGLang's batch-invariant
   ``_rms_norm_kernel``, ``pow`` / ``mean_kernel`` / ``rsqrt`` of the
   decomposed one), this package's Triton kernels (the race kernels of
   sampling and drafting, the verify kernels, the tree-row kernel), SGLang's
   sampling / verify kernels, elementwise work and copies, or other.
2. **Attention sites**: consecutive attention kernels with no GEMM between
   them (split-KV stage 1 / stage 2, FA3 with its combine, a cascade's two
   calls and their merge) are one site, one decoder layer.
3. **Forwards**: in a Llama-style decoder layer the GEMMs run qkv, attention,
   o, gate_up, down, so between two sites of one forward lie exactly four
   GEMMs (o, gate_up, down, the next layer's qkv). Any other count ends a
   forward: after the last site come o, gate_up, down and lm_head; the next
   forward starts with qkv, or with fc then qkv (an EAGLE draft forward).
   A forward with one site is the draft's, one with more the target's.
4. **Position**: a GEMM's layer kind is its slot in that pattern (target:
   ``gemm_qkv`` .. ``gemm_lm_head``; draft: ``gemm_draft_fc``,
   ``gemm_draft_layer``, ``gemm_draft_lm_head``); a split-K reduction takes
   its GEMM's class. Kernels between o and gate_up, between down and the
   next qkv, and between the last down and lm_head that are not named
   otherwise are the norms there (the fused add + RMSNorm, or the
   batch-invariant decomposition into copies, add, pow, mean, rsqrt and
   multiplies), except gathers and index kernels (the last-token selection
   before an lm_head). This package's race kernels after a draft forward's
   lm_head are drafting (``plugin_draft``), elsewhere sampling.

Step time (:func:`breakdown`): every decode / verify step holds exactly one
target forward, so the start of each target forward's first GEMM is an anchor
and the time from one anchor to the next is one step, whatever order a step's
parts run in. Over the window from the first used anchor to the last, each
class's GPU time (kernel intervals clipped to the window) and the idle time
(window minus the union of all kernel intervals) are divided by the number of
steps in it. Where the layer pattern yields no two anchors, :func:`breakdown`
falls back, when told how many steps the trace holds, to classes by kernel
name alone over the whole trace (:func:`classes_by_name`: every GEMM
``gemm_other``), so one unforeseen sequence never loses a whole measurement.
Pure Python: no torch, no SGLang.
"""

from __future__ import annotations

import collections
import dataclasses
import re

# Order matters: attention's helpers before attention, attention before GEMM (CUTLASS-based FA3 kernels are
# cutlass::device_kernel<flash::...>).
ATTENTION_AUX_PATTERN = re.compile(r"prepare_varlen_num_blocks|FlashAttnFwdCombine|merge_state|MergeState"
                                   r"|merge_attn_states", re.IGNORECASE)
ATTENTION_PATTERN = re.compile(
    r"flash::|FlashAttn|flash_fwd|fmha|^_fwd_(grouped_)?kernel|BatchDecodeWith|BatchPrefillWith|SinglePrefillWith"
    r"|SingleDecodeWith|cascade_", re.IGNORECASE)
# A split-K GEMM's reduction kernel: cuBLAS's, and the split-K GEMM experiment's (benchmark/gemm_splitk/gemm_triton.py).
GEMM_AUX_PATTERN = re.compile(r"splitKreduce|splitk_reduce|^_gemm_combine_kernel", re.IGNORECASE)
GEMM_PATTERN = re.compile(
    r"nvjet|xmma_gemm|gemm|gemv|matmul_kernel_persistent|bmm_kernel_persistent|deep_gemm::|s16816|s1688"
    r"|cutlass.*tensorop", re.IGNORECASE)
NORM_PATTERN = re.compile(r"rmsnorm|rms_norm|layernorm|layer_norm|pow_tensor_scalar|^mean_kernel|rsqrt",
                          re.IGNORECASE)
# This package's Triton kernels (python/sglang_detspec/ops/*_triton.py and the tree-attention hook).
PLUGIN_RACE_PATTERN = re.compile(r"^_race_(argmax|topk|reduce)_kernel")
PLUGIN_VERIFY_PATTERN = re.compile(r"^_verify_(race|emit)_kernel|^_coupled_walk_kernel|^_tree_positions_kernel")
PLUGIN_TREE_ROWS_PATTERN = re.compile(r"^_?node_rows(_kernel)?$")
# SGLang's (and torch's) sampling, speculative verify and draft-selection kernels.
SAMPLING_PATTERN = re.compile(
    r"softmax|top_k|top_p|topk|sampling_?from|min_p|renorm|tree_speculative_sampling|verify_tree_greedy"
    r"|build_tree|ArgMax|argmax|multinomial|exponential|sort", re.IGNORECASE)
ELEMENTWISE_PATTERN = re.compile(
    r"elementwise|copy|memcpy|memset|act_and_mul|silu|gelu|rope|rotary|fill|index|gather|scatter|CatArray"
    r"|embedding|store_kv|set_kv|where|clamp|arange|softcap", re.IGNORECASE)
# Kind by name: the first pattern that matches wins, in this order (this package's kernels before the broad
# GEMM and sampling patterns, which their names would also match).
KIND_PATTERNS = (
    ("attention_aux", ATTENTION_AUX_PATTERN),
    ("attention", ATTENTION_PATTERN),
    ("gemm_aux", GEMM_AUX_PATTERN),
    ("plugin_race", PLUGIN_RACE_PATTERN),
    ("plugin_verify", PLUGIN_VERIFY_PATTERN),
    ("plugin_tree_rows", PLUGIN_TREE_ROWS_PATTERN),
    ("gemm", GEMM_PATTERN),
    ("norm", NORM_PATTERN),
    ("sampling", SAMPLING_PATTERN),
    ("elementwise", ELEMENTWISE_PATTERN),
)
# Kernels between two GEMMs of a norm's place that are not that norm: the last-token selection before lm_head.
NOT_NORM_PATTERN = re.compile(r"gather|index", re.IGNORECASE)

# Classes of the breakdown, in table order; "idle" is the step's GPU time with no kernel running.
TARGET_GEMMS = {"qkv": "gemm_qkv", "o": "gemm_o", "gate_up": "gemm_gate_up", "down": "gemm_down",
                "lm_head": "gemm_lm_head"}
DRAFT_GEMMS = {"fc": "gemm_draft_fc", "qkv": "gemm_draft_layer", "o": "gemm_draft_layer",
               "gate_up": "gemm_draft_layer", "down": "gemm_draft_layer", "lm_head": "gemm_draft_lm_head"}
CLASSES = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down", "gemm_lm_head", "gemm_draft_fc",
           "gemm_draft_layer", "gemm_draft_lm_head", "gemm_other", "attention", "norm", "elementwise",
           "plugin_sampling", "plugin_verify", "plugin_draft", "plugin_tree_rows", "sampling", "other", "idle")
LAYER_GEMMS = 4  # o, gate_up, down and the next layer's qkv between two attention sites of one forward
NAME_CHARS = 80  # kernel names in a breakdown's first-step listing are cut to this


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One GPU activity: ``name``, start ``ts`` and duration ``dur`` in microseconds."""

    name: str
    ts: float
    dur: float

    @property
    def end(self) -> float:
        return self.ts + self.dur


def kernel_kind(name: str) -> str:
    """The kind of a kernel by its name alone.

    One of ``attention_aux`` (attention's scheduler metadata, split-KV
    combine or state merge: class attention, never a site alone),
    ``attention``, ``gemm_aux`` (a GEMM's split-K reduction, part of the GEMM
    before it), ``gemm``, ``plugin_race``, ``plugin_verify``,
    ``plugin_tree_rows``, ``norm``, ``sampling``, ``elementwise``, ``other``.
    """
    for kind, pattern in KIND_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


@dataclasses.dataclass
class Forward:
    """One model forward: its attention sites (indices into the site list), role and first GEMM."""

    first_site: int
    last_site: int
    role: str = "target"  # "target" (more than one decoder layer) or "draft" (one)
    first_gemm: int | None = None  # kernel index of its first GEMM (qkv, or fc for a draft)

    @property
    def layers(self) -> int:
        return self.last_site - self.first_site + 1


@dataclasses.dataclass
class Classified:
    """:func:`classify`'s result: one class per kernel, the forwards found and what did not fit the pattern."""

    classes: list[str]
    forwards: list[Forward]
    anchors: list[int]  # kernel index of each target forward's first GEMM, in order
    anomalies: list[tuple[int, str]]  # (kernel index where it was seen, what did not fit)


def _sites(kinds: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Attention sites (kernel indices) and the GEMM groups around them: ``groups[k]`` precedes site k."""
    sites: list[list[int]] = []
    groups: list[list[int]] = [[]]
    in_site = False
    for i, kind in enumerate(kinds):
        if kind == "attention":  # attention_aux joins no site: it may run alone, before a step's graph replay
            if not in_site:
                sites.append([])
                in_site = True
            sites[-1].append(i)
        elif kind == "gemm":
            if in_site:
                groups.append([])
                in_site = False
            groups[-1].append(i)
    if in_site:
        groups.append([])
    return sites, groups


def classify(kernels: list[Kernel], *, draft_layers: int = 1) -> Classified:
    """The class of every kernel of ``kernels`` (one stream, in start order), by name and position.

    Args:
        kernels: GPU activities in start order (:class:`Kernel`).
        draft_layers: decoder layers of a draft forward (1 for EAGLE); a
            forward with more is the target's.

    Returns:
        :class:`Classified`: ``classes[i]`` is one of ``CLASSES`` (never
        ``idle``); ``anomalies`` names GEMM groups that fit no pattern (their
        GEMMs are ``gemm_other``) and a trace with no attention site.

    Raises:
        ValueError: kernels not in start order, or draft_layers below 1.
    """
    if draft_layers < 1:
        raise ValueError(f"draft_layers must be >= 1, got {draft_layers}")
    if any(b.ts < a.ts for a, b in zip(kernels, kernels[1:])):
        raise ValueError("kernels must be sorted by start time (ts)")
    kinds = [kernel_kind(k.name) for k in kernels]
    sites, groups = _sites(kinds)
    anomalies: list[tuple[int, str]] = []
    if not sites:
        anomalies.append((0, "no attention kernel: GEMMs cannot be placed in layers"))
    # Forward boundaries: a group between two sites that is not one layer's four GEMMs.
    forwards: list[Forward] = []
    start = 0
    for k in range(len(sites)):
        last = k == len(sites) - 1
        if last or len(groups[k + 1]) != LAYER_GEMMS:
            forwards.append(Forward(start, k))
            start = k + 1
    for f in forwards:
        f.role = "draft" if f.layers <= draft_layers else "target"
    # An extra or missing GEMM inside a forward splits it where it should not: the pieces then have
    # layer counts no real target forward has.
    depth = collections.Counter(f.layers for f in forwards if f.role == "target")
    if depth:
        usual = depth.most_common(1)[0][0]
        for f in forwards:
            if f.role == "target" and f.layers != usual:
                anomalies.append((sites[f.first_site][0], f"a target forward of {f.layers} layers where most have "
                                                         f"{usual}: GEMMs out of the layer pattern nearby"))
    site_forward = {}
    for n, f in enumerate(forwards):
        for k in range(f.first_site, f.last_site + 1):
            site_forward[k] = n

    slot: dict[int, tuple[str, str]] = {}  # GEMM kernel index -> (role, slot)

    def place(indices: list[int], names: list[str], role: str) -> None:
        for i, name in zip(indices, names):
            slot[i] = (role, name)

    for g, group in enumerate(groups):
        before = forwards[site_forward[g - 1]] if g >= 1 and sites else None  # forward ending before group
        after = forwards[site_forward[g]] if g < len(sites) else None  # forward whose site follows
        if before is not None and after is not None and before is after:
            place(group, ["o", "gate_up", "down", "qkv"], before.role)
            continue
        head: list[int] = []
        if before is not None:  # the end of a forward: o, gate_up, down, lm_head
            head = group[:4]
            place(head, ["o", "gate_up", "down", "lm_head"], before.role)
        rest = group[len(head):]
        if after is not None:  # the start of a forward: qkv, after fc for a draft
            lead = rest[-2:] if after.role == "draft" and len(rest) >= 2 else rest[-1:]
            place(lead, ["fc", "qkv"][-len(lead):] if lead else [], after.role)
            if lead:
                after.first_gemm = lead[0]
            rest = rest[: len(rest) - len(lead)]
        if rest:
            where = ("before the first attention site" if before is None else
                     "after the last attention site" if after is None else f"between forwards at site {g}")
            anomalies.append((rest[0], f"{len(rest)} GEMM(s) {where} fit no layer slot (gemm_other)"))
        if before is not None and after is not None and len(head) < 4:
            anomalies.append((group[0] if group else sites[g][0],
                              f"a forward ends at site {g - 1} with {len(head)} GEMM(s) after its last site, "
                              "fewer than o, gate_up, down, lm_head"))

    classes: list[str] = []
    last_lm_head_role: str | None = None
    last_gemm_class = "gemm_other"  # the GEMM a split-K reduction finishes; none once an attention site ran
    for i, kind in enumerate(kinds):
        if kind == "gemm":
            role, name = slot.get(i, ("", "other"))
            if name == "lm_head":
                last_lm_head_role = role
            table = DRAFT_GEMMS if role == "draft" else TARGET_GEMMS
            classes.append(table.get(name, "gemm_other"))
            last_gemm_class = classes[-1]
        elif kind == "gemm_aux":
            classes.append(last_gemm_class)
        elif kind == "plugin_race":
            classes.append("plugin_draft" if last_lm_head_role == "draft" else "plugin_sampling")
        elif kind in ("attention", "attention_aux"):
            classes.append("attention")
            last_gemm_class = "gemm_other"
        else:  # the kind is the class; elementwise / other may become norms below
            classes.append(kind)
    # Unnamed kernels between o and gate_up, down and the next qkv, down and lm_head: that norm's work.
    gemm_idx = [i for i, kind in enumerate(kinds) if kind == "gemm"]
    for a, b in zip(gemm_idx, gemm_idx[1:]):
        ra, sa = slot.get(a, ("", "other"))
        rb, sb = slot.get(b, ("", "other"))
        if ra != rb or (sa, sb) not in (("o", "gate_up"), ("down", "qkv"), ("down", "lm_head")):
            continue
        if any(kinds[j] in ("attention", "attention_aux") for j in range(a + 1, b)):
            continue  # not adjacent within a layer (a forward boundary with its own kernels)
        for j in range(a + 1, b):
            if classes[j] in ("elementwise", "other") and not NOT_NORM_PATTERN.search(kernels[j].name):
                classes[j] = "norm"
    anchors = [f.first_gemm for f in forwards if f.role == "target" and f.first_gemm is not None]
    return Classified(classes, forwards, anchors, anomalies)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def classes_by_name(kernels: list[Kernel]) -> list[str]:
    """Each kernel's class from its name alone, for a sequence whose layer pattern was not found.

    GEMMs and their split-K reductions are ``gemm_other`` (no layer slot
    without the pattern), this package's race kernels ``plugin_sampling``
    (drafting and sampling are told apart only by the forward before them),
    attention's helpers ``attention``; every other kind is its class, so
    elementwise kernels of a norm's decomposition stay ``elementwise``.
    """
    out = []
    for k in kernels:
        kind = kernel_kind(k.name)
        out.append({"gemm": "gemm_other", "gemm_aux": "gemm_other", "plugin_race": "plugin_sampling",
                    "attention_aux": "attention"}.get(kind, kind))
    return out


def _window(kernels: list[Kernel], classes: list[str], lo: float, hi: float, steps: int) -> dict:
    """Per-step class times, idle, busy time, kernel count and largest names of ``kernels`` clipped to [lo, hi)."""
    per_class = dict.fromkeys(CLASSES, 0.0)
    intervals = []
    names: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
    inside = 0
    for k, cls in zip(kernels, classes):
        s, e = max(k.ts, lo), min(k.end, hi)
        if e <= s and not (k.dur == 0 and lo <= k.ts < hi):
            continue
        inside += 1
        per_class[cls] += max(0.0, e - s)
        intervals.append((s, max(s, e)))
        row = names[(k.name, cls)]
        row[0] += 1
        row[1] += max(0.0, e - s)
    busy = _union_length(intervals)
    per_class["idle"] = (hi - lo) - busy
    top = sorted(({"name": n, "class": c, "count": v[0], "total_us": v[1]} for (n, c), v in names.items()),
                 key=lambda r: -r["total_us"])[:40]
    return {"steps": steps, "step_ms": (hi - lo) / steps / 1e3,
            "gpu_ms_per_step": {c: v / steps / 1e3 for c, v in per_class.items()},
            "busy_ms": busy / steps / 1e3, "kernels_per_step": inside / steps, "top": top}


def breakdown(kernels: list[Kernel], *, skip_steps: int = 1, draft_layers: int = 1,
              steps_in_trace: int | None = None) -> dict:
    """GPU time per class and idle time per decode / verify step, in milliseconds.

    Args:
        kernels: one stream's GPU activities in start order (:class:`Kernel`, microseconds).
        skip_steps: steps left out at the start (the first captured step
            can carry the profiler's start-up).
        draft_layers: see :func:`classify`.
        steps_in_trace: the number of steps the profiler recorded (SGLang's
            ``num_steps``), or None. Used only where the layer pattern gives
            fewer than two target forwards after ``skip_steps``: then the
            whole trace (first kernel start to last kernel end) is divided
            into this many steps and classed by :func:`classes_by_name`.

    Returns:
        ``{"classified_by": "layer_pattern" or "kernel_name", "steps": int,
        "step_ms": float, "gpu_ms_per_step": {class: ms} (every class of
        CLASSES, idle included), "busy_ms": union of kernel time per step,
        "forwards_per_step": {"target": float, "draft": float},
        "kernels_per_step": float, "anomalies": [str] (inside the window),
        "anomalies_outside_window": int, "top": [{"name", "class", "count",
        "total_us"}] (the 40 largest names in the window), "first_step":
        [[name (cut to NAME_CHARS), class, duration us]] (the window's first
        step, in order; by kernel name: the trace's first
        ``len(kernels) // steps_in_trace`` kernels)}``. By kernel name,
        ``anomalies`` holds why the pattern failed and ``forwards_per_step``
        is zero. Class times can sum above ``busy_ms`` where kernels overlap.

    Raises:
        ValueError: fewer than two target forwards after ``skip_steps`` and
            ``steps_in_trace`` None (no whole step to measure), no kernels,
            ``skip_steps`` below 0, ``steps_in_trace`` below 1, or what
            :func:`classify` raises.
    """
    if skip_steps < 0:
        raise ValueError(f"skip_steps must be >= 0, got {skip_steps}")
    if steps_in_trace is not None and steps_in_trace < 1:
        raise ValueError(f"steps_in_trace must be >= 1 or None, got {steps_in_trace}")
    if not kernels:
        raise ValueError("kernels is empty: the trace holds no GPU activity")
    result = classify(kernels, draft_layers=draft_layers)
    anchors = result.anchors[skip_steps:]
    if len(anchors) < 2:
        why = (f"need at least 2 target forwards after skipping {skip_steps}, found "
               f"{len(result.anchors)} in {len(kernels)} kernels "
               f"({'; '.join(t for _, t in result.anomalies) or 'no anomaly'})")
        if steps_in_trace is None:
            raise ValueError(why)
        classes = classes_by_name(kernels)
        out = _window(kernels, classes, kernels[0].ts, max(k.end for k in kernels), steps_in_trace)
        n = max(1, len(kernels) // steps_in_trace)
        return {"classified_by": "kernel_name", **out, "forwards_per_step": {"target": 0.0, "draft": 0.0},
                "anomalies": [f"layer pattern not found, classes by kernel name over {steps_in_trace} profiled "
                              f"steps, GEMMs as gemm_other: {why}"],
                "anomalies_outside_window": 0,
                "first_step": [[k.name[:NAME_CHARS], c, round(k.dur, 2)] for k, c in zip(kernels[:n], classes)]}
    lo, hi = kernels[anchors[0]].ts, kernels[anchors[-1]].ts
    steps = len(anchors) - 1
    out = _window(kernels, result.classes, lo, hi, steps)
    in_window = [f for f in result.forwards if f.first_gemm is not None and lo <= kernels[f.first_gemm].ts < hi]
    second = kernels[anchors[1]].ts
    # The first step's kernels in order, names cut short: what a reader checks the layer placement on.
    first_step = [[k.name[:NAME_CHARS], cls, round(k.dur, 2)] for k, cls in zip(kernels, result.classes)
                  if lo <= k.ts < second]
    return {
        "classified_by": "layer_pattern",
        **out,
        "forwards_per_step": {r: sum(1 for f in in_window if f.role == r) / steps for r in ("target", "draft")},
        "anomalies": [t for i, t in result.anomalies if lo <= kernels[i].ts < hi],
        "anomalies_outside_window": sum(1 for i, _ in result.anomalies if not lo <= kernels[i].ts < hi),
        "first_step": first_step,
    }


def kernels_from_events(events: list[dict]) -> list[Kernel]:
    """The GPU activities of a Chrome trace's events (kernels, memcpy, memset), sorted by start.

    Only the busiest stream's device is kept when the trace holds several
    devices (a profile of one server uses one).
    """
    gpu = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in
           ("kernel", "gpu_memcpy", "gpu_memset")]
    by_device = collections.Counter(e.get("pid") for e in gpu)
    if len(by_device) > 1:
        device = by_device.most_common(1)[0][0]
        gpu = [e for e in gpu if e.get("pid") == device]
    out = [Kernel(str(e.get("name", "")), float(e["ts"]), float(e.get("dur", 0.0))) for e in gpu]
    out.sort(key=lambda k: k.ts)
    return out
