"""Launch configs of the Triton grouped GEMMs at run time: tuned-file lookup and defaults.

This is the runtime half: backends (and ``fusedmoe.plan``) read it at construction. It imports
nothing from ``fusedmoe.bench``, ``fusedmoe.cli`` or the layer; the tuner that writes the files
is ``fusedmoe.tuner`` (``fusedmoe tune``).

File format (see ``fusedmoe/kernels/configs/README.md``)::

    E={E},N={N},device_name={device},dtype={tag}[,block_shape=[bn,bk]].json
    {"triton_version": "3.6.0",
     "1":  {"gemm1": {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages, SPLIT_K},
            "gemm2": {...}},
     "16": {...}, ...,
     "meta": {...}}            # optional evidence written by the tuner; ignored by the lookup

E = local experts, N = intermediate size per partition (I_tp, as vLLM names it), device =
``Platform.device_name`` (spaces -> '_', H200 family -> NVIDIA_H200), tag = the dtype name
for the 'none' scheme ('bfloat16', 'float16', 'float32') else the scheme's method ('fp8_block',
'int4_w4a16', ...). An entry without "gemm1"/"gemm2" (a vLLM-style flat config) serves both.

Lookup rules:
- ``override(...)`` (context manager) wins over everything.
- Files are searched in ``FUSEDMOE_CONFIG_DIR`` first, then ``fusedmoe/kernels/configs/``;
  the first file with the exact name is used. A ``FUSEDMOE_CONFIG_DIR`` that is not a folder
  gets ONE warning naming it.
- Every entry is checked at load: the keys above are positive ints, BLOCK_SIZE_M/N/K and
  num_warps powers of two, a K tile of at least 32 bytes, and with fp8 blocks a BLOCK_SIZE_K
  that divides the blocks' bk (``check_pair``). A file that cannot be read or fails a check
  is ignored as if absent, with ONE warning naming it and a note in the selection report.
- The token-count key nearest to T is used (absolute distance, as vLLM does), if it lies
  within a factor ``MAX_KEY_RATIO`` (4) of T; otherwise the shape-aware default. On a tie the
  LARGER key wins: its tiles were tuned for at least as many tokens per expert, and a BLOCK_M
  that is too large only wastes masked rows, while one tuned for fewer tokens can starve the
  tensor cores.
- A file tuned under another Triton major.minor is still used; ``LaunchConfigs.notes`` says so
  (and is shown in the selection report). A file may hold entries tuned under other Tritons in
  ``"triton_versions": {"3.9": {"16384": {...}, ...}}``: under that major.minor they win for
  their T (the notes name them). ``fusedmoe tune`` under another Triton than an existing file's
  writes its results there and leaves the file's own entries alone.
- No file: ``fusedmoe.kernels.grouped_gemm.default_config`` (shape-aware defaults) and ONE
  warning per file name per process, naming the file and the folders searched.

``LaunchConfigs.load`` reads files once (at backend construction); ``.get(T)`` is pure Python
with no I/O, no device work, safe inside CUDA-graph capture and torch.compile tracing.
"""
from __future__ import annotations

import bisect
import contextlib
import contextvars
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from . import env
from .config import MoEConfig, QuantMethod, QuantScheme, dtype_name
from .errors import ConfigError, ConfigTypeError

__all__ = [
    "GEMM_KEYS", "LaunchConfigs", "config_file_name", "config_tag", "search_dirs", "package_config_dir",
    "override", "normalize_launch_config", "check_pair", "check_file", "read_config_file", "name_fields",
    "builtin_default", "MAX_KEY_RATIO", "SIBLING_DEVICES", "VERSIONS_KEY",
]

log = logging.getLogger("fusedmoe.tuned_configs")

