"""The one attribute namespace of slotscope spans, and the span names.

Producer (:mod:`tracing.spans`), readers (:mod:`tracing.analyze`, :mod:`tracing.chrome`) and
docs/TRACING.md all use these constants, so a renamed attribute cannot silently split the
producer from the analyser. Every name starts with ``slotscope.``.
"""
from __future__ import annotations

NS = "slotscope."

# -- span names (low cardinality, so Jaeger's operation list stays short) ----------------------
SPAN_RUN = "slotscope.run"
SPAN_STEP = "slotscope.step"
SPAN_BACKEND = "slotscope.backend"     # one per (step, backend): per-layer shapes as arrays
SPAN_BOUNDARY = "slotscope.boundary"   # one per (step, backend, layer) crossing
SPAN_NAMES = (SPAN_RUN, SPAN_STEP, SPAN_BACKEND, SPAN_BOUNDARY)

# -- resource and run --------------------------------------------------------------------------
SCENARIO = "slotscope.scenario"
SCENARIO_PATH = "slotscope.scenario_path"
SCENARIO_HASH = "slotscope.scenario_hash"
DESIGN = "slotscope.design"
SEED = "slotscope.seed"
BACKENDS = "slotscope.backends"               # string[]: backends in run order
DEVICE = "slotscope.device"
LEVEL = "slotscope.trace_level"
NUM_LAYERS = "slotscope.num_layers"
NUM_SWA_LAYERS = "slotscope.num_swa_layers"
NUM_STEPS = "slotscope.num_steps"
NUM_BOUNDARIES = "slotscope.num_boundaries"   # crossings recorded (all levels)
EXTRA_PREFIX = "slotscope.extra."              # RunInfo.extra scalars

# -- step (StepRecord) ---------------------------------------------------------------------------
STEP = "slotscope.step"
MODE = "slotscope.mode"
GRAPH = "slotscope.graph_path"
NUM_REQUESTS = "slotscope.num_requests"
REAL_TOKENS = "slotscope.real_tokens"
DP_PADDED_TOKENS = "slotscope.dp_padded_tokens"
PADDED_TOKENS = "slotscope.padded_tokens"
FULL_USED = "slotscope.full_used"
SWA_USED = "slotscope.swa_used"
FULL_SIZE = "slotscope.full_size"
SWA_SIZE = "slotscope.swa_size"

# -- backend and boundary ------------------------------------------------------------------------
BACKEND = "slotscope.backend"
LAYER = "slotscope.layer"
LAYER_KIND = "slotscope.layer_kind"
LOC_SHAPE = "slotscope.loc_shape"             # int[]: shape of loc, e.g. [37]
SWA_LOC_SHAPE = "slotscope.swa_loc_shape"     # int[]: shape of swa_loc; [] when absent
LOC_DTYPE = "slotscope.loc_dtype"
SWA_LOC_DTYPE = "slotscope.swa_loc_dtype"
MISMATCH = "slotscope.mismatch"               # bool: an SWA layer whose swa_loc length != loc length
MISMATCH_DIRECTION = "slotscope.mismatch_direction"   # "longer" | "shorter" (swa_loc vs loc)
ERROR = "slotscope.error"                     # bool: the store raised (length mismatch)

LAYER_IDS = "slotscope.layer_ids"             # int[] per backend span
LAYER_KINDS = "slotscope.layer_kinds"         # string[]
LOC_LENS = "slotscope.loc_lens"               # int[]
SWA_LOC_LENS = "slotscope.swa_loc_lens"       # int[]; -1 where a layer had no swa_loc
LOC_DTYPES = "slotscope.loc_dtypes"           # string[]
SWA_LOC_DTYPES = "slotscope.swa_loc_dtypes"   # string[]
MISMATCH_COUNT = "slotscope.mismatch_count"
MISMATCH_LAYERS = "slotscope.mismatch_layers"  # int[]
ERROR_COUNT = "slotscope.error_count"
ERROR_LAYERS = "slotscope.error_layers"        # int[]

FINDINGS = "slotscope.findings"               # int: findings at this span's scope
FINDINGS_PREFIX = "slotscope.findings."       # + class: per-class count, only where non-zero
