"""Cached Triton launches: repeat launches skip ``JITFunction.run`` (host ~70 us -> a few us).

Why: ``kernel[grid](*args, **kw)`` runs ``triton.runtime.jit.JITFunction.run`` on every
call: it binds the arguments to the signature, specializes each one, turns the
specialization and the options into a string key, looks the compiled kernel up, builds
launch metadata for the profiler hooks and only then calls the compiled kernel's launcher.
On an H100 host (triton 3.6) that is ~70 us per launch, while a decode-size MoE forward
(4 launches) spends ~40 us on the GPU in all: eager calls are host bound.

    launch(kernel, grid, args, constexprs, num_warps=4, num_stages=3)

``args`` are the leading parameters of the kernel, positionally and in signature order
(normally every non-constexpr one); ``constexprs`` maps the remaining (constexpr)
parameters by name; parameters given in neither take their defaults. Then:
  * miss: ``kernel[grid](*args, **constexprs, num_warps=.., num_stages=..)``, the normal
    path (compiles if needed); the ``CompiledKernel`` it returns is kept under the key;
  * hit: the compiled kernel's launcher is called directly, as the end of
    ``JITFunction.run`` does (triton 3.9 runtime/jit.py:776-787, 3.6 :731-745):
        ck.run(grid_0, grid_1, grid_2, stream, ck.function, ck.packed_metadata,
               launch_metadata, launch_enter_hook, launch_exit_hook, *bound_args.values())
    ``bound_args`` is the dict of EVERY parameter, constexprs included, in signature order
    with defaults applied (``create_function_from_signature``: ``params = {name: name ...}``,
    3.9 jit.py:440-446, 3.6 :424-429); the launcher itself drops the constexprs. Here that
    sequence is ``*args`` followed by the other parameters (from ``constexprs`` or their
    defaults), which are fixed per cache entry and stored with it.
    Launch hooks are known to be empty here (see below), so launch_metadata and both hooks
    are passed as None: the launcher skips a None hook (3.9 driver.c ``launchHook``; 3.6
    generated launcher, nvidia/driver.py:519), and an empty ``HookChain``,
    what ``JITFunction.run`` passes, calls nothing.

The cache key must separate every pair of calls that triton would compile differently.
Triton's key is, per non-constexpr parameter, ``native_specialize_impl(backend, arg,
is_const, specialize, align)`` (python/src/specialize.cc, the same in 3.6 and 3.9, where
``specialize`` = not in ``do_not_specialize``, ``align`` = not in
``do_not_specialize_on_alignment``), per constexpr its value, plus the options
(num_warps, num_stages, debug, instrumentation), per device. Our key, per positional
argument (a generated function, ``_make_key_fn``; it is never coarser than triton's):

    argument                        triton (type, key)                      ours
    torch.Tensor                    ('*<dtype>', 'D' if data_ptr % 16 == 0    (dtype, aligned)
                                     and specialize and align else '')       (aligned False
                                                                              unless spec+align)
    int, spec, == 1                 ('constexpr', 1)                         1
    int in int32, otherwise         ('i32', 'D' if spec, align and % 16 == 0  2 or 3 (3 = 'D')
                                     else '' if spec else None)
    int outside int32               ('i64' | 'u64', as above)                (int, 'i64'|'u64', D)
    bool / float / None             ('u1', None) / ('fp32', None) /          (bool,) / (float,)
                                    ('constexpr', None)                      / (None,)
    TensorDescriptor                ('tensordesc<dtype[block_shape]>', None) (cls, dtype, block_shape,
                                                                              padding, tf32 flag)
    constexpr given positionally    ('constexpr', value)                     (class, value)
    anything else (tuples, ...)     -                                        normal path, not cached

plus the constexpr dict (its names, its values AND the values' classes: ``1``, ``True`` and
``1.0`` are equal and hash alike in Python, but compile differently), num_warps,
num_stages, the current device and the current stream. A Tensor subclass (Parameter) takes
the (class, dtype, aligned) form. Annotated parameters (``x: tl.int32``) only narrow
triton's key, so ours stays at least as fine. The fast path is refused, for the kernel or
the call, whenever triton itself would do more than specialize-and-launch:
  * ``set_fast(False)`` (the plan override's ``fast_launch``), ``TRITON_INTERPRET=1`` (the interpreter
    has no compiled kernels: ``launch`` is then exactly ``kernel[grid](...)``), or a
    kernel that is not a plain ``JITFunction`` (autotuner, interpreter);
  * launch hooks set (a profiler: non-empty ``knobs.runtime.launch_*_hook``), pre-run
    hooks on the kernel, ``knobs.runtime.add_stages_inspection_hook``, TRITON_DEBUG or an
    instrumentation mode (these change options or need launch metadata);
  * a callable grid, an argument type not in the table above, a backend without native
    tensor specialization (AMD adds a buffer-range flag: not modelled here);
  * the first direct launch of an entry raised: the kernel goes back to the normal path
    for good (logged once at DEBUG) and the call is redone through it. The launcher
    raises only before the kernel is enqueued (argument packing, scratch allocation), so
    the redo cannot run it twice.
Not re-checked on hits: ``JITFunction.run``'s "global variable changed since compile"
guard (a debugging aid for monkeypatched module globals).

Launch state: per launch, ``JITFunction.run`` reads the current device and stream and
triton's hooks and debug flags. ``pin_launch_state()`` lets a caller that launches several
kernels in a row (``ModularKernel``: one forward) have them read once, at the first launch
of the block, on this thread: ~1-2 us per further launch on an H100 host
(``torch.cuda.current_device`` is Python). Inside the block the caller must not switch
device or stream (no fusedmoe forward does); a hook that another thread installs meanwhile
applies from the next block on, as if the block had started a moment earlier.

``TRITON_INTERPRET`` is read at the first launch; ``reset()`` re-reads it and forgets every
cached launch; ``set_fast(False)`` turns the cached path off. Each kernel keeps at most ``MAX_ENTRIES``
entries (then its cache is cleared and refilled). Works with triton 3.6 and 3.9; an API
that is missing turns the fast path off (normal launches only).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Optional, Sequence

import torch


try:
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
    from triton.runtime.jit import JITFunction as _JITFunction
except Exception:  # pragma: no cover - a triton without these: normal launches only
    _knobs = _driver = _JITFunction = None

try:  # host-side TMA descriptors (triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except Exception:  # pragma: no cover
    _TensorDescriptor = None

__all__ = ["launch", "bind", "Bound", "pin_launch_state", "unpin_launch_state", "cdiv", "next_power_of_2", "fast_path_enabled", "set_fast",
           "reset", "stats", "MAX_ENTRIES"]

log = logging.getLogger("fusedmoe.launcher")

MAX_ENTRIES = 256          # per kernel; the cache is cleared when it would grow past this


# ---------------------------------------------------------------------------- int helpers
# triton.cdiv / triton.next_power_of_2 are ConstexprFunction objects in triton 3.9 (~3 us a
# call from Python); these are the same arithmetic (next_power_of_2: for n < 2**64).
def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """Smallest power of 2 >= n; 0 for n <= 0 (as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


# ---------------------------------------------------------------------------- cache key
class _NoFastPath(Exception):
    """This call (not the kernel) cannot take the fast path: launch normally, cache nothing."""


_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _other_key(a: Any, spec: bool, align: bool):
    """Key of an argument the generated fast checks did not cover (see the module table)."""
    t = a.__class__
    if t is int:                                   # outside int32 (1 and small ints are inline)
        if -2 ** 63 <= a < 2 ** 63:
            ty = "i64"
        elif 0 <= a < 2 ** 64:
            ty = "u64"
        else:
            raise _NoFastPath                      # triton raises OverflowError: let it
        return (int, ty, spec and align and not a & 15)
    if t is bool or t is float or a is None:
        return (t,)
    if isinstance(a, torch.Tensor):                # a subclass (nn.Parameter, ...)
        return (t, a.dtype, spec and align and not a.data_ptr() & 15)
    if _TensorDescriptor is not None and t is _TensorDescriptor:
        return (t, a.base.dtype, tuple(a.block_shape), getattr(a, "padding", None),
                getattr(a, "round_f32_to_tf32", None))
    raise _NoFastPath


def _make_key_fn(params: Sequence, n: int, name: str = "kernel"):
    """``key(a0, .., a{n-1})`` -> tuple: one specialization summary per positional argument.

    Generated (like triton's own binder) so that the common cases, an exact torch.Tensor or
    an int32-range int, cost one inline expression and no call; the rest goes to
    ``_other_key``. ``params`` are the kernel's ``KernelParam`` objects.
    """
    if n > len(params):
        raise _NoFastPath                          # too many arguments: triton raises
    exprs = []
    for i, p in enumerate(params[:n]):
        a = f"a{i}"
        if p.is_constexpr:                         # a constexpr given positionally: by value
            exprs.append(f"({a}.__class__, {a})")
            continue
        spec = not p.do_not_specialize
        align = spec and not p.do_not_specialize_on_alignment
        tensor = f"({a}.dtype, not {a}.data_ptr() & 15)" if align else f"({a}.dtype, False)"
        if align:
            small = f"(1 if {a} == 1 else 2 + (not {a} & 15))"   # 1: constexpr 1, 3: 'D'
        elif spec:
            small = f"(1 if {a} == 1 else 2)"
        else:
            small = "2"
        exprs.append(f"({tensor} if {a}.__class__ is _Tensor else "
                     f"{small} if {a}.__class__ is int and {_INT32_MIN} <= {a} <= {_INT32_MAX} else "
                     f"_other_key({a}, {spec}, {align}))")
    args = ", ".join(f"a{i}" for i in range(n))
    src = f"def key_{name}({args}):\n    return ({', '.join(exprs)}{',' if exprs else ''})\n"
    namespace = {"_Tensor": torch.Tensor, "_other_key": _other_key}
    exec(src, namespace)
    return namespace[f"key_{name}"]


# ---------------------------------------------------------------------------- per-kernel cache
class _KernelCache:
    """Compiled launches of one kernel by key; ``disabled`` (a reason) turns the fast path off."""

    __slots__ = ("fn", "name", "params", "key_fns", "entries", "disabled", "hits", "misses")

    def __init__(self, fn):
        self.fn = fn                    # also keeps id(fn), the registry key, unique
        self.name = getattr(fn, "__name__", "kernel")
        self.params = getattr(fn, "params", None)
        self.key_fns: dict = {}         # number of positional args -> key function
        self.entries: dict = {}         # key -> (run, function, packed_metadata, tail, verified, ck)
        self.hits = self.misses = 0
        self.disabled: Optional[str] = None
        if _JITFunction is None or not isinstance(fn, _JITFunction):
            self.disabled = f"{type(fn).__name__} is not a JITFunction"
        elif not hasattr(fn, "pre_run_hooks") or not hasattr(fn, "device_caches") or not all(
                hasattr(p, a) for p in self.params for a in
                ("name", "is_constexpr", "do_not_specialize", "do_not_specialize_on_alignment",
                 "has_default", "default")):
            self.disabled = "unknown JITFunction layout (triton version)"

    def key_fn(self, n: int):
        fn = self.key_fns.get(n)
        if fn is None:
            fn = self.key_fns[n] = _make_key_fn(self.params, n, self.name)
        return fn

    def disable(self, reason: str) -> None:
        self.disabled = reason
        self.entries.clear()
        log.debug("fusedmoe launcher: fast path off for %s: %s", self.name, reason)

    def add(self, key, ck, n: int, constexprs: dict, device) -> None:
        """Keep ``ck`` (what kernel[grid] returned) under ``key``, if it can be launched directly."""
        rest = self.params[n:]
        names = {p.name for p in rest if p.is_constexpr}
        bad = [k for k in constexprs if k not in names]
        if bad:   # a non-constexpr (or positional) parameter by keyword: keep the normal path
            self.disable(f"keyword arguments {bad} are not trailing constexpr parameters")
            return
        tail = []                       # the parameters after args, in signature order
        for p in rest:
            if p.name in constexprs:
                tail.append(constexprs[p.name])
            elif p.has_default:         # fixed per entry, so is its specialization
                tail.append(p.default)
            else:                       # kernel[grid] would have raised already
                return
        try:
            backend = self.fn.device_caches[device][3]
            if not getattr(backend, "supports_native_tensor_specialization", False):
                self.disable("backend specializes tensors in Python (not modelled)")
                return
            entry = (ck.run, ck.function, ck.packed_metadata, tuple(tail), False, ck)
        except Exception as e:          # an unexpected CompiledKernel / cache layout
            self.disable(f"cannot read the compiled kernel: {e!r}")
            return
        if len(self.entries) >= MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = entry


_caches: dict = {}                      # id(kernel) -> _KernelCache
_enabled: Optional[bool] = None         # None: read at the next launch
_wanted = True                          # set_fast: the caller's choice (FUSEDMOE_PLAN fast_launch)
_generation = 0                         # reset() count: a Bound made before a reset re-checks


def _refresh() -> bool:
    global _enabled
    ok = _wanted and _knobs is not None
    if ok:
        try:
            rt = _knobs.runtime
            ok = (not rt.interpret and hasattr(rt, "launch_enter_hook") and hasattr(rt, "launch_exit_hook")
                  and hasattr(rt, "debug") and hasattr(_knobs.compilation, "instrumentation_mode"))
        except Exception:               # pragma: no cover
            ok = False
    _enabled = bool(ok)
    return _enabled


def _triton_idle() -> bool:
    """True when JITFunction.run would do nothing beyond specialize-and-launch."""
    rt = _knobs.runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        # triton >= 3.5: a HookChain (empty unless a profiler added one); before: None or a callable
        if hook is not None and (getattr(hook, "calls", None) is None or hook.calls):
            return False
    return not (rt.debug or _knobs.compilation.instrumentation_mode
                or getattr(rt, "add_stages_inspection_hook", None) is not None)


def _device_stream():
    """(current device index, its current raw stream), as JITFunction.run computes them."""
    drv = _driver.active
    device = drv.get_current_device()
    return device, drv.get_current_stream(device)


def _launch_state():
    """(device, stream) when a launch may take the fast path, () when triton would do more."""
    return _device_stream() if _triton_idle() else ()


_UNREAD = object()                      # in a pinned block, before its first launch


class _Pinned(threading.local):
    """This thread's pinned launch state: None outside a pinned block (read per launch),
    ``_UNREAD``, or what ``_launch_state`` returned at the block's first launch."""

    state = None


_pinned = _Pinned()


def pin_launch_state():
    """From here to ``unpin_launch_state(token)``, this thread's launches read the launch state
    once (module doc); returns the token. Nests. Reads nothing until the first launch, so a
    block that launches nothing (a torch-only backend, no GPU driver) queries no device.

        token = pin_launch_state()
        try:
            ...                      # launches
        finally:
            unpin_launch_state(token)

    (Two calls rather than a context manager: this runs once per forward, and a ``with``
    block's object and method calls cost about twice as much.)

    Code that switches streams inside a pinned block (``with torch.cuda.stream(side)``) must
    pin again inside the switch. Otherwise its launches go to the stream pinned first, or,
    if the switch makes the block's first launch, the rest of the block goes to the side
    stream; graph capture then fails with "capturing stream has unjoined work"."""
    token = _pinned.state
    _pinned.state = _UNREAD
    return token


def unpin_launch_state(token) -> None:
    """End the block ``pin_launch_state`` began (the enclosing block's state comes back)."""
    _pinned.state = token


# Every fusedmoe kernel compiles with floating-point contraction (a*b + c as one FMA) ON, by
# name: it is triton's default up to 3.9, which warns once when the default is used ("will
# change to DISABLED in Triton 3.10") and flips it in 3.10. The kernels' tolerance table and
# their speed (the decode GEMMs' sums are FMA chains) assume it. TRITON_FORCE_DISABLE_FP_FUSION
# still turns it off (triton's own override, for debugging).
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl=False):
    opts = dict(COMPILE_OPTIONS)
    if num_warps is not None:
        opts["num_warps"] = num_warps
    if num_stages is not None:
        opts["num_stages"] = num_stages
    if launch_pdl:   # a compile option of triton >= 3.4 (programmatic dependent launch)
        opts["launch_pdl"] = True
    return kernel[grid](*args, **constexprs, **opts)