#: Keys of one GEMM launch config. Missing optional keys are filled by ``normalize_launch_config``.
GEMM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages", "SPLIT_K")
_REQUIRED = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")
_OPTIONAL_DEFAULTS = {"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3, "SPLIT_K": 1}
_POW2_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps")

_WARNED: set = set()          # file names already warned about in this process
_OVERRIDE: contextvars.ContextVar = contextvars.ContextVar("fusedmoe_launch_override", default=None)

Pair = tuple  # (gemm1_cfg: dict, gemm2_cfg: dict)


# ----------------------------------------------------------------------------------------------
# names and places
# ----------------------------------------------------------------------------------------------
#: devices whose tuned files stand in for each other when a device has none of its own
#: (same SM architecture and tile economics; the H200 only has more memory bandwidth)
SIBLING_DEVICES = {
    "NVIDIA_H200": ("NVIDIA_H100_80GB_HBM3",),
    "NVIDIA_H100_80GB_HBM3": ("NVIDIA_H200",),
    "NVIDIA_H100": ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"),
    "NVIDIA_H100_NVL": ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"),
}


def config_tag(scheme, dtype) -> str:
    """The ``dtype=`` field of a file name: dtype name for scheme 'none', else the scheme method."""
    s = QuantScheme.parse(scheme)
    if s.method == QuantMethod.NONE:
        return dtype_name(dtype)
    return s.method.value


def config_file_name(E: int, N: int, device_name: str, scheme="none", dtype="bfloat16") -> str:
    """``E={E},N={N},device_name={device_name},dtype={tag}[,block_shape=[bn,bk]].json``.

    N is the intermediate size per partition (I_tp); ``device_name`` is ``Platform.device_name``.
    """
    s = QuantScheme.parse(scheme)
    name = f"E={E},N={N},device_name={device_name},dtype={config_tag(s, dtype)}"
    if s.method == QuantMethod.FP8_BLOCK:
        bn, bk = s.block_shape
        name += f",block_shape=[{bn},{bk}]"
    return name + ".json"


def package_config_dir() -> str:
    """The folder of the configs shipped with fusedmoe (``fusedmoe/kernels/configs``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "configs")


def search_dirs() -> list:
    """Folders searched, in order: FUSEDMOE_CONFIG_DIR (if set), then the package's folder."""
    dirs = []
    user = env.config_dir()
    if user:
        path = os.path.abspath(os.path.expanduser(user))
        key = f"FUSEDMOE_CONFIG_DIR={path}"
        if not os.path.isdir(path) and key not in _WARNED:   # a typo would otherwise go unnoticed
            _WARNED.add(key)
            log.warning("fusedmoe: FUSEDMOE_CONFIG_DIR=%r is not a folder (missing, or a file): its tuned launch "
                        "configs cannot be read. Fix: create it, or point the variable at the folder that holds "
                        "them", path)
        dirs.append(path)
    dirs.append(package_config_dir())
    return dirs


def _running_triton_version() -> Optional[str]:
    try:
        import triton  # noqa: PLC0415 (optional dependency)
        return str(triton.__version__)
    except Exception:  # triton missing or broken: no version to compare
        return None


def _major_minor(v: Optional[str]) -> Optional[tuple]:
    if not v:
        return None
    parts = str(v).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _mm_str(v: Optional[str]) -> Optional[str]:
    """'3.9.0' -> '3.9' (the key of a file's per-version section); None if unparsable."""
    mm = _major_minor(v)
    return f"{mm[0]}.{mm[1]}" if mm else None


#: a file's entries tuned under another Triton major.minor than its own ``triton_version``:
#: {"triton_versions": {"3.9": {"16384": {"gemm1": ..., "gemm2": ...}, "meta": {...}}}}
VERSIONS_KEY = "triton_versions"


def _version_section(data: dict, run: Optional[str], fname: str) -> dict:
    """{T: (cfg1, cfg2)} of the running Triton's section of a file whose own entries were tuned
    under another major.minor ({} when there is none or the versions match)."""
    mm = _mm_str(run)
    sections = data.get(VERSIONS_KEY)
    if mm is None or not isinstance(sections, dict) or _major_minor(data.get("triton_version")) == _major_minor(run):
        return {}
    sec = sections.get(mm)
    if not isinstance(sec, dict) or not any(str(k).isdigit() for k in sec):
        return {}
    return _parse_table(sec, f"{fname}[{VERSIONS_KEY!r}][{mm!r}]")


# ----------------------------------------------------------------------------------------------
# config dicts
# ----------------------------------------------------------------------------------------------
def normalize_launch_config(cfg, where: str = "launch config") -> dict:
    """Check one GEMM config dict and fill optional keys (GROUP_SIZE_M=1, num_warps=4,
    num_stages=3, SPLIT_K=1). Unknown keys are kept (kernels may take extra knobs)."""
    if not isinstance(cfg, dict):
        raise ConfigTypeError(where, cfg, "a dict with BLOCK_SIZE_M/N/K (and GROUP_SIZE_M, num_warps, num_stages, SPLIT_K)")
    out = dict(cfg)
    for k in _REQUIRED:
        if k not in out:
            raise ConfigError(f"{where}.{k}", None, "a positive power-of-two int", f"add {k} to the config",
                              problem="is missing")
    for k, v in _OPTIONAL_DEFAULTS.items():
        out.setdefault(k, v)
    for k in GEMM_KEYS:
        v = out[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}.{k}", v, "a positive int", "rerun `fusedmoe tune` or fix the file")
        if k in _POW2_KEYS and v & (v - 1):
            raise ConfigError(f"{where}.{k}", v, "a power of two (Triton's tile shapes and num_warps are)",
                              "rerun `fusedmoe tune` or fix the file", problem="is not a power of two")
    v = out.get("PERSISTENT", 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}.PERSISTENT", v, "an int >= 0 (programs per SM; 0: one per tile)",
                          "rerun `fusedmoe tune` or fix the file")
    return out


