"""What users touch: ``FusedMoE`` (nn.Module), ``fused_experts`` (functional) and
``prepare_experts`` (select once, run many times).

Legend: T tokens, E global experts, k top-k, H hidden, I intermediate.

The backend is chosen ONCE, at construction (``.selection`` says which and why); weights
are converted to the backend's layout once; the forward pass only checks shapes on the
host (no device sync; data-dependent checks such as the topk id range run on CPU tensors,
or when ``FUSEDMOE_DEBUG=1`` was set at construction) and runs the kernels. The forward is
the registered custom op ``torch.ops.fusedmoe.experts`` (with a fake implementation), so
``torch.compile(fullgraph=True)`` and CUDA-graph capture see one opaque call.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import nn

from . import env
from .backends.registry import get_spec
from .config import MoEConfig, QuantScheme
from .errors import ConfigError, ConfigTypeError, InputError, check_bool, check_choice, check_int
from .modular import LocalBatched, ModularKernel, NoEP
from .modular.interfaces import ActivationFormat
from .oracle import Selection, select_backend
from .platform import Platform
from .weights import ExpertWeights

BATCHED_DEFAULT_MAX_TOKENS = 256

__all__ = ["PreparedExperts", "prepare_experts", "fused_experts", "FusedMoE", "platform_for"]


def platform_for(device: torch.device, platform=None) -> Platform:
    """The platform of the device the weights live on (a named platform is honoured)."""
    if platform is not None:
        return Platform.resolve(platform)
    cur = Platform.current()
    if device.type == "cuda" or cur.kind == "cpu":
        return cur
    return Platform("cpu", "cpu", None, 0.0, 0, cur.interpreter and cur.triton, cur.interpreter)


def check_inputs(config: MoEConfig, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 device: torch.device, data_checks: bool) -> None:
    """Host-side checks, once per call. ``data_checks``: also check the topk ids' values (range,
    repeats), which syncs the device (``PreparedExperts.data_checks``)."""
    if not isinstance(x, torch.Tensor):
        raise ConfigTypeError("x", x, "torch.Tensor [T, H]")
    shape = x.shape
    if len(shape) != 2 or shape[1] != config.hidden_size:
        raise InputError("x.shape", tuple(shape), f"[T, {config.hidden_size}]",
                         "pass hidden states flattened to [tokens, hidden_size]")
    if x.dtype != config.torch_dtype:
        raise InputError("x.dtype", x.dtype, [config.torch_dtype], f"cast with x.to({config.torch_dtype})")
    if x.device != device:
        raise InputError("x.device", str(x.device), [str(device)], "move x to the device of the weights")
    T = shape[0]
    k = config.top_k
    for name, t in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise ConfigTypeError(name, t, f"torch.Tensor [T, top_k] ({'fp32' if name == 'topk_weights' else 'int32'})",
                                  "route with FusedMoE.route or fusedmoe.reference.routing.route")
    if topk_ids.shape != (T, k):                # torch.Size is a tuple: no tuple() per call
        raise InputError("topk_ids.shape", tuple(topk_ids.shape), f"[{T}, {k}] (T, top_k)",
                         "route with top_k = config.top_k")
    if topk_weights.shape != (T, k):
        raise InputError("topk_weights.shape", tuple(topk_weights.shape), f"[{T}, {k}]", "one weight per topk id")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise InputError("topk_ids.dtype", topk_ids.dtype, [torch.int32, torch.int64], "cast with .to(torch.int32)")
    if not topk_weights.is_floating_point():
        raise InputError("topk_weights.dtype", topk_weights.dtype, [torch.float32], "cast with .float()")
    if topk_ids.device != device or topk_weights.device != device:
        raise InputError("topk_ids.device", str(topk_ids.device), [str(device)], "route on the weights' device")
    if T and data_checks:
        lo, hi = (int(v) for v in torch.aminmax(topk_ids))
        if lo < 0 or hi >= config.num_experts:
            raise InputError("topk_ids", f"values in [{lo}, {hi}]", f"[0, {config.num_experts})",
                             "topk ids are global expert indices")
        # a repeat is an off-diagonal match in the [T, k, k] comparison of each token's ids
        # (CPU, T=1, k=8: 6 us; sort + diff + == + any took 13-17 us)
        if k > 1 and int((topk_ids.unsqueeze(2) == topk_ids.unsqueeze(1)).sum()) != T * k:
            raise InputError("topk_ids", "a token listing one expert twice", "k distinct experts per token",
                             "top-k routing never repeats an expert; deduplicate the ids")


@dataclass(frozen=True)
class _Recipe:
    """How a PreparedExperts builds its kernel from its (converted) weights: kept so that what
    the kernel derives from the weight tensors (bound launches, views, dequantized copies,
    workspaces) is rebuilt for new tensors (``rebind``) or after unpickling, never copied."""

    backend: str
    platform: Platform
    fmt: ActivationFormat
    deterministic: bool
    max_num_tokens: Optional[int]
    shared_experts: Optional[Callable]
    chunk_size: Optional[int]


def _build_kernel(config: MoEConfig, weights: ExpertWeights, r: _Recipe) -> ModularKernel:
    experts = get_spec(r.backend).make_experts(config, weights, r.platform, r.fmt, deterministic=r.deterministic,
                                               max_num_tokens=r.max_num_tokens)
    pf = LocalBatched(r.max_num_tokens) if r.fmt == ActivationFormat.BATCHED else NoEP()
    from .kernels.launcher import pin_launch_state, unpin_launch_state
    return ModularKernel(pf, experts, shared_experts=r.shared_experts, chunk_size=r.chunk_size,
                         launch_scope=(pin_launch_state, unpin_launch_state))


def _layout(t: Optional[torch.Tensor]) -> str:
    return "None" if t is None else f"{t.dtype} {tuple(t.shape)} on {t.device}"


@dataclass
class PreparedExperts:
    """A selected, weight-converted, ready-to-run experts kernel. Call it as
    ``pe(x [T,H], topk_weights fp32 [T,k], topk_ids int32 [T,k]) -> out [T,H]``.

    It follows its weight tensors: values written in place reach the kernels (backends that
    keep a copy recompute it on the next call); new tensors go through ``rebind``. Pickling
    keeps the weights and the recipe, and rebuilds the kernel on load."""

    config: MoEConfig
    weights: ExpertWeights
    selection: Selection
    kernel: ModularKernel
    expert_map: Optional[torch.Tensor]
    recipe: Optional[_Recipe] = None
    # the topk ids' values are checked per call on CPU weights, or with FUSEDMOE_DEBUG=1
    # (they sync a GPU); decided here, as every FUSEDMOE_* variable is read at construction
    # (a per-call read of os.environ was ~1 us of a decode forward's host time)
    data_checks: bool = field(init=False)

    def __post_init__(self):
        debug = env.debug()          # read (and checked) on every device, not only where it matters
        self.data_checks = self.weights.device.type == "cpu" or debug

    def __call__(self, x, topk_weights, topk_ids):
        check_inputs(self.config, x, topk_weights, topk_ids, self.weights.device, self.data_checks)
        return self.run(x, topk_weights, topk_ids)

    def quantizes_activations(self, num_tokens: int) -> bool:
        """Whether a call with ``num_tokens`` tokens quantizes the GEMM inputs as the weight
        scheme's W8A8 rule does. False for 16-bit and weight-only schemes, and for the
        ``triton`` backend's decode-size calls with FUSEDMOE_W8A8_DECODE=a16 (the default):
        those keep x and h 16-bit (``reference_moe(..., quantize_activations=False)``).
        Answered for the chunks the call runs in (``kernel.chunk_sizes``: FUSEDMOE_CHUNK_SIZE);
        an InputError where they differ (then ask per chunk size)."""
        f = getattr(self.kernel.experts, "quantizes_activations", None)
        if f is None:
            return self.weights.scheme.method.quantizes_activations
        return self._per_chunk("quantizes_activations", f, num_tokens)

    def h_group(self, num_tokens: int):
        """g where a call with ``num_tokens`` tokens quantizes GEMM2's input h in fp8 1 x g
        groups instead of by the scheme's own rule (the ``triton`` backend's fp8_channel
        prefill, FUSEDMOE_H_QUANT=epilogue): its math is ``reference_moe(..., h_group=g)``.
        None otherwise. Per chunk as ``quantizes_activations``."""
        f = getattr(self.kernel.experts, "h_group", None)
        return self._per_chunk("h_group", f, num_tokens) if f is not None else None

    def _per_chunk(self, what: str, f, num_tokens: int):
        """``f``'s answer for every chunk of a ``num_tokens`` call: the experts decide per chunk."""
        sizes = self.kernel.chunk_sizes(num_tokens) or (num_tokens,)
        answers = {n: f(n) for n in sizes}
        if len(set(answers.values())) == 1:
            return answers[sizes[0]]
        raise InputError("num_tokens", num_tokens, "a token count whose chunks all run one math",
                         f"ask per chunk: {what}(n) for n in kernel.chunk_sizes({num_tokens}), each chunk against "
                         "its own reference, or choose chunk_size (FUSEDMOE_CHUNK_SIZE) so that they agree",
                         problem=f"runs in chunks of {' and '.join(map(str, sizes))} tokens "
                                 f"(chunk_size={self.kernel.chunk_size}) whose {what} differ: {answers}")

    def rebind(self, weights: ExpertWeights) -> None:
        """Run on ``weights`` from now on: new tensors of the layout the kernel was built for
        (``self.weights``' dtypes, shapes and device, contiguous or the same strides), e.g. a
        module's buffers replaced by load_state_dict(assign=True). What the experts derived
        from the old tensors (bound launches, views, copies) and the workspaces are rebuilt."""
        if self.recipe is None:
            raise ConfigError("weights", "new tensors", "the tensors this PreparedExperts was built with",
                              "build it with prepare_experts (which records how to rebuild it)",
                              problem="cannot be rebound")
        old, new = self.weights.tensors(), weights.tensors()
        for name in sorted(old.keys() | new.keys()):
            a, b = old.get(name), new.get(name)
            if (a is None or b is None or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
                    or not (b.is_contiguous() or b.stride() == a.stride())):
                raise ConfigError(name, _layout(b), f"{_layout(a)}, contiguous (what the kernels were built for)",
                                  "copy new values into the existing tensors (load_state_dict without assign, "
                                  "copy_), or build a new layer for another dtype / device",
                                  problem="cannot replace the weight tensor")
        self.kernel = _build_kernel(self.config, weights, self.recipe)
        self.weights = weights

    def __getstate__(self):
        state = dict(self.__dict__)
        if self.recipe is not None:
            # derived from the weights and this process (compiled kernels, device pointers,
            # per-thread workspaces): rebuilt on load
            state["kernel"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.kernel is None:
            self.kernel = _build_kernel(self.config, self.weights, self.recipe)

    def run(self, x, topk_weights, topk_ids):
        """Without the input checks (the custom op calls this after checking)."""
        # kernels index with plain row-major strides: make views contiguous (free when they are)
        topk_weights = topk_weights.float().contiguous()
        return self.kernel(x.contiguous(), topk_weights, topk_ids.contiguous(), self.expert_map)


def prepare_experts(config: MoEConfig, weights: ExpertWeights, backend: str = "auto", *, platform=None,
                    deterministic: bool = False, fmt: Union[str, ActivationFormat] = "standard",
                    max_num_tokens: Optional[int] = None, shared_experts: Optional[Callable] = None,
                    chunk_size: Optional[int] = None) -> PreparedExperts:
    """Select a backend for (config, weights.scheme) on the weights' device and build it.

    ``platform``: None or 'current' (the weights' device), a preset name of the weights'
    device kind (a GPU name with CPU weights is an error), or a Platform object, taken as
    given (tests drive a GPU platform's selection on CPU with stand-in kernels)."""
    if not isinstance(config, MoEConfig):
        raise ConfigTypeError("config", config, "fusedmoe.MoEConfig")
    if not isinstance(weights, ExpertWeights):
        raise ConfigTypeError("weights", weights, "fusedmoe.ExpertWeights (see fusedmoe.quantize_experts)")
    weights.validate(config)
    _check_prepare_args(backend, deterministic, max_num_tokens, shared_experts, chunk_size)
    fmt = check_choice("fmt", fmt, ActivationFormat, "'standard' (token-major) or 'batched' (expert-major)")
    if isinstance(platform, str) and platform.strip().lower() == "current":
        platform = None                      # this machine's platform for the weights' device
    plat = platform_for(weights.device, platform)
    if isinstance(platform, str) and plat.kind != weights.device.type:
        raise ConfigError("platform", platform, f"a platform of the weights' device ({weights.device.type}): "
                          + ("'current', 'cpu'" if weights.device.type == "cpu" else "'current' or a GPU name"),
                          "leave platform unset (the weights' device decides); to see what another GPU would run, "
                          "use select_backend(config, quant, Platform.preset(name)) or `fusedmoe explain --platform`",
                          problem=f"is a {plat.kind} platform but the weights are on {weights.device}")
    if fmt == ActivationFormat.BATCHED and max_num_tokens is None:
        # the batched buffer is [E_loc, T_max, H]: T_max = the chunk would be 60 GB for
        # DeepSeek-V3 at 16384; 256 tokens per chunk is the decode-sized default (vLLM's DP
        # chunk is 256 too) and T is chunked to it
        max_num_tokens = min(chunk_size or env.chunk_size(), BATCHED_DEFAULT_MAX_TOKENS)
    sel = select_backend(config, weights.scheme, plat, backend, fmt=fmt, deterministic=deterministic)
    spec = get_spec(sel.winner)
    if spec.convert_weights is not None:
        weights = spec.convert_weights(config, weights, plat)
    recipe = _Recipe(sel.winner, plat, fmt, deterministic, max_num_tokens, shared_experts, chunk_size)
    kernel = _build_kernel(config, weights, recipe)
    # a rebuild keeps this chunk size, not FUSEDMOE_CHUNK_SIZE as it is then
    recipe = dataclasses.replace(recipe, chunk_size=kernel.chunk_size)
    return PreparedExperts(config, weights, sel, kernel, config.expert_map(weights.device), recipe)


def _check_prepare_args(backend, deterministic, max_num_tokens, shared_experts, chunk_size) -> None:
    if not isinstance(backend, str):
        raise ConfigTypeError("backend", backend, "str: 'auto' or a backend name (`fusedmoe backends` lists them)")
    check_bool("deterministic", deterministic)
    if max_num_tokens is not None:
        # the batched buffer holds max_num_tokens rows per expert: <= 0 would size it to nothing
        check_int("max_num_tokens", max_num_tokens, min_value=1, hint="rows per expert of the batched buffer, "
                  f"or None for the default {BATCHED_DEFAULT_MAX_TOKENS}")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, min_value=1, hint="or None for FUSEDMOE_CHUNK_SIZE (16384)")
    if shared_experts is not None and not callable(shared_experts):
        raise ConfigTypeError("shared_experts", shared_experts, "a callable x [T, H] -> [T, H] (an nn.Module) or None")