# ---------------------------------------------------------------------------- public API
def launch(kernel, grid, args: Sequence, constexprs: dict, num_warps: Optional[int] = None,
           num_stages: Optional[int] = None, launch_pdl: bool = False):
    """``kernel[grid](*args, **constexprs, num_warps=.., num_stages=..)``, cached (module doc).
    ``launch_pdl``: also ``launch_pdl=True`` (a programmatic dependent launch, sm90+; part of
    the key, as it is a compile option).

    Returns the CompiledKernel (what kernel[grid] returns; whatever it returns on the
    normal path).
    """
    if not _enabled and (_enabled is not None or not _refresh()):
        return _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
    kc = _caches.get(id(kernel))
    if kc is None:
        kc = _caches[id(kernel)] = _KernelCache(kernel)
    if kc.disabled is not None or kernel.pre_run_hooks or callable(grid):
        return _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
    state = _pinned.state
    if state is None:
        state = _launch_state()
    elif state is _UNREAD:
        state = _pinned.state = _launch_state()
    if not state:
        return _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
    device, stream = state
    values = constexprs.values()
    try:
        key = (kc.key_fn(len(args))(*args), tuple(constexprs), tuple(values), tuple(map(type, values)),
               num_warps, num_stages, device, stream, launch_pdl)
        entry = kc.entries.get(key)          # TypeError: an unhashable constexpr value
    except (_NoFastPath, TypeError):
        return _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
    if entry is None:
        ck = _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
        kc.misses += 1
        if ck is not None:
            kc.add(key, ck, len(args), constexprs, device)
        return ck
    run, function, packed, tail, verified, ck = entry
    n = len(grid)
    g0 = grid[0]
    g1 = grid[1] if n > 1 else 1
    g2 = grid[2] if n > 2 else 1
    if verified:
        run(g0, g1, g2, stream, function, packed, None, None, None, *args, *tail)
    else:
        try:
            run(g0, g1, g2, stream, function, packed, None, None, None, *args, *tail)
        except Exception as e:               # raised before the kernel was enqueued
            kc.disable(f"direct launch failed: {e!r}")
            return _normal(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl)
        kc.entries[key] = (run, function, packed, tail, True, ck)
    kc.hits += 1
    return ck