def check_pair(pair: Pair, tag: str, block_k: Optional[int] = None, where: str = "launch config") -> Pair:
    """What the kernels need of a (gemm1, gemm2) pair beyond each config's own keys, for
    operands of file tag ``tag``; a ConfigError naming the entry otherwise. A K tile of at
    least 32 bytes (Triton's smallest tl.dot K on NVIDIA: 32 8-bit, 16 16-bit, 8 fp32
    elements) and, with fp8 blocks of K group ``block_k``, a BLOCK_SIZE_K that divides it
    (one block scale a K step: the grouped GEMM asserts it at launch). An A_RESIDENT config
    takes its K chunks from the shape instead of BLOCK_SIZE_K."""
    import torch  # noqa: PLC0415
    esize = getattr(torch, _TAG_TORCH_DTYPE.get(tag, "bfloat16")).itemsize
    for g, c in zip(("gemm1", "gemm2"), pair):
        bk = c["BLOCK_SIZE_K"]
        if c.get("A_RESIDENT"):
            continue
        if bk * esize < 32:
            raise ConfigError(f"{where}.{g}.BLOCK_SIZE_K", bk, f"at least {32 // esize} for {tag} operands "
                              "(the smallest K of a Triton dot)", "rerun `fusedmoe tune` or fix the file",
                              problem="is too small")
        if block_k is not None and block_k % bk:
            raise ConfigError(f"{where}.{g}.BLOCK_SIZE_K", bk, f"a divisor of the blocks' bk={block_k}",
                              "rerun `fusedmoe tune` or fix the file", problem="does not divide the fp8 blocks")
    return pair