# ------------------------------------------------------------------------------ custom op
_HANDLES: "weakref.WeakValueDictionary[int, PreparedExperts]" = weakref.WeakValueDictionary()
_next_handle = itertools.count(1)


def _register(pe: PreparedExperts) -> int:
    h = next(_next_handle)
    _HANDLES[h] = pe
    return h


@torch.library.custom_op("fusedmoe::experts", mutates_args=())
def _experts_op(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    return _HANDLES[handle].run(x, topk_weights, topk_ids)


@_experts_op.register_fake
def _(x, topk_weights, topk_ids, handle):
    return torch.empty_like(x)


@torch.library.custom_op("fusedmoe::no_backward", mutates_args=())
def _no_backward(grad: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("fusedmoe kernels are inference-only: no backward pass is implemented. "
                              "Run under torch.no_grad() / torch.inference_mode(), or use a training MoE")


@_no_backward.register_fake
def _(grad):
    return torch.empty_like(grad)


def _experts_backward(ctx, grad):
    # Traceable (the fake returns a tensor) so torch.compile with grad enabled works; running
    # a real backward raises instead of silently dropping the gradient.
    return _no_backward(grad), None, None, None


# Registered so that tracing with grad enabled (torch.compile with default modules) works;
# only an actual backward call fails, with a clear message.
_experts_op.register_autograd(_experts_backward)


# ------------------------------------------------------------------------------ functional
_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def _storage_state(tensors: dict, copied: tuple):
    """What a cached kernel depends on beyond its weights' identity: every tensor's storage
    (data pointers: ``.data =``, ``set_``) and the versions of those the backend's
    convert_weights copied (the copy would not see an in-place update; the tensors the kernel
    holds as they are it reads as they are, and copies it derives itself it refreshes itself)."""
    return [t.data_ptr() for t in tensors.values()], [t._version for t in copied]


def _as_weights(weights, w2=None) -> ExpertWeights:
    if isinstance(weights, ExpertWeights):
        return weights
    if isinstance(weights, torch.Tensor) and isinstance(w2, torch.Tensor):
        return ExpertWeights(weights, w2)
    if isinstance(weights, torch.Tensor):
        raise ConfigTypeError("w2", w2, "torch.Tensor [E, H, I] when weights is the tensor w13",
                              "pass fused_experts(x, w13, topk_weights, topk_ids, w2=w2)")
    raise ConfigTypeError("weights", weights, "ExpertWeights, or the tensors w13 and w2")


def fused_experts(x: torch.Tensor, weights, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  config: Optional[MoEConfig] = None, *, w2: Optional[torch.Tensor] = None,
                  backend: str = "auto", deterministic: bool = False, activation: str = "silu") -> torch.Tensor:
    """out [T, H] = sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(x), for users who route themselves.

    ``weights``: an ExpertWeights, or w13 [E, N, H] with ``w2=`` [E, H, I] (16-bit). ``config``
    defaults to one inferred from the shapes with ``activation``. The selected kernel is
    cached per (weights, config, backend), so repeated calls select once; it follows the
    weights' values when they are updated in place.
    """
    ew = _as_weights(weights, w2)
    if not isinstance(x, torch.Tensor):
        raise ConfigTypeError("x", x, "torch.Tensor [T, H]")
    if not isinstance(topk_ids, torch.Tensor):
        raise ConfigTypeError("topk_ids", topk_ids, "torch.Tensor [T, top_k] int32")
    if config is not None and not isinstance(config, MoEConfig):
        raise ConfigTypeError("config", config, "fusedmoe.MoEConfig or None (inferred from the shapes)")
    if config is None:
        if not x.is_floating_point():            # named here: the inferred config takes x's dtype
            raise InputError("x.dtype", x.dtype, [torch.bfloat16, torch.float16, torch.float32],
                             "pass 16/32-bit float hidden states")
        E, N = ew.w13.shape[:2]
        H, I = ew.logical_k("w13"), ew.logical_k("w2")
        config = MoEConfig(E, topk_ids.shape[1] if topk_ids.dim() == 2 else 1, H, I,
                           activation=activation, dtype=x.dtype)
    tensors = ew.tensors()
    key = (tuple((n, id(t)) for n, t in tensors.items()), ew.scheme, config, backend, deterministic)
    hit = _CACHE.get(key)
    # id() may be reused after a free: keep the tensors and compare identities
    if (hit is None or any(hit[0].get(n) is not t for n, t in tensors.items())
            or _storage_state(tensors, hit[2]) != hit[3]):
        pe = prepare_experts(config, ew, backend, deterministic=deterministic)
        held = pe.weights.tensors()
        # inference tensors have no version counter: a copy of one is not refreshed
        copied = tuple(t for n, t in tensors.items() if held.get(n) is not t and not t.is_inference())
        with _CACHE_LOCK:                    # another thread may be evicting
            if key not in _CACHE and len(_CACHE) >= 16:
                _CACHE.pop(next(iter(_CACHE)))
            hit = _CACHE[key] = (tensors, pe, copied, _storage_state(tensors, copied))
    return hit[1](x, topk_weights, topk_ids)


# ------------------------------------------------------------------------------ module
class FusedMoE(nn.Module):
    """An MoE layer's experts + router: ``forward(x [T,H], router_logits [T,E]) -> [T,H]``.

    Build it from weights in any scheme (``weights=ExpertWeights``) or from 16-bit weights
    quantized on the fly (``FusedMoE.from_float``). The backend is selected once here;
    ``.selection.explain()`` says why. Construct it on the device it will run on.
    """

    def __init__(self, config: MoEConfig, weights: ExpertWeights, *, backend: str = "auto",
                 platform=None, deterministic: bool = False, correction_bias: Optional[torch.Tensor] = None,
                 shared_experts: Optional[nn.Module] = None, fmt: str = "standard",
                 max_num_tokens: Optional[int] = None):
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise ConfigTypeError("config", config, "fusedmoe.MoEConfig")
        if not isinstance(weights, ExpertWeights):
            raise ConfigTypeError("weights", weights, "fusedmoe.ExpertWeights (see fusedmoe.quantize_experts)")
        if correction_bias is not None and not isinstance(correction_bias, torch.Tensor):
            raise ConfigTypeError("correction_bias", correction_bias, f"a float tensor [{config.num_experts}] or None")
        if config.routing.has_correction_bias:
            if correction_bias is None or tuple(correction_bias.shape) != (config.num_experts,):
                raise InputError("correction_bias", None if correction_bias is None else tuple(correction_bias.shape),
                                 f"fp32 tensor [{config.num_experts}]", "Routing(has_correction_bias=True) needs it")
            if not correction_bias.is_floating_point():
                raise InputError("correction_bias.dtype", correction_bias.dtype, [torch.float32],
                                 "cast with correction_bias.float()")
            correction_bias = correction_bias.float().to(weights.device)
            # a NaN or Inf bias wins (or loses) every token's selection while the outputs stay
            # finite: refused once here (a host sync at construction, none per forward)
            bad = ~torch.isfinite(correction_bias)
            if bool(bad.any()):
                e = int(bad.nonzero()[0, 0])
                raise InputError("correction_bias", f"{float(correction_bias[e])} at expert {e}", "finite values",
                                 "pass the checkpoint's e_score_correction_bias (a NaN there is a corrupt checkpoint)",
                                 problem="is not finite")
        elif correction_bias is not None:
            raise InputError("correction_bias", tuple(correction_bias.shape), [None],
                             "set Routing(has_correction_bias=True) to use a correction bias")
        if config.routing.custom is not None:
            from .reference.routing import get_routing_fn
            get_routing_fn(config.routing.custom)        # unknown: an error here, not at the first forward
        self.config = config
        self.shared_experts = shared_experts
        self.prepared = prepare_experts(config, weights, backend, platform=platform, deterministic=deterministic,
                                        fmt=fmt, max_num_tokens=max_num_tokens)
        self.register_buffer("correction_bias", correction_bias, persistent=False)
        # the tensors the kernels actually read (after the backend's layout conversion), so
        # state_dict() holds them; they are views of the same storage, not copies
        for name, t in self.prepared.weights.tensors().items():
            self.register_buffer(name, t)
        self._bound = tuple(self.prepared.weights.tensors().items())    # (name, tensor) the kernels run on
        self._handle = _register(self.prepared)

    def _follow_buffers(self) -> None:
        """Rebind the kernels to the weight buffers where one was replaced by a new tensor
        (load_state_dict(assign=True), setattr, a loader writing ``_buffers``, ``to_empty``).
        Values written in place need nothing here: the kernels read the buffers, and backends
        that keep a copy recompute it. Once per call: an identity test per weight tensor
        (~0.1 us each on a CPU host)."""
        b = self._buffers
        for name, t in self._bound:
            if b.get(name) is not t:
                self.prepared.rebind(self.prepared.weights.replace(**{n: b.get(n) for n, _ in self._bound}))
                self._bound = tuple(self.prepared.weights.tensors().items())
                return

    def _apply(self, fn, recurse=True):
        # .to(other device) / .half() would hand the kernels tensors of a device or dtype they
        # were not built for (int8 weights stay, their fp32 scales would turn fp16): refused
        for name, w in self.prepared.weights.tensors().items():
            moved = fn(w)
            if moved is not w and (moved.device != w.device or moved.dtype != w.dtype):
                raise ConfigError("FusedMoE.to", f"{name}: {w.device}/{w.dtype} -> {moved.device}/{moved.dtype}",
                                  "the device and dtype chosen at construction",
                                  "build FusedMoE on the target device with the target weights (the backend is "
                                  "selected and the weights converted for that device)", problem="cannot move")
        out = super()._apply(fn, recurse)
        self._follow_buffers()
        return out

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._follow_buffers()          # assign=True: a tensor the kernels cannot take fails here

    def __setstate__(self, state):
        # a copy (deepcopy / pickle) owns its own PreparedExperts: give it its own op handle
        super().__setstate__(state)
        self._handle = _register(self.prepared)

    @classmethod
    def from_float(cls, config: MoEConfig, w13: torch.Tensor, w2: torch.Tensor, quant="none", *,
                   w13_bias=None, w2_bias=None, **kw) -> "FusedMoE":
        """Quantize 16-bit expert weights (w13 [E,N,H], w2 [E,H,I]) to ``quant`` and build the layer."""
        from .quantize import quantize_experts
        return cls(config, quantize_experts(w13, w2, QuantScheme.parse(quant), w13_bias=w13_bias,
                                            w2_bias=w2_bias), **kw)

    @property
    def selection(self) -> Selection:
        return self.prepared.selection

    @property
    def weights(self) -> ExpertWeights:
        return self.prepared.weights

    def route(self, x: torch.Tensor, router_logits: torch.Tensor):
        """-> (topk_weights fp32 [T,k], topk_ids int32 [T,k])."""
        c = self.config
        r = c.routing
        if not isinstance(x, torch.Tensor):
            raise ConfigTypeError("x", x, "torch.Tensor [T, H]")
        if x.dim() != 2 or x.shape[1] != c.hidden_size:   # named before the logits, which are sized by x
            raise InputError("x.shape", tuple(x.shape), f"[T, {c.hidden_size}]",
                             "pass hidden states flattened to [tokens, hidden_size]: x.reshape(-1, x.shape[-1])")
        if not isinstance(router_logits, torch.Tensor):
            raise ConfigTypeError("router_logits", router_logits, f"torch.Tensor [T, {c.num_experts}]")
        if router_logits.dim() != 2 or router_logits.shape != (x.shape[0], c.num_experts):
            raise InputError("router_logits.shape", tuple(router_logits.shape), f"[{x.shape[0]}, {c.num_experts}]",
                             "one logit per (token, expert)")
        if not router_logits.is_floating_point():
            raise InputError("router_logits.dtype", router_logits.dtype, [torch.float32, torch.bfloat16, torch.float16],
                             "cast with router_logits.float()")
        if router_logits.device != x.device:
            raise InputError("router_logits.device", str(router_logits.device), [str(x.device)],
                             "compute the logits on the device of x")
        if router_logits.is_cuda and r.custom is None and not torch.compiler.is_compiling():
            from .kernels.routing import fused_topk
            return fused_topk(router_logits, c.top_k, sigmoid=r.scoring.value == "sigmoid",
                              renormalize=r.renormalize, correction_bias=self.correction_bias,
                              num_groups=r.num_groups, topk_groups=r.topk_groups,
                              routed_scaling_factor=r.routed_scaling_factor)
        from .reference.routing import route
        res = route(router_logits, c.top_k, r, self.correction_bias, x)
        return res.topk_weights, res.topk_ids

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.route(x, router_logits)
        return self.experts(x, topk_weights, topk_ids)

    def experts(self, x, topk_weights, topk_ids):
        if not torch.compiler.is_compiling():
            self._follow_buffers()
            check_inputs(self.config, x, topk_weights, topk_ids, self.prepared.weights.device,
                         self.prepared.data_checks)
        out = torch.ops.fusedmoe.experts(x, topk_weights.float(), topk_ids, self._handle)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    def extra_repr(self) -> str:
        return f"{self.config!r}, quant={self.weights.scheme.name}, backend={self.selection.winner}"
