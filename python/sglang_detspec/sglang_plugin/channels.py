"""Per-call channels: every value one hook hands to another, written here once, with publish and read.

A hook that knows something the hook of a call further in needs (the verify
context for the verify sampler, the drafted positions for ``fast_sample``,
the ``n > 1`` sample counter for the sends of one request) publishes it on a
:class:`Channel` for the duration of the SGLang call it wraps; the inner hook
reads it. Channels are context variables: concurrent requests and threads
never see each other's values, and a value is gone when its block ends
(also on error).

Values kept across calls on one SGLang object (the FA3 node path's metadata
and buffers on the backend, the seed a request was sent with on its
``ReqState``) are :class:`Slot` s: the attribute's name is written here once,
and the hook table lists each as an ``ATTR`` row.

Imports nothing of the package: every hook module may use it.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Generic, TypeVar

T = TypeVar("T")


class Channel(Generic[T]):
    """A typed per-call value: :meth:`publish` it for a block, :meth:`read` it inside (None outside)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._var: contextvars.ContextVar[T | None] = contextvars.ContextVar(f"detspec_{name}", default=None)

    @contextlib.contextmanager
    def publish(self, value: T):
        """Make ``value`` current while the block runs (restored afterwards, also on error)."""
        token = self._var.set(value)
        try:
            yield value
        finally:
            self._var.reset(token)

    def open(self, value: T) -> contextvars.Token:
        """Make ``value`` current until :meth:`close` (for scopes that cannot be one ``with`` block)."""
        return self._var.set(value)

    def close(self, token: contextvars.Token) -> None:
        """End the scope :meth:`open` began."""
        self._var.reset(token)

    def read(self) -> T | None:
        """The value published in the scope in progress, or None."""
        return self._var.get()


class Slot(Generic[T]):
    """A value the plugin keeps on one SGLang object, under the attribute name :attr:`attr`."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def write(self, obj, value: T) -> None:
        """Keep ``value`` on ``obj``."""
        setattr(obj, self.attr, value)

    def read(self, obj, default: T | None = None) -> T | None:
        """The value kept on ``obj``, or ``default`` where none was written."""
        return getattr(obj, self.attr, default)


# -- per-call channels --------------------------------------------------------------
# positions.PositionRule: the coupled draft position rule of the multi-layer call site in progress.
DRAFT_RULE: Channel = Channel("draft_rule")
# positions.DraftSite: the top-k draft site in progress (topk_draft_hook).
DRAFT_SITE: Channel = Channel("draft_site")
# verify_hook.VerifyContext: what eagle_sample publishes for the verify sampler it calls.
VERIFY: Channel = Channel("verify")
# request_seeds.SampleCounter: the sends of one n > 1 request, until SGLang's first output.
SAMPLES: Channel = Channel("parallel_samples")

# -- values kept on SGLang objects ---------------------------------------------------
# On SGLang's FlashAttentionBackend (tree_attention_hook; the FA3_SPLIT pair: fa3_split_hook):
TREE_NODES_OK: Slot = Slot("_detspec_tree_nodes_ok")  # bool: this backend takes the node path (decided at __init__)
TREE_NODES: Slot = Slot("_detspec_tree_nodes")  # node metadata of the forward in progress, or None
TREE_BUFFERS: Slot = Slot("_detspec_tree_buffers")  # CUDA-graph buffers (dict of tensors), or None
TREE_GRAPH_META: Slot = Slot("_detspec_tree_graph_metadata")  # per graph batch size: metadata over the buffers
FA3_SPLIT_OK: Slot = Slot("_detspec_fa3_split_ok")  # bool: this FA3 backend takes the split (decided at __init__)
FA3_SPLIT: Slot = Slot("_detspec_fa3_split")  # (layout, built while capturing) of the forward in progress, or None
FA3_SPLIT_WARNED: Slot = Slot("_detspec_fa3_split_warned")  # bool: a layer the split does not cover was logged
FA3_OWN_CALLS: Slot = Slot("_detspec_fa3_own_calls")  # bool: the split stood down for SGLang's own calls (at __init__)
# On SGLang's EAGLEWorkerV2 (shape_hook): shape_hook.Shapes, the tree and chain states of a switching tree.
DRAFT_SHAPES: Slot = Slot("_detspec_shapes")
# On SGLang's EagleDraftWorker (shape_hook): int, the active state's draft top-k that draft() narrows to.
DRAFT_TOPK: Slot = Slot("_detspec_draft_topk")
# On SGLang's ReqState (request_seeds): the uint64 seed the request was sent with (None: greedy).
REQUEST_SEED: Slot = Slot("detspec_sampling_seed")