def read_config_file(path: str) -> dict:
    """The JSON object in ``path``; a ConfigError naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("tuned config file", os.path.basename(path), "a readable JSON file",
                          "fix or delete it; rerun `fusedmoe tune`",
                          problem=f"at {path} cannot be read ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError("tuned config file", os.path.basename(path), "a JSON object keyed by token counts",
                          "see fusedmoe/kernels/configs/README.md",
                          problem=f"at {path} holds a JSON {type(data).__name__}")
    return data


def check_file(data: dict, fname: str, tag: Optional[str], block_k: Optional[int] = None) -> dict:
    """{T: pair} of a file's own entries, every entry (its Triton sections' too) checked as the
    kernels need (``check_pair``; skipped where ``tag`` is None); a ConfigError naming the entry
    otherwise."""
    table = _parse_table(data, fname)
    tables = [(fname, table)]
    sections = data.get(VERSIONS_KEY)
    if sections is not None:
        if not isinstance(sections, dict):
            raise ConfigError(f"{fname}[{VERSIONS_KEY!r}]", type(sections).__name__,
                              "a JSON object keyed by Triton major.minor", "rerun `fusedmoe tune` or fix the file")
        for mm, sec in sections.items():
            where = f"{fname}[{VERSIONS_KEY!r}][{mm!r}]"
            if not isinstance(sec, dict) or any(str(k).isdigit() for k in sec):   # (meta alone: no entries)
                tables.append((where, _parse_table(sec, where)))
    for where, t in tables:
        for T, pair in t.items():
            if tag is not None:
                check_pair(pair, tag, block_k, f"{where}[{str(T)!r}]")
    return table


def name_fields(fname: str) -> tuple:
    """(tag, block bk or None) of a ``config_file_name``; (None, None) for another name."""
    m = re.fullmatch(r"E=\d+,N=\d+,device_name=[^,]+,dtype=([^,]+?)(?:,block_shape=\[\d+,(\d+)\])?\.json", fname)
    if m is None:
        return None, None
    return m.group(1), int(m.group(2)) if m.group(2) else None


def _split_entry(entry, where: str) -> Pair:
    """{'gemm1': {...}, 'gemm2': {...}} or one flat vLLM-style config for both GEMMs -> pair."""
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return (normalize_launch_config(entry[0], f"{where}.gemm1"), normalize_launch_config(entry[1], f"{where}.gemm2"))
    if isinstance(entry, dict) and ("gemm1" in entry or "gemm2" in entry):
        if "gemm1" not in entry or "gemm2" not in entry:
            raise ConfigError(where, sorted(entry), "both 'gemm1' and 'gemm2'", "write both GEMMs' configs")
        return (normalize_launch_config(entry["gemm1"], f"{where}.gemm1"),
                normalize_launch_config(entry["gemm2"], f"{where}.gemm2"))
    c = normalize_launch_config(entry, where)
    return (c, dict(c))


def _parse_table(data, where: str) -> dict:
    """JSON object -> {T: (cfg1, cfg2)}; non-integer keys ('triton_version', 'meta') are skipped."""
    if not isinstance(data, dict):
        raise ConfigError(where, type(data).__name__, "a JSON object keyed by token counts",
                          "see fusedmoe/kernels/configs/README.md")
    table = {}
    for k, v in data.items():
        if not str(k).isdigit():
            continue
        table[int(k)] = _split_entry(v, f"{where}[{k!r}]")
    if not table:
        raise ConfigError(where, "no token-count keys", "at least one entry like \"16\": {\"gemm1\": ..., \"gemm2\": ...}",
                          "rerun `fusedmoe tune` or delete the file", problem="has no configs")
    return table


#: a tuned entry serves T only within this factor of its key; beyond it the tiles belong to
#: another regime (a file tuned at T=4096 alone must not give decode BLOCK_M 64 x BLOCK_N 256,
#: and Mixtral T=64 ran 30% slower on the T=1 entry than on the shape-aware default)
MAX_KEY_RATIO = 4


def _nearest_key(keys: Sequence[int], T: int) -> int:
    """Nearest key by absolute distance; ties go to the larger key. ``keys`` sorted, non-empty."""
    i = bisect.bisect_left(keys, T)
    if i == 0:
        return keys[0]
    if i == len(keys):
        return keys[-1]
    lo, hi = keys[i - 1], keys[i]
    return hi if hi - T <= T - lo else lo


_TAG_TORCH_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                    "fp8_tensor": "float8_e4m3fn", "fp8_channel": "float8_e4m3fn", "fp8_block": "float8_e4m3fn",
                    "int8_channel": "int8"}


def builtin_default(T: int, E: int, N: int, H: int, top_k: int, tag: str, gated: bool = True) -> dict:
    """``fusedmoe.kernels.grouped_gemm.default_config`` for both GEMMs (N = I per partition;
    ``tag`` the file tag: the dtype the GEMMs' operands are loaded in). Backends usually pass
    their own ``default_fn``; this is the fallback."""
    import torch  # noqa: PLC0415
    from .kernels.grouped_gemm import default_config  # noqa: PLC0415 (kernels import triton)
    dt = getattr(torch, _TAG_TORCH_DTYPE.get(tag, "bfloat16"))
    n13 = 2 * N if gated else N
    return {g: default_config(T, E, n13, H, top_k, dt, gemm=g, gated=gated) for g in ("gemm1", "gemm2")}


# ----------------------------------------------------------------------------------------------
# override
# ----------------------------------------------------------------------------------------------
def _as_override(configs):
    """Normalize what ``override`` accepts into a callable T -> pair."""
    if isinstance(configs, LaunchConfigs):
        return configs._lookup
    if callable(configs):
        return configs
    if isinstance(configs, dict) and configs and all(isinstance(k, int) or str(k).isdigit() for k in configs):
        table = {int(k): _split_entry(v, f"override[{k!r}]") for k, v in configs.items()}
        keys = sorted(table)
        return lambda T: table[_nearest_key(keys, T)]
    pair = _split_entry(configs, "override")
    return lambda T: pair


@contextlib.contextmanager
def override(configs):
    """Force the launch configs every ``LaunchConfigs.get`` returns inside the block.

    ``configs``: a (gemm1, gemm2) pair, a {"gemm1", "gemm2"} dict, one flat config (both
    GEMMs), a {T: entry} table (nearest T), a ``LaunchConfigs``, or a callable T -> pair.
    Nests; the innermost wins. Used by the tuner and by tests.
    """
    token = _OVERRIDE.set(_as_override(configs))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


# ----------------------------------------------------------------------------------------------
# LaunchConfigs
# ----------------------------------------------------------------------------------------------
@dataclass
class LaunchConfigs:
    """The launch configs of one (platform, E, N, H, top_k, scheme, dtype), loaded once.

    ``get(T)`` -> (gemm1_cfg, gemm2_cfg); ``source`` is 'tuned:<path>' or 'default';
    ``notes`` are human-readable remarks for the selection report (Triton mismatch, defaults).
    """

    E: int
    N: int
    H: int
    top_k: int
    tag: str
    file_name: str
    table: dict = field(default_factory=dict)          # {T: (cfg1, cfg2)}; empty -> defaults
    source: str = "default"
    notes: tuple = ()
    triton_version: Optional[str] = None               # of the file
    default_fn: Optional[Callable] = None              # (T, E, N, H, top_k, tag) -> pair or dict
    gated: bool = True                                 # GEMM1 has 2N rows (for the built-in default)
    _keys: list = field(default_factory=list, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._keys = sorted(self.table)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def load(cls, platform, E: int, N: int, H: int, top_k: int, scheme="none", dtype="bfloat16",
             *, default_fn: Optional[Callable] = None, gated: bool = True) -> "LaunchConfigs":
        """Find and read the tuned file for this shape (the only I/O), else fall back to defaults.

        ``platform``: a ``fusedmoe.Platform`` (or preset name / None for this machine).
        ``E`` local experts, ``N`` intermediate size per partition, ``H`` hidden size.
        ``default_fn(T, E, N, H, top_k, tag)`` -> {"gemm1", "gemm2"} (or one flat config)
        replaces ``builtin_default`` for the T no file covers.
        """
        from .platform import Platform  # noqa: PLC0415
        plat = Platform.resolve(platform)
        s = QuantScheme.parse(scheme)
        tag = config_tag(s, dtype)
        block_k = s.block_shape[1] if s.method == QuantMethod.FP8_BLOCK else None
        fname = config_file_name(E, N, plat.device_name, s, dtype)
        dirs = search_dirs()
        ignored: list = []

        def read(path: str, name: str) -> Optional["LaunchConfigs"]:
            """The file's configs, or None (and one warning naming it) when it is malformed:
            the lookup goes on as if it were absent."""
            try:
                lc = cls._from_file(path, E, N, H, top_k, tag, name, default_fn, block_k)
            except (ConfigError, ConfigTypeError) as e:
                ignored.append(f"ignored {path}: {e}")
                if path not in _WARNED:
                    _WARNED.add(path)
                    log.warning("fusedmoe: ignoring the tuned launch-config file %s: %s", path, e)
                return None
            lc.gated = gated
            lc.notes = (*ignored, *lc.notes)
            return lc

        for d in dirs:
            path = os.path.join(d, fname)
            if os.path.isfile(path):
                lc = read(path, fname)
                if lc is not None:
                    return lc
        # A sibling chip (same SM architecture, e.g. H100 <-> H200) is a better start than the
        # generic defaults: use its file, and say so in the selection report.
        for sib in SIBLING_DEVICES.get(plat.device_name, ()):
            sname = config_file_name(E, N, sib, s, dtype)
            for d in dirs:
                path = os.path.join(d, sname)
                if os.path.isfile(path):
                    lc = read(path, sname)
                    if lc is None:
                        continue
                    lc.notes = (*lc.notes, f"no file tuned on {plat.device_name}; using the one tuned on {sib} "
                                           f"(same SM architecture): run `fusedmoe tune` here for the best configs")
                    lc.source = f"sibling:{path}"
                    if plat.kind == "cuda" and fname not in _WARNED:
                        _WARNED.add(fname)
                        log.warning("fusedmoe: %s", lc.notes[-1])
                    return lc
        msg = (f"no tuned launch config {fname!r} (looked in: {', '.join(dirs)}); using shape-aware "
               f"defaults, performance may be sub-optimal. Run `fusedmoe tune` on this GPU and put the "
               f"file in FUSEDMOE_CONFIG_DIR.")
        if plat.kind == "cuda":
            if fname not in _WARNED:
                _WARNED.add(fname)
                log.warning(msg)
        else:  # CPU / interpreter: speed is not the point there
            log.debug(msg)
        return cls(E, N, H, top_k, tag, fname, {}, "default",
                   (*ignored, f"default launch configs: {fname} not found in {', '.join(dirs)}"), None,
                   default_fn, gated)

    @classmethod
    def _from_file(cls, path, E, N, H, top_k, tag, fname, default_fn, block_k=None) -> "LaunchConfigs":
        data = read_config_file(path)
        table = check_file(data, fname, tag, block_k)
        fv = data.get("triton_version")
        notes = []
        run = _running_triton_version()
        section = _version_section(data, run, fname)
        if section:
            # entries tuned under the running Triton (`fusedmoe tune` under another major.minor
            # than the file's writes them there, keeping the file's own): they win for their T
            table.update(section)
            notes.append(f"{fname}: T={sorted(section)} from its Triton {_mm_str(run)} entries, the others tuned "
                         f"with Triton {fv}")
        elif fv is None:
            notes.append(f"{fname} has no triton_version; it was used as is")
        elif _major_minor(fv) != _major_minor(run):
            notes.append(f"{fname} was tuned with Triton {fv}, running {run}: configs are used anyway; "
                         f"retune (`fusedmoe tune`) if this shape is slow")
            log.info("fusedmoe: %s", notes[-1])
        return cls(E, N, H, top_k, tag, fname, table, f"tuned:{path}", tuple(notes), fv, default_fn)

    @classmethod
    def for_config(cls, config: MoEConfig, scheme="none", platform=None) -> "LaunchConfigs":
        """``load`` with E, N, H, top_k and dtype taken from a ``MoEConfig``."""
        return cls.load(platform, config.num_local_experts, config.intermediate_size, config.hidden_size,
                        config.top_k, scheme, config.dtype, gated=config.is_gated)

    @classmethod
    def from_table(cls, table, *, E=0, N=0, H=0, top_k=1, tag="bfloat16", source="table") -> "LaunchConfigs":
        """In-memory configs ({T: entry}), e.g. for tests or a tuner's result."""
        parsed = _parse_table({str(k): v for k, v in table.items()}, source)
        return cls(E, N, H, top_k, tag, "", parsed, source)

    # -- lookup (hot path: no I/O) -------------------------------------------------------------
    def get(self, T: int) -> Pair:
        """(gemm1_cfg, gemm2_cfg) for T tokens: override > tuned file (nearest T) > defaults.

        The returned dicts are shared; do not mutate them."""
        ov = _OVERRIDE.get()
        if ov is not None:
            return ov(T)
        return self._lookup(T)

    def _lookup(self, T: int) -> Pair:
        if self._keys:
            key = _nearest_key(self._keys, T)
            if max(key, 1) <= MAX_KEY_RATIO * max(T, 1) and max(T, 1) <= MAX_KEY_RATIO * max(key, 1):
                return self.table[key]
            # the nearest tuned T is in another regime (decode vs prefill tiles): defaults
        pair = self._cache.get(T)
        if pair is None:
            if self.default_fn is not None:
                d = self.default_fn(T, self.E, self.N, self.H, self.top_k, self.tag)
            else:
                d = builtin_default(T, self.E, self.N, self.H, self.top_k, self.tag, self.gated)
            pair = _split_entry(d, f"default_config(T={T})")
            self._cache[T] = pair
        return pair

    def defaults_only(self) -> "LaunchConfigs":
        """The same key with the tuned table dropped: what runs when no file exists."""
        return LaunchConfigs(self.E, self.N, self.H, self.top_k, self.tag, self.file_name, {}, "default",
                             (), None, self.default_fn, self.gated)

    @property
    def is_tuned(self) -> bool:
        return bool(self._keys)

    def describe(self) -> str:
        """One line for the selection report."""
        s = f"launch configs: {self.source}"
        if self._keys:
            s += f" (T keys {self._keys})"
        if self.notes:
            s += "; " + "; ".join(self.notes)
        return s
