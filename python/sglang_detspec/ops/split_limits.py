"""The positional-split attention's fixed sizes and bounds, torch-free (the claim rule in ``config`` reads them).

``split_attention`` and its kernels take every size from here.
"""

# Keys per segment: SGLang's deterministic Triton decode splits at the same positions and sizes its
# decode scratch (attn_logits [bs, heads, ceil(context / 256), v_head_dim]) for them, which the
# decode writes into.
SEGMENT_KEYS = 256
# Query rows per tile: the decode tile holds one KV head's query heads, so at most this many per KV head.
TILE_ROWS = 64
# Largest head dim (query / key and value) the kernels take.
MAX_HEAD_DIM = 256
# Draft tokens per request a tree verify may hold (one mask row per node is read as one vector).
MAX_TREE_NODES = 256
# The KV page size the kernels read (token slots).
PAGE_SIZE = 1

# The prefix / tail split (``prefix_split``): a row with L keys reads [0, S(L)) as its prefix part and
# [S(L), L) as its tail, S(L) = PREFIX_SPLIT_BLOCK * floor(max(L - 1 - PREFIX_SPLIT_DEPTH, 0) /
# PREFIX_SPLIT_BLOCK). The depth bounds a draft tree's deepest node (root at depth 0): every node then
# splits inside its request's cached prefix, at one of two keys, so a tree's nodes can share prefix reads.
PREFIX_SPLIT_BLOCK = 128
PREFIX_SPLIT_DEPTH = 64
# Keys a tail part holds at most.
PREFIX_SPLIT_TAIL_KEYS = PREFIX_SPLIT_BLOCK + PREFIX_SPLIT_DEPTH
# Query rows one extend element holds at most (its first group spans D + B positions).
PREFIX_SPLIT_GROUP_ROWS = PREFIX_SPLIT_DEPTH + PREFIX_SPLIT_BLOCK
# Largest head size FA3 (sgl-kernel's Hopper build) takes, and so the prefix / tail split.
FA3_MAX_HEAD_DIM = 256
# Draft tokens a tree may hold under the split: a node's depth (root 0) is below the token count, and every
# node must lie at most PREFIX_SPLIT_DEPTH deep to split inside its request's cached prefix.
PREFIX_SPLIT_MAX_TREE_TOKENS = PREFIX_SPLIT_DEPTH + 1