class Bound:
    """A launch whose arguments are fixed except those at ``slots``: ``b(*values)`` launches
    ``kernel[grid](*args, **constexprs, ...)`` with ``args[slots[i]] = values[i]``.

    For callers that repeat one launch with new tensors in a few positions (a decode step:
    the activations, routing ids and outputs change, the weights, sizes, strides and
    constexprs do not). A repeat skips what ``launch`` does per call (argument key,
    constexpr tuples, a hash of ~70 items): ~9 us -> ~2 us on a CPU host for a 28-argument
    kernel. It takes the compiled kernel of the cache entry the first launch filled, and
    relaunches through ``launch`` (the checked path) whenever a repeat could specialize
    differently or triton would do more than launch:
      * a slot value that is not an exact ``torch.Tensor`` of the dtype and 16-byte
        alignment (``data_ptr() % 16``) the entry was compiled for;
      * fast launches off, ``reset()`` since binding, the kernel's fast path disabled, launch
        hooks set, or another device current than at binding.
    The fixed arguments are the caller's promise: a ``Bound`` is only as right as the key it
    was built under (the caller keys it on everything but the slot tensors' data). A Bound
    keeps the last call's slot tensors referenced until the next call (decode-sized here),
    and one Bound must not be called from two threads at once (its argument list is reused).
    """

    __slots__ = ("kernel", "grid", "args", "slots", "constexprs", "num_warps", "num_stages", "pdl", "sig",
                 "entry", "device", "gen", "kc", "full", "g", "fast")

    def __init__(self, kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl, slots):
        self.kernel, self.grid, self.constexprs = kernel, grid, constexprs
        self.num_warps, self.num_stages, self.pdl = num_warps, num_stages, launch_pdl
        self.args = list(args)
        self.slots = tuple(slots)
        self.sig = None                     # per slot (dtype, aligned) the entry was compiled for
        self.entry = self.device = self.kc = None
        self.gen = -1
        self.fast = self.slow               # the repeat: ``_make_fast`` once an entry is verified

    def _refresh(self, state) -> None:
        """Take the verified cache entry of the current arguments (after a checked launch)."""
        self.entry = None
        self.fast = self.slow
        kc = _caches.get(id(self.kernel))
        if kc is None or kc.disabled is not None or not state:
            return
        device, stream = state
        values = self.constexprs.values()
        try:
            key = (kc.key_fn(len(self.args))(*self.args), tuple(self.constexprs), tuple(values),
                   tuple(map(type, values)), self.num_warps, self.num_stages, device, stream, self.pdl)
            entry = kc.entries.get(key)
        except (_NoFastPath, TypeError):
            return
        if entry is None or not entry[4]:    # not there, or its first direct launch not yet done
            return
        a = self.args
        sig = []
        for i in self.slots:
            v = a[i]
            if v.__class__ is not torch.Tensor:
                return
            sig.append((v.dtype, not v.data_ptr() & 15))
        self.sig = tuple(sig)
        self.full = a + list(entry[3])      # every parameter in order, as the direct launch takes them
        g = self.grid
        self.g = (g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)
        self.entry, self.device, self.kc, self.gen = entry, device, kc, _generation
        self.fast = self._make_fast(entry, device, kc, _generation)

    def __call__(self, *values):
        return self.fast(*values)

    def slow(self, *values):
        """Through ``launch`` (checked), then re-take the entry: the path whenever ``fast``
        refuses, and the only one before an entry is verified."""
        a = self.args
        for i, v in zip(self.slots, values):
            a[i] = v
        ck = launch(self.kernel, self.grid, a, self.constexprs, self.num_warps, self.num_stages, self.pdl)
        state = _pinned.state
        if state is None or state is _UNREAD:
            state = _launch_state() if (_enabled and _knobs is not None) else ()
        self._refresh(state)
        return ck

    def _make_fast(self, entry, device, kc, gen):
        """The repeat as straight-line code for this entry (generated, like ``_make_key_fn``):
        each slot's class, dtype and alignment checked inline, then the compiled kernel's
        launcher; anything else goes to ``slow``. Module state (``_generation``, the pinned
        launch state) is read live; the rest is bound at generation."""
        n = len(self.slots)
        vs = ", ".join(f"v{i}" for i in range(n))
        conds = "".join(f" and v{i}.__class__ is _T and v{i}.dtype is _d{i} and (not v{i}.data_ptr() & 15) is _a{i}"
                        for i in range(n))
        sets = "".join(f"            _full[{s}] = v{i}\n" for i, s in enumerate(self.slots))
        params = ", ".join(["_T", "_gen", "_kc", "_dev", "_full", "_run", "_fn", "_packed", "_g0", "_g1", "_g2", "_ck",
                            "_slow"] + [f"_d{i}, _a{i}" for i in range(n)])
        src = (f"def factory({params}):\n"
               f"    def fast({vs}):\n"
               f"        if _generation == _gen and _kc.disabled is None{conds}:\n"
               f"            state = _pinned.state\n"
               f"            if state is None:\n"
               f"                state = _launch_state()\n"
               f"            elif state is _UNREAD:\n"
               f"                state = _pinned.state = _launch_state()\n"
               f"            if state and state[0] == _dev:\n"
               f"{sets}"
               f"                _run(_g0, _g1, _g2, state[1], _fn, _packed, None, None, None, *_full)\n"
               f"                return _ck\n"
               f"        return _slow({vs})\n"
               f"    return fast\n")
        src = src.replace("            _full[", "                _full[")
        loc: dict = {}
        exec(src, globals(), loc)
        sig = [x for pair in self.sig for x in pair]
        return loc["factory"](torch.Tensor, gen, kc, device, self.full, entry[0], entry[1], entry[2], *self.g,
                              entry[5], self.slow, *sig)


def bind(kernel, grid, args: Sequence, constexprs: dict, num_warps: Optional[int] = None,
         num_stages: Optional[int] = None, launch_pdl: bool = False, slots: Sequence[int] = ()) -> Bound:
    """Launch now (as ``launch``) and return a ``Bound`` that repeats the launch with new
    tensors at the positions ``slots`` of ``args`` (see ``Bound``)."""
    b = Bound(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl, slots)
    b(*(b.args[i] for i in b.slots))
    return b


def fast_path_enabled() -> bool:
    """Whether launches may take the cached path (``set_fast``, TRITON_INTERPRET)."""
    return _refresh() if _enabled is None else _enabled


def set_fast(on: bool) -> None:
    """Allow (the default) or refuse the cached path; a change forgets every cached launch."""
    global _wanted
    if bool(on) != _wanted:
        _wanted = bool(on)
        reset()


def reset(fast: Optional[bool] = None) -> None:
    """Forget every cached launch and re-check TRITON_INTERPRET at the next launch; ``fast``
    given: ``set_fast(fast)`` too."""
    global _enabled, _generation, _wanted
    if fast is not None:
        _wanted = bool(fast)
    _caches.clear()
    _enabled = None
    _generation += 1


def stats(kernel) -> dict:
    """Cache state of ``kernel``: entries, hits (direct launches), misses (normal launches
    that filled an entry), disabled (reason or None), compiled (the CompiledKernels)."""
    kc = _caches.get(id(kernel))
    if kc is None:
        return dict(entries=0, hits=0, misses=0, disabled=None, compiled=[])
    return dict(entries=len(kc.entries), hits=kc.hits, misses=kc.misses, disabled=kc.disabled,
                compiled=[e[5] for e in kc.entries.values()])
